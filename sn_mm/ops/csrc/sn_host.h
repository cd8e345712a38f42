// The CPU operator's host side: its forward and backward (sn_forward.cpp,
// sn_backward.cpp) as sn_operator.cpp calls them, and what they share
// (sn_host.cpp): the kernels' dispatch and parallel loops, the ratios, the
// statistics buffer, the special paths and the host's cut-offs. Raw
// pointers throughout: at small shapes (batch-1 inference, RoI heads) an
// ATen call per (C,) vector would cost as much as the data's passes.
// Semantics: the reference's (sn_mm/ops/reference.py).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "row_kernels.h"

namespace sn_mm_cpu {

using namespace sn_mm_rows;
using OptTensor = c10::optional<at::Tensor>;

inline bool defined(const OptTensor& t) {
  return t.has_value() && t->defined();
}

// The host's cut-offs, as row_kernels.h's (docs/performance.md#cut-offs).
#ifndef SN_TASK_VALUES
// Values per parallel task: enough work to amortise its scheduling.
#define SN_TASK_VALUES 32768
#endif
#ifndef SN_PARALLEL_SUMS_MIN
// (N, C) sums over fewer values run in one thread.
#define SN_PARALLEL_SUMS_MIN 16384
#endif
#ifndef SN_SAMPLE_MAX_KIB
// by_sample: samples of up to this size, in blocks of about SN_BLOCK_KIB
// (in L2 from one pass to the next), SN_BLOCKS_PER_THREAD blocks or more
// per thread (fewer would leave threads idle).
#define SN_SAMPLE_MAX_KIB 512
#endif
#ifndef SN_BLOCK_KIB
#define SN_BLOCK_KIB 256
#endif
#ifndef SN_BLOCKS_PER_THREAD
#define SN_BLOCKS_PER_THREAD 4
#endif

// The instruction set the kernels run with: the best this CPU has, unless
// $SN_MM_CPU_ISA or set_cpu_isa chose another (sn_host.cpp).
const RowKernels& kernels();
std::vector<std::string> cpu_isas();  // this build's and CPU's, best first
void set_cpu_isa(const std::string& name);

// The ratio vectors in use: IN first where IN is defined (K entries, else
// K - 1, LN first), and where LN sits (BN follows it). Group SN: G such
// vectors one after the other, channel c taking group c / (C / G)'s.
struct Ratios {
  std::vector<double> mean, var;
  bool has_in = true;
  int64_t k_ln = 1;
  int64_t groups = 1;
  // Which vectors are given instead of learned: 2 x G flags (mean's groups,
  // then the variance's), from ratio_fixed (2,) or, for group SN, (2, G).
  std::vector<bool> fixed;
  int64_t terms() const { return static_cast<int64_t>(mean.size()) / groups; }
};

// A call's input as (N, C, L) rows and what backward needs of its forward:
// the statistics buffer, the ratios mixed with.
struct Forward {
  at::Tensor y, x3, ws;
  Ratios ratios;
  int64_t correction = 0;
  bool bn_batch = false;
};

// The forward pass; with BN in training it also updates the running
// statistics (momentum < 0: the cumulative average) unless the batch is
// empty. for_backward: keep what backward_impl needs in the result.
Forward forward_impl(const at::Tensor& x, const at::Tensor& weight,
                     const at::Tensor& bias, const at::Tensor& mean_logits,
                     const at::Tensor& var_logits,
                     const OptTensor& running_mean,
                     const OptTensor& running_var,
                     const OptTensor& num_batches_tracked,
                     const OptTensor& nonfinite, const OptTensor& fixed,
                     const OptTensor& fixed_ratios, bool training,
                     double momentum, double eps, bool unbiased,
                     bool ratios_given, bool for_backward);

// The gradients of x, weight, bias and the two logit (or, with
// ratios_given, ratio) tensors, from the forward's saved tensors.
std::vector<at::Tensor> backward_impl(
    const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight,
    const at::Tensor& mean_logits, const at::Tensor& var_logits,
    const at::Tensor& ws, const OptTensor& fixed,
    const OptTensor& fixed_ratios, bool using_bn, bool bn_batch, bool unbiased,
    bool ratios_given);

// A call's input as (N, C, L) rows, checked, the variances' correction
// and the ratios the call mixes with: a forward without its statistics.
Forward prepared(const at::Tensor& x, const at::Tensor& mean_logits,
                 const at::Tensor& var_logits, const OptTensor& fixed,
                 const OptTensor& fixed_ratios, bool unbiased,
                 bool ratios_given);

// Kernel k over rows (or samples) [begin, end).
template <typename T>
void run(Kernel k, const RowArgs<T>& a, int64_t begin, int64_t end,
         double* sums = nullptr) {
  if constexpr (std::is_same_v<T, float>)
    kernels().f32[k](a, begin, end, sums);
  else
    kernels().f64[k](a, begin, end, sums);
}

// Over all rows, in parallel tasks of about SN_TASK_VALUES values.
template <typename T>
void run_rows(Kernel k, const RowArgs<T>& a, int64_t rows) {
  const int64_t grain =
      std::max<int64_t>(1, SN_TASK_VALUES / std::max<int64_t>(a.length, 1));
  if (rows <= grain) return run(k, a, 0, rows);  // no parallel region
  at::parallel_for(0, rows, grain,
                   [&](int64_t begin, int64_t end) { run(k, a, begin, end); });
}

// Sums over the samples of an (N, C) computation: each task adds its
// samples into its own `width` partial sums in double, which are then
// added up. fn(n, acc) adds sample n's into acc[0, width).
template <typename Fn>
std::vector<double> sum_over_samples(int64_t samples, int64_t width,
                                     const Fn& fn) {
  const int64_t tasks =
      std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), samples));
  std::vector<double> total(width, 0.0);
  if (tasks == 1 || samples * width < SN_PARALLEL_SUMS_MIN) {
    for (int64_t n = 0; n < samples; ++n) fn(n, total.data());
    return total;
  }
  std::vector<double> partial(tasks * width, 0.0);
  const int64_t per_task = (samples + tasks - 1) / tasks;
  at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t n = t * per_task; n < std::min(samples, (t + 1) * per_task);
           ++n)
        fn(n, partial.data() + t * width);
  });
  for (int64_t t = 0; t < tasks; ++t)
    for (int64_t i = 0; i < width; ++i) total[i] += partial[t * width + i];
  return total;
}

// The special paths: ways a call is computed only at some sizes, each
// because it measured faster there (docs/performance.md#special-paths-on-
// the-cpu). Each counts the calls that took it and can be switched off
// (for the tests and tools/analysis_tools/benchmark_paths.py); off, a call
// takes the general way, which computes the same.
enum Path { kPathShortRows, kPathBySample, kPathCount };
bool take(Path p, bool applies);  // counted where it does
std::vector<std::pair<std::string, int64_t>> path_counts();
bool set_path(const std::string& name, bool on);  // returns the old state

// The statistics buffer (Forward::ws): mean_in, var_in, dmean, mu, rstd
// (N x C each), LN's mean and variance (N each), the BN mean and variance
// in use (C each), the channels' shifts (C).
inline int64_t bn_offset(int64_t samples, int64_t channels) {
  return 5 * samples * channels + 2 * samples;
}
inline int64_t stats_size(int64_t samples, int64_t channels) {
  return bn_offset(samples, channels) + 3 * channels;
}

// What a forward's and a backward's passes share: the rows, the weight,
// each ratio group's six ratios in the rows' dtype, the statistics at
// `stats` (bn: where the BN mean, then the variance, are written).
template <typename T>
struct Pass {
  RowArgs<T> a;
  std::vector<T> ratios;
  T* bn;
  Pass(const Forward& f, const at::Tensor& weight, bool using_bn, T* stats)
      : ratios(kRatios * f.ratios.groups) {
    const int64_t samples = f.x3.size(0), channels = f.x3.size(1),
                  spatial = f.x3.size(2), rows = samples * channels;
    const Ratios& w = f.ratios;
    const int64_t k = w.k_ln, terms = w.terms();
    for (int64_t g = 0; g < w.groups; ++g) {
      const double* m = w.mean.data() + g * terms;
      const double* v = w.var.data() + g * terms;
      T* out = ratios.data() + kRatios * g;
      out[kWmIn] = static_cast<T>(w.has_in ? m[0] : 0.0);
      out[kWvIn] = static_cast<T>(w.has_in ? v[0] : 0.0);
      out[kWmLn] = static_cast<T>(m[k]);
      out[kWvLn] = static_cast<T>(v[k]);
      out[kWmBn] = static_cast<T>(using_bn ? m[k + 1] : 0.0);
      out[kWvBn] = static_cast<T>(using_bn ? v[k + 1] : 0.0);
    }
    a.w.ratios = ratios.data();
    a.w.group_channels = std::max<int64_t>(channels / w.groups, 1);
    a.x = f.x3.data_ptr<T>();
    a.weight = weight.data_ptr<T>();
    a.channels = channels;
    a.length = spatial;
    a.divisor = static_cast<T>(std::max<int64_t>(spatial - f.correction, 1));
    a.short_rows =
        f.x3.numel() &&
        take(kPathShortRows, spatial < kShortRow && rows >= kShortRowsMin);
    a.mean_in = stats;
    a.var_in = stats + rows;
    a.dmean = stats + 2 * rows;
    a.mu = stats + 3 * rows;
    a.rstd = stats + 4 * rows;
    a.ln_mean = stats + 5 * rows;
    a.ln_var = a.ln_mean + samples;
    bn = stats + bn_offset(samples, channels);
    a.bn_mean = bn;
    a.bn_var = bn + channels;
    a.shift = bn + 2 * channels;
  }
};

}  // namespace sn_mm_cpu
