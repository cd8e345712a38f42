// SN's vectors (GCC/clang vector extensions; why not at::vec:
// docs/layer_reference.md#the-cpu-kernels) and the one form every row loop
// takes: whole vectors, then the row's last part through a counted load.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#define SN_INLINE __attribute__((always_inline)) inline
// A kernel: all it calls inlined, lambdas too (the sums stay in registers).
#define SN_KERNEL __attribute__((flatten))

#ifndef SN_REGISTER_BYTES
#error "define SN_REGISTER_BYTES (16, 32 or 64) before including this file"
#endif

namespace {

// Lanes of one of this set's registers (wider vectors GCC splits via the
// stack; its target pragma defines no __AVX2__ to read the width from).
template <typename T>
constexpr int kLanes = SN_REGISTER_BYTES / sizeof(T);

template <typename T, int W>
struct VecOf {
  typedef T type __attribute__((vector_size(sizeof(T) * W)));
  // at any address a T may have (as immintrin.h's __m256_u)
  typedef T unaligned __attribute__((vector_size(sizeof(T) * W),
                                     aligned(alignof(T)), may_alias));
};
template <typename T, int W>
using Vec = typename VecOf<T, W>::type;
// The integer lanes of a T vector, for masks.
template <typename T>
using LaneInt = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;

// A row's last `count` (1 to W - 1) values: in a row of W or more (kBack)
// loaded with those before them, in the last lanes; else copied, first.
template <bool kBack>
struct Part {
  int count;
};
struct Whole {};

template <int W, typename T>
SN_INLINE Vec<T, W> load(const T* p, Whole = {}) {
  return *reinterpret_cast<const typename VecOf<T, W>::unaligned*>(p);
}
template <int W, typename T, bool kBack>
SN_INLINE Vec<T, W> load(const T* p, Part<kBack> part) {
  if constexpr (kBack) return load<W>(p + part.count - W);
  Vec<T, W> v = {};
  for (int k = 0; k < part.count; ++k) v[k] = p[k];
  return v;
}
template <int W, typename T>
SN_INLINE void store(T* p, Vec<T, W> v, Whole = {}) {
  *reinterpret_cast<typename VecOf<T, W>::unaligned*>(p) = v;
}
template <int W, typename T, bool kBack>
SN_INLINE void store(T* p, Vec<T, W> v, Part<kBack> part) {
  if constexpr (kBack) return store<W>(p + part.count - W, v);
  for (int k = 0; k < part.count; ++k) p[k] = v[k];
}

// v with the lanes outside the part zeroed (a bitwise and: a vector ?: is
// not portable between GCC and clang).
template <int W, typename V>
SN_INLINE V keep(V v, Whole) {
  return v;
}
template <typename I, int W, int... K>
SN_INLINE Vec<I, W> lane_numbers(std::integer_sequence<int, K...>) {
  return Vec<I, W>{K...};
}
template <int W, typename V, bool kBack>
SN_INLINE V keep(V v, Part<kBack> part) {
  using I = LaneInt<decltype(v[0] + 0)>;
  const auto lane = lane_numbers<I, W>(std::make_integer_sequence<int, W>());
  if constexpr (kBack) return (V)((Vec<I, W>)v & (lane >= I(W - part.count)));
  return (V)((Vec<I, W>)v & (lane < I(part.count)));
}

// *p += v over the part's lanes.
template <int W, typename T, typename P>
SN_INLINE void add_to(T* p, Vec<T, W> v, P part) {
  store<W>(p, load<W>(p, part) + keep<W>(v, part), part);
}

// body(i, part, u) for each W values of a row of n from i: whole vectors
// U at a time (u, a constant: U sums in registers hide the adds' latency),
// then one at a time (u = 0), then the part left (u = U - 1).
template <int W, typename Body, int... U>
SN_INLINE void vectors(int64_t i, const Body& body,
                       std::integer_sequence<int, U...>) {
  (body(i + U * W, Whole{}, U), ...);
}
template <int W, int U, typename Body>
SN_INLINE void over_row(int64_t n, const Body& body) {
  int64_t i = 0;
  for (; i + U * W <= n; i += U * W)
    vectors<W>(i, body, std::make_integer_sequence<int, U>());
  for (; i + W <= n; i += W) body(i, Whole{}, 0);
  if (i == n) return;  // one test a row (two took 1.05x at 1024x256x14x14)
  if (n >= W) return body(i, Part<true>{int(n - i)}, U - 1);
  body(i, Part<false>{int(n)}, U - 1);
}

template <typename T, int W>
SN_INLINE T lane_sum(Vec<T, W> v) {  // pairwise
  for (int width = W / 2; width > 0; width /= 2)
    for (int k = 0; k < width; ++k) v[k] += v[k + width];
  return v[0];
}

// Lanes I... of a:b (b's numbered after a's); GCC 11 has no
// __builtin_shufflevector.
template <int... I, typename V>
SN_INLINE V shuffle(V a, V b) {
#if defined(__clang__) || __GNUC__ >= 12
  return __builtin_shufflevector(a, b, I...);
#else
  using Lanes = Vec<LaneInt<decltype(a[0] + 0)>, sizeof...(I)>;
  return __builtin_shuffle(a, b, Lanes{I...});
#endif
}

template <typename V, int... I>
SN_INLINE V pair_sums(V a, V b, std::integer_sequence<int, I...>) {
  return shuffle<(2 * I)...>(a, b) + shuffle<(2 * I + 1)...>(a, b);
}

// The lane sums of M vectors v[0..M) into s[0..M): eight by a transposing
// tree of pairwise sums (at W = 8 within 128-bit halves first: one AVX2
// instruction a level); other counts one by one.
template <int M, int W, typename T>
SN_INLINE void lane_sums(Vec<T, W>* v, T* __restrict__ s) {
  if constexpr (M != 8 || W > 8) {
    for (int k = 0; k < M; ++k) s[k] = lane_sum<T, W>(v[k]);
  } else if constexpr (W == 8) {
    Vec<T, W> half[4], quarter[2];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k)  // [a01 a23 b01 b23 | a45 a67 b45 b67]
      half[k] = shuffle<0, 2, 8, 10, 4, 6, 12, 14>(v[2 * k], v[2 * k + 1]) +
                shuffle<1, 3, 9, 11, 5, 7, 13, 15>(v[2 * k], v[2 * k + 1]);
#pragma GCC unroll 2
    for (int k = 0; k < 2; ++k)  // [a0-3 b0-3 c0-3 d0-3 | a4-7 ... d4-7]
      quarter[k] =
          shuffle<0, 2, 8, 10, 4, 6, 12, 14>(half[2 * k], half[2 * k + 1]) +
          shuffle<1, 3, 9, 11, 5, 7, 13, 15>(half[2 * k], half[2 * k + 1]);
    store<W>(s,
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

}  // namespace
