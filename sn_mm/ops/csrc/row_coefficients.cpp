// The row kernels' input-gradient coefficients (row_kernels.h), compiled once
// for every instruction set's kernels: products and sums over channels (the
// mixed statistics' square roots and divisions are compiled per set:
// row_kernels_impl.h).
#include "row_kernels.h"

namespace sn_mm_rows {

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

template void input_grad_coefficients(const RowArgs<float>&, int64_t, int64_t,
                                      float*, float*, float*);
template void input_grad_coefficients(const RowArgs<double>&, int64_t, int64_t,
                                      double*, double*, double*);

}  // namespace sn_mm_rows
