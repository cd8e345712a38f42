// SN's forward and backward on the CPU as the operator runs them
// (sn_operator.cpp): the statistics, the mixing, the running-statistics
// update and the ratio gradients on raw pointers between the parallel
// passes of the row kernels (row_kernels_impl.h, in the instruction set
// cpu_isa.cpp picked), the special paths some sizes take, and SyncSN's
// forward and backward split at their collectives. Semantics:
// those of the reference, sn_mm/ops/reference.py, which the tests hold
// this to. The glue between the passes works on raw pointers: at small
// shapes (batch-1 inference, RoI heads) each ATen call on a (C,) vector
// would cost as much as the data's passes.
#include "sn_passes.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_isa.h"
#include "row_kernels.h"

namespace sn_mm_cpu {

using sn_mm_rows::BnDevArgs;
using sn_mm_rows::GradReduceArgs;
using sn_mm_rows::GradSumsArgs;
using sn_mm_rows::InputGradArgs;
using sn_mm_rows::LnStatsArgs;
using sn_mm_rows::MomentsArgs;
using sn_mm_rows::NormalizeArgs;

#define SN_RUN(kernel, Args)                                    \
  void run(const Args<float>& a, int64_t begin, int64_t end) {  \
    kernels().f32.kernel(a, begin, end);                        \
  }                                                             \
  void run(const Args<double>& a, int64_t begin, int64_t end) { \
    kernels().f64.kernel(a, begin, end);                        \
  }
SN_RUN(moments, MomentsArgs)
SN_RUN(grad_sums, GradSumsArgs)
SN_RUN(normalize, NormalizeArgs)
SN_RUN(input_grad, InputGradArgs)
SN_RUN(ln_stats, LnStatsArgs)
SN_RUN(bn_dev, BnDevArgs)
SN_RUN(grad_reduce, GradReduceArgs)
#undef SN_RUN

// Rows per task: enough work per task to amortise scheduling.
int64_t grain(int64_t length) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(length, 1));
}

// ------------------------------------------------------ special paths --
// The ways a call is computed only at some sizes, each because it measured
// faster there (docs/performance.md#special-paths-on-the-cpu has the A/B
// figures). Each counts the calls that took it and can be switched off,
// for the tests (which assert that theirs ran) and for the A/B tool
// (tools/analysis_tools/benchmark_paths.py); switched off, a call takes
// the general way, which computes the same.
enum Path {
  kPathShortRows,
  kPathBySample,
  kPathChunkedRows,
  kPathPrefetch,
  kPathCount
};
const char* const kPathNames[kPathCount] = {"short_rows", "by_sample",
                                            "chunked_rows", "prefetch"};
std::atomic<bool> path_on[kPathCount] = {true, true, true, true};
std::atomic<int64_t> path_taken[kPathCount] = {};

// Whether a call takes path p where it applies.
bool take(Path p, bool applies) {
  if (!applies || !path_on[p].load(std::memory_order_relaxed)) return false;
  path_taken[p].fetch_add(1, std::memory_order_relaxed);
  return true;
}

// Whether a call's later pass follows path p, which its first pass took
// (take() counted the call there).
bool taken(Path p, bool applies) {
  return applies && path_on[p].load(std::memory_order_relaxed);
}

// Whether a call's rows of `length` values take the short-row kernels
// (kShortRow): its first pass decides, and counts the call; its later
// passes follow.
enum class Pass { kFirst, kLater };
bool short_rows(int64_t length, Pass pass) {
  const bool applies = length < sn_mm_rows::kShortRow;
  return pass == Pass::kFirst ? take(kPathShortRows, applies)
                              : taken(kPathShortRows, applies);
}

Path path_named(const std::string& name) {
  for (int p = 0; p < kPathCount; ++p)
    if (name == kPathNames[p]) return static_cast<Path>(p);
  TORCH_CHECK_VALUE(false, "SN's CPU kernels: unknown path '", name,
                    "' (expected short_rows, by_sample, chunked_rows or "
                    "prefetch)");
}

std::vector<std::pair<std::string, int64_t>> path_counts() {
  std::vector<std::pair<std::string, int64_t>> counts;
  for (int p = 0; p < kPathCount; ++p)
    counts.emplace_back(kPathNames[p], path_taken[p].load());
  return counts;
}

bool set_path(const std::string& name, bool on) {
  return path_on[path_named(name)].exchange(on);
}

template <typename Args>
void run_rows(const Args& args, int64_t rows, int64_t length) {
  if (rows <= grain(length)) {  // one task: no parallel region
    run(args, 0, rows);
    return;
  }
  at::parallel_for(0, rows, grain(length),
                   [&](int64_t begin, int64_t end) { run(args, begin, end); });
}

// Sums over the samples n of an (N, C) computation: each task adds its
// block of samples into its own `width` partial sums in double, which are
// then added up. `fn(n, acc)` handles sample n, adding into acc[0, width).
template <typename Fn>
std::vector<double> sum_over_samples(int64_t samples, int64_t width,
                                     const Fn& fn) {
  const int64_t tasks =
      std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), samples));
  if (tasks == 1 || samples * width < 16384) {
    // Small: a parallel region would cost more than the work.
    std::vector<double> total(width, 0.0);
    for (int64_t n = 0; n < samples; ++n) fn(n, total.data());
    return total;
  }
  std::vector<double> partial(tasks * width, 0.0);
  const int64_t per_task = (samples + tasks - 1) / tasks;
  at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t end = std::min(samples, (t + 1) * per_task);
      for (int64_t n = t * per_task; n < end; ++n)
        fn(n, partial.data() + t * width);
    }
  });
  std::vector<double> total(width, 0.0);
  for (int64_t t = 0; t < tasks; ++t)
    for (int64_t i = 0; i < width; ++i) total[i] += partial[t * width + i];
  return total;
}

// LN and BN statistics from the IN moments (Eq. 5) in the stable form,
// e.g. var_ln = mean_c(var_in) + mean_c((mean_in - mean_ln)^2): the released
// mean(var_in + mean_in^2) - mean^2 without its cancellation. LN statistics
// per sample into plm/plv, BN mean and M2 per channel into pbm/pb2 unless
// those are null (eval, where the running statistics stand in, and one
// sample, whose are its IN ones); BN's from the means pdm about the
// channels' shifts pshift.
template <typename scalar_t>
void reductions_into(const scalar_t* pm, const scalar_t* pv, int64_t samples,
                     int64_t channels, scalar_t* plm, scalar_t* plv,
                     scalar_t* pbm, scalar_t* pb2, const scalar_t* pdm,
                     const scalar_t* pshift) {
  if (pbm == nullptr) {
    run(LnStatsArgs<scalar_t>{pm, pv, channels, plm, plv, nullptr, pdm,
                              pshift},
        0, samples);
    return;
  }
  // Pass 1: per sample the LN statistics (its row is in cache twice);
  // per channel the sums of the means about the shifts and of var_in.
  const auto cols =
      sum_over_samples(samples, 2 * channels, [&](int64_t n, double* col) {
        run(LnStatsArgs<scalar_t>{pm, pv, channels, plm, plv, col, pdm,
                                  pshift},
            n, n + 1);
      });
  std::vector<double> centre(channels, 0.0);
  if (samples > 0)
    for (int64_t c = 0; c < channels; ++c) centre[c] = cols[c] / samples;
  // Pass 2: squared deviations of those means about their channel's mean.
  const auto devs =
      sum_over_samples(samples, channels, [&](int64_t n, double* col) {
        run(BnDevArgs<scalar_t>{pdm, centre.data(), channels, col}, n, n + 1);
      });
  for (int64_t c = 0; c < channels; ++c) {
    pbm[c] = static_cast<scalar_t>(double(pshift[c]) + centre[c]);
    pb2[c] = static_cast<scalar_t>(cols[channels + c] + devs[c]);
  }
}

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

// Each ratio group's six ratios in the computation's dtype, as the kernels
// take them (sn_mm_rows::GroupRatioArgs).
template <typename T>
struct GroupRatios {
  std::vector<T> data;
  int64_t group_channels;
  GroupRatios(const Ratios& w, int64_t channels, bool using_bn)
      : data(sn_mm_rows::kRatios * w.groups),
        group_channels(std::max<int64_t>(channels / w.groups, 1)) {
    const int64_t k = w.k_ln, terms = w.terms();
    for (int64_t g = 0; g < w.groups; ++g) {
      const double* m = w.mean.data() + g * terms;
      const double* v = w.var.data() + g * terms;
      T* out = data.data() + sn_mm_rows::kRatios * g;
      out[sn_mm_rows::kWmIn] = static_cast<T>(w.has_in ? m[0] : 0.0);
      out[sn_mm_rows::kWvIn] = static_cast<T>(w.has_in ? v[0] : 0.0);
      out[sn_mm_rows::kWmLn] = static_cast<T>(m[k]);
      out[sn_mm_rows::kWvLn] = static_cast<T>(v[k]);
      out[sn_mm_rows::kWmBn] = static_cast<T>(using_bn ? m[k + 1] : 0.0);
      out[sn_mm_rows::kWvBn] = static_cast<T>(using_bn ? v[k + 1] : 0.0);
    }
  }
  sn_mm_rows::GroupRatioArgs<T> args() const {
    return {data.data(), group_channels};
  }
  // Channel c's six ratios (RatioIndex).
  const T* of_channel(int64_t c) const {
    return data.data() + sn_mm_rows::kRatios * (c / group_channels);
  }
};

std::vector<double> read_doubles(const at::Tensor& t) {
  auto c = t.is_contiguous() ? t : t.contiguous();
  std::vector<double> out(c.numel());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, c.scalar_type(),
                                  "read", [&] {
                                    const scalar_t* p = c.data_ptr<scalar_t>();
                                    for (int64_t i = 0; i < c.numel(); ++i)
                                      out[i] = static_cast<double>(p[i]);
                                  });
  return out;
}

// Which ratio vectors are fixed: 2 x G flags (mean's groups, then the
// variance's), from ratio_fixed (2,) or, for group SN, (2, G).
std::vector<bool> read_fixed(const c10::optional<at::Tensor>& fixed,
                             int64_t groups) {
  if (!(fixed.has_value() && fixed->defined()))
    return std::vector<bool>(2 * groups, false);
  auto f = fixed->scalar_type() == at::kBool && fixed->is_contiguous()
               ? *fixed
               : fixed->to(at::kBool).contiguous();
  TORCH_CHECK(f.numel() == 2 * groups,
              "switchable_norm: ratio_fixed must "
              "hold 2 x ",
              groups, " flags, got ", f.sizes());
  const bool* p = f.data_ptr<bool>();
  return std::vector<bool>(p, p + 2 * groups);
}

// G: the rows of (G, K) logits (group SN), else 1.
int64_t ratio_groups(const at::Tensor& logits) {
  return logits.dim() == 2 ? logits.size(0) : 1;
}

// Where IN is undefined: the other terms of src (k values) renormalised
// into dst (k - 1), or LN alone if the vector selected IN alone
// (sn_mm/ops/ratios.py's ratio_without_in).
void without_in(const double* src, int64_t k, double* dst) {
  double total = 0;
  for (int64_t i = 1; i < k; ++i) total += src[i];
  for (int64_t i = 1; i < k; ++i)
    dst[i - 1] = total > 0 ? src[i] / std::max(total, 1e-30) : 0.0;
  if (!(total > 0)) dst[0] = 1;
}

Ratios mixing_ratios(const at::Tensor& mean_logits,
                     const at::Tensor& var_logits,
                     const std::vector<bool>& is_fixed,
                     const c10::optional<at::Tensor>& fixed_ratios,
                     bool has_in, bool ratios_given) {
  Ratios out;
  out.has_in = has_in;
  out.k_ln = has_in ? 1 : 0;
  out.groups = ratio_groups(mean_logits);
  const int64_t groups = out.groups, k = mean_logits.numel() / groups;
  const int64_t terms = has_in ? k : k - 1;
  std::vector<double> fixed_values;
  if (std::find(is_fixed.begin(), is_fixed.end(), true) != is_fixed.end())
    fixed_values = read_doubles(*fixed_ratios);
  const at::Tensor* logits[2] = {&mean_logits, &var_logits};
  // In place, group by group: group SN's host work stays a few hundred
  // flops, without an allocation per group.
  for (int row = 0; row < 2; ++row) {
    const std::vector<double> all = read_doubles(*logits[row]);
    std::vector<double>& rows = row == 0 ? out.mean : out.var;
    rows.resize(groups * terms);
    for (int64_t g = 0; g < groups; ++g) {
      double* r = rows.data() + g * terms;
      if (is_fixed[row * groups + g]) {
        const double* src = fixed_values.data() + (row * groups + g) * k;
        if (has_in)
          std::copy_n(src, k, r);
        else
          without_in(src, k, r);
        continue;
      }
      std::copy_n(all.data() + g * k + (has_in ? 0 : 1), terms, r);
      if (!ratios_given) {  // softmax; given ratios come renormalised
        const double top = *std::max_element(r, r + terms);
        double total = 0;
        for (int64_t i = 0; i < terms; ++i)
          total += (r[i] = std::exp(r[i] - top));
        for (int64_t i = 0; i < terms; ++i) r[i] /= total;
      }
    }
  }
  return out;
}

// Every (N, C), (N,) and (C,) statistic lives in one buffer: mean_in,
// var_in, mu, rstd (N x C each), then LN's mean and variance (N each), then
// the BN mean and variance used (C each), then for the batch's BN
// statistics the means about the channels' shifts (N x C) and the shifts.
template <typename T>
struct Stats {
  T *mean_in, *var_in, *mu, *rstd, *ln_mean, *ln_var, *bn_mean, *bn_var,
      *dmean, *shift;
  Stats(T* base, int64_t samples, int64_t channels) {
    const int64_t rows = samples * channels;
    mean_in = base;
    var_in = base + rows;
    mu = base + 2 * rows;
    rstd = base + 3 * rows;
    ln_mean = base + 4 * rows;
    ln_var = ln_mean + samples;
    bn_mean = ln_var + samples;
    bn_var = bn_mean + channels;
    dmean = bn_var + channels;
    shift = dmean + rows;
  }
  static int64_t size(int64_t samples, int64_t channels) {
    return 5 * samples * channels + 2 * samples + 3 * channels;
  }
  static int64_t bn_offset(int64_t samples, int64_t channels) {
    return 4 * samples * channels + 2 * samples;
  }
};

void check_input(const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 2, "switchable_norm: expected (N, C, *), got ",
              x.sizes());
  const auto dtype = x.scalar_type();
  TORCH_CHECK(
      x.device().is_cpu() && (dtype == at::kFloat || dtype == at::kDouble),
      "switchable_norm: float32/float64 CPU tensors only, got ", dtype, " on ",
      x.device());
}

void check_params(const at::Tensor& x, const at::Tensor& weight,
                  const at::Tensor& bias) {
  check_input(x);
  const auto dtype = x.scalar_type();
  for (const auto* t : {&weight, &bias})
    TORCH_CHECK(t->scalar_type() == dtype && t->numel() == x.size(1) &&
                    t->device().is_cpu(),
                "switchable_norm: weight and bias must be ", x.size(1),
                " CPU values of the input's dtype");
}

void check_running(const at::Tensor& mean, const at::Tensor& var,
                   int64_t channels) {
  TORCH_CHECK(mean.numel() == channels && var.numel() == channels &&
                  mean.is_contiguous() && var.is_contiguous() &&
                  mean.scalar_type() == var.scalar_type(),
              "switchable_norm: running statistics must be ", channels,
              " contiguous values each");
}

// x as (N, C, L) contiguous rows.
at::Tensor rows_of(const at::Tensor& x) {
  int64_t spatial = 1;
  for (int64_t d = 2; d < x.dim(); ++d) spatial *= x.size(d);
  auto x3 = x.reshape({x.size(0), x.size(1), spatial});
  return x3.is_contiguous() ? x3 : x3.contiguous();
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

// Rows of more than kChunkBytes take their moments in chunks of that
// size (chunked_rows), each chunk's mean and squared deviations while it is
// in L1: the general way takes four rows' means and then their squared
// deviations, and four rows of 2x256x200x304 (243 KB each) come back from
// L3 or memory. It pays at 2x256x200x304 eval and
// at 1x64x400x608, batch-1 inference at ResNet's stem (docs/performance.md,
// special paths: chunked_rows, has the off/on figures).
constexpr int64_t kChunkBytes = int64_t(8) << 10;

// Inputs of kPrefetchInputBytes or more take their moments with software
// prefetches (the prefetch path; row_kernels_impl.h, prefetch_ahead): such
// an input comes from memory, not from the last-level cache. Where it is in
// the caches the prefetches only cost instructions (0.87-0.94x the time
// of an eval at 8x256x56x56, 2x1024x50x76, 1x512x28x28 and 2x256x25x38 in
// an A/B with them on and off). It pays 1.64-1.70x at 1024x256x14x14 eval
// and 1.09-1.26x in eval at the other inputs of 32 MiB or more there;
// docs/performance.md, special paths: prefetch, has the figures.
constexpr int64_t kPrefetchInputBytes = int64_t(32) << 20;

// The rows' means are also kept about each channel's first value (of
// sample 0), s.shift: LN's and BN's variances sum the means' differences
// between channels and between samples, which as absolute float32 values
// (means of 1e4) would be rounded to 1e-3.
template <typename T>
MomentsArgs<T> moments_args(const Forward& f, const Stats<T>& s) {
  const int64_t channels = f.x3.size(1), spatial = f.x3.size(2);
  MomentsArgs<T> a{
      f.x3.data_ptr<T>(), s.mean_in, s.var_in, spatial,
      static_cast<T>(std::max<int64_t>(spatial - f.correction, 1))};
  for (int64_t c = 0; c < channels; ++c) s.shift[c] = a.x[c * spatial];
  a.shift = s.shift;
  a.dmean = s.dmean;
  a.channels = channels;
  a.short_rows = short_rows(spatial, Pass::kFirst);
  const int64_t chunk = kChunkBytes / int64_t(sizeof(T));
  if (take(kPathChunkedRows, spatial > chunk)) a.chunk = chunk;
  a.prefetch = take(kPathPrefetch, f.x3.nbytes() >= kPrefetchInputBytes);
  return a;
}

// IN's moments and LN's statistics; with bn_sums, also the batch's BN
// channel means and M2 sums (into bn_mean and bn_var).
template <typename T>
void moments_and_reductions(const Forward& f, const Stats<T>& s,
                            bool bn_sums) {
  const int64_t samples = f.x3.size(0), channels = f.x3.size(1),
                spatial = f.x3.size(2), rows = samples * channels;
  if (f.x3.numel()) {
    run_rows(moments_args(f, s), rows, spatial);
  } else {
    std::fill_n(s.mean_in, 2 * rows, T(0));
    std::fill_n(s.dmean, rows, T(0));
    std::fill_n(s.shift, channels, T(0));
  }
  reductions_into(s.mean_in, s.var_in, samples, channels, s.ln_mean, s.ln_var,
                  bn_sums ? s.bn_mean : nullptr, bn_sums ? s.bn_var : nullptr,
                  s.dmean, s.shift);
}

// IN's moments, then LN's and the BN statistics in use: the batch's (one
// sample's are its IN statistics, read where they are), else fixed_bn's.
// Returns where the BN mean and variance are.
template <typename T>
std::pair<const T*, const T*> statistics(const Forward& f, const Stats<T>& s,
                                         const Running& run_stats,
                                         bool for_backward) {
  const int64_t samples = f.x3.size(0), channels = f.x3.size(1);
  const bool bn_batch =
      run_stats.using_bn && run_stats.training && samples > 0;
  const bool one_sample = bn_batch && samples == 1;
  const bool bn_sums = bn_batch && !one_sample;
  moments_and_reductions(f, s, bn_sums);
  if (!bn_batch) return fixed_bn(f, s, run_stats, for_backward);
  if (bn_sums)  // bn_var holds the M2 sums until divided by the count
    for (int64_t c = 0; c < channels; ++c)
      s.bn_var[c] /= static_cast<T>(samples);
  const T* bn_m = one_sample ? s.mean_in : s.bn_mean;
  const T* bn_v = one_sample ? s.var_in : s.bn_var;
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
  a.w = w.args();
  a.eps = static_cast<T>(eps);
  a.y = y.data_ptr<T>();
  a.mu = s.mu;
  a.rstd = s.rstd;
  a.channels = f.x3.size(1);
  a.length = f.x3.size(2);
  a.short_rows = short_rows(a.length, Pass::kLater);
  return a;
}

// Without the batch's BN statistics (eval), a sample's output needs only
// that sample: its moments, LN statistics and normalisation can run one
// after the other while it is in this core's L2, so that the input comes
// from memory once, as GroupNorm's does, rather than twice. Samples of up
// to kSampleMax bytes take this path in blocks of about kBlockBytes (RoI
// features, 50 KB, five at a time) when the blocks keep every thread busy
// (docs/performance.md has the figures).
constexpr int64_t kSampleMax = int64_t(512) << 10, kBlockBytes = int64_t(256)
                                                                 << 10;

// Samples per block of the by-sample path; 0 where it does not apply.
template <typename T>
int64_t by_sample_block(const Forward& f, const Running& run_stats) {
  const int64_t bytes = f.x3.size(1) * f.x3.size(2) * int64_t(sizeof(T));
  const int64_t block =
      std::max<int64_t>(1, kBlockBytes / std::max<int64_t>(bytes, 1));
  const int64_t blocks = (f.x3.size(0) + block - 1) / block;
  return take(kPathBySample, !(run_stats.using_bn && run_stats.training) &&
                                 bytes <= kSampleMax &&
                                 blocks >= 4 * at::get_num_threads())
             ? block
             : 0;
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
  const LnStatsArgs<T> ln{s.mean_in, s.var_in, channels, s.ln_mean,
                          s.ln_var,  nullptr,  s.dmean,  s.shift};
  const int64_t blocks = (samples + block - 1) / block;
  // Each thread walks its own contiguous share of the blocks in order, so
  // that its reads and writes stay one stream each; a thread that finishes
  // its share takes the next blocks of the other shares, so that a slower
  // core (a VM's vCPU that the host lends elsewhere, a hybrid CPU's
  // efficiency core) holds up no other. Blocks share nothing, so the values
  // do not depend on who computes them. Against every thread taking the
  // next block of one shared sequence: 0.81-0.86x the time at
  // 1024x256x14x14, 1000x256x7x7 and 512x256x7x7 eval where the VM ran at
  // full speed, 0.96-1.07x where it ran slower (in one process,
  // alternating, AVX2 and AVX-512, the AMD VM); 0.96-0.98x with one thread
  // more than vCPUs (alternating processes, AVX2).
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

// A call's input as (N, C, L) rows, checked, and the variances' correction.
Forward rows_for(const at::Tensor& x, bool unbiased) {
  check_input(x);
  Forward f;
  f.x3 = rows_of(x);
  f.correction = (unbiased && f.x3.size(2) > 1) ? 1 : 0;
  return f;
}

// rows_for's, and the ratios the call mixes with.
Forward prepared(const at::Tensor& x, const at::Tensor& mean_logits,
                 const at::Tensor& var_logits, const OptTensor& fixed,
                 const OptTensor& fixed_ratios, bool unbiased,
                 bool ratios_given) {
  Forward f = rows_for(x, unbiased);
  const bool has_in = f.x3.size(2) > 1;
  const int64_t groups = ratio_groups(mean_logits);
  TORCH_CHECK(groups >= 1 && x.size(1) % groups == 0 &&
                  var_logits.sizes() == mean_logits.sizes(),
              "switchable_norm: ", groups, " ratio groups do not divide ",
              x.size(1), " channels (or the logits' shapes differ)");
  f.ratios = mixing_ratios(mean_logits, var_logits, read_fixed(fixed, groups),
                           fixed_ratios, has_in, ratios_given);
  return f;
}

// The forward pass; with BN in training it also updates the running
// statistics (momentum < 0: the cumulative average) unless the batch is
// empty.
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
  check_params(x, weight, bias);
  Forward f = prepared(x, mean_logits, var_logits, fixed, fixed_ratios,
                       unbiased, ratios_given);
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

// SyncSN's forward, before its all-gather: this process's statistics, the
// BN channel means and M2 sums also returned on their own (one sample's
// and none's too: the ranks combine them).
std::vector<at::Tensor> sync_statistics(const at::Tensor& x, bool unbiased) {
  Forward f = rows_for(x, unbiased);
  const int64_t samples = f.x3.size(0), channels = f.x3.size(1);
  f.ws = at::empty({Stats<float>::size(samples, channels)}, f.x3.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "sync_statistics", [&] {
    moments_and_reductions(
        f, Stats<scalar_t>(f.ws.data_ptr<scalar_t>(), samples, channels),
        true);
  });
  const int64_t at = bn_offset(samples, channels);
  return {f.ws, f.ws.narrow(0, at, channels).clone(),
          f.ws.narrow(0, at + channels, channels).clone()};
}

// SyncSN's forward after its all-gather: all ranks' BN statistics into ws,
// then the normalisation.
at::Tensor sync_normalize(const at::Tensor& x, const at::Tensor& ws,
                          const at::Tensor& bn_mean, const at::Tensor& bn_var,
                          const at::Tensor& weight, const at::Tensor& bias,
                          const at::Tensor& mean_logits,
                          const at::Tensor& var_logits, const OptTensor& fixed,
                          const OptTensor& fixed_ratios, double eps,
                          bool unbiased, bool ratios_given) {
  check_params(x, weight, bias);
  Forward f = prepared(x, mean_logits, var_logits, fixed, fixed_ratios,
                       unbiased, ratios_given);
  const int64_t samples = f.x3.size(0), channels = f.x3.size(1);
  TORCH_CHECK(ws.numel() == Stats<float>::size(samples, channels) &&
                  ws.scalar_type() == x.scalar_type() &&
                  bn_mean.numel() == channels && bn_var.numel() == channels,
              "sync_normalize: statistics that do not fit the input");
  const int64_t at = bn_offset(samples, channels);
  ws.narrow(0, at, channels).copy_(bn_mean.reshape(-1));
  ws.narrow(0, at + channels, channels).copy_(bn_var.reshape(-1));
  // In x's shape, not a view: autograd lets a Python Function's output be
  // modified in place (an inplace ReLU) only where it is no view.
  auto y = at::empty(x.sizes(), f.x3.options());
  const auto w_c = weight.contiguous(), b_c = bias.contiguous();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "sync_normalize", [&] {
    const Stats<scalar_t> s(ws.data_ptr<scalar_t>(), samples, channels);
    const GroupRatios<scalar_t> w(f.ratios, channels, true);
    const auto args =
        normalize_args(f, s, {s.bn_mean, s.bn_var}, w, w_c, b_c, eps, y);
    run_rows(args, samples * channels, f.x3.size(2));
  });
  return y;
}

// Backward's intermediate sums: per row the sums of g and g * (x - mean_in),
// per sample the sums of the mixed statistics' gradients, zeros, and apart
// (in `bn`, 2 x C: what SyncSN all-reduces) per channel those of the BN
// statistics'.
template <typename T>
struct GradSums {
  T *s1, *s2, *d_mu_n, *d_var_n, *zeros_c, *d_mu_c, *d_var_c;
  // The ratio gradients' products: per channel, or for one ratio group
  // summed over the channels (grad_reductions_into).
  std::vector<double> dots;
  GradSums(T* sums, T* bn, int64_t samples, int64_t channels) {
    const int64_t rows = samples * channels;
    s1 = sums;
    s2 = s1 + rows;
    d_mu_n = s2 + rows;
    d_var_n = d_mu_n + samples;
    zeros_c = d_var_n + samples;
    std::fill_n(zeros_c, channels, T(0));
    d_mu_c = bn;
    d_var_c = bn + channels;
  }
  // The values at `sums`.
  static int64_t size(int64_t samples, int64_t channels) {
    return 2 * samples * channels + 2 * samples + channels;
  }
};

// sum a[i] * b[i] in double, in eight independent sums (one would be a
// chain of dependent additions: 5 us over 2048 channels).
template <typename T>
double dot_double(const T* a, const T* b, int64_t n) {
  double part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) part[k] += double(a[i + k]) * b[i + k];
  double total = 0;
  for (; i < n; ++i) total += double(a[i]) * b[i];
  for (int k = 0; k < 8; ++k) total += part[k];
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
  for (int64_t c0 = 0; c0 < channels; c0 += w.group_channels) {
    const T* r = w.of_channel(c0);
    const double m = r[sn_mm_rows::kWmBn] * s_c,
                 v = r[sn_mm_rows::kWvBn] * s_c;
    for (int64_t c = c0; c < std::min(channels, c0 + w.group_channels); ++c) {
      gs.d_mu_c[c] = static_cast<T>(gs.d_mu_c[c] * m);
      gs.d_var_c[c] = static_cast<T>(gs.d_var_c[c] * v);
    }
  }
}

// The BN statistics a forward normalised with: one sample's are its IN
// ones (see statistics()), except where all ranks' were shared.
template <typename T>
std::pair<const T*, const T*> bn_used(const Forward& f, const Stats<T>& s) {
  if (f.bn_batch && f.x3.size(0) == 1 && !f.bn_shared)
    return {s.mean_in, s.var_in};
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
  const GradReduceArgs<T> rargs{gs.s1,
                                gs.s2,
                                s.mu,
                                s.rstd,
                                weight.data_ptr<T>(),
                                s.mean_in,
                                s.var_in,
                                s.ln_mean,
                                s.ln_var,
                                using_bn ? bn.first : gs.zeros_c,
                                cw.args(),
                                channels,
                                gs.d_mu_n,
                                gs.d_var_n,
                                nullptr,
                                w.groups > 1};
  if (f.x3.numel()) {
    GradSumsArgs<T> sargs{
        g.data_ptr<T>(), f.x3.data_ptr<T>(), s.mean_in, gs.s1, gs.s2, spatial};
    sargs.short_rows = short_rows(spatial, Pass::kFirst);
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
  InputGradArgs<T> iargs{
      g.data_ptr<T>(),
      f.x3.data_ptr<T>(),
      gs.s1,
      gs.s2,
      s.mu,
      s.rstd,
      weight.data_ptr<T>(),
      s.mean_in,
      gs.d_var_n,
      gs.d_mu_n,
      s.ln_mean,
      gs.d_var_c,
      gs.d_mu_c,
      bn_count > 0 ? bn_used(f, s).first : gs.zeros_c,
      cw.args(),
      static_cast<T>(2.0 / std::max<int64_t>(spatial - f.correction, 1)),
      grad_x.data_ptr<T>(),
      channels,
      spatial};
  iargs.short_rows = short_rows(spatial, Pass::kLater);
  run_rows(iargs, samples * channels, spatial);
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
  const int64_t need = GradSums<T>::size(samples, channels) + 2 * channels;
  static thread_local std::vector<T> scratch;
  if (static_cast<int64_t>(scratch.size()) < need) scratch.resize(need);
  GradSums<T> gs(scratch.data(), scratch.data() + need - 2 * channels, samples,
                 channels);
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

// The gradients of the mean's and the variance's logits (or given ratios).
std::vector<at::Tensor> logit_grads(const Ratios& w,
                                    const std::vector<double>& d_wm,
                                    const std::vector<double>& d_wv,
                                    const at::Tensor& mean_logits,
                                    const std::vector<bool>& is_fixed,
                                    bool ratios_given) {
  return {logit_grad(w.mean, d_wm, mean_logits, is_fixed, 0, w.groups,
                     w.has_in, ratios_given),
          logit_grad(w.var, d_wv, mean_logits, is_fixed, 1, w.groups, w.has_in,
                     ratios_given)};
}

// The backward pass: gradients of x, weight, bias and the two logit (or,
// with ratios_given, ratio) tensors.
std::vector<at::Tensor> backward_impl(const at::Tensor& grad_y,
                                      const Forward& f,
                                      const at::Tensor& weight,
                                      const at::Tensor& mean_logits,
                                      const std::vector<bool>& is_fixed,
                                      bool using_bn, bool ratios_given) {
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
  auto logits =
      logit_grads(f.ratios, d_wm, d_wv, mean_logits, is_fixed, ratios_given);
  return {grad_x.view(grad_y.sizes()), grad_weight, grad_bias, logits[0],
          logits[1]};
}

// SyncSN's forward state, as sync_normalize left it.
Forward synced(const at::Tensor& x, const at::Tensor& ws,
               const at::Tensor& mean_logits, const at::Tensor& var_logits,
               const OptTensor& fixed, const OptTensor& fixed_ratios,
               bool unbiased, bool ratios_given) {
  Forward f = prepared(x, mean_logits, var_logits, fixed, fixed_ratios,
                       unbiased, ratios_given);
  TORCH_CHECK(ws.numel() == Stats<float>::size(f.x3.size(0), f.x3.size(1)) &&
                  ws.scalar_type() == x.scalar_type(),
              "switchable_norm: statistics that do not fit the input");
  f.ws = ws;
  f.bn_batch = f.bn_shared = true;
  return f;
}

// SyncSN's backward before its all-reduce.
std::vector<at::Tensor> sync_grad_sums(
    const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& ws,
    const at::Tensor& weight, const at::Tensor& mean_logits,
    const at::Tensor& var_logits, const OptTensor& fixed,
    const OptTensor& fixed_ratios, bool unbiased, bool ratios_given) {
  const Forward f = synced(x, ws, mean_logits, var_logits, fixed, fixed_ratios,
                           unbiased, ratios_given);
  const int64_t samples = f.x3.size(0), channels = f.x3.size(1);
  const auto g = grad_rows(grad_y, f);
  const auto w_c = weight.contiguous();
  auto sums =
      at::empty({GradSums<float>::size(samples, channels)}, f.x3.options());
  auto bn_grads = at::empty({2 * channels}, f.x3.options());
  auto grad_weight = at::empty({channels}, f.x3.options());
  auto grad_bias = at::empty_like(grad_weight);
  std::vector<double> d_wm, d_wv;
  AT_DISPATCH_FLOATING_TYPES(f.x3.scalar_type(), "sync_grad_sums", [&] {
    GradSums<scalar_t> gs(sums.data_ptr<scalar_t>(),
                          bn_grads.data_ptr<scalar_t>(), samples, channels);
    const GroupRatios<scalar_t> cw(f.ratios, channels, true);
    grad_sums_pass(g, f, w_c, true, cw, gs, grad_weight, grad_bias, d_wm,
                   d_wv);
  });
  auto logits = logit_grads(f.ratios, d_wm, d_wv, mean_logits,
                            read_fixed(fixed, f.ratios.groups), ratios_given);
  return {sums, bn_grads, grad_weight, grad_bias, logits[0], logits[1]};
}

// SyncSN's backward after its all-reduce: the input's gradient (the sums
// are scaled in place).
at::Tensor sync_input_grad(const at::Tensor& grad_y, const at::Tensor& x,
                           const at::Tensor& ws, const at::Tensor& sums,
                           const at::Tensor& bn_grads,
                           const at::Tensor& weight,
                           const at::Tensor& mean_logits,
                           const at::Tensor& var_logits,
                           const OptTensor& fixed,
                           const OptTensor& fixed_ratios, int64_t total,
                           bool unbiased, bool ratios_given) {
  const Forward f = synced(x, ws, mean_logits, var_logits, fixed, fixed_ratios,
                           unbiased, ratios_given);
  const int64_t samples = f.x3.size(0), channels = f.x3.size(1);
  TORCH_CHECK(sums.numel() == GradSums<float>::size(samples, channels) &&
                  bn_grads.numel() == 2 * channels &&
                  sums.scalar_type() == x.scalar_type() &&
                  bn_grads.scalar_type() == x.scalar_type() &&
                  total >= samples,
              "sync_input_grad: sums that do not fit the input");
  const auto g = grad_rows(grad_y, f);
  const auto w_c = weight.contiguous();
  auto grad_x = at::empty(grad_y.sizes(), f.x3.options());
  AT_DISPATCH_FLOATING_TYPES(f.x3.scalar_type(), "sync_input_grad", [&] {
    // (input_grad_pass scales the sums in place.)
    const GradSums<scalar_t> gs(sums.data_ptr<scalar_t>(),
                                bn_grads.data_ptr<scalar_t>(), samples,
                                channels);
    const GroupRatios<scalar_t> cw(f.ratios, channels, true);
    input_grad_pass(g, f, w_c, cw, gs, total, grad_x);
  });
  return grad_x;
}

int64_t bn_offset(int64_t samples, int64_t channels) {
  return Stats<float>::bn_offset(samples, channels);
}

}  // namespace sn_mm_cpu
