// SN's CPU operator, registered as the CPU and AutogradCPU kernels of
// sn_mm::switchable_norm (its schema is in sn_mm/ops/operator.py): a whole
// forward, a whole backward, or an eval forward in one call each
// (sn_passes.cpp), with its autograd here in C++; and the module sn_mm._ext
// whose import registers them. The CPU kernel is the forward without
// autograd (eval, no_grad); the AutogradCPU kernel saves what the backward
// needs, and the backward is one call too. The settings the tests and
// benchmarks use (instruction set, special paths) are operators as well, so
// that the module needs no binding library: torch's autograd and library
// headers compile about a third faster than torch/extension.h.
#include <Python.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "cpu_isa.h"
#include "sn_passes.h"

namespace {

using namespace sn_mm_cpu;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const OptTensor&,
                            const OptTensor&, const OptTensor&,
                            const OptTensor&, bool, double, bool, bool)>();
  return op.call(x, weight, bias, mean_logits, var_logits, bn_mean, bn_var,
                 fixed, fixed_ratios, batch_stats, eps, unbiased,
                 ratios_given);
}

OptTensor optional_of(const at::Tensor& t) {
  return t.defined() ? OptTensor(t) : c10::nullopt;
}

// What a backward needs of its forward besides the saved tensors, in
// ctx->saved_data as three entries (the flags as bits with the correction,
// eps, and the mean's then the variance's ratios, as many of each): each
// entry costs a string hash and an allocation on every training call.
struct SavedFlags {
  bool training, unbiased, ratios_given, using_bn, bn_batch, has_in;
  double eps;
  int64_t correction;
  std::vector<double> mean_ratios, var_ratios;

  static SavedFlags of(const Forward& f, bool training, bool unbiased,
                       bool ratios_given, bool using_bn, double eps) {
    return {training,      unbiased,        ratios_given, using_bn,
            f.bn_batch,    f.ratios.has_in, eps,          f.correction,
            f.ratios.mean, f.ratios.var};
  }

  void save(AutogradContext* ctx) const {
    const bool bits[6] = {training, unbiased, ratios_given,
                          using_bn, bn_batch, has_in};
    int64_t packed = correction << 6;
    for (int i = 0; i < 6; ++i) packed |= int64_t(bits[i]) << i;
    std::vector<double> ratios(mean_ratios);
    ratios.insert(ratios.end(), var_ratios.begin(), var_ratios.end());
    auto& d = ctx->saved_data;
    d["flags"] = packed;
    d["eps"] = eps;
    d["ratios"] = std::move(ratios);
  }

  static SavedFlags load(AutogradContext* ctx) {
    const auto& d = ctx->saved_data;
    const int64_t packed = d.at("flags").toInt();
    const auto bit = [&](int i) { return bool((packed >> i) & 1); };
    const std::vector<double> ratios = d.at("ratios").toDoubleVector();
    const auto half = ratios.begin() + ratios.size() / 2;
    return {bit(0),
            bit(1),
            bit(2),
            bit(3),
            bit(4),
            bit(5),
            d.at("eps").toDouble(),
            packed >> 6,
            std::vector<double>(ratios.begin(), half),
            std::vector<double>(half, ratios.end())};
  }

  // The forward's state a backward runs from.
  Forward forward(const at::Tensor& x, const at::Tensor& ws) const {
    Forward f;
    f.x3 = rows_of(x);
    f.ws = ws;
    f.bn_batch = bn_batch;
    f.ratios.has_in = has_in;
    f.ratios.k_ln = has_in ? 1 : 0;
    f.correction = correction;
    f.ratios.mean = mean_ratios;
    f.ratios.var = var_ratios;
    return f;
  }
};

class SwitchableNormOp : public torch::autograd::Function<SwitchableNormOp> {
 public:
  static variable_list forward(
      AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
      const at::Tensor& bias, const at::Tensor& mean_logits,
      const at::Tensor& var_logits, const OptTensor& running_mean,
      const OptTensor& running_var, const OptTensor& num_batches_tracked,
      const OptTensor& nonfinite, const OptTensor& fixed,
      const OptTensor& fixed_ratios, bool training, double momentum,
      double eps, bool unbiased, bool ratios_given) {
    at::AutoDispatchBelowADInplaceOrView guard;
    Forward f = forward_impl(x, weight, bias, mean_logits, var_logits,
                             running_mean, running_var, num_batches_tracked,
                             nonfinite, fixed, fixed_ratios, training,
                             momentum, eps, unbiased, ratios_given, true);
    ctx->save_for_backward({x, weight, bias, mean_logits, var_logits, f.ws,
                            fixed.value_or(at::Tensor()),
                            fixed_ratios.value_or(at::Tensor())});
    SavedFlags::of(f, training, unbiased, ratios_given, defined(running_mean),
                   eps)
        .save(ctx);
    return {f.y};
  }

  static variable_list backward(AutogradContext* ctx,
                                variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const SavedFlags flags = SavedFlags::load(ctx);
    variable_list result(16);
    const auto& grad_y = grad_outputs[0];
    if (!grad_y.defined()) return result;
    if (at::GradMode::is_enabled()) return recorded_backward(ctx, grad_y);
    Forward f = flags.forward(saved[0], saved[5]);
    f.ratios.groups = ratio_groups(saved[3]);
    auto grads =
        backward_impl(grad_y, f, saved[1], saved[3],
                      read_fixed(optional_of(saved[6]), f.ratios.groups),
                      flags.using_bn, flags.ratios_given);
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
    const SavedFlags flags = SavedFlags::load(ctx);
    const int64_t samples = saved[0].size(0), channels = saved[0].size(1);
    OptTensor bn_mean, bn_var;
    if (flags.using_bn) {
      const int64_t at = bn_offset(samples, channels);
      bn_mean = saved[5].narrow(0, at, channels);
      bn_var = saved[5].narrow(0, at + channels, channels);
    }
    auto y =
        reference_output(saved[0], saved[1], saved[2], saved[3], saved[4],
                         bn_mean, bn_var, optional_of(saved[6]),
                         optional_of(saved[7]), flags.training && samples > 0,
                         flags.eps, flags.unbiased, flags.ratios_given);
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
    const OptTensor& num_batches_tracked, const OptTensor& nonfinite,
    const OptTensor& fixed, const OptTensor& fixed_ratios, bool training,
    double momentum, double eps, bool unbiased, bool ratios_given) {
  return forward_impl(x, weight, bias, mean_logits, var_logits, running_mean,
                      running_var, num_batches_tracked, nonfinite, fixed,
                      fixed_ratios, training, momentum, eps, unbiased,
                      ratios_given, false)
      .y;
}

at::Tensor switchable_norm_autograd(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
    const at::Tensor& mean_logits, const at::Tensor& var_logits,
    const OptTensor& running_mean, const OptTensor& running_var,
    const OptTensor& num_batches_tracked, const OptTensor& nonfinite,
    const OptTensor& fixed, const OptTensor& fixed_ratios, bool training,
    double momentum, double eps, bool unbiased, bool ratios_given) {
  const bool any_grad = x.requires_grad() || weight.requires_grad() ||
                        bias.requires_grad() || mean_logits.requires_grad() ||
                        var_logits.requires_grad();
  if (!(at::GradMode::is_enabled() && any_grad)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return switchable_norm_cpu(x, weight, bias, mean_logits, var_logits,
                               running_mean, running_var, num_batches_tracked,
                               nonfinite, fixed, fixed_ratios, training,
                               momentum, eps, unbiased, ratios_given);
  }
  return SwitchableNormOp::apply(
      x, weight, bias, mean_logits, var_logits, running_mean, running_var,
      num_batches_tracked, nonfinite, fixed, fixed_ratios, training, momentum,
      eps, unbiased, ratios_given)[0];
}

}  // namespace

TORCH_LIBRARY_IMPL(sn_mm, CPU, m) {
  m.impl("switchable_norm", &switchable_norm_cpu);
}

TORCH_LIBRARY_IMPL(sn_mm, AutogradCPU, m) {
  m.impl("switchable_norm", &switchable_norm_autograd);
}

// The settings, for tests and benchmarks (sn_mm.ops.cpu_isa and its
// neighbours in operator.py call them).
TORCH_LIBRARY_FRAGMENT(sn_mm, m) {
  m.def("cpu_isa() -> str", []() { return std::string(kernels().isa); });
  m.def("cpu_isas() -> str[]", &cpu_isas);
  m.def("set_cpu_isa(str name) -> ()",
        [](std::string name) { set_cpu_isa(name); });
  m.def("cpu_path_counts() -> (str[], int[])", []() {
    std::tuple<std::vector<std::string>, std::vector<int64_t>> counts;
    for (const auto& [path, calls] : path_counts()) {
      std::get<0>(counts).push_back(path);
      std::get<1>(counts).push_back(calls);
    }
    return counts;
  });
  m.def(
      "set_cpu_path(str name, bool enabled) -> bool",
      [](std::string name, bool enabled) { return set_path(name, enabled); });
}

// SyncSN across processes, split at its collectives
// (sn_mm/ops/native_sync.py runs them around those).
TORCH_LIBRARY_FRAGMENT(sn_mm, m) {
  m.def("sync_statistics(Tensor x, bool unbiased) -> Tensor[]",
        &sync_statistics);
  m.def(
      "sync_normalize(Tensor x, Tensor(a!) ws, Tensor bn_mean, Tensor bn_var, "
      "Tensor weight, Tensor bias, Tensor mean_logits, Tensor var_logits, "
      "Tensor? ratio_fixed, Tensor? fixed_ratios, float eps, bool unbiased, "
      "bool ratios_given) -> Tensor",
      &sync_normalize);
  m.def(
      "sync_grad_sums(Tensor grad_y, Tensor x, Tensor ws, Tensor weight, "
      "Tensor mean_logits, Tensor var_logits, Tensor? ratio_fixed, "
      "Tensor? fixed_ratios, bool unbiased, bool ratios_given) -> Tensor[]",
      &sync_grad_sums);
  m.def(
      "sync_input_grad(Tensor grad_y, Tensor x, Tensor ws, Tensor(a!) sums, "
      "Tensor(b!) bn_grads, Tensor weight, Tensor mean_logits, "
      "Tensor var_logits, Tensor? ratio_fixed, Tensor? fixed_ratios, "
      "int total, bool unbiased, bool ratios_given) -> Tensor",
      &sync_input_grad);
}

// Importing the module (sn_mm._ext) is what registers the operators above.
PyMODINIT_FUNC PyInit__ext() {
  static PyModuleDef module = {
      PyModuleDef_HEAD_INIT, "_ext",
      "SN's CPU kernels, registered as sn_mm::switchable_norm", -1, nullptr};
  return PyModule_Create(&module);
}
