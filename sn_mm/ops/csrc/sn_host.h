// What the CPU operator's passes share (sn_host.cpp, sn_forward.cpp,
// sn_backward.cpp): the row kernels' dispatch and parallel loops, each
// ratio group's ratios, the statistics buffer and the special paths. The
// passes work on raw pointers: at small shapes (batch-1 inference, RoI
// heads) each ATen call on a (C,) vector would cost as much as the data's
// passes. Semantics: those of the reference, sn_mm/ops/reference.py, which
// the tests hold the passes to.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "row_kernels.h"
#include "sn_passes.h"

namespace sn_mm_cpu {

using sn_mm_rows::BnDevArgs;
using sn_mm_rows::GradReduceArgs;
using sn_mm_rows::GradSumsArgs;
using sn_mm_rows::InputGradArgs;
using sn_mm_rows::LnStatsArgs;
using sn_mm_rows::MomentsArgs;
using sn_mm_rows::NormalizeArgs;

// A kernel of the instruction set in use (cpu_isa.cpp) over rows [begin,
// end).
#define SN_RUN(Args)                                          \
  void run(const Args<float>& a, int64_t begin, int64_t end); \
  void run(const Args<double>& a, int64_t begin, int64_t end);
SN_RUN(MomentsArgs)
SN_RUN(GradSumsArgs)
SN_RUN(NormalizeArgs)
SN_RUN(InputGradArgs)
SN_RUN(LnStatsArgs)
SN_RUN(BnDevArgs)
SN_RUN(GradReduceArgs)
#undef SN_RUN

// Rows per task: enough work per task to amortise scheduling.
inline int64_t grain(int64_t length) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(length, 1));
}

// ------------------------------------------------------ special paths --
// The ways a call is computed only at some sizes, each because it measured
// faster there (docs/performance.md#special-paths-on-the-cpu has the A/B
// figures). Each counts the calls that took it and can be switched off,
// for the tests (which assert that theirs ran) and for the A/B tool
// (tools/analysis_tools/benchmark_paths.py); switched off, a call takes
// the general way, which computes the same.
enum Path { kPathShortRows, kPathBySample, kPathCount };

// Whether a call takes path p where it applies (and counts it if so).
bool take(Path p, bool applies);

// Whether a pass over `rows` rows of `length` values takes the short-row
// sums (row_kernels.h), counted.
bool short_rows(int64_t rows, int64_t length);

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

// weight and bias fit x (after prepared() has checked x).
void check_params(const at::Tensor& x, const at::Tensor& weight,
                  const at::Tensor& bias);

// A call's input as (N, C, L) rows, checked, the variances' correction
// and the ratios the call mixes with: a forward without its statistics.
Forward prepared(const at::Tensor& x, const at::Tensor& mean_logits,
                 const at::Tensor& var_logits, const OptTensor& fixed,
                 const OptTensor& fixed_ratios, bool unbiased,
                 bool ratios_given);

}  // namespace sn_mm_cpu
