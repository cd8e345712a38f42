// SN's row kernels (row_kernels.h) for instruction set SN_ISA, in explicit
// vectors (the auto-vectoriser keeps running sums scalar). SN_TARGET applies
// to every function after the library headers, lambdas included; internal
// linkage, calling nothing compiled elsewhere but row_kernels.h's
// input-gradient coefficients: no code compiled for one set reaches callers
// on another.
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "row_kernels.h"

#define SN_PRAGMA(text) _Pragma(#text)
#ifdef SN_TARGET
#if defined(__clang__)
#define SN_TARGET_REGION(isa)                                  \
  SN_PRAGMA(clang attribute push(__attribute__((target(isa))), \
                                 apply_to = function))
#else
#define SN_TARGET_REGION(isa) SN_PRAGMA(GCC target(isa))
#endif
SN_TARGET_REGION(SN_TARGET)
#endif

#include "simd.h"

namespace {

using namespace sn_mm_rows;

// Lanes of the short rows' sums: a register's, at most 8 (four rows' eight
// sums fill one vector in lane_sums).
template <typename T>
constexpr int kSumLanes = kLanes<T> < 8 ? kLanes<T> : 8;

// R rows of n values at x: the sums of d = x - (the row's first value) and
// of d^2 into s[0..R) and s[R..2R), one pass; s2 - s1^2 / n loses at most a
// factor n < SN_SHORT_ROW of relative precision, as (mean - first)^2 <= n var.
template <int R, typename T>
SN_INLINE void rows_shifted_sums(const T* __restrict__ x, int64_t n,
                                 T* __restrict__ s) {
  constexpr int W = kSumLanes<T>;
  Vec<T, W> acc[2 * R] = {};
  T shift[R];
  for (int r = 0; r < R; ++r) shift[r] = x[r * n];
  over_row<W, 1>(n, [&](int64_t i, auto part, int) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const auto d = keep<W>(load<W>(x + r * n + i, part) - shift[r], part);
      acc[r] += d;
      acc[R + r] += d * d;
    }
  });
  lane_sums<2 * R, W>(acc, s);
}

// R rows' means less their first values, and sums of squared deviations
// from the means: two passes while the rows are in L1, the second with one
// sum a row (two spill one from AVX2's 16 registers). (x - first) -
// mean_dev: the mean rounded to x's dtype may be off by half an ulp, which
// squared is not small beside a variance far below |mean|.
template <int R, typename T>
SN_INLINE void rows_moments(const T* __restrict__ x, int64_t n,
                            T* __restrict__ mean_dev, T* __restrict__ m2) {
  constexpr int W = kSumLanes<T>;
  Vec<T, W> acc[2 * R];
  T shift[R], s[2 * R];
  for (int r = 0; r < R; ++r) shift[r] = x[r * n];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    Vec<T, W> row[2] = {};  // constant indices: in registers to the end
    over_row<W, 2>(n, [&](int64_t i, auto part, int u) {
      row[u] += keep<W>(load<W>(x + r * n + i, part) - shift[r], part);
    });
    acc[r] = row[0], acc[R + r] = row[1];
  }
  lane_sums<2 * R, W>(acc, s);
  const T inv_n = T(1) / static_cast<T>(n);
  for (int r = 0; r < R; ++r) mean_dev[r] = (s[r] + s[R + r]) * inv_n;
  Vec<T, W> squares[R] = {};
  over_row<W, 1>(n, [&](int64_t i, auto part, int) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const auto d = keep<W>(
          (load<W>(x + r * n + i, part) - shift[r]) - mean_dev[r], part);
      squares[r] += d * d;
    }
  });
  lane_sums<R, W>(squares, m2);
}

// R rows' sums of g and of g * (x - m[r]) into s[0..R) and s[R..2R), in U
// sums of W lanes per row.
template <int R, int W, int U, typename T>
SN_INLINE void rows_grad_sums(const T* __restrict__ g, const T* __restrict__ x,
                              int64_t n, const T* __restrict__ m,
                              T* __restrict__ s) {
  Vec<T, W> acc[2 * R * U] = {};
  over_row<W, U>(n, [&](int64_t i, auto part, int u) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const auto gv = keep<W>(load<W>(g + r * n + i, part), part);
      acc[2 * R * u + r] += gv;
      acc[2 * R * u + R + r] += gv * (load<W>(x + r * n + i, part) - m[r]);
    }
  });
  for (int u = 1; u < U; ++u)
    for (int k = 0; k < 2 * R; ++k) acc[k] += acc[2 * R * u + k];
  lane_sums<2 * R, W>(acc, s);
}

template <typename Fn>
SN_INLINE void by_rows(int64_t begin, int64_t end, const Fn& fn) {
  int64_t r = begin;
  for (; r + SN_ROWS_AT_ONCE <= end; r += SN_ROWS_AT_ONCE)
    fn(r, std::integral_constant<int, SN_ROWS_AT_ONCE>());
  for (; r < end; ++r) fn(r, std::integral_constant<int, 1>());
}

// Short rows (RoI features: 7 x 7) take one pass; the others, two.
template <typename T>
SN_KERNEL void moments_kernel(const RowArgs<T>& a, int64_t begin, int64_t end,
                              double*) {
  const int64_t n = a.length;
  by_rows(begin, end, [&](int64_t r, auto rows) {
    constexpr int R = decltype(rows)::value;
    const T* x = a.x + r * n;
    T mean_dev[R], m2[R], s[2 * R];
    if (a.short_rows) {
      rows_shifted_sums<R>(x, n, s);
      const T inv_n = T(1) / static_cast<T>(n);
      for (int j = 0; j < R; ++j) {
        mean_dev[j] = s[j] * inv_n;
        const T m2_j = s[R + j] - s[j] * s[j] * inv_n;
        m2[j] = m2_j < 0 ? T(0) : m2_j;  // NaN stays NaN
      }
    } else {
      rows_moments<R>(x, n, mean_dev, m2);
    }
    for (int j = 0; j < R; ++j) {
      const T first = x[j * n];
      a.mean_in[r + j] = first + mean_dev[j];
      a.dmean[r + j] = (first - a.shift[(r + j) % a.channels]) + mean_dev[j];
      a.var_in[r + j] = m2[j] / a.divisor;
    }
  });
}

template <int R, int W, int U, typename T>
SN_INLINE void grad_sums_of_rows(const RowArgs<T>& a, int64_t r) {
  const int64_t o = r * a.length;
  T s[2 * R];
  rows_grad_sums<R, W, U>(a.g + o, a.x + o, a.length, a.mean_in + r, s);
  for (int j = 0; j < R; ++j) {
    a.sum_g[r + j] = s[j];
    a.sum_gxc[r + j] = s[R + j];
  }
}

template <typename T>
SN_KERNEL void grad_sums_kernel(const RowArgs<T>& a, int64_t begin,
                                int64_t end, double*) {
  if (a.short_rows) {
    by_rows(begin, end, [&](int64_t r, auto rows) {
      grad_sums_of_rows<decltype(rows)::value, kSumLanes<T>, 1>(a, r);
    });
    return;
  }
  for (int64_t r = begin; r < end; ++r)
    grad_sums_of_rows<1, kLanes<T>, SN_SUMS>(a, r);
}

// y[i] = value(in[i]...) over a row (restrict parameters, which GCC's
// vectoriser needs).
template <typename T, typename F, typename... In>
SN_INLINE void store_row(T* __restrict__ y, int64_t n, F value,
                         const In* __restrict__... in) {
  for (int64_t i = 0; i < n; ++i) y[i] = value(in[i]...);
}

// One sample's channels [c0, c1) of one group: mu = mean_in + wm_n * (mu_n
// - mean_in) + wm_c * (mu_c - mean_in) (no |mean|-sized products to round)
// and 1 / sqrt(mixed var + eps), in this set's vectors: compiled once, in
// the baseline set's, float64 1x2048x7x7 took 1.04-1.07x the time under AVX2
// (docs/performance.md#the-cpu-kernels-ab). Restrict parameters, so that
// the loop vectorises (GCC ignores restrict on locals).
template <typename T>
SN_INLINE void mixed_stats(const T* __restrict__ mean_in,
                           const T* __restrict__ var_in, T mu_n, T var_n,
                           const T* __restrict__ mu_c,
                           const T* __restrict__ var_c, const T* w, T eps,
                           T* __restrict__ mu, T* __restrict__ rstd,
                           int64_t c0, int64_t c1) {
  const T wm_n = w[kWmLn], wm_c = w[kWmBn], wv_in = w[kWvIn], wv_n = w[kWvLn],
          wv_c = w[kWvBn];
  for (int64_t c = c0; c < c1; ++c) {
    mu[c] = mean_in[c] + wm_n * (mu_n - mean_in[c]) +
            wm_c * (mu_c[c] - mean_in[c]);
    rstd[c] = T(1) / std::sqrt(wv_in * var_in[c] + (wv_n * var_n + eps) +
                               wv_c * var_c[c]);
  }
}

// y = (x - mu) * weight * rstd + bias per row (x - mu first: x * scale -
// mu * scale would cancel where |mu| >> std), the rows' statistics first,
// all of them: a short row's loop then has no scalar latency in front.
template <typename T>
SN_KERNEL void normalize_kernel(const RowArgs<T>& a, int64_t begin,
                                int64_t end, double*) {
  by_sample(
      a.channels, begin, end, [&](int64_t n, int64_t o, int64_t b, int64_t e) {
        for_each_group(a.w, b, e, [&](int64_t c0, int64_t c1, const T* w) {
          mixed_stats(a.mean_in + o, a.var_in + o, a.ln_mean[n], a.ln_var[n],
                      a.bn_mean, a.bn_var, w, a.eps, a.mu + o, a.rstd + o, c0,
                      c1);
        });
      });
  int64_t c = begin % a.channels;
  for (int64_t r = begin; r < end; ++r) {
    const T mu = a.mu[r], s = a.weight[c] * a.rstd[r], b = a.bias[c];
    const int64_t o = r * a.length;
    store_row(
        a.y + o, a.length, [=](T x) { return (x - mu) * s + b; }, a.x + o);
    if (++c == a.channels) c = 0;
  }
}

// dx = g * scale + coef_x * (x - mean_in) + shift, SN_COEF_ROWS rows' at once.
template <typename T>
SN_KERNEL void input_grad_kernel(const RowArgs<T>& a, int64_t begin,
                                 int64_t end, double*) {
  T scale[SN_COEF_ROWS], coef_x[SN_COEF_ROWS], shift[SN_COEF_ROWS];
  for (int64_t r0 = begin; r0 < end; r0 += SN_COEF_ROWS) {
    const int64_t r1 = end - r0 < SN_COEF_ROWS ? end : r0 + SN_COEF_ROWS;
    input_grad_coefficients(a, r0, r1, scale, coef_x, shift);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t o = r * a.length;
      const T s = scale[r - r0], cx = coef_x[r - r0], m = a.mean_in[r],
              sh = shift[r - r0];
      store_row(
          a.dx + o, a.length,
          [=](T g, T x) { return g * s + cx * (x - m) + sh; }, a.g + o,
          a.x + o);
    }
  }
}

// The (N, C) reductions, per sample, in double.
constexpr int kDL = kLanes<double>;
using DV = Vec<double, kDL>;

// Lane by lane: one vcvtps2pd (GCC's __builtin_convertvector takes halves).
template <typename V, int... K>
SN_INLINE DV to_double(V v, std::integer_sequence<int, K...>) {
  return DV{double(v[K])...};
}
template <typename T, typename P>
SN_INLINE DV load_d(const T* p, P part) {
  return to_double(load<kDL>(p, part), std::make_integer_sequence<int, kDL>());
}

SN_INLINE double sum_of(DV* s) {
  for (int k = 1; k < SN_SUMS; ++k) s[0] += s[k];
  return lane_sum<double, kDL>(s[0]);
}

// LN's mean and variance, in the stable form mean_c(var_in) +
// mean_c((mean_in - mean_ln)^2).
template <typename T>
SN_KERNEL void ln_stats_kernel(const RowArgs<T>& a, int64_t begin, int64_t end,
                               double* col) {
  const int64_t C = a.channels;
  for (int64_t n = begin; n < end; ++n) {
    const T* m = a.dmean + n * C;
    const T* v = a.var_in + n * C;
    const auto mean_at = [&](int64_t c, auto part) {
      return load_d(a.shift + c, part) + load_d(m + c, part);
    };
    DV sm[SN_SUMS] = {}, sv[SN_SUMS] = {}, sd[SN_SUMS] = {};
    over_row<kDL, SN_SUMS>(C, [&](int64_t c, auto part, int u) {
      sm[u] += keep<kDL>(mean_at(c, part), part);
      sv[u] += keep<kDL>(load_d(v + c, part), part);
      if (col) {
        add_to<kDL>(col + c, load_d(m + c, part), part);
        add_to<kDL>(col + C + c, load_d(v + c, part), part);
      }
    });
    const double mean = sum_of(sm) / C;
    over_row<kDL, SN_SUMS>(C, [&](int64_t c, auto part, int u) {
      const DV d = keep<kDL>(mean_at(c, part) - mean, part);
      sd[u] += d * d;
    });
    a.ln_mean[n] = static_cast<T>(mean);
    a.ln_var[n] = static_cast<T>((sum_of(sv) + sum_of(sd)) / C);
  }
}

template <typename T>
SN_KERNEL void bn_dev_kernel(const RowArgs<T>& a, int64_t begin, int64_t end,
                             double* col) {
  for (int64_t n = begin; n < end; ++n) {
    const T* m = a.dmean + n * a.channels;
    over_row<kDL, 1>(a.channels, [&](int64_t c, auto part, int) {
      const DV d = load_d(m + c, part) - load<kDL>(a.centre + c, part);
      add_to<kDL>(col + c, d * d, part);
    });
  }
}

// From the row sums: per sample the sums over c of d_mu and d_var times
// the channel's LN ratio; the per-channel sums into acc.
template <typename T>
SN_KERNEL void grad_reduce_kernel(const RowArgs<T>& a, int64_t begin,
                                  int64_t end, double* acc) {
  const int64_t C = a.channels;
  for (int64_t n = begin; n < end; ++n) {
    const int64_t o = n * C;
    const double ml = a.ln_mean[n], vl = a.ln_var[n];
    DV dots[5] = {};
    double d_mu_n = 0, d_var_n = 0;
    for_each_group(a.w, 0, C, [&](int64_t cb, int64_t ce, const T* w) {
      DV group_mu = {}, group_var = {};
      over_row<kDL, 1>(ce - cb, [&](int64_t i, auto part, int) {
        const int64_t c = cb + i, r = o + c;
        const DV s1 = load_d(a.sum_g + r, part), rs = load_d(a.rstd + r, part),
                 mi = load_d(a.mean_in + r, part);
        const DV centred =
            load_d(a.sum_gxc + r, part) - (load_d(a.mu + r, part) - mi) * s1;
        const DV scale = load_d(a.weight + c, part) * rs;
        const DV d_mu = keep<kDL>(-scale * s1, part);
        const DV d_var = keep<kDL>(-0.5 * scale * rs * rs * centred, part);
        add_to<kDL>(acc + c, centred * rs, part);
        add_to<kDL>(acc + C + c, s1, part);
        add_to<kDL>(acc + 2 * C + c, d_mu, part);
        add_to<kDL>(acc + 3 * C + c, d_var, part);
        const DV products[5] = {d_mu * (ml - mi),
                                d_mu * (load_d(a.bn_mean + c, part) - mi),
                                d_var * load_d(a.var_in + r, part), d_var * vl,
                                d_var * load_d(a.bn_var + c, part)};
        for (int j = 0; j < 5; ++j) {
          if (a.per_channel)
            add_to<kDL>(acc + (4 + j) * C + c, products[j], part);
          else
            dots[j] += keep<kDL>(products[j], part);
        }
        group_mu += d_mu;
        group_var += d_var;
      });
      d_mu_n += w[kWmLn] * lane_sum<double, kDL>(group_mu);
      d_var_n += w[kWvLn] * lane_sum<double, kDL>(group_var);
    });
    if (!a.per_channel)
      for (int j = 0; j < 5; ++j)
        acc[4 * C + j] += lane_sum<double, kDL>(dots[j]);
    a.d_mu_n[n] = static_cast<T>(d_mu_n);
    a.d_var_n[n] = static_cast<T>(d_var_n);
  }
}

template <typename T>
constexpr void fill_kernels(KernelFn<T>* table) {
  table[kMoments] = &moments_kernel<T>;
  table[kLnStats] = &ln_stats_kernel<T>;
  table[kBnDev] = &bn_dev_kernel<T>;
  table[kNormalize] = &normalize_kernel<T>;
  table[kGradSums] = &grad_sums_kernel<T>;
  table[kGradReduce] = &grad_reduce_kernel<T>;
  table[kInputGrad] = &input_grad_kernel<T>;
}

constexpr RowKernels kernel_table(const char* isa) {
  RowKernels table{isa, {}, {}};
  fill_kernels<float>(table.f32);
  fill_kernels<double>(table.f64);
  return table;
}

}  // namespace

#define SN_TABLE(isa) row_kernels_##isa
#define SN_TABLE_OF(isa) SN_TABLE(isa)
#define SN_NAME(isa) #isa
#define SN_NAME_OF(isa) SN_NAME(isa)
const sn_mm_rows::RowKernels* sn_mm_rows::SN_TABLE_OF(SN_ISA)() {
  static constexpr RowKernels table = kernel_table(SN_NAME_OF(SN_ISA));
  return &table;
}

#if defined(SN_TARGET) && defined(__clang__)
#pragma clang attribute pop
#endif
