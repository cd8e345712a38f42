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
#include <Python.h>  // first, as Python's API manual asks
// torch's headers
#include <ATen/FuncTorchTLS.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "cpu_isa.h"
#include "sn_passes.h"

namespace {

using namespace sn_mm_cpu;
using torch::autograd::SavedVariable;
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

// What a backward needs of its forward besides the saved tensors.
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

// SN's backward: a node of the autograd graph written as PyTorch writes its
// own operators' (its saved tensors and flags are members). A
// torch::autograd::Function, whose generic node keeps a context, took 13-14
// us more host time per training step (forward and backward) at 1x64x8x8
// and 1x256x7x7: a sixth of the step, where GroupNorm's takes 57-64 us.
struct SwitchableNormBackward : public torch::autograd::Node {
  SavedVariable x, weight, bias, mean_logits, var_logits, ws, fixed,
      fixed_ratios;
  SavedFlags flags;

  std::string name() const override { return "SwitchableNormBackward"; }

  // Compiled autograd (torch._dynamo.compiled_autograd) asks every node for
  // a functional form to trace, which this one does not give.
  void compiled_args(
      torch::dynamo::autograd::CompiledNodeArgs& /*args*/) const override {
    TORCH_CHECK(false,
                "SN's CPU backward (SwitchableNormBackward) does not run "
                "under compiled autograd: use kernels='torch' for the layers "
                "there, or torch.compile their forward too (compiled code "
                "runs the PyTorch-op reference)");
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (SavedVariable* v : {&x, &weight, &bias, &mean_logits, &var_logits,
                             &ws, &fixed, &fixed_ratios})
      v->reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    variable_list result(5);
    const at::Tensor& grad_y = grads[0];
    if (!grad_y.defined()) return result;
    const at::Tensor x_ = x.unpack(), weight_ = weight.unpack(),
                     mean_logits_ = mean_logits.unpack(), ws_ = ws.unpack();
    if (at::GradMode::is_enabled()) return recorded(grad_y, x_, weight_, ws_);
    Forward f = flags.forward(x_, ws_);
    f.ratios.groups = ratio_groups(mean_logits_);
    auto grads_ =
        backward_impl(grad_y, f, weight_, mean_logits_,
                      read_fixed(optional_of(fixed.unpack()), f.ratios.groups),
                      flags.using_bn, flags.ratios_given);
    for (int i = 0; i < 5; ++i)
      if (should_compute_output(i)) result[i] = std::move(grads_[i]);
    return result;
  }

  // A graph of the gradient is wanted: differentiate a recomputed forward of
  // the reference. (The BN statistics kept are constants to the output where
  // the running ones stood in; elsewhere the reference recomputes them.)
  variable_list recorded(const at::Tensor& grad_y, const at::Tensor& x_,
                         const at::Tensor& weight_, const at::Tensor& ws_) {
    const at::Tensor inputs[5] = {x_, weight_, bias.unpack(),
                                  mean_logits.unpack(), var_logits.unpack()};
    const int64_t samples = x_.size(0), channels = x_.size(1);
    OptTensor bn_mean, bn_var;
    if (flags.using_bn) {
      const int64_t at = bn_offset(samples, channels);
      bn_mean = ws_.narrow(0, at, channels);
      bn_var = ws_.narrow(0, at + channels, channels);
    }
    auto y = reference_output(x_, weight_, inputs[2], inputs[3], inputs[4],
                              bn_mean, bn_var, optional_of(fixed.unpack()),
                              optional_of(fixed_ratios.unpack()),
                              flags.training && samples > 0, flags.eps,
                              flags.unbiased, flags.ratios_given);
    variable_list wanted, result(5);
    std::vector<int> where;
    for (int i = 0; i < 5; ++i)
      if (should_compute_output(i)) {
        wanted.push_back(inputs[i]);
        where.push_back(i);
      }
    auto grads_ = torch::autograd::grad({y}, wanted, {grad_y},
                                        /*retain_graph=*/true,
                                        /*create_graph=*/true,
                                        /*allow_unused=*/true);
    for (size_t j = 0; j < where.size(); ++j)
      result[where[j]] =
          grads_[j].defined() ? grads_[j] : at::zeros_like(wanted[j]);
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
  if (const auto& functorch = at::functorch::functorchTLSAccessor()) {
    try {  // raises inside a transform
      functorch->checkSupportsCppAutogradFunction();
    } catch (const c10::Error&) {
      TORCH_CHECK(false,
                  "sn_mm::switchable_norm's CPU kernels do not run under "
                  "functorch transforms (vmap, grad, vjp, ...): use "
                  "kernels='torch' there");
    }
  }
  for (const at::Tensor* t : {&x, &weight, &bias, &mean_logits, &var_logits})
    TORCH_CHECK(!t->_fw_grad(/*level=*/0).defined(),
                "sn_mm::switchable_norm on the CPU has no forward-mode "
                "derivative: use kernels='torch' for forward-mode AD");
  auto node = c10::make_intrusive<SwitchableNormBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(
      x, weight, bias, mean_logits, var_logits));
  Forward f;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    f = forward_impl(x, weight, bias, mean_logits, var_logits, running_mean,
                     running_var, num_batches_tracked, nonfinite, fixed,
                     fixed_ratios, training, momentum, eps, unbiased,
                     ratios_given, true);
  }
  node->x = SavedVariable(x, false);
  node->weight = SavedVariable(weight, false);
  node->bias = SavedVariable(bias, false);
  node->mean_logits = SavedVariable(mean_logits, false);
  node->var_logits = SavedVariable(var_logits, false);
  node->ws = SavedVariable(f.ws, false);
  node->fixed = SavedVariable(fixed, false);
  node->fixed_ratios = SavedVariable(fixed_ratios, false);
  node->flags = SavedFlags::of(f, training, unbiased, ratios_given,
                               defined(running_mean), eps);
  torch::autograd::set_history(f.y, node);
  return f.y;
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
