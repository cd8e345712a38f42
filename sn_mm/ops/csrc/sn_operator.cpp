// sn_mm::switchable_norm's CPU and AutogradCPU kernels (a Function, which
// compiled autograd runs), the tests' settings, and sn_mm._ext, whose import
// registers them (no torch/extension.h: these headers compile 1/3 faster).
#include <Python.h>  // first, as Python's API manual asks
// torch's headers
#include <ATen/FuncTorchTLS.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "sn_host.h"

using namespace sn_mm_cpu;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// A backward that records a graph (create_graph=True): the gradients of the
// reference forward, recomputed (sn_mm::switchable_norm_graph_grads, from
// Python), whose higher derivatives are exact. The BN statistics kept are
// constants where the running ones stood in; else the reference's own.
variable_list graph_grads(const at::Tensor& grad_y, const variable_list& t,
                          const OptTensor& fixed,
                          const OptTensor& fixed_ratios, bool training,
                          bool using_bn, double eps, bool unbiased,
                          bool ratios_given, const c10::List<bool>& wanted) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("sn_mm::switchable_norm_graph_grads", "")
          .typed<variable_list(
              const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const OptTensor&, const OptTensor&, const OptTensor&,
              const OptTensor&, bool, double, bool, bool, c10::List<bool>)>();
  const int64_t samples = t[0].size(0), channels = t[0].size(1);
  OptTensor bn_mean, bn_var;
  if (using_bn) {
    const int64_t at = bn_offset(samples, channels);
    bn_mean = t[5].narrow(0, at, channels);
    bn_var = t[5].narrow(0, at + channels, channels);
  }
  return op.call(grad_y, t[0], t[1], t[2], t[3], t[4], bn_mean, bn_var, fixed,
                 fixed_ratios, training && samples > 0, eps, unbiased,
                 ratios_given, wanted);
}

}  // namespace

// SN's autograd: the forward keeps the statistics buffer, the backward is
// one call. (At the top level: its node is CppNode<SwitchableNormBackward>.)
struct SwitchableNormBackward
    : public torch::autograd::Function<SwitchableNormBackward> {
  static at::Tensor forward(AutogradContext* ctx, SN_ARGUMENTS) {
    at::AutoDispatchBelowADInplaceOrView guard;
    Forward f = forward_impl(SN_ARGUMENT_NAMES, true);
    ctx->save_for_backward({x, weight, bias, mean_logits, var_logits, f.ws,
                            fixed.value_or(at::Tensor()),
                            fixed_ratios.value_or(at::Tensor())});
    // Flags only: the ratios are recomputed from the logits, as compiled
    // autograd would keep a saved number as a constant of its graph.
    ctx->saved_data["flags"] = c10::List<bool>(
        {training, defined(running_mean), unbiased, ratios_given});
    ctx->saved_data["eps"] = eps;
    return f.y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto t = ctx->get_saved_variables();
    const auto flags = ctx->saved_data["flags"].toBoolList();
    const bool training = flags[0], using_bn = flags[1], unbiased = flags[2],
               ratios_given = flags[3];
    variable_list result(16);
    if (!grads[0].defined()) return result;
    c10::List<bool> wanted;
    for (size_t i = 0; i < 5; ++i) wanted.push_back(ctx->needs_input_grad(i));
    OptTensor fixed, fixed_ratios;  // as the optionals they were
    if (t[6].defined()) fixed = t[6];
    if (t[7].defined()) fixed_ratios = t[7];
    const auto grad5 =
        at::GradMode::is_enabled()
            ? graph_grads(grads[0], t, fixed, fixed_ratios, training, using_bn,
                          ctx->saved_data["eps"].toDouble(), unbiased,
                          ratios_given, wanted)
            : backward_impl(grads[0], t[0], t[1], t[3], t[4], t[5], fixed,
                            fixed_ratios, using_bn && training, unbiased,
                            ratios_given);
    for (size_t i = 0; i < 5; ++i)
      if (wanted[i]) result[i] = grad5[i];
    return result;
  }
};

namespace {

at::Tensor switchable_norm_cpu(SN_ARGUMENTS) {
  return forward_impl(SN_ARGUMENT_NAMES, false).y;
}

at::Tensor switchable_norm_autograd(SN_ARGUMENTS) {
  const bool any_grad = x.requires_grad() || weight.requires_grad() ||
                        bias.requires_grad() || mean_logits.requires_grad() ||
                        var_logits.requires_grad();
  if (!(at::GradMode::is_enabled() && any_grad)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return switchable_norm_cpu(SN_ARGUMENT_NAMES);
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
  return SwitchableNormBackward::apply(SN_ARGUMENT_NAMES);
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
  m.def("set_cpu_isa(str name) -> ()", &set_cpu_isa);
  m.def("cpu_path_counts() -> (str[], int[])", &path_counts);
  m.def("set_cpu_path(str name, bool enabled) -> bool", &set_path);
}

// Importing the module (sn_mm._ext) is what registers the operators above.
PyMODINIT_FUNC PyInit__ext() {
  static PyModuleDef module = {
      PyModuleDef_HEAD_INIT, "_ext",
      "SN's CPU kernels, registered as sn_mm::switchable_norm", -1, nullptr};
  return PyModule_Create(&module);
}
