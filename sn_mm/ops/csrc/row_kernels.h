// What SN's row kernels (row_kernels_impl.h, compiled once per instruction
// set) and the host side (sn_host.h) share: each kernel's arguments, set
// by name; the table of one instruction set's kernels; the kernels'
// cut-offs; and the per-channel coefficients, which have no vector code of
// their own and are compiled once (row_coefficients.cpp).
#pragma once

#include <cstdint>

namespace sn_mm_rows {

// Cut-offs: each names its figure, docs/performance.md#cut-offs (the A/B
// tool, tools/analysis_tools/benchmark_kernels.py, builds other values
// with -D).
#ifndef SN_SHORT_ROW
// Rows shorter than this may take their sums several rows in one pass, in
// the sums of (x - first value), whose cancellation costs at most a factor
// kShortRow of relative precision.
#define SN_SHORT_ROW 128
#endif
constexpr int64_t kShortRow = SN_SHORT_ROW;
#ifndef SN_SHORT_ROWS_MIN
// Calls of fewer rows spend their time outside the rows' sums.
#define SN_SHORT_ROWS_MIN 256
#endif
constexpr int64_t kShortRowsMin = SN_SHORT_ROWS_MIN;
#ifndef SN_ROWS_AT_ONCE
// Rows the sums take at a time: independent chains of adds in flight.
#define SN_ROWS_AT_ONCE 4
#endif
constexpr int kRowsAtOnce = SN_ROWS_AT_ONCE;
#ifndef SN_SUMS
// Running sums a loop keeps, so that its adds do not wait on each other.
#define SN_SUMS 4
#endif
constexpr int kSums = SN_SUMS;
#ifndef SN_COEF_ROWS
// Rows whose coefficients the input gradient computes at a time (3 values
// each, on the stack).
#define SN_COEF_ROWS 256
#endif
constexpr int64_t kCoefRows = SN_COEF_ROWS;

// Each ratio group's six ratios, at ratios + kRatios * g in the order of
// RatioIndex (IN's 0 where undefined, BN's 0 without a BN term); a group
// spans group_channels consecutive channels. Per group, not per channel:
// C x 6 values written each call and read by the other threads cost 2-3 us
// at 1x2048x7x7 in cache lines moved between cores.
enum RatioIndex { kWmIn, kWvIn, kWmLn, kWvLn, kWmBn, kWvBn, kRatios };
template <typename T>
struct GroupRatioArgs {
  const T* ratios = nullptr;
  int64_t group_channels = 1;
  const T* of_channel(int64_t c) const {
    return ratios + kRatios * (c / group_channels);
  }
};

template <typename T>
struct MomentsArgs {
  const T* x = nullptr;
  T *mean = nullptr, *var = nullptr;
  int64_t length = 0;
  T divisor = 1;
  // Where given: each row's mean also less its channel's shift, which
  // keeps the precision of the differences between samples that BN's
  // variance sums (absolute float32 means of 1e4 round them to 1e-3).
  const T* shift = nullptr;
  T* dmean = nullptr;
  int64_t channels = 1;
  bool short_rows = false;  // several rows in one pass (kShortRow)
};
template <typename T>
struct GradSumsArgs {
  const T *g = nullptr, *x = nullptr, *mean_in = nullptr;
  T *sum_g = nullptr, *sum_gxc = nullptr;
  int64_t length = 0;
  bool short_rows = false;
};
template <typename T>
struct NormalizeArgs {
  const T *x = nullptr, *mean_in = nullptr, *var_in = nullptr;
  const T *mu_n = nullptr, *var_n = nullptr;  // LN's, per sample
  const T *mu_c = nullptr, *var_c = nullptr;  // BN's, per channel
  const T *weight = nullptr, *bias = nullptr;
  GroupRatioArgs<T> w;
  T eps = 0;
  T *y = nullptr, *mu = nullptr, *rstd = nullptr;
  int64_t channels = 1, length = 0;
};
template <typename T>
struct InputGradArgs {
  const T *g = nullptr, *x = nullptr, *sum_g = nullptr, *sum_gxc = nullptr;
  const T *mu = nullptr, *rstd = nullptr, *weight = nullptr;
  const T* mean_in = nullptr;
  // The gradients of LN's (per sample) and BN's (per channel) mean and
  // variance, and the means their variances centre on.
  const T *dmean_n = nullptr, *dvar_n = nullptr, *center_n = nullptr;
  const T *dmean_c = nullptr, *dvar_c = nullptr, *center_c = nullptr;
  GroupRatioArgs<T> w;
  T two_over_divisor = 0;
  T* dx = nullptr;
  int64_t channels = 1, length = 0;
};
template <typename T>
struct LnStatsArgs {
  const T *mean_in = nullptr, *var_in = nullptr;
  int64_t channels = 1;
  T *ln_mean = nullptr, *ln_var = nullptr;
  double* col = nullptr;  // where given: += mean_in (C), then var_in (C)
  // Where given: the means about the channels' shifts (MomentsArgs), which
  // LN's statistics add back in double and col sums as they are.
  const T *dmean = nullptr, *shift = nullptr;
};
template <typename T>
struct BnDevArgs {
  const T* mean_in = nullptr;
  const double* centre = nullptr;
  int64_t channels = 1;
  double* col = nullptr;  // += (mean_in - centre)^2 per channel
};
template <typename T>
struct GradReduceArgs {
  const T *s1 = nullptr, *s2 = nullptr, *mu = nullptr, *rstd = nullptr;
  const T *weight = nullptr, *mean_in = nullptr, *var_in = nullptr;
  const T *mean_ln = nullptr, *var_ln = nullptr, *mean_c = nullptr;
  GroupRatioArgs<T> w;
  int64_t channels = 1;
  T *d_mu_n = nullptr, *d_var_n = nullptr;
  // += per channel: grad_weight, grad_bias, d_mu_c, d_var_c, and the ratio
  // gradients' products (d_mu with the LN and the BN mean less mean_in,
  // d_var with var_in and with the LN variance): 8 x C; for one ratio group
  // (per_channel false) the four products summed over the channels, 4 x C
  // + 4 (8 x C took 1.14-1.25x the time in training at 512x256x7x7,
  // 16x256x7x7 and 1x2048x7x7).
  double* acc = nullptr;
  bool per_channel = true;
};

// One instruction set's kernels; each takes a range of rows (for the (N,
// C) reductions, of samples).
template <typename T>
struct KernelSet {
  void (*moments)(const MomentsArgs<T>&, int64_t, int64_t);
  void (*grad_sums)(const GradSumsArgs<T>&, int64_t, int64_t);
  void (*normalize)(const NormalizeArgs<T>&, int64_t, int64_t);
  void (*input_grad)(const InputGradArgs<T>&, int64_t, int64_t);
  void (*ln_stats)(const LnStatsArgs<T>&, int64_t, int64_t);
  void (*bn_dev)(const BnDevArgs<T>&, int64_t, int64_t);
  void (*grad_reduce)(const GradReduceArgs<T>&, int64_t, int64_t);
};
struct RowKernels {
  const char* isa;
  KernelSet<float> f32;
  KernelSet<double> f64;
};

// Each instruction set's table; nullptr where this build has none (not
// x86-64 GCC or clang for avx2 and avx512).
const RowKernels* row_kernels_avx512();
const RowKernels* row_kernels_avx2();
const RowKernels* row_kernels_baseline();

// Compiled once (row_coefficients.cpp), called by every set's kernels:
// rows [begin, end)'s mixed mean and 1 / sqrt(mixed variance + eps) into
// a.mu and a.rstd;
template <typename T>
void mixed_statistics(const NormalizeArgs<T>& a, int64_t begin, int64_t end);
// and rows [begin, end)'s input-gradient coefficients, dx = g * scale +
// coef_x * (x - mean_in) + shift, into [0, end - begin) of each array.
template <typename T>
void input_grad_coefficients(const InputGradArgs<T>& a, int64_t begin,
                             int64_t end, T* scale, T* coef_x, T* shift);

}  // namespace sn_mm_rows
