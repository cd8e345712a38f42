// What SN's row kernels (row_kernels_impl.h, compiled once per instruction
// set) and the host side (sn_host.h) share: the cut-offs, the kernels'
// arguments and tables, the input-gradient coefficients (compiled once).
#pragma once

#include <cstdint>

namespace sn_mm_rows {

// Cut-offs, each settable by -D (figures: docs/performance.md#cut-offs).
#ifndef SN_SHORT_ROW
// Rows shorter may take their sums in one pass, several rows at a time,
// losing at most a factor SN_SHORT_ROW of relative precision.
#define SN_SHORT_ROW 128
#endif
#ifndef SN_ROWS_AT_ONCE
// Rows the sums take at a time: independent chains of adds in flight.
#define SN_ROWS_AT_ONCE 4
#endif
#ifndef SN_SUMS
// Running sums a loop keeps, so that its adds do not wait on each other.
#define SN_SUMS 4
#endif
#ifndef SN_COEF_ROWS
// Rows whose input-gradient coefficients are computed at a time.
#define SN_COEF_ROWS 256
#endif

// Each ratio group's six ratios (IN's 0 where undefined, BN's 0 without a
// BN term), per group: C x 6 values per call cost 2-3 us at 1x2048x7x7.
enum RatioIndex { kWmIn, kWvIn, kWmLn, kWvLn, kWmBn, kWvBn, kRatios };
template <typename T>
struct GroupRatioArgs {
  const T* ratios = nullptr;
  int64_t group_channels = 1;
  const T* of_channel(int64_t c) const {
    return ratios + kRatios * (c / group_channels);
  }
};

// fn(c0, c1, ratios) for each ratio group's part of channels [begin, end).
template <typename T, typename Fn>
inline void for_each_group(const GroupRatioArgs<T>& w, int64_t begin,
                           int64_t end, const Fn& fn) {
  for (int64_t c = begin; c < end;) {
    const int64_t e = (c / w.group_channels + 1) * w.group_channels;
    fn(c, e < end ? e : end, w.of_channel(c));
    c = e;
  }
}

// fn(n, o, c0, c1) for each sample's part of rows [begin, end): sample n,
// its first row o, its channels [c0, c1).
template <typename Fn>
inline void by_sample(int64_t channels, int64_t begin, int64_t end,
                      const Fn& fn) {
  for (int64_t r0 = begin; r0 < end;) {
    const int64_t n = r0 / channels, o = n * channels;
    const int64_t r1 = end < o + channels ? end : o + channels;
    fn(n, o, r0 - o, r1 - o);
    r0 = r1;
  }
}

// Every kernel's arguments, set by name, one per pass (sn_forward.cpp,
// sn_backward.cpp): per row (N x C), per sample (N) or per channel (C).
template <typename T>
struct RowArgs {
  const T *x = nullptr, *g = nullptr;  // the input's rows, y's gradient's
  const T *weight = nullptr, *bias = nullptr;
  GroupRatioArgs<T> w;
  int64_t channels = 1, length = 0;
  T divisor = 1;  // of IN's variances: length, less one where unbiased
  T eps = 0;
  bool short_rows = false;  // several rows in one pass (SN_SHORT_ROW)
  // IN's moments, the means also less their channel's shift (sample 0's
  // first value): BN's variance sums their differences between samples,
  // which absolute float32 means of 1e4 would round to 1e-3.
  T *mean_in = nullptr, *var_in = nullptr, *dmean = nullptr, *shift = nullptr;
  T *ln_mean = nullptr, *ln_var = nullptr;        // per sample
  const T *bn_mean = nullptr, *bn_var = nullptr;  // per channel, in use
  T *mu = nullptr, *rstd = nullptr;               // the mixed statistics
  T *y = nullptr, *dx = nullptr;
  // Backward: per row the sums of g and g * (x - mean_in); the gradients
  // of LN's and BN's mean and variance.
  T *sum_g = nullptr, *sum_gxc = nullptr, *d_mu_n = nullptr,
    *d_var_n = nullptr, *d_mu_c = nullptr, *d_var_c = nullptr;
  const double* centre = nullptr;  // bn_dev: the means' mean per channel
  // grad_reduce: the ratio gradients' products per channel, or summed over
  // the channels (one group: per-channel sums took 1.14-1.25x the time in
  // training at 512x256x7x7 and 1x2048x7x7).
  bool per_channel = true;
};

// The kernels, over rows [begin, end) (the reductions: samples, adding
// into `sums`, per channel):
enum Kernel {
  kMoments,     // IN's moments
  kLnStats,     // LN's statistics; sums += dmean, var_in
  kBnDev,       // sums += (dmean - centre)^2
  kNormalize,   // the mixed statistics, y
  kGradSums,    // sum_g, sum_gxc
  kGradReduce,  // d_mu_n, d_var_n; sums += the gradients, the products
  kInputGrad,   // dx
  kKernels
};
template <typename T>
using KernelFn = void (*)(const RowArgs<T>&, int64_t begin, int64_t end,
                          double* sums);
struct RowKernels {
  const char* isa;
  KernelFn<float> f32[kKernels];
  KernelFn<double> f64[kKernels];
};

// Each instruction set's table: AVX-512's and AVX2's in x86-64 GCC and
// clang builds (SN_X86) only.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SN_X86
const RowKernels* row_kernels_avx512();
const RowKernels* row_kernels_avx2();
#endif
const RowKernels* row_kernels_baseline();

// Compiled once (row_coefficients.cpp) for every set's kernels: rows
// [begin, end)'s input-gradient coefficients, dx = g * scale + coef_x * (x -
// mean_in) + shift, into [0, end - begin) of each array.
template <typename T>
void input_grad_coefficients(const RowArgs<T>& a, int64_t begin, int64_t end,
                             T* scale, T* coef_x, T* shift);

}  // namespace sn_mm_rows
