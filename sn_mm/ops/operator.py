"""SN's one entry point: :func:`switchable_norm` and the operator
``sn_mm::switchable_norm`` that PyTorch dispatches.

The operator, registered with ``torch.library``:

=================  ==========================================================
dispatch key       implementation
=================  ==========================================================
CPU, AutogradCPU   the C++ kernels (``csrc/sn_operator.cpp``, loaded or
                   built on first use by :mod:`sn_mm.ops.native`), forward
                   and backward in one call each
CUDA, AutogradCUDA the fused Triton kernels (:mod:`sn_mm.ops.triton_fused`)
Meta (fake)        the output's shape, for tracers and ``meta`` tensors
=================  ==========================================================

A layer's own CUDA call (outside tracing) skips the dispatcher and calls
the Triton module directly, which computes the same for less host time per
call (``CUDA_ROUTE`` below).

A double backward (``create_graph=True``) differentiates a recomputed
forward of the PyTorch-op reference (:mod:`sn_mm.ops.reference`; on the CPU
as the operator ``sn_mm::switchable_norm_graph_grads``), so that every
higher derivative is exact.

Which implementation computes a call, and how it is called, is decided in
one place, :func:`route`, from the layer's ``kernels`` setting:

* ``'auto'`` (default): the operator where its device kernel takes the
  input (float32/float64 CPU tensors where the C++ kernels run;
  float32/bfloat16/float16 GPU tensors where Triton works), else the
  reference;
* ``'native'``: the C++ kernels; an error where they cannot run (SyncSN
  across processes takes the reference, which computes the same);
* ``'triton'``: the Triton kernels (GPUs, or CPU tensors in Triton's
  interpreter, ``TRITON_INTERPRET=1``); float64 and empty inputs take the
  reference, which computes the same thing;
* ``'torch'``: the reference everywhere (for debugging).

Group SN (logits (G, K)) runs on the same kernels: each channel takes its
ratios from its group, and the ratio gradients are summed per group.

Under ``torch.compile``, ``torch.export``, ``torch.jit.trace`` and ONNX
export every call takes the reference, which those tools trace like any
other layer. SyncSN across processes (a ``group``, in training with a BN
term) runs on the Triton kernels split at their collectives, one all-gather
forward and one all-reduce backward, on GPUs, and on the reference, with
the same collectives, elsewhere (as PyTorch's SyncBatchNorm, it is for
GPUs; on the CPU it serves gloo tests and debugging).
"""
import math
import warnings
from typing import Callable, List, NamedTuple, Optional

import torch
from torch import Tensor

from . import _compat
from .native import native_available, native_status
from .ratios import RATIO_FNS, sparsest_ratios
from .reference import graph_grads, switchable_norm_reference

KERNEL_CHOICES = ('auto', 'native', 'triton', 'torch')
KERNELS_ENV = 'SN_MM_KERNELS'

SCHEMA = (
    'switchable_norm(Tensor x, Tensor weight, Tensor bias, '
    'Tensor mean_logits, Tensor var_logits, Tensor(a!)? running_mean, '
    'Tensor(b!)? running_var, Tensor(c!)? num_batches_tracked, '
    'Tensor(d!)? nonfinite_batches, Tensor? ratio_fixed, '
    'Tensor? fixed_ratios, bool training, '
    'float momentum, float eps, bool unbiased, bool ratios_given) -> Tensor')
# The schema's momentum is a float: the cumulative average (momentum=None,
# as nn.BatchNorm2d's) travels as this value, which the kernels test for.
CUMULATIVE = -1.
# A backward that records a graph (create_graph=True) on the C++ kernels:
# the reference's gradients for given BN statistics (the batch's,
# recomputed from x, where batch_stats; else bn_mean/bn_var), zeros for
# those not wanted.
GRAPH_GRADS_SCHEMA = (
    'switchable_norm_graph_grads(Tensor grad_y, Tensor x, Tensor weight, '
    'Tensor bias, Tensor mean_logits, Tensor var_logits, Tensor? bn_mean, '
    'Tensor? bn_var, Tensor? ratio_fixed, Tensor? fixed_ratios, '
    'bool batch_stats, float eps, bool unbiased, bool ratios_given, '
    'bool[] wanted) -> Tensor[]')

_LIB = torch.library.Library('sn_mm', 'FRAGMENT')
_LIB.define(SCHEMA)
_LIB.define(GRAPH_GRADS_SCHEMA)


def _graph_grads_op(grad_y, x, weight, bias, mean_logits, var_logits, bn_mean,
                    bn_var, ratio_fixed, fixed_ratios, batch_stats, eps,
                    unbiased, ratios_given, wanted):
    inputs = (x, weight, bias, mean_logits, var_logits)
    grads = graph_grads(grad_y, inputs, wanted, bn_mean, bn_var, batch_stats,
                        eps, unbiased, ratio_fixed, fixed_ratios, ratios_given)
    return [
        torch.zeros_like(t) if g is None else g for t, g in zip(inputs, grads)
    ]


_LIB.impl('switchable_norm_graph_grads', _graph_grads_op,
          'CompositeImplicitAutograd')


@_compat.register_fake('sn_mm::switchable_norm')
def _switchable_norm_fake(x, weight, bias, mean_logits, var_logits,
                          running_mean, running_var, num_batches_tracked,
                          nonfinite_batches, ratio_fixed, fixed_ratios,
                          training, momentum, eps, unbiased, ratios_given):
    # The C++ kernels write contiguous rows; the Triton kernels keep the
    # input's layout.
    if x.device.type == 'cpu':
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    return torch.empty_like(x)


# The CPU and AutogradCPU kernels and the settings below register when the
# C++ library loads: on the first call that needs them (native.py).


def cpu_path_counts() -> dict:
    """How many calls took each of the C++ kernels' special paths
    ('short_rows', 'by_sample'; see
    docs/performance.md#special-paths-on-the-cpu) since the process began;
    empty without the extension."""
    if not native_available():
        return {}
    return dict(zip(*torch.ops.sn_mm.cpu_path_counts()))


def set_cpu_path(name: str, enabled: bool) -> bool:
    """Let calls take special path ``name`` where it applies, or never (the
    general way, which computes the same): for A/B timings and tests.
    Returns whether it was on. Every path is on by default."""
    if not native_available():
        raise RuntimeError(f'set_cpu_path: the C++ kernels do not run '
                           f'here: {native_status().reason}')
    return torch.ops.sn_mm.set_cpu_path(name, enabled)


def cpu_isa() -> Optional[str]:
    """The instruction set the C++ kernels run with ('avx512', 'avx2' or
    'baseline'): the best this CPU has unless ``$SN_MM_CPU_ISA`` or
    :func:`set_cpu_isa` chose another; None without the extension."""
    return torch.ops.sn_mm.cpu_isa() if native_available() else None


def cpu_isas() -> List[str]:
    """The instruction sets the C++ kernels are built for and this CPU
    runs, best first (empty without the extension)."""
    return torch.ops.sn_mm.cpu_isas() if native_available() else []


def set_cpu_isa(name: str) -> None:
    """Run the C++ kernels with instruction set ``name`` (one of
    :func:`cpu_isas`), e.g. to test or time AVX2 on a CPU with AVX-512."""
    if not native_available():
        raise RuntimeError(f'set_cpu_isa: the C++ kernels do not run here: '
                           f'{native_status().reason}')
    torch.ops.sn_mm.set_cpu_isa(name)


# The operator's one overload, called without OpOverload's Python frames
# (the same dispatcher call).
_OP = _compat.op_function(torch.ops.sn_mm.switchable_norm.default)

# -- the Triton kernels under the CUDA keys ---------------------------------
# The oldest Triton the fused kernels are written for and tested with
# (torch >= 2.4 ships one); with an older one (torch 2.1-2.3 ship 2.1-2.3)
# SN runs on PyTorch ops on CUDA.
MIN_TRITON = (3, 0)
_triton = None
_triton_targets = None  # sn_mm.ops.triton_targets, imported with _triton
_triton_problem = None


def triton_version_problem(version: str) -> Optional[str]:
    """Why Triton ``version`` cannot run SN's fused kernels, or None."""
    try:
        have = tuple(int(part) for part in version.split('.')[:2])
    except ValueError:
        return None  # a development build: tried, and the probe decides
    if have >= MIN_TRITON:
        return None
    need = '.'.join(map(str, MIN_TRITON))
    return (f'Triton {version} is older than the {need} that SN\'s fused '
            f'kernels need (torch >= 2.4 ships one)')


def triton_module():
    """:mod:`sn_mm.ops.triton_fused`, imported on first use; None without a
    Triton that runs it (:func:`triton_problem` says why; on a machine with
    a GPU a warning says so once)."""
    global _triton, _triton_targets, _triton_problem
    if _triton is None:
        _triton = False
        try:
            import triton
            _triton_problem = triton_version_problem(triton.__version__)
        except ImportError as err:
            _triton_problem = f'Triton cannot be imported ({err})'
        if _triton_problem is None:
            try:
                from . import triton_fused, triton_targets
                _triton, _triton_targets = triton_fused, triton_targets
            except ImportError as err:
                _triton_problem = (f'SN\'s Triton kernels cannot be '
                                   f'imported ({err})')
        if _triton_problem is not None and torch.cuda.is_available():
            warnings.warn(f'sn_mm: {_triton_problem}; SN runs on PyTorch '
                          'ops on CUDA')
    return _triton or None


def triton_problem() -> Optional[str]:
    """Why SN's fused Triton kernels cannot run here, or None."""
    triton_module()
    return _triton_problem


def _cuda_kernel(x, weight, bias, mean_logits, var_logits, running_mean,
                 running_var, num_batches_tracked, nonfinite_batches,
                 ratio_fixed, fixed_ratios, training, momentum, eps, unbiased,
                 ratios_given):
    fused = triton_module()
    if fused is None:
        raise RuntimeError('sn_mm::switchable_norm on CUDA runs SN\'s '
                           f'Triton kernels: {triton_problem()}')
    return fused.switchable_norm(
        x,
        weight,
        bias,
        mean_logits,
        var_logits,
        running_mean,
        running_var,
        num_batches_tracked,
        ratio_fixed,
        fixed_ratios,
        training,
        None if momentum == CUMULATIVE else momentum,
        eps,
        unbiased,
        ratios_given,
        nonfinite_batches=nonfinite_batches)


# One Python function under both keys: it runs the Triton autograd Function
# where a gradient is wanted and the bare forward otherwise.
_LIB.impl('switchable_norm', _cuda_kernel, 'CUDA')
_LIB.impl('switchable_norm', _cuda_kernel, 'AutogradCUDA')

# How a CUDA call outside tracing reaches the Triton kernels: by calling
# them here ('direct') or through the dispatcher ('operator', what
# torch.ops.sn_mm.switchable_norm does). Both compute the same; the direct
# call saves 18-39 us of host time per call and 8% of a Mask R-CNN training
# step (docs/gpu_check.md#figures, benchmark_norm.py's route rows).
CUDA_ROUTE = {'via': 'direct'}

# -- the kernel setting -----------------------------------------------------
_default: Optional[str] = None
_INTERPRET = _compat.getenv('TRITON_INTERPRET') == '1'


def check_kernels(choice, what: str = 'kernels') -> str:
    """``choice`` if it is one of :data:`KERNEL_CHOICES`, else a
    ValueError naming ``what``."""
    if choice not in KERNEL_CHOICES:
        raise ValueError(f'{what}={choice!r}: expected one of ' +
                         ', '.join(repr(c) for c in KERNEL_CHOICES))
    return choice


def default_kernels() -> str:
    """The global default: :func:`set_default_kernels`, else
    ``$SN_MM_KERNELS``, else ``'auto'``."""
    if _default is not None:
        return _default
    choice = _compat.getenv(KERNELS_ENV)
    return 'auto' if choice is None else check_kernels(choice, KERNELS_ENV)


def set_default_kernels(choice: Optional[str]) -> None:
    """Set the kernels of every layer whose own ``kernels`` is None;
    ``None`` goes back to ``$SN_MM_KERNELS`` / ``'auto'``."""
    global _default
    _default = None if choice is None else check_kernels(choice)


def is_tracing() -> bool:
    """Whether a graph is being captured (dynamo, export, jit or ONNX)."""
    return (_compat.is_compiling() or _compat.jit_is_tracing()
            or _compat.in_onnx_export())


_NATIVE_DTYPES = (torch.float32, torch.float64)


class Route(NamedTuple):
    """What computes a call (``kind``: ``'native'``, ``'triton'`` or
    ``'torch'``) and the function that :func:`switchable_norm` calls for
    it (``call``: through the dispatcher, to the Triton module, or to the
    reference)."""
    kind: str
    call: Callable


def route(kernels: Optional[str],
          x: Tensor,
          weight: Tensor,
          running_mean: Optional[Tensor],
          group=None) -> Route:
    """The one place that decides how SN computes ``x`` for a layer's
    ``kernels`` setting (None: the global default) and process ``group``.
    Unknown settings, and settings that cannot run on ``x``, raise a
    ValueError or RuntimeError naming the problem."""
    kind = _kind(kernels, x, weight, running_mean)
    if kind == 'native':
        return _VIA_OPERATOR[kind] if group is None else _DIRECT['torch']
    if (kind == 'triton' and x.is_cuda and group is None
            and CUDA_ROUTE['via'] == 'operator'):
        return _VIA_OPERATOR[kind]
    return _DIRECT[kind]


def implementation(kernels: Optional[str],
                   x: Tensor,
                   weight: Tensor,
                   running_mean: Optional[Tensor],
                   group=None) -> str:
    """``'native'``, ``'triton'`` or ``'torch'``: what computes SN on ``x``
    (:func:`route`'s ``kind``)."""
    return route(kernels, x, weight, running_mean, group).kind


def _kind(kernels, x, weight, running_mean) -> str:
    """Route's kind: the setting, the input's device and dtype and tracing
    decide. (Each test is made once: at small shapes this function's cost
    is a visible part of a call.)"""
    if is_tracing():
        # (Before the environment is read: Dynamo 2.1 cannot trace that.)
        check_kernels(kernels or 'auto')
        return 'torch'
    choice = kernels or default_kernels()
    if choice == 'torch':
        return 'torch'
    if (choice == 'auto' or choice == 'native') and x.is_cpu \
            and x.dtype is weight.dtype and x.dtype in _NATIVE_DTYPES \
            and native_available():
        return 'native'
    if choice == 'triton' or (x.is_cuda and choice == 'auto'):
        return _triton_implementation(choice, x, weight, running_mean)
    if check_kernels(choice) == 'native':
        if not native_available():
            raise RuntimeError(f'kernels=\'native\': the C++ kernels do '
                               f'not run here: {native_status().reason}')
        raise ValueError(f'kernels=\'native\' runs on float32/float64 CPU '
                         f'tensors with parameters of the same dtype, got '
                         f'{x.dtype} on {x.device} (parameters '
                         f'{weight.dtype})')
    return 'torch'


def _triton_implementation(choice, x, weight, running_mean) -> str:
    fused = triton_module()
    if choice == 'triton':
        if not (x.is_cuda or _INTERPRET):
            raise ValueError(f'kernels=\'triton\' runs on CUDA tensors (or '
                             f'in Triton\'s interpreter with '
                             f'TRITON_INTERPRET=1), got one on {x.device}')
        if fused is None:
            raise RuntimeError(f'kernels=\'triton\': {triton_problem()}')
        # float64 and empty inputs: the reference computes the same thing.
        return 'triton' if fused.applies(x, weight, running_mean) \
            else 'torch'
    works = (
        fused is not None and fused.applies(x, weight, running_mean)
        and _triton_targets.works_on(x))
    return 'triton' if works else 'torch'


# -- the entry point --------------------------------------------------------
def check_input(x: Tensor, num_features: int, layer: str) -> None:
    """A clear error, naming ``layer``, for an input that is not a
    floating-point (N, C, *) tensor with ``num_features`` channels."""
    shape = x.shape  # one test for the valid case: it runs on every call
    if len(shape) >= 2 and shape[1] == num_features and x.is_floating_point():
        return
    if not x.is_floating_point():
        raise TypeError(f'{layer} normalises floating-point inputs, got '
                        f'{x.dtype}')
    if x.dim() < 2:
        raise ValueError(f'{layer} expects an input of shape (N, C, *) with '
                         f'C={num_features}, got a {x.dim()}D tensor of shape '
                         f'{tuple(x.shape)}')
    if x.shape[1] != num_features:
        raise ValueError(
            f'{layer} was built for {num_features} channels, got an input '
            f'with {x.shape[1]} channels (shape {tuple(x.shape)})')


def switchable_norm(x: Tensor,
                    weight: Tensor,
                    bias: Tensor,
                    mean_weight: Tensor,
                    var_weight: Tensor,
                    running_mean: Optional[Tensor],
                    running_var: Optional[Tensor],
                    num_batches_tracked: Optional[Tensor],
                    training: bool,
                    momentum: Optional[float],
                    eps: float,
                    unbiased: bool,
                    kernels: Optional[str] = None,
                    group=None,
                    layer: str = 'SwitchableNorm',
                    ratio_fixed: Optional[Tensor] = None,
                    fixed_ratios: Optional[Tensor] = None,
                    ratio_fn: str = 'softmax',
                    radius: Optional[Tensor] = None,
                    nonfinite_batches: Optional[Tensor] = None) -> Tensor:
    """Switchable Normalization of ``x`` (N, C, *); in training with a BN
    branch it also updates ``running_mean``/``running_var``/
    ``num_batches_tracked`` in place, except after a batch whose BN
    statistics are not all finite, which it counts in ``nonfinite_batches``
    (an int64 scalar; None: not counted) instead, and except in a forward
    that autograd's backward runs (activation checkpointing's
    recomputation), which leaves them as the step's forward left them.
    Arguments as
    :class:`sn_mm.SwitchableNorm`'s; ``group``: the process group sharing BN
    statistics (None: this device only); ``layer``: the name errors use;
    ``ratio_fixed`` (2,) bool and ``fixed_ratios`` (2, K) (group SN: (2, G)
    and (2, G, K)): mean and variance ratios given instead of the softmax
    of the logits where set;
    ``ratio_fn='sparsestmax'``: Sparse SN, the ratios are SparsestMax of the
    logits at ``radius`` (:func:`sn_mm.ops.ratios.sparsest_ratios`)."""
    check_input(x, weight.shape[0], layer)
    if not training or running_mean is None:
        group = None  # only the batch's BN statistics are shared
    elif not is_tracing() and _compat.in_backward():
        # (is_tracing first: dynamo cannot trace the engine query.)
        # Activation checkpointing (with_cp=True) runs this forward again
        # in the backward; the step's forward has updated the statistics
        # already, so this one updates copies. (Training-mode outputs and
        # gradients do not depend on the running statistics.)
        running_mean, running_var, num_batches_tracked, nonfinite_batches = (
            None if t is None else t.clone()
            for t in (running_mean, running_var, num_batches_tracked,
                      nonfinite_batches))
    call = route(kernels, x, weight, running_mean, group).call
    ratios_given = ratio_fn != 'softmax'
    if ratios_given:
        if ratio_fn not in RATIO_FNS:
            raise ValueError(
                f'{layer}: unknown ratio_fn {ratio_fn!r} '
                f'(choose from {", ".join(map(repr, RATIO_FNS))})')
        if radius is None or ratio_fixed is None:
            raise ValueError(f'{layer}: ratio_fn=\'sparsestmax\' needs a '
                             'radius and fixed-ratio buffers')
        mean_weight, var_weight = sparsest_ratios(mean_weight, var_weight,
                                                  radius, ratio_fixed,
                                                  fixed_ratios, training,
                                                  math.prod(x.shape[2:]) > 1)
    return call(x, weight, bias, mean_weight, var_weight, running_mean,
                running_var, num_batches_tracked, ratio_fixed, fixed_ratios,
                training, momentum, eps, unbiased, ratios_given, group,
                nonfinite_batches)


def _call_operator(x, weight, bias, mean_weight, var_weight, running_mean,
                   running_var, num_batches_tracked, ratio_fixed, fixed_ratios,
                   training, momentum, eps, unbiased, ratios_given, group,
                   nonfinite_batches):
    return _OP(x, weight, bias, mean_weight, var_weight, running_mean,
               running_var, num_batches_tracked, nonfinite_batches,
               ratio_fixed, fixed_ratios, training,
               CUMULATIVE if momentum is None else momentum, eps, unbiased,
               ratios_given)


def _call_triton(x, weight, bias, mean_weight, var_weight, running_mean,
                 running_var, num_batches_tracked, ratio_fixed, fixed_ratios,
                 training, momentum, eps, unbiased, ratios_given, group,
                 nonfinite_batches):
    return triton_module().switchable_norm(
        x, weight, bias, mean_weight, var_weight, running_mean, running_var,
        num_batches_tracked, ratio_fixed, fixed_ratios, training, momentum,
        eps, unbiased, ratios_given, group, nonfinite_batches)


def _call_reference(x, weight, bias, mean_weight, var_weight, running_mean,
                    running_var, num_batches_tracked, ratio_fixed,
                    fixed_ratios, training, momentum, eps, unbiased,
                    ratios_given, group, nonfinite_batches):
    args = (weight, bias, mean_weight, var_weight, running_mean, running_var,
            num_batches_tracked, training, momentum, eps, unbiased,
            ratio_fixed, fixed_ratios, ratios_given, group, nonfinite_batches)
    # (No autocast on the meta device: shape inference, deferred init.)
    if not x.is_meta and _compat.autocast_enabled(x.device.type):
        with torch.autocast(x.device.type, enabled=False):
            return switchable_norm_reference(x, *args)
    return switchable_norm_reference(x, *args)


# route()'s answers, made once: through the dispatcher, or called directly.
_VIA_OPERATOR = {k: Route(k, _call_operator) for k in ('native', 'triton')}
_DIRECT = {
    'triton': Route('triton', _call_triton),
    'torch': Route('torch', _call_reference)
}
