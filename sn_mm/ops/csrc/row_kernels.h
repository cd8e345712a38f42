// What SN's CPU row kernels (row_kernels_impl.h) and the operator's host
// side (sn_host.h) share: each kernel's arguments as one plain struct,
// and the table of one instruction set's kernels. The kernels are compiled
// once per instruction set (row_kernels_<isa>.cpp); the host side picks a
// table at run time (cpu_isa.cpp). Nothing here holds code, so that no
// function compiled for one instruction set can be shared with code that
// runs on another.
#pragma once

#include <cstdint>

namespace sn_mm_rows {

// Each ratio group's six ratios, at ratios + kRatios * g in the order of
// RatioIndex (IN's 0 where undefined, BN's 0 without a BN term); a group
// spans group_channels consecutive channels. Six values per group, not
// per channel: C x 6 values written each call and read by the other
// threads cost 2-3 us at 1x2048x7x7 in cache lines moved between cores.
enum RatioIndex { kWmIn, kWvIn, kWmLn, kWvLn, kWmBn, kWvBn, kRatios };
template <typename T>
struct GroupRatioArgs {
  const T* ratios;
  int64_t group_channels;
};

template <typename T>
struct MomentsArgs {
  const T* x;
  T* mean;
  T* var;
  int64_t length;
  T divisor;
  // Where given: each row's mean also as its difference from its channel's
  // shift, which keeps the precision of the differences between samples
  // that BN's variance sums (as absolute float32 values means of 1e4 round
  // them to 1e-3). row[0] - shift is exact for values within a factor 2.
  const T* shift = nullptr;
  T* dmean = nullptr;
  int64_t channels = 1;
  bool short_rows = false;  // one pass for several rows (kShortRow)
};
template <typename T>
struct GradSumsArgs {
  const T* g;
  const T* x;
  const T* mean_in;
  T* sum_g;
  T* sum_gxc;
  int64_t length;
  bool short_rows = false;  // several rows in one pass (kShortRow)
};
template <typename T>
struct NormalizeArgs {
  const T *x, *mean_in, *var_in, *mu_n, *var_n, *mu_c, *var_c, *weight, *bias;
  GroupRatioArgs<T> w;
  T eps;
  T *y, *mu, *rstd;
  int64_t channels, length;
};
template <typename T>
struct InputGradArgs {
  const T *g, *x, *sum_g, *sum_gxc, *mu, *rstd, *weight, *mean_in, *dvar_n,
      *dmean_n, *center_n, *dvar_c, *dmean_c, *center_c;
  GroupRatioArgs<T> w;
  T two_over_divisor;
  T* dx;
  int64_t channels, length;
};
template <typename T>
struct LnStatsArgs {
  const T *mean_in, *var_in;
  int64_t channels;
  T *ln_mean, *ln_var;
  double* col;  // where given: += mean_in (first C) and var_in (next C)
  // Where given: the means about the channels' shifts (MomentsArgs), which
  // LN's statistics add back in double and col sums as they are.
  const T *dmean = nullptr, *shift = nullptr;
};
template <typename T>
struct BnDevArgs {
  const T* mean_in;
  const double* centre;
  int64_t channels;
  double* col;  // += (mean_in - centre)^2 per channel
};
template <typename T>
struct GradReduceArgs {
  const T *s1, *s2, *mu, *rstd, *weight, *mean_in, *var_in, *mean_ln, *var_ln,
      *mean_c;
  GroupRatioArgs<T> w;
  int64_t channels;
  T *d_mu_n, *d_var_n;
  // += per channel: grad_weight, grad_bias, d_mu_c, d_var_c, and the ratio
  // gradients' products (d_mu with the LN and the BN mean less mean_in,
  // d_var with var_in and with the LN variance): 8 x C; for a single ratio
  // group (per_channel false) the four products summed over the channels
  // instead, 4 x C + 4 (RoI shapes' training: 8 x C took 1.14-1.25x the
  // time at 512x256x7x7, 16x256x7x7 and 1x2048x7x7).
  double* acc;
  bool per_channel = true;
};

// One instruction set's kernels; each takes a range of rows (for the (N, C)
// reductions, of samples n).
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

// Rows shorter than this may take their sums several rows in one pass, in
// the sums of (x - first value) whose cancellation costs at most a factor
// kShortRow of relative precision (row_kernels_impl.h, rows_shifted_sums).
constexpr int64_t kShortRow = 128;
// Calls of fewer rows (1x64x8x8: 1.00-1.04 off/on in four runs) spend their
// time outside the rows' sums and take the general kernels.
constexpr int64_t kShortRowsMin = 256;

struct RowKernels {
  const char* isa;
  KernelSet<float> f32;
  KernelSet<double> f64;
};

// Each instruction set's table; nullptr where this build has none (not
// x86-64 GCC for avx2 and avx512).
const RowKernels* row_kernels_avx512();
const RowKernels* row_kernels_avx2();
const RowKernels* row_kernels_baseline();

}  // namespace sn_mm_rows
