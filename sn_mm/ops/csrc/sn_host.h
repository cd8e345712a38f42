// The CPU operator's host side (semantics: sn_mm/ops/reference.py's), on raw
// pointers: at small shapes an ATen call per (C,) vector would cost as much
// as the data's passes.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
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
// (in L2 between passes), at least one per thread.
#define SN_SAMPLE_MAX_KIB 512
#endif
#ifndef SN_BLOCK_KIB
#define SN_BLOCK_KIB 256
#endif

// The kernels' instruction set: the best this CPU has, unless
// $SN_MM_CPU_ISA or set_cpu_isa chose another.
const RowKernels& kernels();
std::vector<std::string> cpu_isas();  // this build's and CPU's, best first
void set_cpu_isa(std::string name);

// The ratios in the kernels' layout (GroupRatioArgs); which groups' are
// fixed (the mean's G flags, then the variance's); K logits per group.
struct Ratios {
  std::vector<double> six;
  std::vector<bool> fixed;
  int64_t groups = 1, logits = 3;
  bool has_in = true;
};

// A call's input as (N, C, L) rows, its ratios and, for backward, the
// statistics buffer.
struct Forward {
  at::Tensor y, x3, ws;
  Ratios ratios;
  int64_t correction = 0;
  bool bn_batch = false;
};

// The operator's arguments (its schema: sn_mm/ops/operator.py).
#define SN_ARGUMENTS                                                        \
  const at::Tensor &x, const at::Tensor &weight, const at::Tensor &bias,    \
      const at::Tensor &mean_logits, const at::Tensor &var_logits,          \
      const OptTensor &running_mean, const OptTensor &running_var,          \
      const OptTensor &num_batches_tracked, const OptTensor &nonfinite,     \
      const OptTensor &fixed, const OptTensor &fixed_ratios, bool training, \
      double momentum, double eps, bool unbiased, bool ratios_given
#define SN_ARGUMENT_NAMES                                              \
  x, weight, bias, mean_logits, var_logits, running_mean, running_var, \
      num_batches_tracked, nonfinite, fixed, fixed_ratios, training,   \
      momentum, eps, unbiased, ratios_given

// The forward; for_backward: keeps what backward_impl needs.
Forward forward_impl(SN_ARGUMENTS, bool for_backward);

// The gradients of x, weight, bias and the logits (or given ratios).
std::vector<at::Tensor> backward_impl(
    const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight,
    const at::Tensor& mean_logits, const at::Tensor& var_logits,
    const at::Tensor& ws, const OptTensor& fixed,
    const OptTensor& fixed_ratios, bool bn_batch, bool unbiased,
    bool ratios_given);

// A call's input, checked, as (N, C, L) rows, and its ratios.
Forward prepared(const at::Tensor& x, const at::Tensor& mean_logits,
                 const at::Tensor& var_logits, const OptTensor& fixed,
                 const OptTensor& fixed_ratios, bool unbiased,
                 bool ratios_given);

// This thread's scratch memory of at least n values (allocated once).
template <typename T>
T* scratch(int64_t n) {
  static thread_local std::vector<T> values;
  if (static_cast<int64_t>(values.size()) < n) values.resize(n);
  return values.data();
}

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

// Sums over the samples: fn(n, acc) adds sample n's into acc[0, width),
// each task's own, in double, added up at the end.
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
    for (int64_t n = t0 * per_task; n < std::min(samples, t1 * per_task); ++n)
      fn(n, partial.data() + n / per_task * width);
  });
  for (int64_t t = 0; t < tasks; ++t)
    for (int64_t i = 0; i < width; ++i) total[i] += partial[t * width + i];
  return total;
}

// The special paths, each taken at the sizes where it measured faster
// (docs/performance.md#special-paths-on-the-cpu); counted, and switched off
// by the tests and benchmark_paths.py (off: the general way, same values).
enum Path { kPathShortRows, kPathBySample, kPathCount };
bool take(Path p, bool applies);  // counted where it does
using PathCounts = std::tuple<std::vector<std::string>, std::vector<int64_t>>;
PathCounts path_counts();                  // names, calls
bool set_path(std::string name, bool on);  // returns the old state

// The statistics buffer (Forward::ws): mean_in, var_in, mu, rstd (N x C
// each), LN's mean and variance (N each), the BN mean and variance in use
// and the channels' shifts (C each), dmean (N x C).
inline int64_t bn_offset(int64_t samples, int64_t channels) {
  return 4 * samples * channels + 2 * samples;
}
inline int64_t stats_size(int64_t samples, int64_t channels) {
  return bn_offset(samples, channels) + 3 * channels + samples * channels;
}

// What a forward's and a backward's passes share: the rows, the weight,
// the ratios in the rows' dtype, the statistics (bn: the BN mean's place;
// a batch of one sample's BN statistics are its IN ones).
template <typename T>
struct Pass {
  RowArgs<T> a;
  std::vector<T> ratios;
  T* bn;
  Pass(const Forward& f, const at::Tensor& weight, T* stats)
      : ratios(f.ratios.six.begin(), f.ratios.six.end()) {
    const int64_t samples = f.x3.size(0), channels = f.x3.size(1),
                  spatial = f.x3.size(2), rows = samples * channels;
    a.w.ratios = ratios.data();
    a.w.group_channels = std::max<int64_t>(channels / f.ratios.groups, 1);
    a.x = f.x3.data_ptr<T>();
    a.weight = weight.data_ptr<T>();
    a.channels = channels;
    a.length = spatial;
    a.divisor = static_cast<T>(std::max<int64_t>(spatial - f.correction, 1));
    a.short_rows =
        f.x3.numel() && take(kPathShortRows, spatial < SN_SHORT_ROW);
    a.mean_in = stats;
    a.var_in = stats + rows;
    a.mu = stats + 2 * rows;
    a.rstd = stats + 3 * rows;
    a.ln_mean = stats + 4 * rows;
    a.ln_var = a.ln_mean + samples;
    bn = stats + bn_offset(samples, channels);
    const bool one_sample_bn = f.bn_batch && samples == 1;
    a.bn_mean = one_sample_bn ? a.mean_in : bn;
    a.bn_var = one_sample_bn ? a.var_in : bn + channels;
    a.shift = bn + 2 * channels;
    a.dmean = a.shift + channels;
  }
};

}  // namespace sn_mm_cpu
