"""Every private API of another package that sn_mm uses, each behind a
function with a public fallback (the fallback is slower, never different).

They exist for one reason: SN's per-call host cost. At small shapes
(batch-1 inference, RoI heads) a layer call costs a few microseconds of
arithmetic, and the public routes below cost as much again.
"""
import os

import torch

# -- the environment ------------------------------------------------------
# os.environ.get encodes the name and decodes the value on every call; the
# kernel setting is read on every layer call. os.environ keeps its private
# dict of bytes current (monkeypatch.setenv included).
_ENV_BYTES = (
    os.environ._data if os.name == 'posix'
    and isinstance(getattr(os.environ, '_data', None), dict) else None)


def getenv(name: str):
    """``os.environ.get(name)``."""
    if _ENV_BYTES is None:
        return os.environ.get(name)
    value = _ENV_BYTES.get(name.encode())
    return None if value is None else os.fsdecode(value)


# -- a module's own tensors -----------------------------------------------
def own_tensors(module: torch.nn.Module):
    """(parameters, buffers) registered on ``module`` itself, as dicts by
    name: the module's own dicts, which a layer's forward reads without
    ``nn.Module.__getattr__``'s lookup (a few microseconds a call at
    batch-1 sizes)."""
    params = getattr(module, '_parameters', None)
    buffers = getattr(module, '_buffers', None)
    if isinstance(params, dict) and isinstance(buffers, dict):
        return params, buffers
    return (dict(module.named_parameters(recurse=False)),
            dict(module.named_buffers(recurse=False)))


# -- autograd's backward ---------------------------------------------------
_GRAPH_TASK_ID = getattr(torch._C, '_current_graph_task_id', None)


def in_backward() -> bool:
    """Whether autograd's engine is running a backward in this thread, as
    when activation checkpointing recomputes a forward. Without torch's
    flag: False (a forward then updates running statistics as BN's
    does)."""
    return _GRAPH_TASK_ID is not None and _GRAPH_TASK_ID() != -1


# -- ONNX export ----------------------------------------------------------
def _onnx_export_flags():
    """The two flags behind ``torch.onnx.is_in_onnx_export``, found once:
    that function imports them on every call. None where torch keeps them
    elsewhere."""
    try:
        from torch.onnx._internal.exporter import _flags
        from torch.onnx._internal.torchscript_exporter._globals import GLOBALS
    except ImportError:
        return None
    if not (hasattr(_flags, '_is_onnx_exporting')
            and hasattr(GLOBALS, 'in_onnx_export')):
        return None
    return _flags, GLOBALS


_ONNX_FLAGS = _onnx_export_flags()


# -- calling an operator ----------------------------------------------------
def op_function(overload):
    """The builtin that ``overload.__call__`` (a torch.ops OpOverload)
    forwards every call to: the same dispatcher call without a Python
    frame. ``overload`` itself where torch keeps it elsewhere."""
    function = getattr(overload, '_op', None)
    return function if callable(function) else overload


# -- jit tracing -----------------------------------------------------------
# torch.jit.is_tracing() outside TorchScript: the C flag it reads, without
# its two Python frames.
_JIT_TRACING = getattr(torch._C, '_is_tracing', None)


def jit_is_tracing() -> bool:
    """``torch.jit.is_tracing()`` (in eager code, not TorchScript)."""
    if _JIT_TRACING is None:
        return torch.jit.is_tracing()
    return _JIT_TRACING()


def in_onnx_export() -> bool:
    """``torch.onnx.is_in_onnx_export()``."""
    if _ONNX_FLAGS is None:
        return torch.onnx.is_in_onnx_export()
    flags, globals_ = _ONNX_FLAGS
    return globals_.in_onnx_export or flags._is_onnx_exporting


# -- Triton launches ------------------------------------------------------
_RAW_STREAM = getattr(torch._C, '_cuda_getCurrentRawStream', None)


def current_raw_stream(device_index: int) -> int:
    """The handle of the current CUDA stream of ``device_index``."""
    if _RAW_STREAM is None:
        return torch.cuda.current_stream(device_index).cuda_stream
    return _RAW_STREAM(device_index)


def can_launch_directly(compiled) -> bool:
    """Whether a compiled Triton kernel exposes the launcher that
    :func:`launch_directly` calls."""
    return all(
        hasattr(compiled, a) for a in ('run', 'function', 'packed_metadata'))


def launch_directly(compiled, grid, device_index: int, args) -> None:
    """Launch a compiled Triton kernel on the current stream of
    ``device_index`` without ``kernel[grid](...)``'s argument binding and
    cache lookup (tens of microseconds per launch). Raises TypeError where
    this Triton's launcher takes other arguments; the caller then launches
    through ``kernel[grid]`` (the fallback)."""
    compiled.run(grid[0], grid[1], 1, current_raw_stream(device_index),
                 compiled.function, compiled.packed_metadata, None, None, None,
                 *args)


def in_transform() -> bool:
    """Whether a functorch transform (vmap, grad, ...) or forward-mode AD
    is active, which a Python autograd.Function without their rules cannot
    run under."""
    return (torch._C._are_functorch_transforms_active()
            or torch.autograd.forward_ad._current_level >= 0)
