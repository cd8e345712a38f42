"""Every private API of another package that sn_mm uses, each behind a
function with a public fallback (the fallback is slower, never different),
and the torch functions whose names or signatures changed between the
torches sn_mm supports (2.1 to 2.14), each behind one name here.

The private ones exist for one reason: SN's per-call host cost. At small
shapes (batch-1 inference, RoI heads) a layer call costs a few microseconds
of arithmetic, and the public routes below cost as much again.
"""
import os
from typing import Optional

import torch

# -- across torch versions ------------------------------------------------
TORCH_VERSION = tuple(
    int(part) for part in torch.__version__.split('+')[0].split('.')[:2])
OLDEST_TORCH = (2, 1)
if TORCH_VERSION < OLDEST_TORCH:
    raise ImportError(
        f'sn_mm needs torch >= {".".join(map(str, OLDEST_TORCH))}, found '
        f'{torch.__version__} (docs/get_started.md#supported-versions)')
# Dynamo traces an autograd.Function's ctx.mark_non_differentiable and
# ctx.set_materialize_grads from torch 2.5 on (pytorch/pytorch#134087,
# #133978); before, it breaks the graph there or ignores them.
DYNAMO_TRACES_FUNCTION_CTX = TORCH_VERSION >= (2, 5)
# ``torch.compiler.is_compiling()`` (torch >= 2.3); before it, the function
# that Dynamo (2.1, 2.2) folds to True while it traces.
is_compiling = getattr(torch.compiler, 'is_compiling', None) or \
    torch._utils.is_compiling

# torch.onnx.export's two exporters: dynamo=True (torch.export-based) and
# the TorchScript one, chosen by its dynamo= argument from torch 2.5 on;
# before it the TorchScript exporter is its only one.
ONNX_EXPORTERS = ('dynamo', 'torchscript') if TORCH_VERSION >= (2, 5) \
    else ('torchscript', )


def onnx_export_kwargs(exporter: str) -> dict:
    """The arguments of ``torch.onnx.export`` that choose ``exporter``
    ('dynamo' or 'torchscript'); a RuntimeError naming the torch version
    where this torch lacks it."""
    if exporter not in ('dynamo', 'torchscript'):
        raise ValueError(f'unknown ONNX exporter {exporter!r}: expected '
                         '\'dynamo\' or \'torchscript\'')
    if exporter not in ONNX_EXPORTERS:
        raise RuntimeError(
            f'the {exporter} ONNX exporter (torch.onnx.export(dynamo=True)) '
            f'needs torch >= 2.5; this is torch {torch.__version__}, whose '
            'exporter is the TorchScript one')
    if len(ONNX_EXPORTERS) == 1:
        return {}
    return dict(dynamo=exporter == 'dynamo')


def register_fake(qualname: str):
    """The decorator that registers an operator's fake implementation (the
    output's shape and layout, for FakeTensor and meta tensors):
    ``torch.library.register_fake`` (torch >= 2.4), ``impl_abstract``
    (2.2, 2.3), ``torch._custom_ops.impl_abstract`` (2.1)."""
    for name in ('register_fake', 'impl_abstract'):
        register = getattr(torch.library, name, None)
        if register is not None:
            return register(qualname)
    from torch._custom_ops import impl_abstract
    return impl_abstract(qualname)


def _autocast_enabled_by_device():
    """``torch.is_autocast_enabled(device_type)`` where it takes a device
    type (torch >= 2.4); before it, one function per device type."""
    try:
        torch.is_autocast_enabled('cpu')
        return torch.is_autocast_enabled
    except TypeError:
        pass

    def enabled(device_type: str) -> bool:
        if device_type == 'cuda':
            return torch.is_autocast_enabled()
        per_device = getattr(torch, f'is_autocast_{device_type}_enabled', None)
        return bool(per_device is not None and per_device())

    return enabled


autocast_enabled = _autocast_enabled_by_device()

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


# -- autograd's version counters -------------------------------------------
def _takes_sequences() -> bool:
    # torch 2.4 and older take one tensor a call (a RuntimeError for a
    # tuple); later ones a tensor or a sequence of them.
    try:
        torch.autograd.graph.increment_version(())
        return True
    except (RuntimeError, TypeError):
        return False


_VERSIONS_AT_ONCE = _takes_sequences()


def increment_versions(tensors) -> None:
    """``torch.autograd.graph.increment_version`` for each of ``tensors``
    (written in place outside autograd's sight)."""
    if _VERSIONS_AT_ONCE:
        torch.autograd.graph.increment_version(tensors)
        return
    for tensor in tensors:
        torch.autograd.graph.increment_version(tensor)


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


# -- across Triton versions -------------------------------------------------
# Imported only where SN's Triton kernels are (Triton is optional). The
# kernels support Triton 3.0 (torch 2.4) to 3.8 (torch 2.14); what differs
# between those releases, and which release it applies to, is here.
def triton_version() -> tuple:
    """Triton's (major, minor)."""
    import triton
    return tuple(int(part) for part in triton.__version__.split('.')[:2])


# The NVIDIA architectures newer than Hopper (sm_90) and the first Triton
# that compiles for each. An older Triton's LLVM aborts the whole process
# on them ("'sm_100' is not a recognized processor for this target", then
# "LLVM ERROR: Cannot select"; measured with Triton 3.0), which no
# exception handler catches, so they are never tried with one. Blackwell
# came with Triton 3.3 (torch 2.7, pytorch/pytorch#146518), sm_103 with
# 3.5.1 (pytorch/pytorch#167008), sm_121 with 3.6's second ptxas
# (triton-lang/triton#10331); sm_110 is measured from 3.8.
FIRST_TRITON_FOR = {
    100: (3, 3),
    101: (3, 3),
    120: (3, 3),
    103: (3, 5),
    121: (3, 6),
    110: (3, 8),
}
NEWEST_BEFORE_BLACKWELL = 90


def untargeted_capability(capability: int) -> Optional[str]:
    """Why this Triton cannot be asked to compile for sm_``capability``
    (one newer than it knows), or None."""
    if capability <= NEWEST_BEFORE_BLACKWELL:
        return None
    have = triton_version()
    first = FIRST_TRITON_FOR.get(capability)
    if first is not None and have >= first:
        return None
    version = '.'.join(map(str, have))
    needs = ('a Triton that knows it'
             if first is None else f'Triton >= {".".join(map(str, first))}')
    return (f'Triton {version} does not target sm_{capability} (compiling '
            f'for it would abort the process); it needs {needs}')


def _ast_source_takes_constexprs() -> bool:
    # Triton >= 3.3: ASTSource(fn, signature, constexprs=...), the signature
    # naming every argument ('constexpr' for compile-time ones); Triton
    # 3.0-3.2: ASTSource(fn, signature, constants=...), the signature naming
    # the runtime arguments only.
    import inspect

    from triton.compiler import ASTSource
    return 'constexprs' in inspect.signature(ASTSource.__init__).parameters


def compile_for_gpu(kernel, signature: dict, constexprs: dict,
                    capability: int):
    """``kernel`` (a ``triton.jit`` function) compiled ahead of time for an
    NVIDIA GPU of compute capability ``capability`` (``90`` for sm_90),
    no GPU needed: Triton lowers it to PTX and ptxas assembles a cubin.
    ``signature`` maps each argument's name to its Triton type, compile-time
    ones to ``'constexpr'``; ``constexprs`` gives their values. Raises what
    Triton raises where it cannot compile the kernel for that target."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    if _ast_source_takes_constexprs():
        source = ASTSource(
            fn=kernel, signature=signature, constexprs=constexprs)
    else:
        runtime = {
            name: kind
            for name, kind in signature.items() if kind != 'constexpr'
        }
        source = ASTSource(fn=kernel, signature=runtime, constants=constexprs)
    return triton.compile(source, target=GPUTarget('cuda', capability, 32))
