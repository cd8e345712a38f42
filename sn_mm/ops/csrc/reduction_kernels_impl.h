// The (N, C) reductions between the row passes (per sample, over its C
// statistics) and the table of one instruction set's kernels, on
// row_kernels_impl.h's vector helpers; row_kernels_<isa>.cpp compiles it
// once per instruction set.
#pragma once

#include "row_kernels_impl.h"

namespace {

// Per sample, loops over its C statistics, summed in double a register at a
// time: explicit vectors, as the auto-vectoriser keeps running sums scalar
// (it may not reorder floating-point additions).
constexpr int kDL = kLanes<double>;
using DV = Vec<double, kDL>::type;

template <typename T>
SN_INLINE DV load_d(const T* p) {
  return __builtin_convertvector(load<kDL>(p), DV);
}

SN_INLINE void add_to(double* p, DV v) { store<kDL>(p, load<kDL>(p) + v); }

// The sum of a DV's lanes (once per sample: a scalar fold will do).
SN_INLINE double lanes_sum(DV v) {
  double lanes[kDL];
  store<kDL>(lanes, v);
  return fold<kDL>(lanes);
}

// The sum of term(c), a DV of the kDL values from c, over c = 0, kDL, ...
// below end (a multiple of kDL), in kSums running sums, so that the adds
// do not wait on each other's latency.
constexpr int kSums = 4;
template <typename F>
SN_INLINE DV sum_vectors(int64_t end, const F& term) {
  DV s[kSums] = {};
  int64_t c = 0;
  for (; c + kSums * kDL <= end; c += kSums * kDL)
#pragma GCC unroll 4
    for (int k = 0; k < kSums; ++k) s[k] += term(c + k * kDL);
  for (; c < end; c += kDL) s[0] += term(c);
  for (int k = 1; k < kSums; ++k) s[0] += s[k];
  return s[0];
}

// Per sample: LN's mean and its variance in the stable form mean_c(var_in)
// + mean_c((mean_in - mean_ln)^2).
template <typename T>
void ln_stats_kernel(const LnStatsArgs<T>& a, int64_t begin, int64_t end) {
  const int64_t C = a.channels, CV = C - C % kDL;
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
    const DV sm = sum_vectors(CV, mean_at);
    const DV sv = sum_vectors(CV, [&](int64_t c) { return load_d(v + c); });
    double tm = 0, tv = 0;
    if (col)
      for (int64_t c = 0; c < CV; c += kDL) {
        add_to(col + c, load_d(m + c));
        add_to(col + C + c, load_d(v + c));
      }
    for (int64_t c = CV; c < C; ++c) {
      tm += mean_of(c);
      tv += v[c];
      if (col) {
        col[c] += m[c];
        col[C + c] += v[c];
      }
    }
    const double mean = (lanes_sum(sm) + tm) / C;
    const DV sd = sum_vectors(CV, [&](int64_t c) {
      const DV d = mean_at(c) - mean;
      return d * d;
    });
    double td = 0;
    for (int64_t c = CV; c < C; ++c)
      td += (mean_of(c) - mean) * (mean_of(c) - mean);
    const double var = (lanes_sum(sv) + tv + lanes_sum(sd) + td) / C;
    a.ln_mean[n] = static_cast<T>(mean);
    a.ln_var[n] = static_cast<T>(var);
  }
}

template <typename T>
void bn_dev_kernel(const BnDevArgs<T>& a, int64_t begin, int64_t end) {
  const int64_t C = a.channels, CV = C - C % kDL;
  for (int64_t n = begin; n < end; ++n) {
    const T* m = a.mean_in + n * C;
    for (int64_t c = 0; c < CV; c += kDL) {
      const DV d = load_d(m + c) - load<kDL>(a.centre + c);
      add_to(a.col + c, d * d);
    }
    for (int64_t c = CV; c < C; ++c) {
      const double d = m[c] - a.centre[c];
      a.col[c] += d * d;
    }
  }
}

// Per sample, from the row sums (grad_reductions_into, sn_backward.cpp): the
// sums over c of d_mu and d_var weighted by each channel's LN ratio (a
// group's sums, then times its ratio), and into acc the per-channel sums.
template <typename T>
void grad_reduce_kernel(const GradReduceArgs<T>& a, int64_t begin,
                        int64_t end) {
  const int64_t C = a.channels;
  double* acc = a.acc;
  for (int64_t n = begin; n < end; ++n) {
    const int64_t o = n * C;
    const double ml = a.mean_ln[n], vl = a.var_ln[n];
    DV dots[4] = {};
    double t_dots[4] = {}, d_mu_n = 0, d_var_n = 0;
    for_each_group(a.w, 0, C, [&](int64_t cb, int64_t ce, const T* w) {
      DV group_mu = {}, group_var = {};
      double t_mu = 0, t_var = 0;
      int64_t c = cb;
      for (; c + kDL <= ce; c += kDL) {
        const DV s1 = load_d(a.s1 + o + c), r = load_d(a.rstd + o + c),
                 mi = load_d(a.mean_in + o + c);
        const DV centred =
            load_d(a.s2 + o + c) - (load_d(a.mu + o + c) - mi) * s1;
        const DV scale = load_d(a.weight + c) * r;
        const DV d_mu = -scale * s1;
        const DV d_var = -0.5 * scale * r * r * centred;
        add_to(acc + c, centred * r);
        add_to(acc + C + c, s1);
        add_to(acc + 2 * C + c, d_mu);
        add_to(acc + 3 * C + c, d_var);
        const DV products[4] = {d_mu * (ml - mi),
                                d_mu * (load_d(a.mean_c + c) - mi),
                                d_var * load_d(a.var_in + o + c), d_var * vl};
        for (int j = 0; j < 4; ++j) {
          if (a.per_channel)
            add_to(acc + (4 + j) * C + c, products[j]);
          else
            dots[j] += products[j];
        }
        group_mu += d_mu;
        group_var += d_var;
      }
      for (; c < ce; ++c) {
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
        t_mu += d_mu;
        t_var += d_var;
      }
      d_mu_n += w[sn_mm_rows::kWmLn] * (lanes_sum(group_mu) + t_mu);
      d_var_n += w[sn_mm_rows::kWvLn] * (lanes_sum(group_var) + t_var);
    });
    if (!a.per_channel)
      for (int j = 0; j < 4; ++j)
        acc[4 * C + j] += lanes_sum(dots[j]) + t_dots[j];
    a.d_mu_n[n] = static_cast<T>(d_mu_n);
    a.d_var_n[n] = static_cast<T>(d_var_n);
  }
}

// The table of this instruction set's kernels (each an out-of-line
// function; what they call is inlined into them).
template <typename T>
constexpr sn_mm_rows::KernelSet<T> kernel_set() {
  return {&moments_kernel<T>,    &grad_sums_kernel<T>, &normalize_kernel<T>,
          &input_grad_kernel<T>, &ln_stats_kernel<T>,  &bn_dev_kernel<T>,
          &grad_reduce_kernel<T>};
}

}  // namespace

// Defines sn_mm_rows::row_kernels_<name>() returning this compilation's
// table.
#define SN_DEFINE_ROW_KERNELS(name)                                \
  const sn_mm_rows::RowKernels* sn_mm_rows::row_kernels_##name() { \
    static constexpr RowKernels table{#name, kernel_set<float>(),  \
                                      kernel_set<double>()};       \
    return &table;                                                 \
  }
