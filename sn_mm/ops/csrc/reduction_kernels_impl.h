// The (N, C) reductions between the row passes, per sample over its C
// statistics, summed in double: explicit vectors, as the auto-vectoriser
// keeps running sums scalar (it may not reorder floating-point adds).
// Compiled once per instruction set, as row_kernels_impl.h.
#pragma once

#include "row_kernels_impl.h"

namespace {

constexpr int kDL = kLanes<double>;
using DV = Vec<double, kDL>;

template <typename T, typename P>
SN_INLINE DV load_d(const T* p, P part) {
  return __builtin_convertvector(load<kDL>(p, part), DV);
}

SN_INLINE double sum_of(DV* s) {
  for (int k = 1; k < kSums; ++k) s[0] += s[k];
  return lane_sum<double, kDL>(s[0]);
}

// Per sample: LN's mean and its variance in the stable form mean_c(var_in)
// + mean_c((mean_in - mean_ln)^2).
template <typename T>
SN_KERNEL void ln_stats_kernel(const LnStatsArgs<T>& a, int64_t begin,
                               int64_t end) {
  const int64_t C = a.channels;
  for (int64_t n = begin; n < end; ++n) {
    const T* m = (a.dmean ? a.dmean : a.mean_in) + n * C;
    const T* v = a.var_in + n * C;
    // The absolute means in double: m plus the shift where there is one.
    const auto mean_at = [&](int64_t c, auto part) {
      const DV d = load_d(m + c, part);
      return a.shift ? load_d(a.shift + c, part) + d : d;
    };
    DV sm[kSums] = {}, sv[kSums] = {}, sd[kSums] = {};
    over_row<kDL, kSums>(C, [&](int64_t c, auto part, int u) {
      sm[u] += keep<kDL>(mean_at(c, part), part);
      sv[u] += keep<kDL>(load_d(v + c, part), part);
      if (a.col) {
        add_to<kDL>(a.col + c, load_d(m + c, part), part);
        add_to<kDL>(a.col + C + c, load_d(v + c, part), part);
      }
    });
    const double mean = sum_of(sm) / C;
    over_row<kDL, kSums>(C, [&](int64_t c, auto part, int u) {
      const DV d = keep<kDL>(mean_at(c, part) - mean, part);
      sd[u] += d * d;
    });
    a.ln_mean[n] = static_cast<T>(mean);
    a.ln_var[n] = static_cast<T>((sum_of(sv) + sum_of(sd)) / C);
  }
}

template <typename T>
SN_KERNEL void bn_dev_kernel(const BnDevArgs<T>& a, int64_t begin,
                             int64_t end) {
  for (int64_t n = begin; n < end; ++n) {
    const T* m = a.mean_in + n * a.channels;
    over_row<kDL, 1>(a.channels, [&](int64_t c, auto part, int) {
      const DV d = load_d(m + c, part) - load<kDL>(a.centre + c, part);
      add_to<kDL>(a.col + c, d * d, part);
    });
  }
}

// Per sample, from the row sums (grad_reductions_into, sn_backward.cpp):
// the sums over c of d_mu and d_var weighted by each channel's LN ratio (a
// group's sums, then times its ratio), and into acc the per-channel sums.
template <typename T>
SN_KERNEL void grad_reduce_kernel(const GradReduceArgs<T>& a, int64_t begin,
                                  int64_t end) {
  const int64_t C = a.channels, per_group = a.w.group_channels;
  double* acc = a.acc;
  for (int64_t n = begin; n < end; ++n) {
    const int64_t o = n * C;
    const double ml = a.mean_ln[n], vl = a.var_ln[n];
    DV dots[4] = {};
    double d_mu_n = 0, d_var_n = 0;
    for (int64_t cb = 0; cb < C; cb += per_group) {
      DV group_mu = {}, group_var = {};
      over_row<kDL, 1>(per_group, [&](int64_t i, auto part, int) {
        const int64_t c = cb + i, r = o + c;
        const DV s1 = load_d(a.s1 + r, part), rs = load_d(a.rstd + r, part),
                 mi = load_d(a.mean_in + r, part);
        const DV centred =
            load_d(a.s2 + r, part) - (load_d(a.mu + r, part) - mi) * s1;
        const DV scale = load_d(a.weight + c, part) * rs;
        const DV d_mu = keep<kDL>(-scale * s1, part);
        const DV d_var = keep<kDL>(-0.5 * scale * rs * rs * centred, part);
        add_to<kDL>(acc + c, centred * rs, part);
        add_to<kDL>(acc + C + c, s1, part);
        add_to<kDL>(acc + 2 * C + c, d_mu, part);
        add_to<kDL>(acc + 3 * C + c, d_var, part);
        const DV products[4] = {
            d_mu * (ml - mi), d_mu * (load_d(a.mean_c + c, part) - mi),
            d_var * load_d(a.var_in + r, part), d_var * vl};
        for (int j = 0; j < 4; ++j) {
          if (a.per_channel)
            add_to<kDL>(acc + (4 + j) * C + c, products[j], part);
          else
            dots[j] += keep<kDL>(products[j], part);
        }
        group_mu += d_mu;
        group_var += d_var;
      });
      const T* w = a.w.of_channel(cb);
      d_mu_n += w[kWmLn] * lane_sum<double, kDL>(group_mu);
      d_var_n += w[kWvLn] * lane_sum<double, kDL>(group_var);
    }
    if (!a.per_channel)
      for (int j = 0; j < 4; ++j)
        acc[4 * C + j] += lane_sum<double, kDL>(dots[j]);
    a.d_mu_n[n] = static_cast<T>(d_mu_n);
    a.d_var_n[n] = static_cast<T>(d_var_n);
  }
}

// The table of this instruction set's kernels (each out of line; what they
// call is inlined into them).
template <typename T>
constexpr KernelSet<T> kernel_set() {
  KernelSet<T> set{};
  set.moments = &moments_kernel<T>;
  set.grad_sums = &grad_sums_kernel<T>;
  set.normalize = &normalize_kernel<T>;
  set.input_grad = &input_grad_kernel<T>;
  set.ln_stats = &ln_stats_kernel<T>;
  set.bn_dev = &bn_dev_kernel<T>;
  set.grad_reduce = &grad_reduce_kernel<T>;
  return set;
}

}  // namespace
