// SN's CPU operator, registered as the CPU and AutogradCPU kernels of
// sn_mm::switchable_norm (its schema is in sn_mm/ops/operator.py): a whole
// forward, a whole backward, or an eval forward in one call each
// (sn_forward.cpp, sn_backward.cpp), with its autograd here in C++; and the
// module sn_mm._ext whose import registers them. The CPU kernel is the forward
// without autograd (eval, no_grad); the AutogradCPU kernel saves what the
// backward needs, and the backward is one call too. The settings the tests and
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
#include <torch/csrc/dynamo/compiled_autograd.h>
#include <torch/library.h>

#include <array>
#include <string>
#include <tuple>
#include <vector>

#include "cpu_isa.h"
#include "sn_passes.h"

namespace {

using namespace sn_mm_cpu;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;
using torch::dynamo::autograd::CompiledNodeArgs;
using torch::dynamo::autograd::PackedArgs;
using torch::dynamo::autograd::SwapSavedVariables;

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

// The tensors a backward reads, as saved by the forward.
struct SavedTensors {
  at::Tensor x, weight, bias, mean_logits, var_logits, ws, fixed, fixed_ratios;
};

// What a backward needs of its forward besides the saved tensors. has_in,
// correction and the ratios follow from the tensors and the flags before
// them (prepared() recomputes them, as compiled autograd's form of the
// backward does); the node keeps them so that its backward need not.
struct SavedFlags {
  bool training, unbiased, ratios_given, using_bn, bn_batch;
  double eps;
  bool has_in;
  int64_t correction;
  std::vector<double> mean_ratios, var_ratios;

  // The five switches, as pointers into `flags` (const or not): what
  // compiled autograd specialises on and packs, with eps.
  template <typename Flags>
  static auto switches(Flags& flags) {
    return std::array{&flags.training, &flags.unbiased, &flags.ratios_given,
                      &flags.using_bn, &flags.bn_batch};
  }

  static SavedFlags of(const Forward& f, bool training, bool unbiased,
                       bool ratios_given, bool using_bn, double eps) {
    return {training,      unbiased,    ratios_given,    using_bn,
            f.bn_batch,    eps,         f.ratios.has_in, f.correction,
            f.ratios.mean, f.ratios.var};
  }

  // The forward's state a backward runs from.
  Forward forward(const SavedTensors& t) const {
    Forward f;
    f.x3 = rows_of(t.x);
    f.ws = t.ws;
    f.bn_batch = bn_batch;
    f.ratios.has_in = has_in;
    f.ratios.k_ln = has_in ? 1 : 0;
    f.ratios.groups = ratio_groups(t.mean_logits);
    f.correction = correction;
    f.ratios.mean = mean_ratios;
    f.ratios.var = var_ratios;
    return f;
  }
};

using Wanted = std::array<bool, 5>;  // which gradients the graph needs

// A graph of the gradient is wanted: differentiate a recomputed forward of
// the reference. (The BN statistics kept are constants to the output where
// the running ones stood in; elsewhere the reference recomputes them.)
variable_list recorded_backward(const at::Tensor& grad_y,
                                const SavedTensors& t, const SavedFlags& flags,
                                const Wanted& wanted) {
  const at::Tensor inputs[5] = {t.x, t.weight, t.bias, t.mean_logits,
                                t.var_logits};
  const int64_t samples = t.x.size(0), channels = t.x.size(1);
  OptTensor bn_mean, bn_var;
  if (flags.using_bn) {
    const int64_t at = bn_offset(samples, channels);
    bn_mean = t.ws.narrow(0, at, channels);
    bn_var = t.ws.narrow(0, at + channels, channels);
  }
  auto y = reference_output(t.x, t.weight, t.bias, t.mean_logits, t.var_logits,
                            bn_mean, bn_var, optional_of(t.fixed),
                            optional_of(t.fixed_ratios),
                            flags.training && samples > 0, flags.eps,
                            flags.unbiased, flags.ratios_given);
  variable_list asked, result(5);
  std::vector<int> where;
  for (int i = 0; i < 5; ++i)
    if (wanted[i]) {
      asked.push_back(inputs[i]);
      where.push_back(i);
    }
  auto grads = torch::autograd::grad({y}, asked, {grad_y},
                                     /*retain_graph=*/true,
                                     /*create_graph=*/true,
                                     /*allow_unused=*/true);
  for (size_t j = 0; j < where.size(); ++j)
    result[where[j]] =
        grads[j].defined() ? grads[j] : at::zeros_like(asked[j]);
  return result;
}

// The gradients of x, weight, bias and the two logit tensors (those
// wanted), from the forward's saved state f.
variable_list backward_of(const at::Tensor& grad_y, const SavedTensors& t,
                          const SavedFlags& flags, const Forward& f,
                          const Wanted& wanted) {
  variable_list result(5);
  if (!grad_y.defined()) return result;
  if (at::GradMode::is_enabled())
    return recorded_backward(grad_y, t, flags, wanted);
  auto grads = backward_impl(grad_y, f, t.weight, t.mean_logits,
                             read_fixed(optional_of(t.fixed), f.ratios.groups),
                             flags.using_bn, flags.ratios_given);
  for (int i = 0; i < 5; ++i)
    if (wanted[i]) result[i] = std::move(grads[i]);
  return result;
}

// The backward as compiled autograd calls it (a C++ function it runs
// eagerly, as it runs a torch::autograd::Function's): the saved tensors
// and the flags packed by SwitchableNormBackward::apply_with_saved. The
// ratios are recomputed from the logits: a packed number would be a
// constant of the compiled graph, stale at the next step.
variable_list compiled_backward(const variable_list& grads,
                                const std::vector<c10::IValue>& args) {
  PackedArgs packed(args);
  SavedTensors t;
  for (at::Tensor* v : {&t.x, &t.weight, &t.bias, &t.mean_logits,
                        &t.var_logits, &t.ws, &t.fixed, &t.fixed_ratios})
    *v = packed.unpack<OptTensor>().value_or(at::Tensor());
  SavedFlags flags{};  // (has_in, correction, ratios: in f)
  for (bool* v : SavedFlags::switches(flags)) *v = packed.unpack<bool>();
  flags.eps = packed.unpack<double>();
  const auto wanted = packed.unpack<std::vector<bool>>();
  Forward f = prepared(t.x, t.mean_logits, t.var_logits, optional_of(t.fixed),
                       optional_of(t.fixed_ratios), flags.unbiased,
                       flags.ratios_given);
  f.ws = t.ws;
  f.bn_batch = flags.bn_batch;
  return backward_of(grads[0], t, flags, f,
                     {wanted[0], wanted[1], wanted[2], wanted[3], wanted[4]});
}

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

  // The saved variables, as pointers into `node` (const or not), in
  // SavedTensors' order.
  template <typename Self>
  static auto saved(Self& node) {
    return std::array{&node.x,           &node.weight,      &node.bias,
                      &node.mean_logits, &node.var_logits,  &node.ws,
                      &node.fixed,       &node.fixed_ratios};
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (SavedVariable* v : saved(*this)) v->reset_data();
  }

  // The saved tensors; bias, the variance's logits and the fixed ratios
  // only for a backward through the reference (`graph`): each unpack costs
  // host time on every training step.
  SavedTensors unpacked(bool graph) {
    const auto if_graph = [&](const SavedVariable& v) {
      return graph ? v.unpack() : at::Tensor();
    };
    return {x.unpack(),           weight.unpack(),       if_graph(bias),
            mean_logits.unpack(), if_graph(var_logits),  ws.unpack(),
            fixed.unpack(),       if_graph(fixed_ratios)};
  }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const Wanted wanted = {should_compute_output(0), should_compute_output(1),
                           should_compute_output(2), should_compute_output(3),
                           should_compute_output(4)};
    if (!grads[0].defined()) return variable_list(5);
    const SavedTensors t = unpacked(at::GradMode::is_enabled());
    return backward_of(grads[0], t, flags, flags.forward(t), wanted);
  }

  // Compiled autograd (torch._dynamo.compiled_autograd): what its graph
  // specialises on (the saved tensors and the flags; the ratios come from
  // the logits), and a call of compiled_backward in the graph.
  void compiled_args(CompiledNodeArgs& args) const override {
    args.collect(name());
    for (const SavedVariable* v : saved(*this)) args.collect(*v, false);
    for (const bool* v : SavedFlags::switches(flags)) args.collect(*v);
    args.collect(flags.eps);
  }

  variable_list apply_with_saved(const variable_list& inputs,
                                 SwapSavedVariables& swap) override {
    for (SavedVariable* v : saved(*this)) swap.before(*v);
    PackedArgs packed;
    for (SavedVariable* v : saved(*this))
      packed.pack(optional_of(v->unpack()));
    for (const bool* v : SavedFlags::switches(flags)) packed.pack(*v);
    packed.pack(flags.eps);
    std::vector<bool> wanted;
    for (size_t i = 0; i < next_edges().size(); ++i)
      wanted.push_back(task_should_compute_output(i));
    packed.pack(wanted);
    const auto args = std::move(packed).vec();
    std::vector<at::TypePtr> schema;
    for (const auto& v : args)
      schema.push_back(v.isTensor() ? at::TensorType::get() : v.type());
    const auto& py = torch::dynamo::autograd::getPyCompilerInterface();
    const auto fn =
        py->bind_function(swap.get_py_compiler(), "SwitchableNormBackward",
                          compiled_backward, schema,
                          /*is_custom_function=*/true,
                          /*is_traceable=*/false);
    auto results = py->call_function(
        swap.get_py_compiler(), "apply_functional", fn, inputs, args,
        torch::dynamo::autograd::IValuePacker<
            std::vector<std::optional<torch::autograd::InputMetadata>>>::
            pack(torch::dynamo::autograd::get_input_metadata(next_edges())));
    for (SavedVariable* v : saved(*this)) swap.after(*v);
    return results;
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

// Importing the module (sn_mm._ext) is what registers the operators above.
PyMODINIT_FUNC PyInit__ext() {
  static PyModuleDef module = {
      PyModuleDef_HEAD_INIT, "_ext",
      "SN's CPU kernels, registered as sn_mm::switchable_norm", -1, nullptr};
  return PyModule_Create(&module);
}
