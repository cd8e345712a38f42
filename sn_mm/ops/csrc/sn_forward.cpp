// SN's forward on the CPU as the operator (sn_operator.cpp) runs it: IN's
// moments, LN's and BN's statistics from them (Eq. 5), the running
// statistics' update and the normalisation, as parallel passes of the row
// kernels (row_kernels_impl.h) with the (N, C) work between them on raw
// pointers; and the eval path by sample.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>

#include <atomic>
#include <memory>

#include "sn_host.h"

namespace sn_mm_cpu {

// LN's statistics per sample (over the means about the channels' shifts
// where given, in double), and where col is given the sums per channel of
// those means and of var_in.
template <typename T>
LnStatsArgs<T> ln_args(const Stats<T>& s, int64_t channels, double* col) {
  LnStatsArgs<T> a;
  a.mean_in = s.mean_in;
  a.var_in = s.var_in;
  a.channels = channels;
  a.ln_mean = s.ln_mean;
  a.ln_var = s.ln_var;
  a.col = col;
  a.dmean = s.dmean;
  a.shift = s.shift;
  return a;
}

// LN and BN statistics from the IN moments (Eq. 5) in the stable form,
// e.g. var_ln = mean_c(var_in) + mean_c((mean_in - mean_ln)^2): the
// released mean(var_in + mean_in^2) - mean^2 without its cancellation. With
// bn_sums also the BN mean and M2 per channel into s.bn_mean and s.bn_var
// (not in eval, where the running statistics stand in, nor for one
// sample, whose are its IN ones), from the means about the shifts.
template <typename T>
void reductions_into(const Stats<T>& s, int64_t samples, int64_t channels,
                     bool bn_sums) {
  if (!bn_sums) {
    run(ln_args(s, channels, nullptr), 0, samples);
    return;
  }
  // Pass 1: per sample the LN statistics (its row is in cache twice);
  // per channel the sums of the means about the shifts and of var_in.
  const auto cols =
      sum_over_samples(samples, 2 * channels, [&](int64_t n, double* col) {
        run(ln_args(s, channels, col), n, n + 1);
      });
  std::vector<double> centre(channels, 0.0);
  if (samples > 0)
    for (int64_t c = 0; c < channels; ++c) centre[c] = cols[c] / samples;
  // Pass 2: squared deviations of those means about their channel's mean.
  BnDevArgs<T> dev;
  dev.mean_in = s.dmean;
  dev.centre = centre.data();
  dev.channels = channels;
  const auto devs =
      sum_over_samples(samples, channels, [&](int64_t n, double* col) {
        BnDevArgs<T> a = dev;
        a.col = col;
        run(a, n, n + 1);
      });
  for (int64_t c = 0; c < channels; ++c) {
    s.bn_mean[c] = static_cast<T>(double(s.shift[c]) + centre[c]);
    s.bn_var[c] = static_cast<T>(cols[channels + c] + devs[c]);
  }
}

void check_running(const at::Tensor& mean, const at::Tensor& var,
                   int64_t channels) {
  TORCH_CHECK(mean.numel() == channels && var.numel() == channels &&
                  mean.is_contiguous() && var.is_contiguous() &&
                  mean.scalar_type() == var.scalar_type(),
              "switchable_norm: running statistics must be ", channels,
              " contiguous values each");
}

// Whether all n values are finite: their exponent bits tested with integer
// operations, which vectorise (a chain of std::isfinite tests did not: 2 us
// at 2048 channels).
template <typename T>
bool all_finite(const T* values, int64_t n) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  constexpr Bits exponent =
      sizeof(T) == 4 ? Bits(0x7f800000u) : Bits(0x7ff0000000000000ull);
  Bits bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    Bits bits;
    std::memcpy(&bits, values + i, sizeof(T));
    bad |= Bits((bits & exponent) == exponent);
  }
  return bad == 0;
}

// The running statistics: moving average, or cumulative (momentum < 0);
// untouched where any of the batch's statistics is not finite (an overflow,
// a NaN in the input), which `nonfinite` (where given) counts.
template <typename T>
void update_running(const at::Tensor& running_mean,
                    const at::Tensor& running_var, const at::Tensor& count,
                    const OptTensor& nonfinite, double momentum, const T* bn_m,
                    const T* bn_v, int64_t channels) {
  if (!all_finite(bn_m, channels) || !all_finite(bn_v, channels)) {
    if (nonfinite.has_value() && nonfinite->defined())
      nonfinite->data_ptr<int64_t>()[0] += 1;
    return;
  }
  auto* n = count.data_ptr<int64_t>();
  n[0] += 1;
  const double mom = momentum < 0 ? 1.0 / n[0] : momentum;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, running_mean.scalar_type(), "running", [&] {
        // In the running statistics' opmath type, as BatchNorm's update
        // and the reference's are.
        using R = scalar_t;
        using M = at::opmath_type<R>;
        const M keep = static_cast<M>(1 - mom), add = static_cast<M>(mom);
        R* prm = running_mean.data_ptr<R>();
        R* prv = running_var.data_ptr<R>();
        for (int64_t c = 0; c < channels; ++c) {
          prm[c] = static_cast<R>(keep * M(prm[c]) + add * M(bn_m[c]));
          prv[c] = static_cast<R>(keep * M(prv[c]) + add * M(bn_v[c]));
        }
      });
}

// The running statistics copied into bn_m and bn_v (backward needs them as
// they were; later steps update the running ones in place).
template <typename T>
void copy_running(const at::Tensor& running_mean,
                  const at::Tensor& running_var, T* bn_m, T* bn_v,
                  int64_t channels) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, running_mean.scalar_type(), "running", [&] {
        const scalar_t* prm = running_mean.data_ptr<scalar_t>();
        const scalar_t* prv = running_var.data_ptr<scalar_t>();
        for (int64_t c = 0; c < channels; ++c) {
          bn_m[c] = static_cast<T>(prm[c]);
          bn_v[c] = static_cast<T>(prv[c]);
        }
      });
}

// The statistics buffer: a tensor whose views backward keeps, or, without
// backward, this thread's scratch memory (no allocation).
template <typename T>
T* stats_buffer(Forward& f, bool for_backward) {
  const int64_t need = Stats<T>::size(f.x3.size(0), f.x3.size(1));
  if (for_backward) {
    f.ws = at::empty({need}, f.x3.options());
    return f.ws.data_ptr<T>();
  }
  static thread_local std::vector<T> scratch;
  if (static_cast<int64_t>(scratch.size()) < need) scratch.resize(need);
  return scratch.data();
}

// The running statistics and what a forward does with them.
struct Running {
  const OptTensor &mean, &var, &count, &nonfinite;
  bool using_bn, training;
  double momentum;
};

// The BN statistics where they are not the batch's: the running ones (in
// eval without backward read in place) or none (zeros).
template <typename T>
std::pair<const T*, const T*> fixed_bn(const Forward& f, const Stats<T>& s,
                                       const Running& run_stats,
                                       bool for_backward) {
  const int64_t channels = f.x3.size(1);
  if (!run_stats.using_bn) {
    std::fill_n(s.bn_mean, 2 * channels, T(0));  // no BN term
  } else if (!for_backward &&
             run_stats.mean->scalar_type() == f.x3.scalar_type()) {
    return {run_stats.mean->data_ptr<T>(), run_stats.var->data_ptr<T>()};
  } else {
    copy_running(*run_stats.mean, *run_stats.var, s.bn_mean, s.bn_var,
                 channels);
  }
  return {s.bn_mean, s.bn_var};
}

// The rows' means are also kept about each channel's first value (of
// sample 0), s.shift: LN's and BN's variances sum the means' differences
// between channels and between samples, which as absolute float32 values
// (means of 1e4) would be rounded to 1e-3.
template <typename T>
MomentsArgs<T> moments_args(const Forward& f, const Stats<T>& s) {
  const int64_t channels = f.x3.size(1), spatial = f.x3.size(2);
  MomentsArgs<T> a;
  a.x = f.x3.data_ptr<T>();
  a.mean = s.mean_in;
  a.var = s.var_in;
  a.length = spatial;
  a.divisor = static_cast<T>(std::max<int64_t>(spatial - f.correction, 1));
  for (int64_t c = 0; c < channels; ++c) s.shift[c] = a.x[c * spatial];
  a.shift = s.shift;
  a.dmean = s.dmean;
  a.channels = channels;
  a.short_rows = short_rows(f.x3.size(0) * channels, spatial);
  return a;
}

// IN's moments, then LN's and the BN statistics in use: the batch's (one
// sample's are its IN statistics, read where they are), else fixed_bn's.
// Returns where the BN mean and variance are.
template <typename T>
std::pair<const T*, const T*> statistics(const Forward& f, const Stats<T>& s,
                                         const Running& run_stats,
                                         bool for_backward) {
  const int64_t samples = f.x3.size(0), channels = f.x3.size(1),
                spatial = f.x3.size(2), rows = samples * channels;
  const bool bn_batch =
      run_stats.using_bn && run_stats.training && samples > 0;
  const bool bn_sums = bn_batch && samples > 1;
  if (f.x3.numel()) {
    run_rows(moments_args(f, s), rows, spatial);
  } else {
    std::fill_n(s.mean_in, 2 * rows, T(0));
    std::fill_n(s.dmean, rows, T(0));
    std::fill_n(s.shift, channels, T(0));
  }
  reductions_into(s, samples, channels, bn_sums);
  if (!bn_batch) return fixed_bn(f, s, run_stats, for_backward);
  if (bn_sums)  // bn_var holds the M2 sums until divided by the count
    for (int64_t c = 0; c < channels; ++c)
      s.bn_var[c] /= static_cast<T>(samples);
  const T* bn_m = bn_sums ? s.bn_mean : s.mean_in;
  const T* bn_v = bn_sums ? s.bn_var : s.var_in;
  update_running(*run_stats.mean, *run_stats.var, *run_stats.count,
                 run_stats.nonfinite, run_stats.momentum, bn_m, bn_v,
                 channels);
  return {bn_m, bn_v};
}

template <typename T>
NormalizeArgs<T> normalize_args(const Forward& f, const Stats<T>& s,
                                std::pair<const T*, const T*> bn,
                                const GroupRatios<T>& w,
                                const at::Tensor& weight,
                                const at::Tensor& bias, double eps,
                                at::Tensor& y) {
  NormalizeArgs<T> a;
  a.x = f.x3.data_ptr<T>();
  a.mean_in = s.mean_in;
  a.var_in = s.var_in;
  a.mu_n = s.ln_mean;
  a.var_n = s.ln_var;
  a.mu_c = bn.first;
  a.var_c = bn.second;
  a.weight = weight.data_ptr<T>();
  a.bias = bias.data_ptr<T>();
  a.w = w.args;
  a.eps = static_cast<T>(eps);
  a.y = y.data_ptr<T>();
  a.mu = s.mu;
  a.rstd = s.rstd;
  a.channels = f.x3.size(1);
  a.length = f.x3.size(2);
  return a;
}

// Without the batch's BN statistics (eval), a sample's output needs only
// that sample: its moments, LN statistics and normalisation run one after
// the other in blocks of about SN_BLOCK_KIB while they are in L2, so that
// the input comes from memory once, as GroupNorm's does (by_sample). The
// samples per block; 0 where the path does not apply.
template <typename T>
int64_t by_sample_block(const Forward& f, const Running& run_stats) {
  const int64_t bytes = f.x3.size(1) * f.x3.size(2) * int64_t(sizeof(T));
  const int64_t block = std::max<int64_t>(
      1, (int64_t(SN_BLOCK_KIB) << 10) / std::max<int64_t>(bytes, 1));
  const int64_t blocks = (f.x3.size(0) + block - 1) / block;
  const bool applies = !(run_stats.using_bn && run_stats.training) &&
                       bytes <= (int64_t(SN_SAMPLE_MAX_KIB) << 10) &&
                       blocks >= SN_BLOCKS_PER_THREAD * at::get_num_threads();
  return take(kPathBySample, applies) ? block : 0;
}

template <typename T>
void forward_by_sample(Forward& f, at::Tensor& y, const at::Tensor& weight,
                       const at::Tensor& bias, const Running& run_stats,
                       double eps, const Stats<T>& s, bool for_backward,
                       int64_t block) {
  const int64_t samples = f.x3.size(0), channels = f.x3.size(1);
  const auto bn = fixed_bn(f, s, run_stats, for_backward);
  const GroupRatios<T> w(f.ratios, channels, run_stats.using_bn);
  const auto args = normalize_args(f, s, bn, w, weight, bias, eps, y);
  const MomentsArgs<T> moments = moments_args(f, s);
  const LnStatsArgs<T> ln = ln_args(s, channels, nullptr);
  const int64_t blocks = (samples + block - 1) / block;
  // Each thread walks its own contiguous share of the blocks (one stream
  // of reads and writes), then takes what is left of the others', so that a
  // slower core holds up no other; blocks share nothing, so the values do
  // not depend on who computes them.
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
          run(moments, n0 * channels, n1 * channels);
          run(ln, n0, n1);
          run(args, n0 * channels, n1 * channels);
        }
      }
  });
}

template <typename T>
void forward_pass(Forward& f, at::Tensor& y, const at::Tensor& weight,
                  const at::Tensor& bias, const Running& run_stats, double eps,
                  bool for_backward) {
  const int64_t samples = f.x3.size(0), channels = f.x3.size(1),
                spatial = f.x3.size(2);
  const Stats<T> s(stats_buffer<T>(f, for_backward), samples, channels);
  if (const int64_t block = by_sample_block<T>(f, run_stats)) {
    forward_by_sample(f, y, weight, bias, run_stats, eps, s, for_backward,
                      block);
    return;
  }
  const auto bn = statistics<T>(f, s, run_stats, for_backward);
  const GroupRatios<T> w(f.ratios, channels, run_stats.using_bn);
  const auto args = normalize_args(f, s, bn, w, weight, bias, eps, y);
  run_rows(args, samples * channels, spatial);
}

Forward forward_impl(const at::Tensor& x, const at::Tensor& weight,
                     const at::Tensor& bias, const at::Tensor& mean_logits,
                     const at::Tensor& var_logits,
                     const OptTensor& running_mean,
                     const OptTensor& running_var,
                     const OptTensor& num_batches_tracked,
                     const OptTensor& nonfinite, const OptTensor& fixed,
                     const OptTensor& fixed_ratios, bool training,
                     double momentum, double eps, bool unbiased,
                     bool ratios_given, bool for_backward) {
  Forward f = prepared(x, mean_logits, var_logits, fixed, fixed_ratios,
                       unbiased, ratios_given);
  check_params(x, weight, bias);
  const bool using_bn = defined(running_mean);
  f.bn_batch = using_bn && training;
  if (using_bn) check_running(*running_mean, *running_var, x.size(1));
  TORCH_CHECK(!defined(nonfinite) || (nonfinite->scalar_type() == at::kLong &&
                                      nonfinite->numel() == 1),
              "switchable_norm: nonfinite_batches must be one int64 value");
  const Running run_stats{running_mean, running_var, num_batches_tracked,
                          nonfinite,    using_bn,    training,
                          momentum};
  auto y = at::empty_like(f.x3);
  const auto w_c = weight.contiguous(), b_c = bias.contiguous();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "switchable_norm", [&] {
    forward_pass<scalar_t>(f, y, w_c, b_c, run_stats, eps, for_backward);
  });
  f.y = y.view(x.sizes());
  return f;
}

}  // namespace sn_mm_cpu
