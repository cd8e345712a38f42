// The row kernels' per-channel coefficients (row_kernels.h), compiled once
// for every instruction set's kernels: loops over channels that the
// compiler vectorises in the baseline set as well.
#include <cmath>

#include "row_kernels.h"

namespace sn_mm_rows {

namespace {

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

// fn(n, o, c0, c1) for each sample's part of rows [begin, end): sample n,
// its first row o, its channels [c0, c1).
template <typename Fn>
void by_sample(int64_t channels, int64_t begin, int64_t end, const Fn& fn) {
  for (int64_t r0 = begin; r0 < end;) {
    const int64_t n = r0 / channels, o = n * channels;
    const int64_t r1 = end < o + channels ? end : o + channels;
    fn(n, o, r0 - o, r1 - o);
    r0 = r1;
  }
}

}  // namespace

template <typename T>
void mixed_statistics(const RowArgs<T>& a, int64_t begin, int64_t end) {
  by_sample(
      a.channels, begin, end, [&](int64_t n, int64_t o, int64_t b, int64_t e) {
        for_each_group(a.w, b, e, [&](int64_t c0, int64_t c1, const T* w) {
          mixed_stats(a.mean_in + o, a.var_in + o, a.ln_mean[n], a.ln_var[n],
                      a.bn_mean, a.bn_var, w, a.eps, a.mu + o, a.rstd + o, c0,
                      c1);
        });
      });
}

// From the gradients of the row's IN mean and variance (what autograd
// derives from the reference's formulas).
template <typename T>
void input_grad_coefficients(const RowArgs<T>& a, int64_t begin, int64_t end,
                             T* __restrict__ scale, T* __restrict__ coef_x,
                             T* __restrict__ shift) {
  const T inv_length = T(1) / static_cast<T>(a.length),
          two_over_divisor = T(2) / a.divisor;
  by_sample(
      a.channels, begin, end, [&](int64_t n, int64_t o, int64_t b, int64_t e) {
        const T dvar_n = a.d_var_n[n], dmean_n = a.d_mu_n[n],
                center_n = a.ln_mean[n];
        for_each_group(a.w, b, e, [&](int64_t c0, int64_t c1, const T* w) {
          for (int64_t c = c0; c < c1; ++c) {
            const int64_t r = o + c, j = r - begin;
            const T rstd = a.rstd[r], s = a.weight[c] * rstd, m = a.mean_in[r];
            const T centred = a.sum_gxc[r] - (a.mu[r] - m) * a.sum_g[r];
            const T d_mu = -s * a.sum_g[r];
            const T d_var = T(-0.5) * s * rstd * rstd * centred;
            const T d_var_in = dvar_n + a.d_var_c[c] + w[kWvIn] * d_var;
            const T d_mean_in = dmean_n + a.d_mu_c[c] + w[kWmIn] * d_mu +
                                T(2) * (m - center_n) * dvar_n +
                                T(2) * (m - a.bn_mean[c]) * a.d_var_c[c];
            scale[j] = s;
            coef_x[j] = d_var_in * two_over_divisor;
            shift[j] = d_mean_in * inv_length;
          }
        });
      });
}

#define SN_INSTANTIATE(T)                                                    \
  template void mixed_statistics(const RowArgs<T>&, int64_t, int64_t);       \
  template void input_grad_coefficients(const RowArgs<T>&, int64_t, int64_t, \
                                        T*, T*, T*);
SN_INSTANTIATE(float)
SN_INSTANTIATE(double)

}  // namespace sn_mm_rows
