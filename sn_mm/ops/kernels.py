"""Which implementation computes SN: one setting, chosen once per forward.

``kernels`` takes one of

* ``'auto'`` -- the native CPU extension for float32/float64 CPU tensors
  when it is built; on GPUs the fused Triton kernels
  (:mod:`sn_mm.ops.triton_fused`: float32/bfloat16/float16 inputs, one
  device) where Triton is installed; PyTorch ops everywhere else;
* ``'native'`` -- the native CPU extension (an error where it cannot run);
* ``'triton'`` -- the fused Triton kernels (GPUs, or CPU tensors under
  ``TRITON_INTERPRET=1``); SyncSN across processes runs its chain of
  kernels with Triton's full-size passes for float32; float64 and empty
  inputs fall back to PyTorch ops, which compute the same thing;
* ``'torch'`` -- plain PyTorch ops everywhere (e.g. for debugging).

A layer's ``kernels`` (``norm_cfg=dict(type='SN', kernels=...)``) wins; a
layer with ``kernels=None`` follows the global default, set by
:func:`set_default_kernels` or the ``SN_MM_KERNELS`` environment variable
(``'auto'`` when neither is set).
"""
import os
from types import SimpleNamespace
from typing import Optional

import torch
from torch import Tensor

from . import native_kernels, torch_kernels

KERNEL_CHOICES = ('auto', 'native', 'triton', 'torch')
KERNELS_ENV = 'SN_MM_KERNELS'
# Read once by earlier versions; now a clear error that names its successor.
LEGACY_GPU_KERNELS_ENV = 'SN_MM_GPU_KERNELS'
_NAMES = ('row_moments', 'moment_reductions', 'normalize', 'row_grad_sums',
          'grad_reductions', 'input_grad')

_default: Optional[str] = None


def _kernel_set(name: str, *modules) -> SimpleNamespace:
    """The six kernels, each from the first module that has it."""
    funcs = {k: next(getattr(m, k) for m in modules if hasattr(m, k))
             for k in _NAMES}
    return SimpleNamespace(name=name, **funcs)


TORCH = _kernel_set('torch', torch_kernels)
NATIVE = _kernel_set('native', native_kernels)
_triton_set = None


def native_available() -> bool:
    """Whether the native CPU extension was built."""
    return native_kernels.available()


def check_kernels(choice, what: str = 'kernels') -> str:
    if choice not in KERNEL_CHOICES:
        raise ValueError(f'{what}={choice!r}: expected one of '
                         + ', '.join(repr(c) for c in KERNEL_CHOICES))
    return choice


# The environment as os.environ holds it (bytes on POSIX): read on every
# layer call, where os.environ.get's encoding and decoding cost more than a
# small layer's arithmetic. os.environ keeps it current (monkeypatch too).
_ENV_BYTES = (os.environ._data if os.name == 'posix'
              and isinstance(getattr(os.environ, '_data', None), dict)
              else None)


def _getenv(name: str):
    if _ENV_BYTES is None:
        return os.environ.get(name)
    value = _ENV_BYTES.get(name.encode())
    return None if value is None else os.fsdecode(value)


def default_kernels() -> str:
    """The global default: :func:`set_default_kernels`, else
    ``$SN_MM_KERNELS``, else ``'auto'``."""
    if _default is not None:
        return _default
    legacy = _getenv(LEGACY_GPU_KERNELS_ENV)
    if legacy is not None:
        raise ValueError(
            f'{LEGACY_GPU_KERNELS_ENV}={legacy!r} is no longer read: set '
            f'{KERNELS_ENV}={legacy} (or kernels={legacy!r} in norm_cfg, or '
            f'sn_mm.ops.set_default_kernels({legacy!r})) instead')
    choice = _getenv(KERNELS_ENV)
    return 'auto' if choice is None else check_kernels(choice, KERNELS_ENV)


def set_default_kernels(choice: Optional[str]) -> None:
    """Set the kernels of every layer whose own ``kernels`` is None;
    ``None`` goes back to ``$SN_MM_KERNELS`` / ``'auto'``."""
    global _default
    _default = None if choice is None else check_kernels(choice)


def _triton():
    global _triton_set
    if _triton_set is None:
        try:
            from . import triton_kernels
        except ImportError as err:
            raise RuntimeError(f'SN\'s Triton kernels were asked for '
                               f'(kernels=\'triton\') but Triton cannot be '
                               f'imported: {err}') from err
        _triton_set = _kernel_set('triton', triton_kernels, torch_kernels)
    return _triton_set


def select_kernels(choice: Optional[str], x: Tensor) -> SimpleNamespace:
    """The kernels that compute SN on ``x`` (the contiguous (N, C, L)
    float32/float64 input of the Function) for a layer's ``choice`` (None:
    the global default). Unknown choices raise a ValueError."""
    choice = default_kernels() if choice is None else check_kernels(choice)
    on_cpu_ext = (x.device.type == 'cpu'
                  and x.dtype in (torch.float32, torch.float64))
    if choice == 'auto':
        return NATIVE if (on_cpu_ext and native_available()) else TORCH
    if choice == 'native':
        if not native_available():
            raise RuntimeError('kernels=\'native\': the native extension '
                               'was not built (SN_MM_NO_EXT=1?)')
        if not on_cpu_ext:
            raise ValueError(f'kernels=\'native\' runs on float32/float64 '
                             f'CPU tensors, got {x.dtype} on {x.device}')
        return NATIVE
    if choice == 'triton':
        if x.device.type != 'cuda' and os.environ.get(
                'TRITON_INTERPRET') != '1':
            raise ValueError(f'kernels=\'triton\' runs on CUDA tensors '
                             f'(or in Triton\'s interpreter with '
                             f'TRITON_INTERPRET=1), got one on {x.device}')
        # Empty tensors have no data pointer to hand to a kernel.
        return (_triton() if x.dtype == torch.float32 and x.numel() else
                TORCH)
    return TORCH
