// The CPU operator's forward (sn_forward.cpp) and backward
// (sn_backward.cpp), as the operator's autograd and registration
// (sn_operator.cpp) call them.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sn_mm_cpu {

using OptTensor = c10::optional<at::Tensor>;

inline bool defined(const OptTensor& t) {
  return t.has_value() && t->defined();
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
  // Which vectors are given instead of learned: 2 x G flags (mean's groups,
  // then the variance's), from ratio_fixed (2,) or, for group SN, (2, G).
  std::vector<bool> fixed;
  int64_t terms() const { return static_cast<int64_t>(mean.size()) / groups; }
};

// What backward needs of a forward: the (N, C, L) input, the statistics
// buffer, the ratios mixed with.
struct Forward {
  at::Tensor y, x3, ws;
  Ratios ratios;
  int64_t correction = 0;
  bool bn_batch = false;
};

// The forward pass; with BN in training it also updates the running
// statistics (momentum < 0: the cumulative average) unless the batch is
// empty. for_backward: keep what backward_impl needs in the result.
Forward forward_impl(const at::Tensor& x, const at::Tensor& weight,
                     const at::Tensor& bias, const at::Tensor& mean_logits,
                     const at::Tensor& var_logits,
                     const OptTensor& running_mean,
                     const OptTensor& running_var,
                     const OptTensor& num_batches_tracked,
                     const OptTensor& nonfinite, const OptTensor& fixed,
                     const OptTensor& fixed_ratios, bool training,
                     double momentum, double eps, bool unbiased,
                     bool ratios_given, bool for_backward);

// The backward pass from the forward's saved tensors (x, weight, the
// logits, the statistics buffer ws and the fixed ratios): gradients of x,
// weight, bias and the two logit (or, with ratios_given, ratio) tensors.
std::vector<at::Tensor> backward_impl(
    const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight,
    const at::Tensor& mean_logits, const at::Tensor& var_logits,
    const at::Tensor& ws, const OptTensor& fixed,
    const OptTensor& fixed_ratios, bool using_bn, bool bn_batch, bool unbiased,
    bool ratios_given);

// Where the BN mean (then the variance) sits in Forward::ws.
int64_t bn_offset(int64_t samples, int64_t channels);

// The special paths' calls so far, and their switch (sn_host.cpp), which
// returns whether the path was on.
std::vector<std::pair<std::string, int64_t>> path_counts();
bool set_path(const std::string& name, bool on);

}  // namespace sn_mm_cpu
