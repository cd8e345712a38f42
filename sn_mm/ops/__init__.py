"""SN's kernels and the autograd Function built on them.

Three implementations of the same six kernels sit side by side:
``torch_kernels.py`` (PyTorch ops, the reference), ``csrc/sn_kernels.cpp``
(native CPU, wrapped by ``native_kernels.py``) and ``triton_kernels.py``
(GPUs). ``kernels.py`` picks one per forward; ``sn_function.py`` composes
them into SN's forward and backward.
"""
from .kernels import (KERNEL_CHOICES, KERNELS_ENV, check_kernels,
                      default_kernels, native_available, select_kernels,
                      set_default_kernels)
from .sn_function import SwitchableNormFunction

__all__ = [
    'KERNEL_CHOICES', 'KERNELS_ENV', 'check_kernels', 'default_kernels',
    'native_available', 'select_kernels', 'set_default_kernels',
    'SwitchableNormFunction'
]
