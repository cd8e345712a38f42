// SN's CPU row kernels: the full-size passes over a contiguous (N, C, L)
// input, each over a range of its N x C rows, and the vector helpers they
// share with the (N, C) reductions between them (reduction_kernels_impl.h).
// row_kernels_<isa>.cpp compiles this once per instruction set; everything
// here has internal linkage and calls no library function, so that no code
// compiled for one set is linked into another's callers.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "row_kernels.h"

// Vectors pass by value only between inlined functions: GCC's note that
// such an ABI differs between instruction sets is moot.
#pragma GCC diagnostic ignored "-Wpsabi"
#define SN_INLINE __attribute__((always_inline)) inline

namespace {

using sn_mm_rows::BnDevArgs;
using sn_mm_rows::GradReduceArgs;
using sn_mm_rows::GradSumsArgs;
using sn_mm_rows::InputGradArgs;
using sn_mm_rows::LnStatsArgs;
using sn_mm_rows::MomentsArgs;
using sn_mm_rows::NormalizeArgs;

template <typename T>
SN_INLINE T min_of(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
SN_INLINE T max_of(T a, T b) {
  return a < b ? b : a;
}
SN_INLINE float sqrt_of(float v) { return __builtin_sqrtf(v); }
SN_INLINE double sqrt_of(double v) { return __builtin_sqrt(v); }

// ------------------------------------------------------------ row sums --
// Row sums run in `Lanes` independent partial sums, which the compiler turns
// into SIMD adds (one accumulator would serialise on its latency). Short rows
// (RoI features: 7 x 7) take one vector's worth, several rows at a time, so
// that little time goes to folding the lanes together; long rows take
// several vectors. (kShortRow is in row_kernels.h: the host side chooses.)
using sn_mm_rows::kShortRow;

template <int Lanes, typename T>
SN_INLINE T fold(T* acc) {
  for (int width = Lanes / 2; width > 0; width /= 2)
    for (int k = 0; k < width; ++k) acc[k] += acc[k + width];
  return acc[0];
}

// The sum of term(i) over a row's n values. Its uses keep rows exact far
// from zero (|mean| >> std): sums of deviations from a value of the row (its
// first), which keep the partial sums small, so the mean keeps the precision
// of the data instead of that of the sum; squares of (x - shift) - (mean -
// shift), as the mean rounded to x's dtype could be off by half its unit in
// the last place, which squared is not small beside a variance far below
// |mean|; products with x centred on the row's mean.
template <int Lanes, typename T, typename Term>
SN_INLINE T row_reduce(int64_t n, const Term& term) {
  T acc[Lanes] = {};
  int64_t i = 0;
  for (; i + Lanes <= n; i += Lanes)
    for (int k = 0; k < Lanes; ++k) acc[k] += term(i + k);
  T tail = 0;
  for (; i < n; ++i) tail += term(i);
  return fold<Lanes>(acc) + tail;
}

// Lanes values as one SIMD register (GCC/Clang vector extension), where the
// auto-vectoriser would not keep the sums' accumulators in registers.
template <typename T, int Lanes>
struct Vec {
  typedef T type __attribute__((vector_size(sizeof(T) * Lanes)));
};

template <int Lanes, typename T>
SN_INLINE typename Vec<T, Lanes>::type load(const T* p) {
  typename Vec<T, Lanes>::type v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

template <int Lanes, typename T>
SN_INLINE void store(T* p, typename Vec<T, Lanes>::type v) {
  __builtin_memcpy(p, &v, sizeof(v));
}

// Bytes in one of this set's vector registers, as the file that compiles it
// says (GCC's target pragma defines no __AVX2__ to read it from). Loops
// work a register at a time: GCC splits wider vector types through the
// stack.
#ifndef SN_REGISTER_BYTES
#error "define SN_REGISTER_BYTES (16, 32 or 64) before including this file"
#endif
constexpr int kRegisterBytes = SN_REGISTER_BYTES;
template <typename T>
constexpr int kLanes = kRegisterBytes / sizeof(T);

// Lanes of the short-row sums' vectors: one register's (kLanes), at most
// 8, the width at which the 8 sums of 4 rows fill one vector.
template <typename T>
constexpr int kSumLanes = kLanes<T> < 8 ? kLanes<T> : 8;

// Lanes I... of a:b (b's lanes numbered after a's), one vector of a's
// type. GCC gained __builtin_shufflevector in 12; GCC 11's __builtin_shuffle
// takes the lane numbers as a vector of integers of the lanes' width.
template <int... I, typename V>
SN_INLINE V shuffle(V a, V b) {
#if defined(__clang__) || __GNUC__ >= 12
  return __builtin_shufflevector(a, b, I...);
#else
  using Lane = std::conditional_t<sizeof(a[0]) == 4, int32_t, int64_t>;
  using Lanes = typename Vec<Lane, sizeof...(I)>::type;
  return __builtin_shuffle(a, b, Lanes{I...});
#endif
}

// Pairwise sums of the lanes of a and b, a's first: [a0+a1, a2+a3, ...,
// b0+b1, ...] (the even lanes of a:b plus the odd ones).
template <typename V, int... I>
SN_INLINE V pair_sums(V a, V b, std::integer_sequence<int, I...>) {
  return shuffle<(2 * I)...>(a, b) + shuffle<(2 * I + 1)...>(a, b);
}

// The lane sums of eight W-lane vectors v[0..7] into s[0..7]: a transposing
// tree of log2 W levels of paired shuffles and adds. At W = 8 the first two
// levels stay within 128-bit halves (one AVX2 instruction each).
template <int W, typename V, typename T>
SN_INLINE void transpose_sums(V* v, T* __restrict__ s) {
  if constexpr (W == 8) {
    V half[4], quarter[2];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k)  // [a01 a23 b01 b23 | a45 a67 b45 b67]
      half[k] = shuffle<0, 2, 8, 10, 4, 6, 12, 14>(v[2 * k], v[2 * k + 1]) +
                shuffle<1, 3, 9, 11, 5, 7, 13, 15>(v[2 * k], v[2 * k + 1]);
#pragma GCC unroll 2
    for (int k = 0; k < 2; ++k)  // [a0-3 b0-3 c0-3 d0-3 | a4-7 ... d4-7]
      quarter[k] =
          shuffle<0, 2, 8, 10, 4, 6, 12, 14>(half[2 * k], half[2 * k + 1]) +
          shuffle<1, 3, 9, 11, 5, 7, 13, 15>(half[2 * k], half[2 * k + 1]);
    store<8>(s,
             shuffle<0, 1, 2, 3, 8, 9, 10, 11>(quarter[0], quarter[1]) +
                 shuffle<4, 5, 6, 7, 12, 13, 14, 15>(quarter[0], quarter[1]));
  } else {
    int m = 8;
#pragma GCC unroll 2
    for (int width = W; width > 1; width /= 2) {
      m /= 2;
#pragma GCC unroll 4
      for (int k = 0; k < m; ++k)
        v[k] = pair_sums(v[2 * k], v[2 * k + 1],
                         std::make_integer_sequence<int, W>());
    }
#pragma GCC unroll 4
    for (int k = 0; k < 8 / W; ++k) store<W>(s + k * W, v[k]);
  }
}

// A row of n >= 8 values in W-lane vectors: the whole vectors, then the
// last W values with the lanes already counted masked off (no scalar
// tail).
struct ShortRow {
  int64_t whole;  // values in whole vectors
  int rem;        // values after them (0 to W - 1)
  ShortRow(int64_t n, int lanes) : whole(n - n % lanes), rem(n % lanes) {}
};

// v (W lanes) with all but its last `rem` lanes zeroed (a bitwise and: a
// vector ?: is not portable between GCC and Clang).
template <int W, typename V, int... K>
SN_INLINE V keep_last(V v, int rem, std::integer_sequence<int, K...>) {
  using I = std::conditional_t<sizeof(v[0]) == 4, int32_t, int64_t>;
  using IV = typename Vec<I, W>::type;
  return (V)((IV)v & (IV{K...} >= static_cast<I>(W - rem)));
}
template <int W, typename V>
SN_INLINE V keep_last(V v, int rem) {
  return keep_last<W>(v, rem, std::make_integer_sequence<int, W>());
}

// For 4 consecutive short rows of n >= 8 values at x: sums of (x - shift)
// and (x - shift)^2 in one pass, shift each row's first value, into s[0..3]
// and s[4..7]; four rows keep independent chains of additions in flight.
// s2 - s1^2 / n loses at most a factor n <= kShortRow of relative
// precision, since (mean - shift)^2 <= n * var.
template <typename T>
SN_INLINE void rows_shifted_sums(const T* __restrict__ x, int64_t n,
                                 ShortRow shape, T* __restrict__ s) {
  constexpr int W = kSumLanes<T>;
  using V = typename Vec<T, W>::type;
  V acc[8];
  T shift[4];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
    acc[r] = acc[4 + r] = V{};
    shift[r] = x[r * n];
  }
  for (int64_t i = 0; i < shape.whole; i += W)
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const V d = load<W>(x + r * n + i) - shift[r];
      acc[r] += d;
      acc[4 + r] += d * d;
    }
  if (shape.rem) {
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      V d = load<W>(x + r * n + n - W) - shift[r];
      d = keep_last<W>(d, shape.rem);
      acc[r] += d;
      acc[4 + r] += d * d;
    }
  }
  transpose_sums<W>(acc, s);
}

// For 4 consecutive rows of n >= W values at x (W = kSumLanes<T>): each
// row's mean less its first value into mean_dev[0..3], then its squared
// deviations from that mean into m2[0..3]: two passes while the rows are in
// L1, the first in memory order, the second interleaving the rows.
template <typename T>
SN_INLINE void rows_two_pass_moments(const T* __restrict__ x, int64_t n,
                                     ShortRow shape, T* __restrict__ mean_dev,
                                     T* __restrict__ m2) {
  constexpr int W = kSumLanes<T>;
  using V = typename Vec<T, W>::type;
  V acc[8];
  T shift[4], s[8];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
    acc[r] = acc[4 + r] = V{};
    shift[r] = x[r * n];
  }
  int64_t i;
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
    const T* row = x + r * n;
    for (i = 0; i + 2 * W <= shape.whole; i += 2 * W) {
      acc[r] += load<W>(row + i) - shift[r];
      acc[4 + r] += load<W>(row + i + W) - shift[r];
    }
    if (i < shape.whole) acc[r] += load<W>(row + i) - shift[r];
    if (shape.rem)
      acc[4 + r] += keep_last<W>(load<W>(row + n - W) - shift[r], shape.rem);
  }
  transpose_sums<W>(acc, s);
  const T inv_n = T(1) / static_cast<T>(n);
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
    mean_dev[r] = (s[r] + s[4 + r]) * inv_n;
    acc[r] = acc[4 + r] = V{};
  }
  for (i = 0; i + 2 * W <= shape.whole; i += 2 * W)
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const V d0 = (load<W>(x + r * n + i) - shift[r]) - mean_dev[r];
      const V d1 = (load<W>(x + r * n + i + W) - shift[r]) - mean_dev[r];
      acc[r] += d0 * d0;
      acc[4 + r] += d1 * d1;
    }
  if (i < shape.whole)
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const V d = (load<W>(x + r * n + i) - shift[r]) - mean_dev[r];
      acc[r] += d * d;
    }
  if (shape.rem)
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const V d = keep_last<W>(
          (load<W>(x + r * n + n - W) - shift[r]) - mean_dev[r], shape.rem);
      acc[4 + r] += d * d;
    }
  transpose_sums<W>(acc, s);
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) m2[r] = s[r] + s[4 + r];
}

// Likewise for 4 rows the sums of g and of g * (x - m[row]), into s[0..3]
// and s[4..7].
template <typename T>
SN_INLINE void rows_grad_sums(const T* __restrict__ g, const T* __restrict__ x,
                              int64_t n, ShortRow shape,
                              const T* __restrict__ m, T* __restrict__ s) {
  constexpr int W = kSumLanes<T>;
  using V = typename Vec<T, W>::type;
  V acc[8];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) acc[r] = acc[4 + r] = V{};
  for (int64_t i = 0; i < shape.whole; i += W)
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const V gv = load<W>(g + r * n + i);
      acc[r] += gv;
      acc[4 + r] += gv * (load<W>(x + r * n + i) - m[r]);
    }
  if (shape.rem) {
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      V gv = load<W>(g + r * n + n - W);
      gv = keep_last<W>(gv, shape.rem);
      acc[r] += gv;
      acc[4 + r] += gv * (load<W>(x + r * n + n - W) - m[r]);
    }
  }
  transpose_sums<W>(acc, s);
}

// sum of g * (x - m) and of g over a row of n values.
template <int Lanes, typename T>
SN_INLINE void row_grad_sums(const T* __restrict__ g, const T* __restrict__ x,
                             int64_t n, T m, T* sum_g, T* sum_gxc) {
  *sum_g = row_reduce<Lanes, T>(n, [=](int64_t i) { return g[i]; });
  *sum_gxc =
      row_reduce<Lanes, T>(n, [=](int64_t i) { return g[i] * (x[i] - m); });
}

// --------------------------------------------------------------- kernels --
// Each kernel takes its arguments as one struct and a range of rows (or, for
// the reductions, of samples n).

template <typename T>
SN_INLINE void store_mean(const MomentsArgs<T>& a, int64_t r, T first,
                          T mean_dev) {
  a.mean[r] = first + mean_dev;
  if (a.dmean) a.dmean[r] = (first - a.shift[r % a.channels]) + mean_dev;
}

// Rows one at a time (what the four-row kernels leave, and rows shorter
// than their vectors): the mean, then the squared deviations from it while
// the row is still in cache.
template <int Lanes, typename T>
SN_INLINE void moments_rows(const MomentsArgs<T>& a, int64_t begin,
                            int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const T* row = a.x + r * a.length;
    const T first = row[0];
    const T mean_dev =
        row_reduce<Lanes, T>(a.length,
                             [=](int64_t i) { return row[i] - first; }) /
        static_cast<T>(a.length);
    store_mean(a, r, first, mean_dev);
    a.var[r] = row_reduce<Lanes, T>(a.length,
                                    [=](int64_t i) {
                                      const T d = (row[i] - first) - mean_dev;
                                      return d * d;
                                    }) /
               a.divisor;
  }
}

// Rows begin..end four at a time, `four(x, n, shape, mean_dev, m2)` giving
// the four rows' means less their first values and their sums of squared
// deviations; the rest (fewer than four rows, or rows under 8 values) one at
// a time.
template <typename T, typename Four>
SN_INLINE void moments_in_fours(const MomentsArgs<T>& a, int64_t begin,
                                int64_t end, Four four) {
  const int64_t n = a.length;
  const ShortRow shape(n, kSumLanes<T>);
  T mean_dev[4], m2[4];
  int64_t r = begin;
  if (n >= 8)
    for (; r + 4 <= end; r += 4) {
      const T* x = a.x + r * n;
      four(x, n, shape, mean_dev, m2);
      for (int j = 0; j < 4; ++j) {
        store_mean(a, r + j, x[j * n], mean_dev[j]);
        a.var[r + j] = m2[j] / a.divisor;
      }
    }
  moments_rows<8>(a, r, end);
}

// Short rows (RoI features: 7 x 7) take one pass each (rows_shifted_sums);
// the general way, two (rows_two_pass_moments).
template <typename T>
void moments_kernel(const MomentsArgs<T>& a, int64_t begin, int64_t end) {
  if (a.short_rows) {
    const T inv_n = T(1) / static_cast<T>(a.length);
    moments_in_fours(
        a, begin, end,
        [=](const T* x, int64_t n, ShortRow shape, T* mean_dev, T* m2) {
          T s[8];
          rows_shifted_sums(x, n, shape, s);
          for (int j = 0; j < 4; ++j) {
            mean_dev[j] = s[j] * inv_n;
            m2[j] = max_of(s[4 + j] - s[j] * s[j] * inv_n, T(0));
          }
        });
  } else {
    moments_in_fours(a, begin, end,
                     [](auto... args) { rows_two_pass_moments(args...); });
  }
}

template <typename T>
void grad_sums_kernel(const GradSumsArgs<T>& a, int64_t begin, int64_t end) {
  if (a.short_rows) {  // four rows at a time, as in moments
    const int64_t n = a.length;
    const ShortRow shape(n, kSumLanes<T>);
    T s[8];
    int64_t r = begin;
    if (n >= 8)
      for (; r + 4 <= end; r += 4) {
        rows_grad_sums(a.g + r * n, a.x + r * n, n, shape, a.mean_in + r, s);
        for (int j = 0; j < 4; ++j) {
          a.sum_g[r + j] = s[j];
          a.sum_gxc[r + j] = s[4 + j];
        }
      }
    for (; r < end; ++r)
      row_grad_sums<8>(a.g + r * n, a.x + r * n, n, a.mean_in[r], a.sum_g + r,
                       a.sum_gxc + r);
    return;
  }
  for (int64_t r = begin; r < end; ++r)
    row_grad_sums<32>(a.g + r * a.length, a.x + r * a.length, a.length,
                      a.mean_in[r], a.sum_g + r, a.sum_gxc + r);
}

// For each ratio group's part of channels [c0, c1): fn(begin, end, w),
// w the group's six ratios (RatioIndex).
template <typename T, typename Fn>
SN_INLINE void for_each_group(const sn_mm_rows::GroupRatioArgs<T>& w,
                              int64_t c0, int64_t c1, const Fn& fn) {
  for (int64_t c = c0; c < c1;) {
    const int64_t g = c / w.group_channels;
    const int64_t e = min_of(c1, (g + 1) * w.group_channels);
    fn(c, e, w.ratios + sn_mm_rows::kRatios * g);
    c = e;
  }
}

// One sample's mixed statistics for channels [c0, c1) of one ratio group:
// mu = mean_in + wm_n * (mu_n - mean_in) + wm_c * (mu_c - mean_in) (no
// |mean|-sized products to round) and 1 / sqrt(mixed var + eps). Restrict
// parameters, so that the loop vectorises (GCC ignores restrict on locals).
template <typename T>
SN_INLINE void mixed_stats(const T* __restrict__ mean_in,
                           const T* __restrict__ var_in, T mu_n, T var_n,
                           const T* __restrict__ mu_c,
                           const T* __restrict__ var_c, const T* w, T eps,
                           T* __restrict__ mu, T* __restrict__ rstd,
                           int64_t c0, int64_t c1) {
  using namespace sn_mm_rows;
  const T wm_n = w[kWmLn], wm_c = w[kWmBn], wv_in = w[kWvIn], wv_n = w[kWvLn],
          wv_c = w[kWvBn];
  for (int64_t c = c0; c < c1; ++c) {
    mu[c] = mean_in[c] + wm_n * (mu_n - mean_in[c]) +
            wm_c * (mu_c[c] - mean_in[c]);
    rstd[c] = T(1) / sqrt_of(wv_in * var_in[c] + (wv_n * var_n + eps) +
                             wv_c * var_c[c]);
  }
}

// The normalise and input-gradient passes write each value of a row as
// value(v...) of one or two inputs' values, the inputs restrict parameters
// for GCC's vectoriser.
template <typename T, typename F, typename... In>
SN_INLINE void store_row(T* __restrict__ y, int64_t n, F value,
                         const In* __restrict__... in) {
  for (int64_t i = 0; i < n; ++i) y[i] = value(in[i]...);
}

// Per row (n, c): mix the statistics, mu = wm_in * mean_in + wm_n * mu_n +
// wm_c * mu_c (as mean_in + wm_n * (mu_n - mean_in) + ...) and likewise the
// variance, then y = (x - mu) * scale + bias with
// scale = weight / sqrt(var + eps) (x - mu first: x * scale - mu * scale
// would cancel when |mu| >> std). Keeps mu and 1 / sqrt(var + eps).
template <typename T>
void normalize_kernel(const NormalizeArgs<T>& a, int64_t begin, int64_t end) {
  // First every row's statistics (a loop over c that vectorises, the
  // square roots included), then the rows: a short row's own loop then has
  // no scalar latency in front of it.
  for (int64_t r0 = begin; r0 < end;) {
    const int64_t n = r0 / a.channels, c0 = r0 % a.channels;
    const int64_t r1 = min_of(end, (n + 1) * a.channels), o = n * a.channels;
    for_each_group(a.w, c0, r1 - o, [&](int64_t cb, int64_t ce, const T* w) {
      mixed_stats(a.mean_in + o, a.var_in + o, a.mu_n[n], a.var_n[n], a.mu_c,
                  a.var_c, w, a.eps, a.mu + o, a.rstd + o, cb, ce);
    });
    r0 = r1;
  }
  int64_t c = begin % a.channels;
  for (int64_t r = begin; r < end; ++r) {
    const T mu = a.mu[r], s = a.weight[c] * a.rstd[r], b = a.bias[c];
    const int64_t o = r * a.length;
    store_row(
        a.y + o, a.length, [=](T x) { return (x - mu) * s + b; }, a.x + o);
    if (++c == a.channels) c = 0;
  }
}

// dx = g * scale + a * (x - mean_in) + b per row, a and b from the gradients
// of the row's IN mean and variance (what autograd derives from the
// reference's formulas).
template <typename T>
void input_grad_kernel(const InputGradArgs<T>& a, int64_t begin, int64_t end) {
  const T inv_length = T(1) / static_cast<T>(a.length);
  // In chunks of one sample's rows: first each row's three coefficients (a
  // loop over c that vectorises), then the rows.
  constexpr int64_t kChunk = 256;
  T scale[kChunk], coef_x[kChunk], shift[kChunk];
  for (int64_t r0 = begin; r0 < end;) {
    const int64_t n = r0 / a.channels, c0 = r0 % a.channels;
    const int64_t r1 = min_of(min_of(end, (n + 1) * a.channels), r0 + kChunk);
    const int64_t rows = r1 - r0;
    const T dvar_n = a.dvar_n[n], dmean_n = a.dmean_n[n],
            center_n = a.center_n[n];
    for_each_group(
        a.w, c0, c0 + rows, [&](int64_t cb, int64_t ce, const T* w) {
          const T wm_in = w[sn_mm_rows::kWmIn], wv_in = w[sn_mm_rows::kWvIn];
          for (int64_t c = cb; c < ce; ++c) {
            const int64_t j = c - c0, r = r0 + j;
            const T rstd = a.rstd[r], s = a.weight[c] * rstd, m = a.mean_in[r];
            const T centred = a.sum_gxc[r] - (a.mu[r] - m) * a.sum_g[r];
            const T d_mu = -s * a.sum_g[r];
            const T d_var = T(-0.5) * s * rstd * rstd * centred;
            const T d_var_in = dvar_n + a.dvar_c[c] + wv_in * d_var;
            const T d_mean_in = dmean_n + a.dmean_c[c] + wm_in * d_mu +
                                T(2) * (m - center_n) * dvar_n +
                                T(2) * (m - a.center_c[c]) * a.dvar_c[c];
            scale[j] = s;
            coef_x[j] = d_var_in * a.two_over_divisor;
            shift[j] = d_mean_in * inv_length;
          }
        });
    for (int64_t j = 0; j < rows; ++j) {
      const int64_t r = r0 + j, o = r * a.length;
      const T s = scale[j], cx = coef_x[j], m = a.mean_in[r], sh = shift[j];
      store_row(
          a.dx + o, a.length,
          [=](T g, T x) { return g * s + cx * (x - m) + sh; }, a.g + o,
          a.x + o);
    }
    r0 = r1;
  }
}

}  // namespace
