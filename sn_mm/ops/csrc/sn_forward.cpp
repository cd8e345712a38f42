// SN's forward on the CPU: IN's moments, LN's and BN's statistics from them
// (Eq. 5), the running statistics and the normalisation.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>

#include <atomic>
#include <memory>

#include "sn_host.h"

namespace sn_mm_cpu {

// The running statistics (none without BN) and what a forward does with them.
struct Running {
  OptTensor mean, var, count, nonfinite;
  bool training = false, for_backward = false;
  double momentum = 0;
};

// The batch's BN mean and variance (into bn, then bn + C) in the stable
// form var_bn = mean_n(var_in) + mean_n((mean_in - mean_bn)^2) (the
// released mean(var_in + mean_in^2) - mean^2 cancels), with LN's statistics.
template <typename T>
void batch_bn(RowArgs<T>& a, T* bn, int64_t samples) {
  const int64_t channels = a.channels;
  const auto cols = sum_over_samples(
      samples, 2 * channels,
      [&](int64_t n, double* col) { run(kLnStats, a, n, n + 1, col); });
  std::vector<double> centre(channels);
  for (int64_t c = 0; c < channels; ++c) centre[c] = cols[c] / samples;
  a.centre = centre.data();
  const auto devs = sum_over_samples(
      samples, channels,
      [&](int64_t n, double* col) { run(kBnDev, a, n, n + 1, col); });
  for (int64_t c = 0; c < channels; ++c) {
    bn[c] = static_cast<T>(double(a.shift[c]) + centre[c]);
    bn[channels + c] =
        static_cast<T>(cols[channels + c] + devs[c]) / static_cast<T>(samples);
  }
}

// Whether all n values are finite: x * 0 is 0 exactly where x is (unlike
// std::isfinite, an OR of comparisons vectorises: 2 us at 2048 channels).
template <typename T>
bool all_finite(const T* values, int64_t n) {
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= values[i] * T(0) != T(0);
  return bad == 0;
}

// The running statistics moved toward bn_m and bn_v (cumulative where
// momentum < 0) in their opmath type, as BatchNorm's are; untouched, and
// `nonfinite` counted, where a batch statistic is not finite.
template <typename T>
void update_running(const Running& rs, const T* bn_m, const T* bn_v,
                    int64_t channels) {
  if (!all_finite(bn_m, channels) || !all_finite(bn_v, channels)) {
    if (defined(rs.nonfinite)) rs.nonfinite->data_ptr<int64_t>()[0] += 1;
    return;
  }
  auto* count = rs.count->data_ptr<int64_t>();
  count[0] += 1;
  const double mom = rs.momentum < 0 ? 1.0 / count[0] : rs.momentum;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, rs.mean->scalar_type(), "running", [&] {
        using R = scalar_t;
        using M = at::opmath_type<R>;
        const M keep = static_cast<M>(1 - mom), add = static_cast<M>(mom);
        R* prm = rs.mean->data_ptr<R>();
        R* prv = rs.var->data_ptr<R>();
        for (int64_t c = 0; c < channels; ++c) {
          prm[c] = static_cast<R>(keep * M(prm[c]) + add * M(bn_m[c]));
          prv[c] = static_cast<R>(keep * M(prv[c]) + add * M(bn_v[c]));
        }
      });
}

// The BN statistics where they are not the batch's: the running ones (in
// eval without backward read in place, else copied: backward needs them as
// they were), or none (zeros).
template <typename T>
void fixed_bn(Pass<T>& p, const Running& rs) {
  RowArgs<T>& a = p.a;
  if (!defined(rs.mean)) {
    std::fill_n(p.bn, 2 * a.channels, T(0));
  } else if (!rs.for_backward &&
             rs.mean->scalar_type() == c10::CppTypeToScalarType<T>::value) {
    a.bn_mean = rs.mean->data_ptr<T>();
    a.bn_var = rs.var->data_ptr<T>();
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kHalf, at::kBFloat16, rs.mean->scalar_type(), "running", [&] {
          std::copy_n(rs.mean->data_ptr<scalar_t>(), a.channels, p.bn);
          std::copy_n(rs.var->data_ptr<scalar_t>(), a.channels,
                      p.bn + a.channels);
        });
  }
}

// IN's moments, LN's statistics and the BN statistics in use: the batch's
// (Pass's for one sample), else fixed_bn's.
template <typename T>
void statistics(Pass<T>& p, int64_t samples, const Running& rs) {
  RowArgs<T>& a = p.a;
  const int64_t rows = samples * a.channels;
  if (rows * a.length) {
    run_rows(kMoments, a, rows);
  } else {
    std::fill_n(a.mean_in, 2 * rows, T(0));  // and var_in
    std::fill_n(a.dmean, rows, T(0));
    std::fill_n(a.shift, a.channels, T(0));
  }
  const bool bn_batch = defined(rs.mean) && rs.training && samples > 0;
  if (bn_batch && samples > 1) {
    batch_bn(a, p.bn, samples);
  } else {
    run(kLnStats, a, 0, samples);
    if (!bn_batch) return fixed_bn(p, rs);
  }
  update_running(rs, a.bn_mean, a.bn_var, a.channels);
}

// by_sample: without the batch's BN statistics a sample's output needs only
// that sample, so blocks of samples run all passes while in L2 (the input
// read once, as GroupNorm reads it). The samples per block, or 0.
template <typename T>
int64_t by_sample_block(const Forward& f, const Running& rs) {
  const int64_t bytes = f.x3.size(1) * f.x3.size(2) * int64_t(sizeof(T));
  const int64_t block = std::max<int64_t>(
      1, (int64_t(SN_BLOCK_KIB) << 10) / std::max<int64_t>(bytes, 1));
  const int64_t blocks = (f.x3.size(0) + block - 1) / block;
  const bool applies = !(defined(rs.mean) && rs.training) &&
                       bytes <= (int64_t(SN_SAMPLE_MAX_KIB) << 10) &&
                       blocks >= at::get_num_threads();
  return take(kPathBySample, applies) ? block : 0;
}

// Each thread walks its own share of the blocks (one stream of reads),
// then takes what is left of the others' (a slower core holds up none);
// blocks share nothing, so the values do not depend on who computes them.
template <typename T>
void forward_by_sample(const RowArgs<T>& a, int64_t samples, int64_t block) {
  const int64_t channels = a.channels, blocks = (samples + block - 1) / block;
  const int64_t shares = at::get_num_threads();
  struct alignas(64) NextBlock {  // one cache line per share
    std::atomic<int64_t> next{0};
  };
  std::unique_ptr<NextBlock[]> share(new NextBlock[shares]);
  for (int64_t t = 0; t < shares; ++t) share[t].next = t * blocks / shares;
  at::parallel_for(0, shares, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t k = 0; k < shares; ++k) {
        const int64_t v = (t + k) % shares, end = (v + 1) * blocks / shares;
        for (int64_t b; (b = share[v].next.fetch_add(
                             1, std::memory_order_relaxed)) < end;) {
          const int64_t n0 = b * block, n1 = std::min(samples, n0 + block);
          run(kMoments, a, n0 * channels, n1 * channels);
          run(kLnStats, a, n0, n1);
          run(kNormalize, a, n0 * channels, n1 * channels);
        }
      }
  });
}

template <typename T>
void forward_pass(Forward& f, at::Tensor& y, const at::Tensor& weight,
                  const at::Tensor& bias, const Running& rs, double eps) {
  // The statistics: a tensor whose views backward keeps, or scratch.
  const int64_t samples = f.x3.size(0),
                need = stats_size(samples, f.x3.size(1));
  if (rs.for_backward) f.ws = at::empty({need}, f.x3.options());
  Pass<T> p(f, weight,
            rs.for_backward ? f.ws.data_ptr<T>() : scratch<T>(need));
  RowArgs<T>& a = p.a;
  a.bias = bias.data_ptr<T>();
  a.eps = static_cast<T>(eps);
  a.y = y.data_ptr<T>();
  if (f.x3.numel())
    for (int64_t c = 0; c < a.channels; ++c) a.shift[c] = a.x[c * a.length];
  if (const int64_t block = by_sample_block<T>(f, rs)) {
    fixed_bn(p, rs);
    return forward_by_sample(a, samples, block);
  }
  statistics(p, samples, rs);
  run_rows(kNormalize, a, samples * a.channels);
}

Forward forward_impl(SN_ARGUMENTS, bool for_backward) {
  Forward f = prepared(x, mean_logits, var_logits, fixed, fixed_ratios,
                       unbiased, ratios_given);
  const int64_t channels = x.size(1);
  for (const auto* t : {&weight, &bias})
    TORCH_CHECK(t->scalar_type() == x.scalar_type() &&
                    t->numel() == channels && t->device().is_cpu(),
                "switchable_norm: weight and bias must be ", channels,
                " CPU values of the input's dtype");
  const bool using_bn = defined(running_mean);
  TORCH_CHECK(
      !using_bn ||
          (running_mean->numel() == channels &&
           running_var->numel() == channels && running_mean->is_contiguous() &&
           running_var->is_contiguous() &&
           running_mean->scalar_type() == running_var->scalar_type()),
      "switchable_norm: running statistics must be ", channels,
      " contiguous values each");
  TORCH_CHECK(!defined(nonfinite) || (nonfinite->scalar_type() == at::kLong &&
                                      nonfinite->numel() == 1),
              "switchable_norm: nonfinite_batches must be one int64 value");
  TORCH_CHECK(f.ratios.logits == (using_bn ? 3 : 2),
              "switchable_norm: ", f.ratios.logits, " ratio logits ",
              using_bn ? "with" : "without", " running statistics");
  f.bn_batch = using_bn && training;
  Running rs;
  rs.mean = running_mean;
  rs.var = running_var;
  rs.count = num_batches_tracked;
  rs.nonfinite = nonfinite;
  rs.training = training;
  rs.for_backward = for_backward;
  rs.momentum = momentum;
  auto y = at::empty_like(f.x3);
  const auto w_c = weight.contiguous(), b_c = bias.contiguous();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "switchable_norm", [&] {
    forward_pass<scalar_t>(f, y, w_c, b_c, rs, eps);
  });
  f.y = y.view(x.sizes());
  return f;
}

}  // namespace sn_mm_cpu
