// Switchable Whitening's full-size passes over rows (B, c, L): each block
// b is a whitening group of one sample, c rows of L values, and each pass
// a product of c x c matrices with blocks, at K = c, where MKL's batched
// GEMM takes 2-4x the time of a copy on AMD CPUs. Here a block's rows stay
// in the caches between its two reads, the centring is done in registers
// (the centred rows are never written), and the input's gradient is one
// pass. SW with and without them: docs/performance.md, Switchable
// Whitening. Included by reduction_kernels_impl.h, once per instruction set.
#pragma once

namespace {

using sn_mm_rows::SwApplyArgs;
using sn_mm_rows::SwMomentsArgs;
using sn_mm_rows::SwProductsArgs;

// The transform's register tile: kSwRows output rows by kSwVectors column
// vectors. AVX-512 broadcasts a matrix factor inside its FMA: one vector of
// 16 rows (16 of its 32 registers). AVX2 and SSE2 load each broadcast
// separately, so three vectors share it (4 x 3 of their 16 registers:
// 0.78-0.86x the time of 8 x 1 in cache and at 8x256x56x56, AVX2, alternating
// rounds; 8 x 2 and 8 x 3 did not pay under AVX-512).
constexpr int kSwRows = kRegisterBytes == 64 ? 16 : 4;
constexpr int kSwVectors = kRegisterBytes == 64 ? 1 : 3;
// The products' tiles: kSwProductRows x 4, 16 accumulators under AVX-512;
// 8 under AVX2 and SSE2, where 4 x 4 spills (2 x 4: 0.86-0.93x its time in
// cache and at 8x256x56x56, AVX2, alternating rounds).
constexpr int kSwProductRows = kRegisterBytes == 64 ? 4 : 2;
// Columns a product tile sums before folding its lanes (the block's rows
// at them stay in L2 between the tiles; 256 folded too often, 1024-8192
// read alike at 8x256x56x56 and 2x256x200x304).
constexpr int64_t kSwChunk = 4096;
// How far ahead (values) the transform's loads are prefetched: it reads c
// rows at once, more streams than the hardware prefetchers follow.
constexpr int64_t kSwPrefetch = 64;

template <typename T>
using SwVec = typename Vec<T, kLanes<T>>::type;

// acc[r][v] += the sum over k of m[k][r] (in[k] - shift[k]) at the V
// column vectors from l, for R rows (shift zero where not given). m is the
// matrix transposed (column k of the product at m + k * c), so that the R
// factors of one k are one row apart: one address register for them all.
template <int R, int V, typename T>
SN_INLINE void sw_apply_term(SwVec<T> (*acc)[V], const T* m, const T* in,
                             const T* shift, int64_t c, int64_t L, int64_t l) {
  for (int64_t k = 0; k < c; ++k) {
    SwVec<T> v[V];
#pragma GCC unroll 4
    for (int u = 0; u < V; ++u) {
      __builtin_prefetch(in + k * L + l + u * kLanes<T> + kSwPrefetch);
      v[u] = load<kLanes<T>>(in + k * L + l + u * kLanes<T>);
      if (shift) v[u] -= shift[k];
    }
    const T* column = m + k * c;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const T factor = column[r];
#pragma GCC unroll 4
      for (int u = 0; u < V; ++u) acc[r][u] += factor * v[u];
    }
  }
}

// Rows [i, i + R) of one block's output at the V column vectors from l.
template <int R, int V, typename T>
SN_INLINE void sw_apply_tile(const SwApplyArgs<T>& a, int64_t b, int64_t i,
                             int64_t l) {
  const int64_t c = a.c, L = a.length, block = b * c * L, mats = b * c * c;
  SwVec<T> acc[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < V; ++u)
      acc[r][u] = SwVec<T>{} + (a.bias ? a.bias[b * c + i + r] : T(0));
  sw_apply_term<R, V>(acc, a.m1 + mats + i, a.in1 + block,
                      a.shift1 ? a.shift1 + b * c : nullptr, c, L, l);
  if (a.m2)
    sw_apply_term<R, V>(acc, a.m2 + mats + i, a.in2 + block, a.shift2 + b * c,
                        c, L, l);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < V; ++u)
      store<kLanes<T>>(a.out + block + (i + r) * L + l + u * kLanes<T>,
                       acc[r][u]);
}

// The rows of one block at the V column vectors from l: tiles of kSwRows,
// then of 4 and 1.
template <int V, typename T>
SN_INLINE void sw_apply_columns(const SwApplyArgs<T>& a, int64_t b,
                                int64_t l) {
  int64_t i = 0;
  for (; i + kSwRows <= a.c; i += kSwRows)
    sw_apply_tile<kSwRows, V>(a, b, i, l);
  for (; i + 4 <= a.c; i += 4) sw_apply_tile<4, V>(a, b, i, l);
  for (; i < a.c; ++i) sw_apply_tile<1, V>(a, b, i, l);
}

// out = m1^T (in1 - shift1) + m2^T (in2 - shift2) + bias, blocks [b0, b1):
// the transform in forward, the input's gradient in backward. Column
// vectors outer, so that the block's c rows at them stay in L1 between
// the row tiles.
template <typename T>
void sw_apply_kernel(const SwApplyArgs<T>& a, int64_t b0, int64_t b1) {
  constexpr int W = kLanes<T>, step = kSwVectors * W;
  const int64_t c = a.c, L = a.length, whole = L - L % W;
  for (int64_t b = b0; b < b1; ++b) {
    int64_t l = 0;
    for (; l + step <= whole; l += step) sw_apply_columns<kSwVectors>(a, b, l);
    for (; l < whole; l += W) sw_apply_columns<1>(a, b, l);
    const int64_t block = b * c * L, mats = b * c * c;
    for (int64_t l = whole; l < L; ++l)
      for (int64_t i = 0; i < c; ++i) {
        T s = a.bias ? a.bias[b * c + i] : T(0);
        for (int64_t k = 0; k < c; ++k) {
          const T x = a.in1[block + k * L + l];
          s += a.m1[mats + k * c + i] *
               (a.shift1 ? x - a.shift1[b * c + k] : x);
          if (a.m2)
            s += a.m2[mats + k * c + i] *
                 (a.in2[block + k * L + l] - a.shift2[b * c + k]);
        }
        a.out[block + i * L + l] = s;
      }
  }
}

// out[r][s] (+)= the sum over [l0, l1) of (x[r] - x_shift[r]) (y[s] -
// y_shift[s]) (x_shift zero where not given), for RA rows of x and RB of y
// (row stride c in out), assigned for the first columns (l0 == 0).
template <int RA, int RB, typename T>
SN_INLINE void sw_product_tile(const T* x, const T* x_shift, const T* y,
                               const T* y_shift, int64_t L, int64_t l0,
                               int64_t l1, int64_t c, T* out) {
  SwVec<T> acc[RA][RB] = {};
  for (int64_t l = l0; l < l1; l += kLanes<T>) {
    SwVec<T> vx[RA], vy[RB];
#pragma GCC unroll 4
    for (int r = 0; r < RA; ++r) {
      vx[r] = load<kLanes<T>>(x + r * L + l);
      if (x_shift) vx[r] -= x_shift[r];
    }
#pragma GCC unroll 4
    for (int s = 0; s < RB; ++s)
      vy[s] = load<kLanes<T>>(y + s * L + l) - y_shift[s];
#pragma GCC unroll 4
    for (int r = 0; r < RA; ++r)
#pragma GCC unroll 4
      for (int s = 0; s < RB; ++s) acc[r][s] += vx[r] * vy[s];
  }
  for (int r = 0; r < RA; ++r)
    for (int s = 0; s < RB; ++s) {
      T lanes[kLanes<T>];
      store<kLanes<T>>(lanes, acc[r][s]);
      out[r * c + s] = (l0 ? out[r * c + s] : T(0)) + fold<kLanes<T>>(lanes);
    }
}

// out (c x c) = (x - x_shift)(y - y_shift)^T of one block, in tiles of
// kSwProductRows x 4 (single pairs at the edges where they do not divide
// c); only the tiles that reach the diagonal or above where `symmetric` (x
// and y the same rows).
template <typename T>
void sw_products(const T* x, const T* x_shift, const T* y, const T* y_shift,
                 int64_t c, int64_t L, bool symmetric, T* out) {
  constexpr int RA = kSwProductRows, RB = 4;
  const int64_t whole = L - L % kLanes<T>;
  for (int64_t l0 = 0; l0 < whole; l0 += kSwChunk) {
    const int64_t l1 = min_of(whole, l0 + kSwChunk);
    for (int64_t i = 0; i < c; i += RA)
      for (int64_t j = symmetric ? i - i % RB : 0; j < c; j += RB) {
        if (i + RA <= c && j + RB <= c) {
          sw_product_tile<RA, RB>(x + i * L, x_shift ? x_shift + i : nullptr,
                                  y + j * L, y_shift + j, L, l0, l1, c,
                                  out + i * c + j);
          continue;
        }
        for (int64_t r = i; r < min_of(c, i + RA); ++r)
          for (int64_t s = j; s < min_of(c, j + RB); ++s)
            sw_product_tile<1, 1>(x + r * L, x_shift ? x_shift + r : nullptr,
                                  y + s * L, y_shift + s, L, l0, l1, c,
                                  out + r * c + s);
      }
  }
  for (int64_t i = 0; i < c; ++i)
    for (int64_t j = symmetric ? i : 0; j < c; ++j) {
      T t = 0;
      for (int64_t l = whole; l < L; ++l)
        t += (x[i * L + l] - (x_shift ? x_shift[i] : T(0))) *
             (y[j * L + l] - y_shift[j]);
      out[i * c + j] = (whole ? out[i * c + j] : T(0)) + t;
      if (symmetric) out[j * c + i] = out[i * c + j];
    }
}

// Per block: row means, then the covariance of the centred rows (biased);
// the rows are read from memory once, the second time from the caches.
template <typename T>
void sw_moments_kernel(const SwMomentsArgs<T>& a, int64_t b0, int64_t b1) {
  const int64_t c = a.c, L = a.length;
  for (int64_t b = b0; b < b1; ++b) {
    const T* x = a.x + b * c * L;
    T *mean = a.mean + b * c, *cov = a.cov + b * c * c;
    for (int64_t k = 0; k < c; ++k) {
      const T first = x[k * L];
      mean[k] = first + row_reduce<kLanes<T>, T>(L, [&](int64_t l) {
                          return x[k * L + l] - first;
                        }) / T(L);
    }
    sw_products(x, mean, x, mean, c, L, true, cov);
    for (int64_t k = 0; k < c * c; ++k) cov[k] /= T(L);
  }
}

// Per block: out = g (x - shift)^T and each row's sum of g.
template <typename T>
void sw_products_kernel(const SwProductsArgs<T>& a, int64_t b0, int64_t b1) {
  const int64_t c = a.c, L = a.length;
  for (int64_t b = b0; b < b1; ++b) {
    const T *g = a.g + b * c * L, *x = a.x + b * c * L;
    for (int64_t k = 0; k < c; ++k)
      a.g_sum[b * c + k] =
          row_reduce<kLanes<T>, T>(L, [&](int64_t l) { return g[k * L + l]; });
    sw_products<T>(g, nullptr, x, a.shift + b * c, c, L, false,
                   a.out + b * c * c);
  }
}

}  // namespace
