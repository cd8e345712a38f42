// SN's backward on the CPU: the row sums of y's gradient, from them the
// gradients of weight, bias and the ratio logits, and x's back through the
// shared LN and BN statistics.
#include <ATen/Dispatch.h>

#include "sn_host.h"

namespace sn_mm_cpu {

// d loss / d ratio into d (the ratios' layout), from grad_reduce's
// products: d_mu with the LN and the BN mean, each less the row's IN mean
// (a shift common to all terms, which gradients on the simplex ignore, and
// which keeps large offsets from cancelling: IN's mean ratio gets 0),
// d_var with the IN, LN and BN variance.
template <typename T>
void ratio_grads(const RowArgs<T>& a, const double* dot, const Ratios& w,
                 double* d) {
  const int64_t channels = a.channels;
  for_each_group(a.w, 0, channels, [&](int64_t c0, int64_t c1, const T*) {
    double* dg = d + kRatios * (c0 / a.w.group_channels);
    double sums[5] = {};  // the LN and BN mean's, the IN, LN and BN variance's
    for (int j = 0; j < 5; ++j)
      if (!a.per_channel)
        sums[j] = dot[j];
      else
        for (int64_t c = c0; c < c1; ++c) sums[j] += dot[j * channels + c];
    dg[kWvIn] = w.has_in ? sums[2] : 0.0;
    dg[kWmLn] = sums[0];
    dg[kWvLn] = sums[3];
    if (w.logits == 3) {
      dg[kWmBn] = sums[1];
      dg[kWvBn] = sums[4];
    }
  });
}

// Back through the LN (N) and BN (C) statistics, the latter over bn_count
// samples (0: none, no BN gradient), to each row's IN mean and variance
// (Eq. 5 reversed), in place.
template <typename T>
void through_shared_stats(const RowArgs<T>& a, int64_t samples,
                          int64_t bn_count) {
  const double s_n = 1.0 / a.channels;
  for (int64_t n = 0; n < samples; ++n) {
    a.d_var_n[n] = static_cast<T>(a.d_var_n[n] * s_n);
    a.d_mu_n[n] = static_cast<T>(a.d_mu_n[n] * s_n);
  }
  const double s_c = bn_count > 0 ? 1.0 / bn_count : 0.0;
  for_each_group(a.w, 0, a.channels, [&](int64_t c0, int64_t c1, const T* r) {
    const double m = r[kWmBn] * s_c, v = r[kWvBn] * s_c;
    for (int64_t c = c0; c < c1; ++c) {
      a.d_mu_c[c] = static_cast<T>(a.d_mu_c[c] * m);
      a.d_var_c[c] = static_cast<T>(a.d_var_c[c] * v);
    }
  });
}

// The gradients of x, weight and bias (into the tensors given) and of the
// ratios (into d_ratios, their layout); the sums in this thread's scratch.
template <typename T>
void backward_pass(const at::Tensor& g, const Forward& f,
                   const at::Tensor& weight, at::Tensor& grad_x,
                   at::Tensor& grad_weight, at::Tensor& grad_bias,
                   double* d_ratios) {
  const int64_t samples = f.x3.size(0), channels = f.x3.size(1),
                rows = samples * channels;
  Pass<T> p(f, weight, f.ws.data_ptr<T>());
  RowArgs<T>& a = p.a;
  a.sum_g = scratch<T>(2 * rows + 2 * samples + 2 * channels);
  a.sum_gxc = a.sum_g + rows;
  a.d_mu_n = a.sum_gxc + rows;
  a.d_var_n = a.d_mu_n + samples;
  a.d_mu_c = a.d_var_n + samples;
  a.d_var_c = a.d_mu_c + channels;
  a.g = g.data_ptr<T>();
  a.dx = grad_x.data_ptr<T>();
  a.per_channel = f.ratios.groups > 1;
  if (f.x3.numel())
    run_rows(kGradSums, a, rows);
  else
    std::fill_n(a.sum_g, 2 * rows, T(0));
  const auto cols = sum_over_samples(
      samples, a.per_channel ? 9 * channels : 4 * channels + 5,
      [&](int64_t n, double* acc) { run(kGradReduce, a, n, n + 1, acc); });
  T* const per_channel[4] = {grad_weight.data_ptr<T>(),
                             grad_bias.data_ptr<T>(), a.d_mu_c, a.d_var_c};
  for (int i = 0; i < 4; ++i)
    for (int64_t c = 0; c < channels; ++c)
      per_channel[i][c] = static_cast<T>(cols[i * channels + c]);
  ratio_grads(a, cols.data() + 4 * channels, f.ratios, d_ratios);
  through_shared_stats(a, samples, f.bn_batch ? samples : int64_t(0));
  if (f.x3.numel()) run_rows(kInputGrad, a, rows);
}

// From d loss / d ratio (d) to the mean's (row 0) or variance's logits'
// gradient, through the softmax (as it is for given ratios); fixed ratios
// and an IN logit that took no part get zeros.
at::Tensor logit_grad(const Ratios& w, const std::vector<double>& d, int row,
                      const at::Tensor& logits, bool ratios_given) {
  // empty and filled here: at::zeros costs a dispatched fill kernel, about
  // a microsecond on every backward, for three values.
  auto out = at::empty(logits.sizes(), logits.options());
  const int64_t k = w.logits, first = w.has_in ? 0 : 1;
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "logit_grad", [&] {
    scalar_t* p = out.data_ptr<scalar_t>();
    std::fill_n(p, out.numel(), scalar_t(0));
    for (int64_t g = 0; g < w.groups; ++g) {
      if (w.fixed[row * w.groups + g]) continue;
      const double* rg = w.six.data() + kRatios * g + row;
      const double* dg = d.data() + kRatios * g + row;
      double mean_d = 0;
      for (int64_t i = first; i < k; ++i) mean_d += rg[2 * i] * dg[2 * i];
      for (int64_t i = first; i < k; ++i)
        p[g * k + i] = static_cast<scalar_t>(
            ratios_given ? dg[2 * i] : rg[2 * i] * (dg[2 * i] - mean_d));
    }
  });
  return out;
}

std::vector<at::Tensor> backward_impl(
    const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight,
    const at::Tensor& mean_logits, const at::Tensor& var_logits,
    const at::Tensor& ws, const OptTensor& fixed,
    const OptTensor& fixed_ratios, bool bn_batch, bool unbiased,
    bool ratios_given) {
  Forward f = prepared(x, mean_logits, var_logits, fixed, fixed_ratios,
                       unbiased, ratios_given);
  f.ws = ws;
  f.bn_batch = bn_batch;
  // Rows as x's, in its dtype.
  const auto g =
      grad_y.reshape(f.x3.sizes()).to(f.x3.scalar_type()).contiguous();
  const auto w_c = weight.contiguous();
  auto grad_x = at::empty_like(f.x3);
  auto grad_weight = at::empty({f.x3.size(1)}, f.x3.options());
  auto grad_bias = at::empty_like(grad_weight);
  std::vector<double> d_ratios(f.ratios.six.size(), 0.0);
  AT_DISPATCH_FLOATING_TYPES(
      f.x3.scalar_type(), "switchable_norm_backward", [&] {
        backward_pass<scalar_t>(g, f, w_c, grad_x, grad_weight, grad_bias,
                                d_ratios.data());
      });
  return {grad_x.view(grad_y.sizes()), grad_weight, grad_bias,
          logit_grad(f.ratios, d_ratios, 0, mean_logits, ratios_given),
          logit_grad(f.ratios, d_ratios, 1, mean_logits, ratios_given)};
}

}  // namespace sn_mm_cpu
