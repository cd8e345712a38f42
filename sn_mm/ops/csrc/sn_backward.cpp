// SN's backward on the CPU as the operator (sn_operator.cpp) runs it: the
// row sums of the output gradient, the gradients of weight, bias and the
// ratio logits from them, and the input's gradient back through the shared
// LN and BN statistics.
#include <ATen/Dispatch.h>

#include "sn_host.h"

namespace sn_mm_cpu {

// From the row sums of the output gradient (sum_gxc = sum g * (x - mean_in)):
// the gradients of weight and bias, and the sums over c (per n, weighted by
// each channel's LN ratio) and over n (per c) of the gradients of the mixed
// mean and variance, d_mu = -scale * sum_g and d_var = -scale * rstd^2 / 2 *
// sum g * (x - mu), plus per channel the products for the ratio gradients:
// d_mu with the LN and the BN mean, each less the row's IN mean (a shift
// common to all terms, which the softmax gradient ignores, and which keeps
// large offsets from cancelling), d_var with the IN and the LN variance.
// per_c: grad_weight, grad_bias, d_mu_c, d_var_c; dots: the products, in
// double (4 x C, or 4 summed over the channels where args.per_channel is
// false).
template <typename scalar_t>
void grad_reductions_into(const GradReduceArgs<scalar_t>& args,
                          int64_t samples, scalar_t* const per_c[4],
                          std::vector<double>& dots) {
  const int64_t channels = args.channels;
  const auto cols = sum_over_samples(
      samples, args.per_channel ? 8 * channels : 4 * channels + 4,
      [&](int64_t n, double* acc) {
        GradReduceArgs<scalar_t> a = args;
        a.acc = acc;
        run(a, n, n + 1);
      });
  for (int i = 0; i < 4; ++i) {
    scalar_t* out = per_c[i];
    for (int64_t c = 0; c < channels; ++c)
      out[c] = static_cast<scalar_t>(cols[i * channels + c]);
  }
  dots.assign(cols.begin() + 4 * channels, cols.end());
}

// Backward's intermediate sums: per row the sums of g and g * (x - mean_in),
// per sample the sums of the mixed statistics' gradients, zeros, and per
// channel those of the BN statistics'.
template <typename T>
struct GradSums {
  T *s1, *s2, *d_mu_n, *d_var_n, *zeros_c, *d_mu_c, *d_var_c;
  // The ratio gradients' products: per channel, or for one ratio group
  // summed over the channels (grad_reductions_into).
  std::vector<double> dots;
  GradSums(T* sums, int64_t samples, int64_t channels) {
    const int64_t rows = samples * channels;
    s1 = sums;
    s2 = s1 + rows;
    d_mu_n = s2 + rows;
    d_var_n = d_mu_n + samples;
    zeros_c = d_var_n + samples;
    std::fill_n(zeros_c, channels, T(0));
    d_mu_c = zeros_c + channels;
    d_var_c = d_mu_c + channels;
  }
  // The values at `sums`.
  static int64_t size(int64_t samples, int64_t channels) {
    return 2 * samples * channels + 2 * samples + 3 * channels;
  }
};

// sum a[i] * b[i] in double, in eight running sums (one would be a chain
// of dependent adds: 5 us over 2048 channels).
template <typename T>
double dot_double(const T* a, const T* b, int64_t n) {
  double part[8] = {};
  for (int64_t i = 0; i < n; ++i) part[i % 8] += double(a[i]) * b[i];
  double total = 0;
  for (double p : part) total += p;
  return total;
}

// d loss / d ratio, term by term and group by group (the mean terms less a
// per-row shift common to all, which gradients on the simplex ignore), IN
// first where IN is defined: the per-channel products summed over each
// group's channels.
template <typename T>
void ratio_grads(const GradSums<T>& gs, const T* bn_var, int64_t channels,
                 bool using_bn, const Ratios& w, std::vector<double>& d_wm,
                 std::vector<double>& d_wv) {
  const int64_t per_group = std::max<int64_t>(channels / w.groups, 1);
  const double* dot = gs.dots.data();
  // One group: the four products come summed over the channels.
  const int64_t stride = w.groups == 1 ? 1 : channels;
  for (int64_t g = 0; g < w.groups; ++g) {
    double ln_mean = 0, bn_mean = 0, in_var = 0, ln_var = 0, bn_var_dot = 0;
    if (w.groups == 1) {
      ln_mean = dot[0];
      bn_mean = dot[1];
      in_var = dot[2];
      ln_var = dot[3];
    }
    const int64_t c0 = g * per_group, c1 = (g + 1) * per_group;
    if (w.groups > 1)
      for (int64_t c = c0; c < c1; ++c) {
        ln_mean += dot[c];
        bn_mean += dot[stride + c];
        in_var += dot[2 * stride + c];
        ln_var += dot[3 * stride + c];
      }
    if (using_bn)
      bn_var_dot = dot_double(gs.d_var_c + c0, bn_var + c0, c1 - c0);
    if (w.has_in) {
      d_wm.push_back(0.0);
      d_wv.push_back(in_var);
    }
    d_wm.push_back(ln_mean);
    d_wv.push_back(ln_var);
    if (using_bn) {
      d_wm.push_back(bn_mean);
      d_wv.push_back(bn_var_dot);
    }
  }
}

// Back through the LN (N, 1) and BN (C,) statistics, the latter over
// bn_count samples (0: none, no BN gradient), to each row's IN mean and
// variance (Eq. 5 reversed), in place.
// (The LN sums come weighted by each channel's LN ratio.)
template <typename T>
void through_shared_stats(const GradSums<T>& gs, const GroupRatios<T>& w,
                          int64_t samples, int64_t channels,
                          int64_t bn_count) {
  const double s_n = 1.0 / channels;
  for (int64_t n = 0; n < samples; ++n) {
    gs.d_var_n[n] = static_cast<T>(gs.d_var_n[n] * s_n);
    gs.d_mu_n[n] = static_cast<T>(gs.d_mu_n[n] * s_n);
  }
  const double s_c = bn_count > 0 ? 1.0 / bn_count : 0.0;
  const int64_t per_group = w.args.group_channels;
  for (int64_t c0 = 0; c0 < channels; c0 += per_group) {
    const T* r = w.args.of_channel(c0);
    const double m = r[kWmBn] * s_c, v = r[kWvBn] * s_c;
    for (int64_t c = c0; c < std::min(channels, c0 + per_group); ++c) {
      gs.d_mu_c[c] = static_cast<T>(gs.d_mu_c[c] * m);
      gs.d_var_c[c] = static_cast<T>(gs.d_var_c[c] * v);
    }
  }
}

// The BN statistics a forward normalised with: one sample's are its IN
// ones (see statistics()).
template <typename T>
std::pair<const T*, const T*> bn_used(const Forward& f, const Stats<T>& s) {
  if (f.bn_batch && f.x3.size(0) == 1) return {s.mean_in, s.var_in};
  return {s.bn_mean, s.bn_var};
}

// A backward's first half: the row sums, the gradients of weight and bias
// into the given tensors, of the ratios into d_wm and d_wv, and of the
// mixed and the BN statistics into gs. cw: f's ratios per channel group.
template <typename T>
void grad_sums_pass(const at::Tensor& g, const Forward& f,
                    const at::Tensor& weight, bool using_bn,
                    const GroupRatios<T>& cw, GradSums<T>& gs,
                    at::Tensor& grad_weight, at::Tensor& grad_bias,
                    std::vector<double>& d_wm, std::vector<double>& d_wv) {
  const int64_t samples = f.x3.size(0), channels = f.x3.size(1),
                spatial = f.x3.size(2), rows = samples * channels;
  const Stats<T> s(f.ws.data_ptr<T>(), samples, channels);
  const auto bn = bn_used(f, s);
  const Ratios& w = f.ratios;
  T* const per_c[4] = {grad_weight.data_ptr<T>(), grad_bias.data_ptr<T>(),
                       gs.d_mu_c, gs.d_var_c};
  GradReduceArgs<T> rargs;
  rargs.s1 = gs.s1;
  rargs.s2 = gs.s2;
  rargs.mu = s.mu;
  rargs.rstd = s.rstd;
  rargs.weight = weight.data_ptr<T>();
  rargs.mean_in = s.mean_in;
  rargs.var_in = s.var_in;
  rargs.mean_ln = s.ln_mean;
  rargs.var_ln = s.ln_var;
  rargs.mean_c = using_bn ? bn.first : gs.zeros_c;
  rargs.w = cw.args;
  rargs.channels = channels;
  rargs.d_mu_n = gs.d_mu_n;
  rargs.d_var_n = gs.d_var_n;
  rargs.per_channel = w.groups > 1;
  if (f.x3.numel()) {
    GradSumsArgs<T> sargs;
    sargs.g = g.data_ptr<T>();
    sargs.x = f.x3.data_ptr<T>();
    sargs.mean_in = s.mean_in;
    sargs.sum_g = gs.s1;
    sargs.sum_gxc = gs.s2;
    sargs.length = spatial;
    sargs.short_rows = short_rows(rows, spatial);
    run_rows(sargs, rows, spatial);
  } else {
    std::fill_n(gs.s1, 2 * rows, T(0));
  }
  grad_reductions_into(rargs, samples, per_c, gs.dots);
  ratio_grads(gs, bn.second, channels, using_bn, w, d_wm, d_wv);
}

// A backward's second half: back through the shared statistics (BN's over
// bn_count samples) to the input's gradient.
template <typename T>
void input_grad_pass(const at::Tensor& g, const Forward& f,
                     const at::Tensor& weight, const GroupRatios<T>& cw,
                     const GradSums<T>& gs, int64_t bn_count,
                     at::Tensor& grad_x) {
  const int64_t samples = f.x3.size(0), channels = f.x3.size(1),
                spatial = f.x3.size(2);
  const Stats<T> s(f.ws.data_ptr<T>(), samples, channels);
  through_shared_stats(gs, cw, samples, channels, bn_count);
  if (!f.x3.numel()) return;
  InputGradArgs<T> a;
  a.g = g.data_ptr<T>();
  a.x = f.x3.data_ptr<T>();
  a.sum_g = gs.s1;
  a.sum_gxc = gs.s2;
  a.mu = s.mu;
  a.rstd = s.rstd;
  a.weight = weight.data_ptr<T>();
  a.mean_in = s.mean_in;
  a.dmean_n = gs.d_mu_n;
  a.dvar_n = gs.d_var_n;
  a.center_n = s.ln_mean;
  a.dmean_c = gs.d_mu_c;
  a.dvar_c = gs.d_var_c;
  a.center_c = bn_count > 0 ? bn_used(f, s).first : gs.zeros_c;
  a.w = cw.args;
  a.two_over_divisor =
      static_cast<T>(2.0 / std::max<int64_t>(spatial - f.correction, 1));
  a.dx = grad_x.data_ptr<T>();
  a.channels = channels;
  a.length = spatial;
  run_rows(a, samples * channels, spatial);
}

// The gradients of an SN forward: of x, weight and bias into the given
// tensors, of the ratios into d_wm and d_wv; the sums in this thread's
// scratch memory (no allocation).
template <typename T>
void backward_pass(const at::Tensor& g, const Forward& f,
                   const at::Tensor& weight, bool using_bn, at::Tensor& grad_x,
                   at::Tensor& grad_weight, at::Tensor& grad_bias,
                   std::vector<double>& d_wm, std::vector<double>& d_wv) {
  const int64_t samples = f.x3.size(0), channels = f.x3.size(1);
  const int64_t need = GradSums<T>::size(samples, channels);
  static thread_local std::vector<T> scratch;
  if (static_cast<int64_t>(scratch.size()) < need) scratch.resize(need);
  GradSums<T> gs(scratch.data(), samples, channels);
  const GroupRatios<T> cw(f.ratios, channels, using_bn);
  grad_sums_pass(g, f, weight, using_bn, cw, gs, grad_weight, grad_bias, d_wm,
                 d_wv);
  input_grad_pass(g, f, weight, cw, gs, f.bn_batch ? samples : int64_t(0),
                  grad_x);
}

// From d loss / d ratio to the logits' gradient (through the softmax; as it
// is for given ratios), group by group; fixed ratios and an IN logit that
// took no part get zeros. `row`: 0 for the mean's, 1 for the variance's.
at::Tensor logit_grad(const std::vector<double>& r,
                      const std::vector<double>& d, const at::Tensor& logits,
                      const std::vector<bool>& is_fixed, int row,
                      int64_t groups, bool has_in, bool ratios_given) {
  // empty and filled here: at::zeros costs a dispatched fill kernel, about
  // a microsecond on every backward, for three values.
  auto out = at::empty(logits.sizes(), logits.options());
  const int64_t k = logits.numel() / groups,
                used = static_cast<int64_t>(r.size()) / groups;
  const int64_t off = has_in ? 0 : 1;
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "logit_grad", [&] {
    scalar_t* p = out.data_ptr<scalar_t>();
    std::fill_n(p, out.numel(), scalar_t(0));
    for (int64_t g = 0; g < groups; ++g) {
      if (is_fixed[row * groups + g]) continue;
      const double* rg = r.data() + g * used;
      const double* dg = d.data() + g * used;
      double mean_d = 0;
      for (int64_t i = 0; i < used; ++i) mean_d += rg[i] * dg[i];
      for (int64_t i = 0; i < used; ++i)
        p[g * k + i + off] = static_cast<scalar_t>(
            ratios_given ? dg[i] : rg[i] * (dg[i] - mean_d));
    }
  });
  return out;
}

// grad_y as the forward's (N, C, L) contiguous rows in its dtype.
at::Tensor grad_rows(const at::Tensor& grad_y, const Forward& f) {
  auto g = grad_y.reshape(f.x3.sizes());
  if (g.scalar_type() != f.x3.scalar_type()) g = g.to(f.x3.scalar_type());
  return g.is_contiguous() ? g : g.contiguous();
}

// (The ratios are recomputed from the logits.)
std::vector<at::Tensor> backward_impl(
    const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight,
    const at::Tensor& mean_logits, const at::Tensor& var_logits,
    const at::Tensor& ws, const OptTensor& fixed,
    const OptTensor& fixed_ratios, bool using_bn, bool bn_batch, bool unbiased,
    bool ratios_given) {
  Forward f = prepared(x, mean_logits, var_logits, fixed, fixed_ratios,
                       unbiased, ratios_given);
  f.ws = ws;
  f.bn_batch = bn_batch;
  const auto g = grad_rows(grad_y, f);
  const auto w_c = weight.contiguous();
  auto grad_x = at::empty_like(f.x3);
  auto grad_weight = at::empty({f.x3.size(1)}, f.x3.options());
  auto grad_bias = at::empty_like(grad_weight);
  std::vector<double> d_wm, d_wv;
  AT_DISPATCH_FLOATING_TYPES(
      f.x3.scalar_type(), "switchable_norm_backward", [&] {
        backward_pass<scalar_t>(g, f, w_c, using_bn, grad_x, grad_weight,
                                grad_bias, d_wm, d_wv);
      });
  const Ratios& w = f.ratios;
  return {grad_x.view(grad_y.sizes()), grad_weight, grad_bias,
          logit_grad(w.mean, d_wm, mean_logits, w.fixed, 0, w.groups, w.has_in,
                     ratios_given),
          logit_grad(w.var, d_wv, mean_logits, w.fixed, 1, w.groups, w.has_in,
                     ratios_given)};
}

}  // namespace sn_mm_cpu
