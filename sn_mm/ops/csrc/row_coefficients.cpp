// The row kernels' per-channel coefficients (row_kernels.h), compiled once
// for every instruction set's kernels: loops over channels that the
// compiler vectorises in the baseline set as well.
#include <algorithm>
#include <cmath>

#include "row_kernels.h"

namespace sn_mm_rows {

namespace {

// fn(c0, c1, w) for each ratio group's part of channels [c0, c1), w its
// six ratios (RatioIndex).
template <typename T, typename Fn>
void for_each_group(const GroupRatioArgs<T>& w, int64_t c0, int64_t c1,
                    const Fn& fn) {
  for (int64_t c = c0; c < c1;) {
    const int64_t e =
        std::min(c1, (c / w.group_channels + 1) * w.group_channels);
    fn(c, e, w.of_channel(c));
    c = e;
  }
}

// One sample's channels [c0, c1) of one group: mu = mean_in + wm_n * (mu_n
// - mean_in) + wm_c * (mu_c - mean_in) (no |mean|-sized products to round)
// and 1 / sqrt(mixed var + eps). Restrict parameters, so that the loop
// vectorises (GCC ignores restrict on locals).
template <typename T>
void mixed_stats(const T* __restrict__ mean_in, const T* __restrict__ var_in,
                 T mu_n, T var_n, const T* __restrict__ mu_c,
                 const T* __restrict__ var_c, const T* w, T eps,
                 T* __restrict__ mu, T* __restrict__ rstd, int64_t c0,
                 int64_t c1) {
  const T wm_n = w[kWmLn], wm_c = w[kWmBn], wv_in = w[kWvIn], wv_n = w[kWvLn],
          wv_c = w[kWvBn];
  for (int64_t c = c0; c < c1; ++c) {
    mu[c] = mean_in[c] + wm_n * (mu_n - mean_in[c]) +
            wm_c * (mu_c[c] - mean_in[c]);
    rstd[c] = T(1) / std::sqrt(wv_in * var_in[c] + (wv_n * var_n + eps) +
                               wv_c * var_c[c]);
  }
}

}  // namespace

template <typename T>
void mixed_statistics(const NormalizeArgs<T>& a, int64_t begin, int64_t end) {
  for (int64_t r0 = begin; r0 < end;) {  // sample by sample
    const int64_t n = r0 / a.channels, o = n * a.channels;
    const int64_t r1 = std::min(end, o + a.channels);
    for_each_group(
        a.w, r0 - o, r1 - o, [&](int64_t c0, int64_t c1, const T* w) {
          mixed_stats(a.mean_in + o, a.var_in + o, a.mu_n[n], a.var_n[n],
                      a.mu_c, a.var_c, w, a.eps, a.mu + o, a.rstd + o, c0, c1);
        });
    r0 = r1;
  }
}

// From the gradients of the row's IN mean and variance (what autograd
// derives from the reference's formulas).
template <typename T>
void input_grad_coefficients(const InputGradArgs<T>& a, int64_t begin,
                             int64_t end, T* __restrict__ scale,
                             T* __restrict__ coef_x, T* __restrict__ shift) {
  const T inv_length = T(1) / static_cast<T>(a.length);
  for (int64_t r0 = begin; r0 < end;) {
    const int64_t n = r0 / a.channels, o = n * a.channels;
    const int64_t r1 = std::min(end, o + a.channels);
    const T dvar_n = a.dvar_n[n], dmean_n = a.dmean_n[n],
            center_n = a.center_n[n];
    for_each_group(
        a.w, r0 - o, r1 - o, [&](int64_t c0, int64_t c1, const T* w) {
          for (int64_t c = c0; c < c1; ++c) {
            const int64_t r = o + c, j = r - begin;
            const T rstd = a.rstd[r], s = a.weight[c] * rstd, m = a.mean_in[r];
            const T centred = a.sum_gxc[r] - (a.mu[r] - m) * a.sum_g[r];
            const T d_mu = -s * a.sum_g[r];
            const T d_var = T(-0.5) * s * rstd * rstd * centred;
            const T d_var_in = dvar_n + a.dvar_c[c] + w[kWvIn] * d_var;
            const T d_mean_in = dmean_n + a.dmean_c[c] + w[kWmIn] * d_mu +
                                T(2) * (m - center_n) * dvar_n +
                                T(2) * (m - a.center_c[c]) * a.dvar_c[c];
            scale[j] = s;
            coef_x[j] = d_var_in * a.two_over_divisor;
            shift[j] = d_mean_in * inv_length;
          }
        });
    r0 = r1;
  }
}

#define SN_INSTANTIATE(T)                                                    \
  template void mixed_statistics(const NormalizeArgs<T>&, int64_t, int64_t); \
  template void input_grad_coefficients(const InputGradArgs<T>&, int64_t,    \
                                        int64_t, T*, T*, T*);
SN_INSTANTIATE(float)
SN_INSTANTIATE(double)

}  // namespace sn_mm_rows
