// SN's CPU kernels, registered as the CPU and AutogradCPU kernels of the
// operator sn_mm::switchable_norm (end of this file): the full-size passes
// over a contiguous (N, C, L) input, one pass each and parallel over its
// N x C rows, and the reductions of the (N, C) statistics between them; a
// whole forward, a whole backward, or an eval forward in one call each, the
// softmax mixing, BN statistics, running-statistics update and ratio
// gradients included, with its autograd here in C++. The reference, in
// PyTorch ops, is sn_mm/ops/reference.py.
#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

// The extension is built without -march flags so that it runs on any x86-64;
// GCC's target clones add AVX2 and AVX-512 versions of the kernels, picked at
// load time for the CPU at hand.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    defined(__linux__)
#define SN_ISA_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SN_ISA_CLONES
#endif
#define SN_INLINE __attribute__((always_inline)) inline

namespace {

// Rows per task: enough work per task to amortise scheduling.
int64_t grain(int64_t length) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(length, 1));
}

// ------------------------------------------------------------ row sums --
// Row sums run in `Lanes` independent partial sums, which the compiler turns
// into SIMD adds (one accumulator would serialise on its latency). Short rows
// (RoI features: 7 x 7) take one vector's worth, several rows at a time, so
// that little time goes to folding the lanes together; long rows take
// several vectors.
constexpr int64_t kShortRow = 128;

template <int Lanes, typename T>
SN_INLINE T fold(T* acc) {
  for (int width = Lanes / 2; width > 0; width /= 2)
    for (int k = 0; k < width; ++k) acc[k] += acc[k + width];
  return acc[0];
}

template <int Lanes, typename T>
SN_INLINE T row_sum(const T* __restrict__ x, int64_t n) {
  T acc[Lanes] = {};
  int64_t i = 0;
  for (; i + Lanes <= n; i += Lanes)
    for (int k = 0; k < Lanes; ++k) acc[k] += x[i + k];
  T tail = 0;
  for (; i < n; ++i) tail += x[i];
  return fold<Lanes>(acc) + tail;
}

// sum of (x - shift): summing deviations from a value of the row (its first)
// keeps the partial sums small when |mean| >> std, so the mean keeps the
// precision of the data instead of that of the sum.
template <int Lanes, typename T>
SN_INLINE T row_sum_shifted(const T* __restrict__ x, int64_t n, T shift) {
  T acc[Lanes] = {};
  int64_t i = 0;
  for (; i + Lanes <= n; i += Lanes)
    for (int k = 0; k < Lanes; ++k) acc[k] += x[i + k] - shift;
  T tail = 0;
  for (; i < n; ++i) tail += x[i] - shift;
  return fold<Lanes>(acc) + tail;
}

// sum of (x - mean)^2 as ((x - shift) - (mean - shift)): the mean rounded
// to x's dtype could be off by half its unit in the last place, which
// squared is not small beside a variance far below |mean|.
template <int Lanes, typename T>
SN_INLINE T row_sq_dev(const T* __restrict__ x, int64_t n, T shift,
                       T mean_dev) {
  T acc[Lanes] = {};
  int64_t i = 0;
  for (; i + Lanes <= n; i += Lanes)
    for (int k = 0; k < Lanes; ++k) {
      const T d = (x[i + k] - shift) - mean_dev;
      acc[k] += d * d;
    }
  T tail = 0;
  for (; i < n; ++i) {
    const T d = (x[i] - shift) - mean_dev;
    tail += d * d;
  }
  return fold<Lanes>(acc) + tail;
}

// Lanes values as one SIMD register (GCC/Clang vector extension): the
// sums below keep two accumulators each, which the auto-vectoriser does not
// reliably map to registers. (Every function passing these by value is
// inlined, so GCC's note that such an ABI differs between ISAs is moot.)
#pragma GCC diagnostic ignored "-Wpsabi"
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

template <int Lanes, typename V>
SN_INLINE auto hsum(V v) {
  // A tree of halving adds (log2(Lanes) steps, not Lanes - 1 in a chain).
  static_assert(Lanes == 8, "hsum folds 8 lanes");
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5);
  v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6);
  return v[0];
}

// For Rows consecutive short rows of length n at x: sums of (x - shift)
// and (x - shift)^2 in one pass, shift each row's first value. Several rows
// at once keep several independent chains of additions in flight (one
// short row's chain is mostly latency). Cancellation in s2 - s1^2 / n costs
// at most a factor n <= kShortRow of relative precision, since (mean -
// shift)^2 <= n * var.
template <int Lanes, int Rows, typename T>
SN_INLINE void rows_shifted_sums(const T* __restrict__ x, int64_t n,
                                 T* __restrict__ s1, T* __restrict__ s2) {
  using V = typename Vec<T, Lanes>::type;
  V a1[Rows], a2[Rows];
  T shift[Rows], t1[Rows], t2[Rows];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
    a1[r] = V{};
    a2[r] = V{};
    shift[r] = x[r * n];
    t1[r] = t2[r] = 0;
  }
  int64_t i = 0;
  for (; i + Lanes <= n; i += Lanes)
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) {
      const V d = load<Lanes>(x + r * n + i) - shift[r];
      a1[r] += d;
      a2[r] += d * d;
    }
  for (; i < n; ++i)
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) {
      const T d = x[r * n + i] - shift[r];
      t1[r] += d;
      t2[r] += d * d;
    }
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
    s1[r] = hsum<Lanes>(a1[r]) + t1[r];
    s2[r] = hsum<Lanes>(a2[r]) + t2[r];
  }
}

// Likewise per row sums of g and of g * (x - m[row]).
template <int Lanes, int Rows, typename T>
SN_INLINE void rows_grad_sums(const T* __restrict__ g, const T* __restrict__ x,
                              int64_t n, const T* __restrict__ m,
                              T* __restrict__ sg, T* __restrict__ sgx) {
  using V = typename Vec<T, Lanes>::type;
  V a1[Rows], a2[Rows];
  T t1[Rows], t2[Rows];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
    a1[r] = V{};
    a2[r] = V{};
    t1[r] = t2[r] = 0;
  }
  int64_t i = 0;
  for (; i + Lanes <= n; i += Lanes)
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) {
      const V gv = load<Lanes>(g + r * n + i);
      a1[r] += gv;
      a2[r] += gv * (load<Lanes>(x + r * n + i) - m[r]);
    }
  for (; i < n; ++i)
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) {
      t1[r] += g[r * n + i];
      t2[r] += g[r * n + i] * (x[r * n + i] - m[r]);
    }
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
    sg[r] = hsum<Lanes>(a1[r]) + t1[r];
    sgx[r] = hsum<Lanes>(a2[r]) + t2[r];
  }
}

// sum of a * (b - m): centred on the row mean m, so that an input far from
// zero (|mean| >> std) loses nothing to cancellation.
template <int Lanes, typename T>
SN_INLINE T row_dot_centred(const T* __restrict__ a, const T* __restrict__ b,
                            int64_t n, T m) {
  T acc[Lanes] = {};
  int64_t i = 0;
  for (; i + Lanes <= n; i += Lanes)
    for (int k = 0; k < Lanes; ++k) acc[k] += a[i + k] * (b[i + k] - m);
  T tail = 0;
  for (; i < n; ++i) tail += a[i] * (b[i] - m);
  return fold<Lanes>(acc) + tail;
}

// --------------------------------------------------------------- kernels --
// Each kernel takes its arguments as one struct and a range of rows (or, for
// the reductions, of samples n).

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
};

template <typename T>
SN_INLINE void store_mean(const MomentsArgs<T>& a, int64_t r, T first,
                          T mean_dev) {
  a.mean[r] = first + mean_dev;
  if (a.dmean) a.dmean[r] = (first - a.shift[r % a.channels]) + mean_dev;
}

// Long rows: the mean, then the squared deviations from it while the row
// is still in cache (exact centring, no full-size temporary).
template <int Lanes, typename T>
SN_INLINE void moments_rows(const MomentsArgs<T>& a, int64_t begin,
                            int64_t end) {
  // In blocks of rows: every mean of the block, then every variance, so
  // that the rows' chains of dependent additions overlap.
  constexpr int64_t kBlock = 8;
  T mean_dev[kBlock];
  for (int64_t r0 = begin; r0 < end; r0 += kBlock) {
    const int64_t r1 = std::min(end, r0 + kBlock);
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = a.x + r * a.length;
      mean_dev[r - r0] = row_sum_shifted<Lanes>(row, a.length, row[0]) /
                         static_cast<T>(a.length);
      store_mean(a, r, row[0], mean_dev[r - r0]);
    }
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = a.x + r * a.length;
      a.var[r] = row_sq_dev<Lanes>(row, a.length, row[0], mean_dev[r - r0]) /
                 a.divisor;
    }
  }
}

// Short rows (RoI features: 7 x 7), kRows at a time in one pass each.
template <typename T>
SN_INLINE void moments_short_rows(const MomentsArgs<T>& a, int64_t begin,
                                  int64_t end) {
  constexpr int kRows = 4;
  const T inv_n = T(1) / static_cast<T>(a.length);
  T s1[kRows], s2[kRows];
  for (int64_t r = begin; r < end; r += kRows) {
    const T* x = a.x + r * a.length;
    const int rows = static_cast<int>(std::min<int64_t>(kRows, end - r));
    if (rows == kRows)
      rows_shifted_sums<8, kRows>(x, a.length, s1, s2);
    else
      for (int j = 0; j < rows; ++j)
        rows_shifted_sums<8, 1>(x + j * a.length, a.length, s1 + j, s2 + j);
    for (int j = 0; j < rows; ++j) {
      store_mean(a, r + j, x[j * a.length], s1[j] * inv_n);
      a.var[r + j] =
          std::max(s2[j] - s1[j] * s1[j] * inv_n, T(0)) / a.divisor;
    }
  }
}

template <typename T>
SN_INLINE void moments_kernel(const MomentsArgs<T>& a, int64_t begin,
                              int64_t end) {
  if (a.length < kShortRow)
    moments_short_rows(a, begin, end);
  else
    moments_rows<32>(a, begin, end);
}

template <typename T>
struct GradSumsArgs {
  const T* g;
  const T* x;
  const T* mean_in;
  T* sum_g;
  T* sum_gxc;
  int64_t length;
};

template <typename T>
SN_INLINE void grad_sums_kernel(const GradSumsArgs<T>& a, int64_t begin,
                                int64_t end) {
  if (a.length < kShortRow) {  // kRows rows at a time, as in moments
    constexpr int kRows = 4;
    int64_t r = begin;
    for (; r + kRows <= end; r += kRows)
      rows_grad_sums<8, kRows>(a.g + r * a.length, a.x + r * a.length,
                               a.length, a.mean_in + r, a.sum_g + r,
                               a.sum_gxc + r);
    for (; r < end; ++r)
      rows_grad_sums<8, 1>(a.g + r * a.length, a.x + r * a.length, a.length,
                           a.mean_in + r, a.sum_g + r, a.sum_gxc + r);
    return;
  }
  for (int64_t r = begin; r < end; ++r) {
    const T* g = a.g + r * a.length;
    const T* x = a.x + r * a.length;
    a.sum_g[r] = row_sum<32>(g, a.length);
    a.sum_gxc[r] = row_dot_centred<32>(g, x, a.length, a.mean_in[r]);
  }
}

template <typename T>
struct NormalizeArgs {
  const T *x, *mean_in, *var_in, *mu_n, *var_n, *mu_c, *var_c, *weight,
      *bias;
  // Each channel's ratios, C values each: its group's (ChannelRatios).
  const T *wm_n, *wv_in, *wv_n, *wm_c, *wv_c;
  T eps;
  T *y, *mu, *rstd;
  int64_t channels, length;
  bool stream = false;  // the output bypasses the caches (stream_row)
};

// 16 bytes stored past the caches (SSE2's non-temporal stores, in every
// x86-64 clone).
SN_INLINE void stream16(float* p, Vec<float, 4>::type v) {
  __builtin_ia32_movntps(p, v);
}
SN_INLINE void stream16(double* p, Vec<double, 2>::type v) {
  __builtin_ia32_movntpd(p, v);
}

// out = (row - mu) * s + b with stores that bypass the caches: for outputs
// far larger than the last-level cache, which would be evicted before the
// next layer reads them anyway, and whose lines a normal store would first
// read from memory. Computed 64 bytes at a time, stored 16 at a time.
template <typename T>
SN_INLINE void stream_row(const T* __restrict__ row, T* __restrict__ out,
                          int64_t n, T mu, T s, T b) {
  constexpr int kWide = 64 / sizeof(T), kNarrow = 16 / sizeof(T);
  using Narrow = typename Vec<T, kNarrow>::type;
  int64_t i = 0;
  for (; i < n && reinterpret_cast<uintptr_t>(out + i) % 16; ++i)
    out[i] = (row[i] - mu) * s + b;
  for (; i + kWide <= n; i += kWide) {
    const auto v = (load<kWide>(row + i) - mu) * s + b;
    for (int k = 0; k < kWide; k += kNarrow) {
      Narrow part;
      __builtin_memcpy(&part, reinterpret_cast<const T*>(&v) + k,
                       sizeof(part));
      stream16(out + i + k, part);
    }
  }
  for (; i < n; ++i) out[i] = (row[i] - mu) * s + b;
}

// Rows of fewer than kFlatRow values, in tasks of at least kFlatSpan
// values, are normalised as one flat span (normalize_flat): their own loops
// would end in scalar tails and, where a row's bytes are not a multiple of
// 64, store vectors split across cache lines. (In smaller tasks the
// per-vector test for a row's end costs more than it saves.)
constexpr int64_t kFlatRow = 4096, kFlatSpan = int64_t(1) << 20;

// y = (x - mu) * s + b over rows [begin, end) as one span, in whole
// 64-byte vectors stored at aligned addresses; a vector that crosses from
// one row into the next takes each lane's parameters from its row (rows
// are at least a vector long, so at most two rows meet in one).
template <typename T>
SN_INLINE void normalize_flat(const NormalizeArgs<T>& a, int64_t begin,
                              int64_t end) {
  constexpr int kW = 64 / sizeof(T);
  using V = typename Vec<T, kW>::type;
  using Int = typename std::conditional<sizeof(T) == 4, int32_t,
                                        int64_t>::type;
  using IV = typename Vec<Int, kW>::type;
  IV lane;
  for (int k = 0; k < kW; ++k) lane[k] = k;
  const int64_t L = a.length, C = a.channels, stop = end * L;
  const T* __restrict__ x = a.x;
  T* __restrict__ y = a.y;
  int64_t i = begin * L, r = begin, row_end = (begin + 1) * L,
          c = begin % C;
  T mu = a.mu[r], s = a.weight[c] * a.rstd[r], b = a.bias[c];
  auto next_row = [&]() {
    ++r;
    row_end += L;
    if (++c == C) c = 0;
    if (r < end) {
      mu = a.mu[r];
      s = a.weight[c] * a.rstd[r];
      b = a.bias[c];
    }
  };
  for (; i < stop && reinterpret_cast<uintptr_t>(y + i) % 64; ++i) {
    y[i] = (x[i] - mu) * s + b;
    if (i + 1 == row_end) next_row();
  }
  for (; i + kW <= stop; i += kW) {
    const V v = load<kW>(x + i);
    if (i + kW < row_end) {
      *reinterpret_cast<V*>(y + i) = (v - mu) * s + b;
      continue;
    }
    const Int split = static_cast<Int>(row_end - i);  // lanes of row r
    const IV first = lane < split;
    const T mu0 = mu, s0 = s, b0 = b;
    next_row();
    const V mu_v = first ? V{} + mu0 : V{} + mu;
    const V s_v = first ? V{} + s0 : V{} + s;
    const V b_v = first ? V{} + b0 : V{} + b;
    *reinterpret_cast<V*>(y + i) = (v - mu_v) * s_v + b_v;
  }
  for (; i < stop; ++i) {
    y[i] = (x[i] - mu) * s + b;
    if (i + 1 == row_end) next_row();
  }
}

// Per row (n, c): mix the statistics, mu = wm_in * mean_in + wm_n * mu_n +
// wm_c * mu_c (as mean_in + wm_n * (mu_n - mean_in) + ...) and likewise the
// variance, then y = (x - mu) * scale + bias with
// scale = weight / sqrt(var + eps) (x - mu first: x * scale - mu * scale
// would cancel when |mu| >> std). Keeps mu and 1 / sqrt(var + eps).
template <typename T>
SN_INLINE void normalize_kernel(const NormalizeArgs<T>& a, int64_t begin,
                                int64_t end) {
  // First every row's statistics (a loop over c that vectorises, the
  // square roots included), then the rows: a short row's own loop then has
  // no scalar latency in front of it.
  for (int64_t r0 = begin; r0 < end;) {
    const int64_t n = r0 / a.channels, c0 = r0 % a.channels;
    const int64_t r1 = std::min(end, (n + 1) * a.channels);
    const T* __restrict__ mean_in = a.mean_in + n * a.channels;
    const T* __restrict__ var_in = a.var_in + n * a.channels;
    T* __restrict__ mu = a.mu + n * a.channels;
    T* __restrict__ rstd = a.rstd + n * a.channels;
    const T mu_n = a.mu_n[n], var_n = a.var_n[n];
    for (int64_t c = c0; c < r1 - n * a.channels; ++c) {
      // The row's mean plus weighted differences from it (the ratios sum
      // to 1): no |mean|-sized products to round.
      mu[c] = mean_in[c] + a.wm_n[c] * (mu_n - mean_in[c]) +
              a.wm_c[c] * (a.mu_c[c] - mean_in[c]);
      rstd[c] = T(1) / std::sqrt(a.wv_in[c] * var_in[c] +
                                 (a.wv_n[c] * var_n + a.eps) +
                                 a.wv_c[c] * a.var_c[c]);
    }
    r0 = r1;
  }
  if (!a.stream && a.length >= 64 / int64_t(sizeof(T)) &&
      a.length < kFlatRow && (end - begin) * a.length >= kFlatSpan) {
    normalize_flat(a, begin, end);
    return;
  }
  int64_t c = begin % a.channels;
  for (int64_t r = begin; r < end; ++r) {
    const T mu = a.mu[r], s = a.weight[c] * a.rstd[r], b = a.bias[c];
    const T* __restrict__ row = a.x + r * a.length;
    T* __restrict__ out = a.y + r * a.length;
    if (a.stream)
      stream_row(row, out, a.length, mu, s, b);
    else
      for (int64_t i = 0; i < a.length; ++i) out[i] = (row[i] - mu) * s + b;
    if (++c == a.channels) c = 0;
  }
  if (a.stream) __builtin_ia32_sfence();  // before another thread reads y
}

template <typename T>
struct InputGradArgs {
  const T *g, *x, *sum_g, *sum_gxc, *mu, *rstd, *weight, *mean_in, *dvar_n,
      *dmean_n, *center_n, *dvar_c, *dmean_c, *center_c;
  const T *wm_in, *wv_in;  // each channel's IN ratios
  T two_over_divisor;
  T* dx;
  int64_t channels, length;
};

// dx = g * scale + a * (x - mean_in) + b per row, a and b from the gradients
// of the row's IN mean and variance (what autograd derives from the
// reference's formulas).
template <typename T>
SN_INLINE void input_grad_kernel(const InputGradArgs<T>& a, int64_t begin,
                                 int64_t end) {
  const T inv_length = T(1) / static_cast<T>(a.length);
  // In chunks of one sample's rows: first each row's three coefficients (a
  // loop over c that vectorises), then the rows.
  constexpr int64_t kChunk = 256;
  T scale[kChunk], coef_x[kChunk], shift[kChunk];
  for (int64_t r0 = begin; r0 < end;) {
    const int64_t n = r0 / a.channels, c0 = r0 % a.channels;
    const int64_t r1 = std::min({end, (n + 1) * a.channels, r0 + kChunk});
    const int64_t rows = r1 - r0;
    const T dvar_n = a.dvar_n[n], dmean_n = a.dmean_n[n],
            center_n = a.center_n[n];
    for (int64_t j = 0; j < rows; ++j) {
      const int64_t r = r0 + j, c = c0 + j;
      const T rstd = a.rstd[r], s = a.weight[c] * rstd, m = a.mean_in[r];
      const T centred = a.sum_gxc[r] - (a.mu[r] - m) * a.sum_g[r];
      const T d_mu = -s * a.sum_g[r];
      const T d_var = T(-0.5) * s * rstd * rstd * centred;
      const T d_var_in = dvar_n + a.dvar_c[c] + a.wv_in[c] * d_var;
      const T d_mean_in = dmean_n + a.dmean_c[c] + a.wm_in[c] * d_mu +
                          T(2) * (m - center_n) * dvar_n +
                          T(2) * (m - a.center_c[c]) * a.dvar_c[c];
      scale[j] = s;
      coef_x[j] = d_var_in * a.two_over_divisor;
      shift[j] = d_mean_in * inv_length;
    }
    for (int64_t j = 0; j < rows; ++j) {
      const int64_t r = r0 + j;
      const T s = scale[j], cx = coef_x[j], sh = shift[j], m = a.mean_in[r];
      const T* __restrict__ xr = a.x + r * a.length;
      const T* __restrict__ gr = a.g + r * a.length;
      T* __restrict__ out = a.dx + r * a.length;
      for (int64_t i = 0; i < a.length; ++i)
        out[i] = gr[i] * s + cx * (xr[i] - m) + sh;
    }
    r0 = r1;
  }
}

// ------------------------------------------------- (N, C) reductions --
// Per sample, loops over its C statistics, summed in double 8 lanes at a
// time: explicit vectors, as the auto-vectoriser keeps running sums scalar
// (it may not reorder floating-point additions).
using D8 = Vec<double, 8>::type;

template <typename T>
SN_INLINE D8 load_d(const T* p) {
  return __builtin_convertvector(load<8>(p), D8);
}

SN_INLINE void add_to(double* p, D8 v) { store<8>(p, load<8>(p) + v); }

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

// Per sample: LN's mean and its variance in the stable form mean_c(var_in)
// + mean_c((mean_in - mean_ln)^2).
template <typename T>
SN_INLINE void ln_stats_kernel(const LnStatsArgs<T>& a, int64_t begin,
                               int64_t end) {
  const int64_t C = a.channels, C8 = C - C % 8;
  double* col = a.col;
  for (int64_t n = begin; n < end; ++n) {
    const T* m = (a.dmean ? a.dmean : a.mean_in) + n * C;
    const T* v = a.var_in + n * C;
    // The absolute means in double: m plus the shift where there is one.
    const auto mean_at = [&](int64_t c) {
      return a.shift ? load_d(a.shift + c) + load_d(m + c) : load_d(m + c);
    };
    const auto mean_of = [&](int64_t c) {
      return a.shift ? double(a.shift[c]) + double(m[c]) : double(m[c]);
    };
    D8 sm = {}, sv = {};
    double tm = 0, tv = 0;
    for (int64_t c = 0; c < C8; c += 8) {
      const D8 vv = load_d(v + c);
      sm += mean_at(c);
      sv += vv;
      if (col) {
        add_to(col + c, load_d(m + c));
        add_to(col + C + c, vv);
      }
    }
    for (int64_t c = C8; c < C; ++c) {
      tm += mean_of(c);
      tv += v[c];
      if (col) {
        col[c] += m[c];
        col[C + c] += v[c];
      }
    }
    const double mean = (hsum<8>(sm) + tm) / C;
    D8 sd = {};
    double td = 0;
    for (int64_t c = 0; c < C8; c += 8) {
      const D8 d = mean_at(c) - mean;
      sd += d * d;
    }
    for (int64_t c = C8; c < C; ++c)
      td += (mean_of(c) - mean) * (mean_of(c) - mean);
    a.ln_mean[n] = static_cast<T>(mean);
    a.ln_var[n] = static_cast<T>((hsum<8>(sv) + tv + hsum<8>(sd) + td) / C);
  }
}

template <typename T>
struct BnDevArgs {
  const T* mean_in;
  const double* centre;
  int64_t channels;
  double* col;  // += (mean_in - centre)^2 per channel
};

template <typename T>
SN_INLINE void bn_dev_kernel(const BnDevArgs<T>& a, int64_t begin,
                             int64_t end) {
  const int64_t C = a.channels, C8 = C - C % 8;
  for (int64_t n = begin; n < end; ++n) {
    const T* m = a.mean_in + n * C;
    for (int64_t c = 0; c < C8; c += 8) {
      const D8 d = load_d(m + c) - load<8>(a.centre + c);
      add_to(a.col + c, d * d);
    }
    for (int64_t c = C8; c < C; ++c) {
      const double d = m[c] - a.centre[c];
      a.col[c] += d * d;
    }
  }
}

template <typename T>
struct GradReduceArgs {
  const T *s1, *s2, *mu, *rstd, *weight, *mean_in, *var_in, *mean_ln,
      *var_ln, *mean_c;
  const T *wm_n, *wv_n;  // each channel's LN ratios
  int64_t channels;
  T *d_mu_n, *d_var_n;
  // += per channel: grad_weight, grad_bias, d_mu_c, d_var_c, and the ratio
  // gradients' products (d_mu with the LN and the BN mean less mean_in,
  // d_var with var_in and with the LN variance): 8 x C; for a single ratio
  // group (per_channel false) the four products summed over the channels
  // instead: 4 x C + 4.
  double* acc;
  bool per_channel = true;
};

// Per sample, from the row sums (see grad_reductions): the sums over c of
// d_mu and d_var weighted by each channel's LN ratio, and into acc the
// per-channel sums.
template <typename T>
SN_INLINE void grad_reduce_kernel(const GradReduceArgs<T>& a, int64_t begin,
                                  int64_t end) {
  const int64_t C = a.channels, C8 = C - C % 8;
  double* acc = a.acc;
  for (int64_t n = begin; n < end; ++n) {
    const int64_t o = n * C;
    const double ml = a.mean_ln[n], vl = a.var_ln[n];
    D8 row_mu = {}, row_var = {}, dots[4] = {};
    for (int64_t c = 0; c < C8; c += 8) {
      const D8 s1 = load_d(a.s1 + o + c), r = load_d(a.rstd + o + c),
               mi = load_d(a.mean_in + o + c);
      const D8 centred =
          load_d(a.s2 + o + c) - (load_d(a.mu + o + c) - mi) * s1;
      const D8 scale = load_d(a.weight + c) * r;
      const D8 d_mu = -scale * s1;
      const D8 d_var = -0.5 * scale * r * r * centred;
      add_to(acc + c, centred * r);
      add_to(acc + C + c, s1);
      add_to(acc + 2 * C + c, d_mu);
      add_to(acc + 3 * C + c, d_var);
      const D8 products[4] = {d_mu * (ml - mi),
                              d_mu * (load_d(a.mean_c + c) - mi),
                              d_var * load_d(a.var_in + o + c), d_var * vl};
      for (int j = 0; j < 4; ++j) {
        if (a.per_channel)
          add_to(acc + (4 + j) * C + c, products[j]);
        else
          dots[j] += products[j];
      }
      row_mu += d_mu * load_d(a.wm_n + c);
      row_var += d_var * load_d(a.wv_n + c);
    }
    double t_mu = 0, t_var = 0, t_dots[4] = {};
    for (int64_t c = C8; c < C; ++c) {
      const int64_t r = o + c;
      const double centred =
          a.s2[r] - (double(a.mu[r]) - double(a.mean_in[r])) * a.s1[r];
      const double scale = double(a.weight[c]) * a.rstd[r];
      const double d_mu = -scale * a.s1[r];
      const double d_var = -0.5 * scale * a.rstd[r] * a.rstd[r] * centred;
      acc[c] += centred * a.rstd[r];
      acc[C + c] += a.s1[r];
      acc[2 * C + c] += d_mu;
      acc[3 * C + c] += d_var;
      const double products[4] = {
          d_mu * (ml - double(a.mean_in[r])),
          d_mu * (double(a.mean_c[c]) - double(a.mean_in[r])),
          d_var * a.var_in[r], d_var * vl};
      for (int j = 0; j < 4; ++j) {
        if (a.per_channel)
          acc[(4 + j) * C + c] += products[j];
        else
          t_dots[j] += products[j];
      }
      t_mu += d_mu * a.wm_n[c];
      t_var += d_var * a.wv_n[c];
    }
    a.d_mu_n[n] = static_cast<T>(hsum<8>(row_mu) + t_mu);
    a.d_var_n[n] = static_cast<T>(hsum<8>(row_var) + t_var);
    if (!a.per_channel)
      for (int j = 0; j < 4; ++j)
        acc[4 * C + j] += hsum<8>(dots[j]) + t_dots[j];
  }
}

// One cloned entry point per kernel and dtype (target clones cannot be
// templates); everything they call is inlined into each ISA version.
#define SN_CLONED(kernel, Args, T)                                    \
  SN_ISA_CLONES void kernel##_##T(const Args<T>& a, int64_t begin,    \
                                  int64_t end) {                      \
    kernel##_kernel(a, begin, end);                                   \
  }                                                                   \
  void run(const Args<T>& a, int64_t begin, int64_t end) {            \
    kernel##_##T(a, begin, end);                                      \
  }
SN_CLONED(moments, MomentsArgs, float)
SN_CLONED(moments, MomentsArgs, double)
SN_CLONED(grad_sums, GradSumsArgs, float)
SN_CLONED(grad_sums, GradSumsArgs, double)
SN_CLONED(normalize, NormalizeArgs, float)
SN_CLONED(normalize, NormalizeArgs, double)
SN_CLONED(input_grad, InputGradArgs, float)
SN_CLONED(input_grad, InputGradArgs, double)
SN_CLONED(ln_stats, LnStatsArgs, float)
SN_CLONED(ln_stats, LnStatsArgs, double)
SN_CLONED(bn_dev, BnDevArgs, float)
SN_CLONED(bn_dev, BnDevArgs, double)
SN_CLONED(grad_reduce, GradReduceArgs, float)
SN_CLONED(grad_reduce, GradReduceArgs, double)
#undef SN_CLONED

template <typename Args>
void run_rows(const Args& args, int64_t rows, int64_t length) {
  if (rows <= grain(length)) {  // one task: no parallel region
    run(args, 0, rows);
    return;
  }
  at::parallel_for(0, rows, grain(length), [&](int64_t begin, int64_t end) {
    run(args, begin, end);
  });
}

// Sums over the samples n of an (N, C) computation: each task adds its
// block of samples into its own `width` partial sums in double, which are
// then added up. `fn(n, acc)` handles sample n, adding into acc[0, width).
template <typename Fn>
std::vector<double> sum_over_samples(int64_t samples, int64_t width,
                                     const Fn& fn) {
  const int64_t tasks = std::max<int64_t>(
      1, std::min<int64_t>(at::get_num_threads(), samples));
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

}  // namespace

// --------------------------------------------------------- the operator --
// sn_mm::switchable_norm (its schema is in sn_mm/ops/operator.py): SN on the
// CPU in one call per pass. The CPU kernel is the forward without autograd
// (eval, no_grad); the AutogradCPU kernel saves what the backward needs, and
// the backward is one call too. Semantics: those of the reference,
// sn_mm/ops/reference.py, which the tests hold this to. The glue between the
// passes works on raw pointers: at small shapes (batch-1 inference, RoI
// heads) each ATen call on a (C,) vector would cost as much as the data's
// passes.
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptTensor = c10::optional<at::Tensor>;

bool defined(const OptTensor& t) { return t.has_value() && t->defined(); }

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
    run(LnStatsArgs<scalar_t>{pm, pv, channels, plm, plv, nullptr}, 0,
        samples);
    return;
  }
  if (samples == 1) {
    // Batch-1 inference: BN's statistics are the sample's own IN ones.
    run(LnStatsArgs<scalar_t>{pm, pv, channels, plm, plv, nullptr}, 0, 1);
    std::copy(pm, pm + channels, pbm);
    std::copy(pv, pv + channels, pb2);
    return;
  }
  // Pass 1: per sample the LN statistics (its row is in cache twice);
  // per channel the sums of the means about the shifts and of var_in.
  const auto cols = sum_over_samples(
      samples, 2 * channels, [&](int64_t n, double* col) {
        run(LnStatsArgs<scalar_t>{pm, pv, channels, plm, plv, col, pdm,
                                  pshift},
            n, n + 1);
      });
  std::vector<double> centre(channels, 0.0);
  if (samples > 0)
    for (int64_t c = 0; c < channels; ++c) centre[c] = cols[c] / samples;
  // Pass 2: squared deviations of those means about their channel's mean.
  const auto devs = sum_over_samples(
      samples, channels, [&](int64_t n, double* col) {
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

// The ratio vectors in use: IN first where IN is defined (K entries, else
// K - 1, LN first), and where LN sits (BN follows it).
// Group SN: G such vectors one after the other, channel c taking group
// c / (C / G)'s.
struct Ratios {
  std::vector<double> mean, var;
  bool has_in = true;
  int64_t k_ln = 1;
  int64_t groups = 1;
  int64_t terms() const { return static_cast<int64_t>(mean.size()) / groups; }
};

// Each channel's ratios, C values each: IN's, LN's and BN's for the mean
// and for the variance (IN's 0 where undefined, BN's 0 without a BN term),
// in the computation's dtype.
template <typename T>
struct ChannelRatios {
  std::vector<T> data;
  int64_t channels;
  ChannelRatios(const Ratios& w, int64_t channels, bool using_bn)
      : data(6 * channels), channels(channels) {
    const int64_t k = w.k_ln, terms = w.terms(),
                  per_group = std::max<int64_t>(channels / w.groups, 1);
    for (int64_t g = 0; g < w.groups; ++g) {
      const double* m = w.mean.data() + g * terms;
      const double* v = w.var.data() + g * terms;
      const T values[6] = {
          static_cast<T>(w.has_in ? m[0] : 0.0),
          static_cast<T>(w.has_in ? v[0] : 0.0), static_cast<T>(m[k]),
          static_cast<T>(v[k]), static_cast<T>(using_bn ? m[k + 1] : 0.0),
          static_cast<T>(using_bn ? v[k + 1] : 0.0)};
      for (int i = 0; i < 6; ++i)
        std::fill_n(data.data() + i * channels + g * per_group, per_group,
                    values[i]);
    }
  }
  const T* wm_in() const { return data.data(); }
  const T* wv_in() const { return data.data() + channels; }
  const T* wm_ln() const { return data.data() + 2 * channels; }
  const T* wv_ln() const { return data.data() + 3 * channels; }
  const T* wm_bn() const { return data.data() + 4 * channels; }
  const T* wv_bn() const { return data.data() + 5 * channels; }
};

std::vector<double> read_doubles(const at::Tensor& t) {
  auto c = t.is_contiguous() ? t : t.contiguous();
  std::vector<double> out(c.numel());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, c.scalar_type(),
                                  "read", [&] {
    const scalar_t* p = c.data_ptr<scalar_t>();
    for (int64_t i = 0; i < c.numel(); ++i) out[i] = static_cast<double>(p[i]);
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
  TORCH_CHECK(f.numel() == 2 * groups, "switchable_norm: ratio_fixed must "
              "hold 2 x ", groups, " flags, got ", f.sizes());
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
  std::vector<double> given;
  if (std::find(is_fixed.begin(), is_fixed.end(), true) != is_fixed.end())
    given = read_doubles(*fixed_ratios);
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
        const double* src = given.data() + (row * groups + g) * k;
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

// What backward needs of a forward: the (N, C, L) input, the statistics
// buffer, the ratios mixed with.
struct Forward {
  at::Tensor y, x3, ws;
  Ratios ratios;
  int64_t correction = 0;
  bool bn_batch = false;
  double total = 0;  // samples behind the BN statistics (training)
};

void check_params(const at::Tensor& x, const at::Tensor& weight,
                  const at::Tensor& bias) {
  TORCH_CHECK(x.dim() >= 2, "switchable_norm: expected (N, C, *), got ",
              x.sizes());
  const auto dtype = x.scalar_type();
  TORCH_CHECK(x.device().is_cpu() &&
                  (dtype == at::kFloat || dtype == at::kDouble),
              "switchable_norm: float32/float64 CPU tensors only, got ",
              dtype, " on ", x.device());
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

// The running statistics: moving average, or cumulative (momentum < 0);
// untouched where any of the batch's statistics is not finite (an overflow,
// a NaN in the input), which `nonfinite` (where given) counts.
template <typename T>
void update_running(const at::Tensor& running_mean,
                    const at::Tensor& running_var, const at::Tensor& count,
                    const OptTensor& nonfinite, double momentum,
                    const T* bn_m, const T* bn_v, int64_t channels) {
  bool finite = true;
  for (int64_t c = 0; c < channels; ++c)
    finite = finite && std::isfinite(bn_m[c]) && std::isfinite(bn_v[c]);
  if (!finite) {
    if (nonfinite.has_value() && nonfinite->defined())
      nonfinite->data_ptr<int64_t>()[0] += 1;
    return;
  }
  auto* n = count.data_ptr<int64_t>();
  n[0] += 1;
  const double mom = momentum < 0 ? 1.0 / n[0] : momentum;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, running_mean.scalar_type(), "running", [&] {
        using R = scalar_t;
        R* prm = running_mean.data_ptr<R>();
        R* prv = running_var.data_ptr<R>();
        for (int64_t c = 0; c < channels; ++c) {
          prm[c] = static_cast<R>((1 - mom) * double(prm[c]) +
                                  mom * double(bn_m[c]));
          prv[c] = static_cast<R>((1 - mom) * double(prv[c]) +
                                  mom * double(bn_v[c]));
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

template <typename T>
MomentsArgs<T> moments_args(const Forward& f, const Stats<T>& s) {
  const int64_t spatial = f.x3.size(2);
  return MomentsArgs<T>{
      f.x3.data_ptr<T>(), s.mean_in, s.var_in, spatial,
      static_cast<T>(std::max<int64_t>(spatial - f.correction, 1))};
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
  const bool bn_batch = run_stats.using_bn && run_stats.training &&
                        samples > 0;
  const bool one_sample = bn_batch && samples == 1;
  const bool bn_sums = bn_batch && !one_sample;
  if (f.x3.numel()) {
    MomentsArgs<T> margs = moments_args(f, s);
    if (bn_sums) {  // each channel's shift: its first value
      for (int64_t c = 0; c < channels; ++c)
        s.shift[c] = margs.x[c * spatial];
      margs.shift = s.shift;
      margs.dmean = s.dmean;
      margs.channels = channels;
    }
    run_rows(margs, rows, spatial);
  } else {
    std::fill_n(s.mean_in, 2 * rows, T(0));
    std::fill_n(s.dmean, rows, T(0));
    std::fill_n(s.shift, channels, T(0));
  }
  reductions_into(s.mean_in, s.var_in, samples, channels, s.ln_mean,
                  s.ln_var, bn_sums ? s.bn_mean : nullptr,
                  bn_sums ? s.bn_var : nullptr, s.dmean, s.shift);
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
                                const ChannelRatios<T>& w,
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
  a.wm_n = w.wm_ln();
  a.wv_in = w.wv_in();
  a.wv_n = w.wv_ln();
  a.wm_c = w.wm_bn();
  a.wv_c = w.wv_bn();
  a.eps = static_cast<T>(eps);
  a.y = y.data_ptr<T>();
  a.mu = s.mu;
  a.rstd = s.rstd;
  a.channels = f.x3.size(1);
  a.length = f.x3.size(2);
  return a;
}

// Outputs of long rows far larger than the last-level cache are written
// past the caches (stream_row): the next layer could not find them there,
// and normal stores would first read every line they write. (Short rows
// would leave partial lines at their ends, which such stores make slow.)
constexpr int64_t kStreamBytes = int64_t(32) << 20, kStreamRow = 4096;

// Without the batch's BN statistics (eval), a sample's output needs only
// that sample: its moments, LN statistics and normalisation can run one
// after the other while it is in this core's L2, so that the input comes
// from memory once, as GroupNorm's does, rather than twice. Taken for
// samples of kSampleMin to kSampleMax bytes when the samples keep every
// thread busy (docs/performance.md has the figures); smaller ones (RoI
// features, 50 KB) measured faster in the passes' long streams.
constexpr int64_t kSampleMin = int64_t(128) << 10,
                  kSampleMax = int64_t(512) << 10;

template <typename T>
bool by_sample(const Forward& f, const Running& run_stats) {
  const int64_t bytes = f.x3.size(1) * f.x3.size(2) * int64_t(sizeof(T));
  return !(run_stats.using_bn && run_stats.training) &&
         bytes >= kSampleMin && bytes <= kSampleMax &&
         f.x3.size(0) >= 4 * at::get_num_threads();
}

template <typename T>
void forward_by_sample(Forward& f, at::Tensor& y, const at::Tensor& weight,
                       const at::Tensor& bias, const Running& run_stats,
                       double eps, const Stats<T>& s, bool for_backward) {
  const int64_t samples = f.x3.size(0), channels = f.x3.size(1);
  const auto bn = fixed_bn(f, s, run_stats, for_backward);
  const ChannelRatios<T> w(f.ratios, channels, run_stats.using_bn);
  const auto args = normalize_args(f, s, bn, w, weight, bias, eps, y);
  const MomentsArgs<T> moments = moments_args(f, s);
  const LnStatsArgs<T> ln{s.mean_in, s.var_in, channels, s.ln_mean,
                          s.ln_var, nullptr};
  at::parallel_for(0, samples, 1, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      run(moments, n * channels, (n + 1) * channels);
      run(ln, n, n + 1);
      run(args, n * channels, (n + 1) * channels);
    }
  });
}

template <typename T>
void forward_pass(Forward& f, at::Tensor& y, const at::Tensor& weight,
                  const at::Tensor& bias, const Running& run_stats,
                  double eps, bool for_backward) {
  const int64_t samples = f.x3.size(0), channels = f.x3.size(1),
                spatial = f.x3.size(2);
  const Stats<T> s(stats_buffer<T>(f, for_backward), samples, channels);
  if (by_sample<T>(f, run_stats)) {
    forward_by_sample(f, y, weight, bias, run_stats, eps, s, for_backward);
    return;
  }
  const auto bn = statistics<T>(f, s, run_stats, for_backward);
  const ChannelRatios<T> w(f.ratios, channels, run_stats.using_bn);
  auto args = normalize_args(f, s, bn, w, weight, bias, eps, y);
  args.stream = spatial >= kStreamRow &&
                y.numel() * int64_t(sizeof(T)) > kStreamBytes;
  run_rows(args, samples * channels, spatial);
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
    const OptTensor& nonfinite,
                     const OptTensor& fixed, const OptTensor& fixed_ratios,
                     bool training, double momentum, double eps,
                     bool unbiased, bool ratios_given, bool for_backward) {
  check_params(x, weight, bias);
  Forward f;
  f.x3 = rows_of(x);
  const bool has_in = f.x3.size(2) > 1;
  f.correction = (unbiased && has_in) ? 1 : 0;
  const int64_t groups = ratio_groups(mean_logits);
  TORCH_CHECK(groups >= 1 && x.size(1) % groups == 0 &&
                  var_logits.sizes() == mean_logits.sizes(),
              "switchable_norm: ", groups, " ratio groups do not divide ",
              x.size(1), " channels (or the logits' shapes differ)");
  f.ratios = mixing_ratios(mean_logits, var_logits,
                           read_fixed(fixed, groups), fixed_ratios, has_in,
                           ratios_given);
  const bool using_bn = defined(running_mean);
  f.bn_batch = using_bn && training;
  f.total = static_cast<double>(x.size(0));
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

// Backward's intermediate sums, in this thread's scratch memory: per row
// the sums of g and g * (x - mean_in), per sample and per channel the sums
// of the mixed statistics' gradients, zeros, and three dot products.
template <typename T>
struct GradSums {
  T *s1, *s2, *d_mu_n, *d_var_n, *d_mu_c, *d_var_c, *zeros_c;
  // The ratio gradients' products: per channel, or for one ratio group
  // summed over the channels (grad_reductions_into).
  std::vector<double> dots;
  GradSums(int64_t samples, int64_t channels) {
    static thread_local std::vector<T> scratch;
    const int64_t rows = samples * channels;
    const int64_t need = 2 * rows + 2 * samples + 3 * channels;
    if (static_cast<int64_t>(scratch.size()) < need) scratch.resize(need);
    s1 = scratch.data();
    s2 = s1 + rows;
    d_mu_n = s2 + rows;
    d_var_n = d_mu_n + samples;
    d_mu_c = d_var_n + samples;
    d_var_c = d_mu_c + channels;
    zeros_c = d_var_c + channels;
    std::fill_n(zeros_c, channels, T(0));
  }
};

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
    for (int64_t c = g * per_group; c < (g + 1) * per_group; ++c) {
      if (w.groups > 1) {
        ln_mean += dot[c];
        bn_mean += dot[stride + c];
        in_var += dot[2 * stride + c];
        ln_var += dot[3 * stride + c];
      }
      if (using_bn) bn_var_dot += double(gs.d_var_c[c]) * bn_var[c];
    }
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

// Back through the LN (N, 1) and BN (C,) statistics to each row's IN mean
// and variance (Eq. 5 reversed), in place; a batch without samples sends
// nothing to BN's.
// (The LN sums come weighted by each channel's LN ratio.)
template <typename T>
void through_shared_stats(const GradSums<T>& gs, const Forward& f,
                          const ChannelRatios<T>& w, int64_t samples,
                          int64_t channels, bool bn_grad) {
  const double s_n = 1.0 / channels;
  for (int64_t n = 0; n < samples; ++n) {
    gs.d_var_n[n] = static_cast<T>(gs.d_var_n[n] * s_n);
    gs.d_mu_n[n] = static_cast<T>(gs.d_mu_n[n] * s_n);
  }
  const double s_c = bn_grad ? 1.0 / f.total : 0.0;
  const T* wm = w.wm_bn();
  const T* wv = w.wv_bn();
  for (int64_t c = 0; c < channels; ++c) {
    gs.d_mu_c[c] = static_cast<T>(gs.d_mu_c[c] * (wm[c] * s_c));
    gs.d_var_c[c] = static_cast<T>(gs.d_var_c[c] * (wv[c] * s_c));
  }
}

// The gradients of an SN forward: of x, weight and bias into the given
// tensors, of the ratios into d_wm and d_wv.
template <typename T>
void backward_pass(const at::Tensor& g, const Forward& f,
                   const at::Tensor& weight, bool using_bn,
                   at::Tensor& grad_x, at::Tensor& grad_weight,
                   at::Tensor& grad_bias, std::vector<double>& d_wm,
                   std::vector<double>& d_wv) {
  const int64_t samples = f.x3.size(0), channels = f.x3.size(1),
                spatial = f.x3.size(2), rows = samples * channels;
  const Stats<T> s(f.ws.data_ptr<T>(), samples, channels);
  // One sample's batch statistics are its IN ones (see statistics()).
  const bool one_sample = f.bn_batch && samples == 1;
  const T* bn_mean = one_sample ? s.mean_in : s.bn_mean;
  const T* bn_var = one_sample ? s.var_in : s.bn_var;
  const bool bn_grad = f.bn_batch && samples > 0;
  const Ratios& w = f.ratios;
  GradSums<T> gs(samples, channels);
  if (f.x3.numel()) {
    GradSumsArgs<T> sargs{g.data_ptr<T>(), f.x3.data_ptr<T>(), s.mean_in,
                          gs.s1, gs.s2, spatial};
    run_rows(sargs, rows, spatial);
  } else {
    std::fill_n(gs.s1, 2 * rows, T(0));
  }
  const ChannelRatios<T> cw(w, channels, using_bn);
  T* const per_c[4] = {grad_weight.data_ptr<T>(), grad_bias.data_ptr<T>(),
                       gs.d_mu_c, gs.d_var_c};
  const GradReduceArgs<T> rargs{
      gs.s1, gs.s2, s.mu, s.rstd, weight.data_ptr<T>(), s.mean_in, s.var_in,
      s.ln_mean, s.ln_var, using_bn ? bn_mean : gs.zeros_c, cw.wm_ln(),
      cw.wv_ln(), channels, gs.d_mu_n, gs.d_var_n, nullptr, w.groups > 1};
  grad_reductions_into(rargs, samples, per_c, gs.dots);
  ratio_grads(gs, bn_var, channels, using_bn, w, d_wm, d_wv);
  through_shared_stats(gs, f, cw, samples, channels, bn_grad);
  if (!f.x3.numel()) return;
  InputGradArgs<T> iargs{
      g.data_ptr<T>(), f.x3.data_ptr<T>(), gs.s1, gs.s2, s.mu, s.rstd,
      weight.data_ptr<T>(), s.mean_in, gs.d_var_n, gs.d_mu_n, s.ln_mean,
      gs.d_var_c, gs.d_mu_c, bn_grad ? bn_mean : gs.zeros_c, cw.wm_in(),
      cw.wv_in(),
      static_cast<T>(2.0 / std::max<int64_t>(spatial - f.correction, 1)),
      grad_x.data_ptr<T>(), channels, spatial};
  run_rows(iargs, rows, spatial);
}

// From d loss / d ratio to the logits' gradient (through the softmax; as it
// is for given ratios), group by group; fixed ratios and an IN logit that
// took no part get zeros. `row`: 0 for the mean's, 1 for the variance's.
at::Tensor logit_grad(const std::vector<double>& r,
                      const std::vector<double>& d, const at::Tensor& logits,
                      const std::vector<bool>& is_fixed, int row,
                      int64_t groups, bool has_in, bool ratios_given) {
  auto out = at::zeros(logits.sizes(), logits.options());
  const int64_t k = logits.numel() / groups,
                used = static_cast<int64_t>(r.size()) / groups;
  const int64_t off = has_in ? 0 : 1;
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "logit_grad", [&] {
    scalar_t* p = out.data_ptr<scalar_t>();
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

// The backward pass: gradients of x, weight, bias and the two logit (or,
// with ratios_given, ratio) tensors.
variable_list backward_impl(const at::Tensor& grad_y, const Forward& f,
                            const at::Tensor& weight,
                            const at::Tensor& mean_logits,
                            const std::vector<bool>& is_fixed,
                            bool using_bn, bool ratios_given) {
  const auto dtype = f.x3.scalar_type();
  auto g = grad_y.reshape(f.x3.sizes());
  if (g.scalar_type() != dtype) g = g.to(dtype);
  if (!g.is_contiguous()) g = g.contiguous();
  const auto w_c = weight.contiguous();
  auto grad_x = at::empty_like(f.x3);
  auto grad_weight = at::empty({f.x3.size(1)}, f.x3.options());
  auto grad_bias = at::empty_like(grad_weight);
  std::vector<double> d_wm, d_wv;
  AT_DISPATCH_FLOATING_TYPES(dtype, "switchable_norm_backward", [&] {
    backward_pass<scalar_t>(g, f, w_c, using_bn, grad_x, grad_weight,
                            grad_bias, d_wm, d_wv);
  });
  const Ratios& w = f.ratios;
  return {grad_x.view(grad_y.sizes()), grad_weight, grad_bias,
          logit_grad(w.mean, d_wm, mean_logits, is_fixed, 0, w.groups,
                     w.has_in, ratios_given),
          logit_grad(w.var, d_wv, mean_logits, is_fixed, 1, w.groups,
                     w.has_in, ratios_given)};
}

// The reference's output (sn_mm::switchable_norm_reference, PyTorch ops
// registered from Python), for a backward that records a graph
// (create_graph=True): differentiating it gives exact higher derivatives.
at::Tensor reference_output(const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias,
                            const at::Tensor& mean_logits,
                            const at::Tensor& var_logits,
                            const OptTensor& bn_mean, const OptTensor& bn_var,
                            const OptTensor& fixed,
                            const OptTensor& fixed_ratios, bool batch_stats,
                            double eps, bool unbiased, bool ratios_given) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("sn_mm::switchable_norm_reference", "")
          .typed<at::Tensor(
              const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const at::Tensor&, const at::Tensor&, const OptTensor&,
              const OptTensor&, const OptTensor&, const OptTensor&, bool,
              double, bool, bool)>();
  return op.call(x, weight, bias, mean_logits, var_logits, bn_mean, bn_var,
                 fixed, fixed_ratios, batch_stats, eps, unbiased,
                 ratios_given);
}

OptTensor optional_of(const at::Tensor& t) {
  return t.defined() ? OptTensor(t) : c10::nullopt;
}

// A forward's flags and ratios as one list of doubles (ctx->saved_data),
// and back.
std::vector<double> pack_meta(const Forward& f, bool training, bool unbiased,
                              bool ratios_given, bool using_bn, double eps) {
  std::vector<double> meta = {
      double(training), double(unbiased), double(ratios_given),
      double(using_bn), double(f.bn_batch), double(f.ratios.has_in), eps,
      double(f.correction), f.total, double(f.ratios.mean.size())};
  meta.insert(meta.end(), f.ratios.mean.begin(), f.ratios.mean.end());
  meta.insert(meta.end(), f.ratios.var.begin(), f.ratios.var.end());
  return meta;
}

Forward unpack_meta(const std::vector<double>& meta, const at::Tensor& x,
                    const at::Tensor& ws) {
  Forward f;
  f.x3 = rows_of(x);
  f.ws = ws;
  f.bn_batch = meta[4] != 0;
  f.ratios.has_in = meta[5] != 0;
  f.ratios.k_ln = f.ratios.has_in ? 1 : 0;
  f.correction = static_cast<int64_t>(meta[7]);
  f.total = meta[8];
  const size_t k_mean = static_cast<size_t>(meta[9]);
  f.ratios.mean.assign(meta.begin() + 10, meta.begin() + 10 + k_mean);
  f.ratios.var.assign(meta.begin() + 10 + k_mean, meta.end());
  return f;
}

class SwitchableNormOp : public torch::autograd::Function<SwitchableNormOp> {
 public:
  static variable_list forward(
      AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
      const at::Tensor& bias, const at::Tensor& mean_logits,
      const at::Tensor& var_logits, const OptTensor& running_mean,
      const OptTensor& running_var, const OptTensor& num_batches_tracked,
    const OptTensor& nonfinite,
      const OptTensor& fixed, const OptTensor& fixed_ratios, bool training,
      double momentum, double eps, bool unbiased, bool ratios_given) {
    at::AutoDispatchBelowADInplaceOrView guard;
    Forward f = forward_impl(x, weight, bias, mean_logits, var_logits,
                             running_mean, running_var, num_batches_tracked,
                             nonfinite, fixed, fixed_ratios, training, momentum, eps,
                             unbiased, ratios_given, true);
    ctx->save_for_backward(
        {x, weight, bias, mean_logits, var_logits, f.ws,
         fixed.value_or(at::Tensor()), fixed_ratios.value_or(at::Tensor())});
    ctx->saved_data["meta"] = pack_meta(f, training, unbiased, ratios_given,
                                        defined(running_mean), eps);
    return {f.y};
  }

  static variable_list backward(AutogradContext* ctx,
                                variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const auto meta = ctx->saved_data["meta"].toDoubleList().vec();
    const bool ratios_given = meta[2] != 0, using_bn = meta[3] != 0;
    variable_list result(16);
    const auto& grad_y = grad_outputs[0];
    if (!grad_y.defined()) return result;
    if (at::GradMode::is_enabled()) return recorded_backward(ctx, grad_y);
    Forward f = unpack_meta(meta, saved[0], saved[5]);
    f.ratios.groups = ratio_groups(saved[3]);
    auto grads = backward_impl(grad_y, f, saved[1], saved[3],
                               read_fixed(optional_of(saved[6]),
                                          f.ratios.groups),
                               using_bn, ratios_given);
    for (int i = 0; i < 5; ++i)
      if (ctx->needs_input_grad(i)) result[i] = grads[i];
    return result;
  }

  // A graph of the gradient is wanted: differentiate a recomputed forward of
  // the reference. (The BN statistics kept are constants to the output where
  // the running ones stood in; elsewhere the reference recomputes them.)
  static variable_list recorded_backward(AutogradContext* ctx,
                                         const at::Tensor& grad_y) {
    auto saved = ctx->get_saved_variables();
    const auto meta = ctx->saved_data["meta"].toDoubleList().vec();
    const bool training = meta[0] != 0, unbiased = meta[1] != 0,
               ratios_given = meta[2] != 0, using_bn = meta[3] != 0;
    const int64_t samples = saved[0].size(0), channels = saved[0].size(1);
    OptTensor bn_mean, bn_var;
    if (using_bn) {
      const int64_t at = Stats<float>::bn_offset(samples, channels);
      bn_mean = saved[5].narrow(0, at, channels);
      bn_var = saved[5].narrow(0, at + channels, channels);
    }
    auto y = reference_output(saved[0], saved[1], saved[2], saved[3],
                              saved[4], bn_mean, bn_var,
                              optional_of(saved[6]), optional_of(saved[7]),
                              training && samples > 0, meta[6], unbiased,
                              ratios_given);
    variable_list wanted, result(16);
    std::vector<int> where;
    for (int i = 0; i < 5; ++i)
      if (ctx->needs_input_grad(i)) {
        wanted.push_back(saved[i]);
        where.push_back(i);
      }
    auto grads = torch::autograd::grad({y}, wanted, {grad_y},
                                       /*retain_graph=*/true,
                                       /*create_graph=*/true,
                                       /*allow_unused=*/true);
    for (size_t j = 0; j < where.size(); ++j)
      result[where[j]] =
          grads[j].defined() ? grads[j] : at::zeros_like(wanted[j]);
    return result;
  }
};

at::Tensor switchable_norm_cpu(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
    const at::Tensor& mean_logits, const at::Tensor& var_logits,
    const OptTensor& running_mean, const OptTensor& running_var,
    const OptTensor& num_batches_tracked,
    const OptTensor& nonfinite, const OptTensor& fixed,
    const OptTensor& fixed_ratios, bool training, double momentum,
    double eps, bool unbiased, bool ratios_given) {
  return forward_impl(x, weight, bias, mean_logits, var_logits, running_mean,
                      running_var, num_batches_tracked, nonfinite, fixed, fixed_ratios,
                      training, momentum, eps, unbiased, ratios_given, false)
      .y;
}

at::Tensor switchable_norm_autograd(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
    const at::Tensor& mean_logits, const at::Tensor& var_logits,
    const OptTensor& running_mean, const OptTensor& running_var,
    const OptTensor& num_batches_tracked,
    const OptTensor& nonfinite, const OptTensor& fixed,
    const OptTensor& fixed_ratios, bool training, double momentum,
    double eps, bool unbiased, bool ratios_given) {
  const bool any_grad = x.requires_grad() || weight.requires_grad() ||
                        bias.requires_grad() || mean_logits.requires_grad() ||
                        var_logits.requires_grad();
  if (!(at::GradMode::is_enabled() && any_grad)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return switchable_norm_cpu(x, weight, bias, mean_logits, var_logits,
                               running_mean, running_var,
                               num_batches_tracked, nonfinite, fixed, fixed_ratios,
                               training, momentum, eps, unbiased,
                               ratios_given);
  }
  return SwitchableNormOp::apply(x, weight, bias, mean_logits, var_logits,
                                 running_mean, running_var,
                                 num_batches_tracked, nonfinite, fixed, fixed_ratios,
                                 training, momentum, eps, unbiased,
                                 ratios_given)[0];
}

}  // namespace

TORCH_LIBRARY_IMPL(sn_mm, CPU, m) {
  m.impl("switchable_norm", &switchable_norm_cpu);
}

TORCH_LIBRARY_IMPL(sn_mm, AutogradCPU, m) {
  m.impl("switchable_norm", &switchable_norm_autograd);
}

// Importing the module (sn_mm._ext) is what registers the kernels above.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "SN's CPU kernels, registered as sn_mm::switchable_norm";
}
