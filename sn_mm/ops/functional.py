"""SN as a function of its tensors: what :class:`SwitchableNorm` runs.

Kept free of module state so that tracers see one call: ``torch.fx``
records it as a single node (the layer module wraps it with
``torch.fx.wrap``), and under ``torch.compile``/``torch.export``,
``torch.jit.trace`` and ONNX export it runs as plain differentiable PyTorch
ops (:func:`sn_forward` with the PyTorch kernels), which those tools trace,
fuse and export like any other layer. Eager calls run the chosen kernels
inside :class:`SwitchableNormFunction`.
"""
import math
import os
from typing import Optional

import torch
from torch import Tensor

from .kernels import TORCH, default_kernels, select_kernels
from .native_kernels import switchable_norm_op
from .sn_function import SwitchableNormFunction, ratio_without_in, sn_forward
from .sparsestmax import is_one_hot, sparsestmax

RATIO_FNS = ('softmax', 'sparsestmax')


def _onnx_export_flags():
    """The two flags behind ``torch.onnx.is_in_onnx_export``, found once:
    that function imports them on every call, which costs more than a
    small SN layer's arithmetic. None where torch keeps them elsewhere."""
    try:
        from torch.onnx._internal.exporter import _flags
        from torch.onnx._internal.torchscript_exporter._globals import \
            GLOBALS
    except ImportError:
        return None
    if not (hasattr(_flags, '_is_onnx_exporting')
            and hasattr(GLOBALS, 'in_onnx_export')):
        return None
    return _flags, GLOBALS


_ONNX_FLAGS = _onnx_export_flags()


def _in_onnx_export() -> bool:
    if _ONNX_FLAGS is None:
        return torch.onnx.is_in_onnx_export()
    flags, globals_ = _ONNX_FLAGS
    return globals_.in_onnx_export or flags._is_onnx_exporting


def is_tracing() -> bool:
    """Whether a graph is being captured (dynamo, export, jit or ONNX)."""
    return (torch.compiler.is_compiling() or torch.jit.is_tracing()
            or _in_onnx_export())


_FUSED_DTYPES = (torch.float32, torch.float64)
_FUSED_CHOICES = ('auto', 'native')


def fused_applies(x: Tensor, weight: Tensor, kernels: Optional[str]) -> bool:
    """Whether the native operator ``sn_mm::switchable_norm`` computes a
    call: an eager (tracers take the composite path, see
    :func:`_switchable_norm`) float32/float64 CPU input whose parameters
    share its dtype, with the native kernels chosen (or 'auto'). Kept cheap:
    the layer asks it on every forward (``x.is_cpu``, not ``x.device``,
    which builds a new object)."""
    return (switchable_norm_op is not None and isinstance(x, Tensor)
            and x.is_cpu and x.dtype is weight.dtype
            and x.dtype in _FUSED_DTYPES
            and (kernels or default_kernels()) in _FUSED_CHOICES
            and not is_tracing())


_TRITON_INTERPRET = os.environ.get('TRITON_INTERPRET') == '1'
_triton_fused = None


def _fused_triton():
    """sn_mm.ops.triton_fused, imported on first use; False without
    Triton."""
    global _triton_fused
    if _triton_fused is None:
        try:
            from . import triton_fused
        except ImportError:
            triton_fused = False
        _triton_fused = triton_fused
    return _triton_fused


def triton_fused_applies(x: Tensor, weight: Tensor,
                         running_mean: Optional[Tensor],
                         kernels: Optional[str]) -> bool:
    """Whether SN's fused Triton kernels (:mod:`sn_mm.ops.triton_fused`)
    compute a call on one device: an eager float32/bfloat16/float16 CUDA
    input (any device in Triton's interpreter) with 'triton' chosen, or
    'auto' on a GPU where Triton is installed and the kernels work there
    (:func:`sn_mm.ops.triton_fused.works_on`)."""
    if not (x.is_cuda or _TRITON_INTERPRET):
        return False
    choice = kernels or default_kernels()
    if not (choice == 'triton' or (choice == 'auto' and x.is_cuda)):
        return False
    fused = _fused_triton()
    return (bool(fused) and fused.applies(x, weight, running_mean)
            and not is_tracing()
            and (choice == 'triton' or fused.works_on(x)))


def check_input(x: Tensor, num_features: int, layer: str) -> None:
    if x.dim() < 2:
        raise ValueError(
            f'{layer} expects an input of shape (N, C, *) with '
            f'C={num_features}, got a {x.dim()}D tensor of shape '
            f'{tuple(x.shape)}')
    if x.shape[1] != num_features:
        raise ValueError(
            f'{layer} was built for {num_features} channels, got an input '
            f'with {x.shape[1]} channels (shape {tuple(x.shape)})')


@torch.no_grad()
def update_running_stats(running_mean: Tensor, running_var: Tensor,
                         num_batches_tracked: Tensor, momentum,
                         mean_bn: Tensor, var_bn: Tensor,
                         has_samples: Tensor) -> None:
    """Moving (or, with ``momentum=None``, cumulative) average of the BN
    statistics; untouched when the (possibly synchronised) batch held no
    sample. The count gates the update arithmetically, not by a Python
    branch: SyncSN learns it on the device and must not wait for it on the
    host."""
    has = has_samples.to(mean_bn.dtype)
    num_batches_tracked.add_(has_samples.long())
    if momentum is None:
        m = has / num_batches_tracked.clamp_min(1).to(has.dtype)
    else:
        m = momentum * has
    running_mean.mul_(1 - m).add_((m * mean_bn).to(running_mean.dtype))
    running_var.mul_(1 - m).add_((m * var_bn).to(running_var.dtype))


def switchable_norm(x: Tensor, weight: Tensor, bias: Tensor,
                    mean_weight: Tensor, var_weight: Tensor,
                    running_mean: Optional[Tensor],
                    running_var: Optional[Tensor],
                    num_batches_tracked: Optional[Tensor], training: bool,
                    momentum: Optional[float], eps: float, unbiased: bool,
                    kernels: Optional[str] = None, group=None,
                    layer: str = 'SwitchableNorm',
                    ratio_fixed: Optional[Tensor] = None,
                    fixed_ratios: Optional[Tensor] = None,
                    ratio_fn: str = 'softmax',
                    radius: Optional[Tensor] = None) -> Tensor:
    """Switchable Normalization of ``x`` (N, C, *); in training with a BN
    branch it also updates ``running_mean``/``running_var``/
    ``num_batches_tracked`` in place. Arguments as
    :class:`sn_mm.SwitchableNorm`'s; ``group``: the process group sharing BN
    statistics (None: this device only); ``layer``: the name errors use;
    ``ratio_fixed`` (2,) bool and ``fixed_ratios`` (2, K): mean and variance
    ratios given instead of the softmax of the logits where set;
    ``ratio_fn``: ``'softmax'`` or ``'sparsestmax'`` (SSN: the ratios are
    :func:`sparsestmax` of the logits at ``radius``, and in training a ratio
    vector that has become one-hot is fixed in ``ratio_fixed``/
    ``fixed_ratios``, in place)."""
    check_input(x, weight.shape[0], layer)
    if ratio_fn not in RATIO_FNS:
        raise ValueError(f'{layer}: unknown ratio_fn {ratio_fn!r} (choose '
                         f'from {", ".join(map(repr, RATIO_FNS))})')
    if ratio_fn == 'sparsestmax' and (radius is None or ratio_fixed is None):
        raise ValueError(f'{layer}: ratio_fn=\'sparsestmax\' needs a radius '
                         'and fixed-ratio buffers')
    sparse = ratio_fn == 'sparsestmax'
    if group is None and fused_applies(x, weight, kernels):
        if sparse:
            mean_weight, var_weight = _sparsest_ratios(
                mean_weight, var_weight, radius, ratio_fixed, fixed_ratios,
                training, math.prod(x.shape[2:]) > 1)
        return switchable_norm_op(
            x, weight, bias, mean_weight, var_weight, running_mean,
            running_var, num_batches_tracked, ratio_fixed, fixed_ratios,
            training, -1. if momentum is None else momentum, eps, unbiased,
            sparse)
    if triton_fused_applies(x, weight, running_mean, kernels):
        if sparse:
            mean_weight, var_weight = _sparsest_ratios(
                mean_weight, var_weight, radius, ratio_fixed, fixed_ratios,
                training, math.prod(x.shape[2:]) > 1)
        return _triton_fused.switchable_norm(
            x, weight, bias, mean_weight, var_weight, running_mean,
            running_var, num_batches_tracked, ratio_fixed, fixed_ratios,
            training, momentum, eps, unbiased, sparse, group)
    args = (weight, bias, mean_weight, var_weight, running_mean, running_var,
            num_batches_tracked, training, momentum, eps, unbiased, kernels,
            group, ratio_fixed, fixed_ratios, sparse, radius)
    if torch.is_autocast_enabled(x.device.type):
        with torch.autocast(x.device.type, enabled=False):
            return _switchable_norm(x, *args)
    return _switchable_norm(x, *args)


def _as(t: Tensor, dtype) -> Tensor:
    # No cast where none is needed: tracers would record one.
    return t if t.dtype == dtype else t.to(dtype)


def _switchable_norm(x, weight, bias, mean_weight, var_weight, running_mean,
                     running_var, num_batches_tracked, training, momentum,
                     eps, unbiased, kernels, group, ratio_fixed,
                     fixed_ratios, sparse, radius):
    shape = x.shape
    # Statistics in fp32 at least (fp16/bf16 sums lose too much).
    dtype = torch.promote_types(x.dtype, torch.float32)
    spatial = math.prod(shape[2:])
    # A view where it can be (a channels_last input's rows are strided):
    # the PyTorch kernels take it as it is, so a channels_last input gives
    # a channels_last output without a layout round trip; the native and
    # Triton kernels want contiguous rows (below).
    x3 = _as(x.reshape(shape[0], shape[1], spatial), dtype)
    has_in = spatial > 1
    # A single position has zero variance; Bessel's correction would divide
    # by zero there, so it applies only where IN is defined.
    correction = 1 if (unbiased and has_in) else 0
    using_bn = running_mean is not None
    running = ((_as(running_mean, dtype), _as(running_var, dtype))
               if using_bn else (None, None))
    if sparse:
        mean_weight, var_weight = _sparsest_ratios(
            mean_weight, var_weight, radius, ratio_fixed, fixed_ratios,
            training, has_in)
    params = (_as(weight, dtype), _as(bias, dtype), _as(mean_weight, dtype),
              _as(var_weight, dtype))
    fixed = (ratio_fixed, None if fixed_ratios is None else
             _as(fixed_ratios, dtype))
    if is_tracing():
        out, saved = sn_forward(TORCH, x3, *params, *running, training,
                                has_in, correction, eps, group, *fixed,
                                sparse)
        mean_bn, var_bn, has_samples = saved[6], saved[7], saved[8]
        if not training:
            mean_bn = None
        elif mean_bn is not None:
            mean_bn, var_bn = mean_bn.detach(), var_bn.detach()
    else:
        # Chosen once here (unknown values raise before anything is
        # touched) and kept by the Function for backward.
        chosen = select_kernels(kernels, x3)
        if chosen is not TORCH:
            x3 = x3.contiguous()
        out, mean_bn, var_bn, has_samples = SwitchableNormFunction.apply(
            x3, *params, *running, training, has_in, correction, eps, group,
            chosen, *fixed, sparse)
    if mean_bn is not None:
        update_running_stats(running_mean, running_var, num_batches_tracked,
                             momentum, mean_bn, var_bn, has_samples)
    return _as(out.reshape(shape), x.dtype)


def _sparsest_ratios(mean_logits: Tensor, var_logits: Tensor, radius: Tensor,
                     ratio_fixed: Tensor, fixed_ratios: Tensor,
                     training: bool, has_in: bool):
    """SSN's ratio vectors: SparsestMax of each logit vector at ``radius``
    (in float64: the one-hot test must not miss by a rounding). In training,
    a vector that has become one-hot is fixed (as SSN does, to the argmax of
    its logits), by tensor ops so that nothing waits on the device. Without
    IN the rest are renormalised as for fixed ratios."""
    ratios = []
    for row, logits in enumerate((mean_logits, var_logits)):
        p = sparsestmax(logits.double(), radius.double())
        if training:
            with torch.no_grad():
                newly = is_one_hot(p) & ~ratio_fixed[row]
                hot = torch.zeros_like(fixed_ratios[row])
                hot = hot.scatter(0, torch.argmax(p).reshape(1),
                                  torch.ones_like(hot[:1]))
                fixed_ratios[row].copy_(
                    torch.where(newly, hot, fixed_ratios[row]))
                ratio_fixed[row] |= newly
        p = p.to(logits.dtype)
        if not has_in:
            p = torch.cat([p.new_zeros(1), ratio_without_in(p)])
        ratios.append(p)
    return ratios
