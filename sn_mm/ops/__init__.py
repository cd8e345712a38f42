"""SN's operator and its implementations.

``operator.py`` holds the one entry point (:func:`switchable_norm`), the
``torch.library`` operator ``sn_mm::switchable_norm`` and the one place
that picks an implementation; ``reference.py`` is SN in PyTorch ops;
``csrc/`` the C++ CPU kernels (``simd.h`` their vectors and loop form,
``row_kernels_impl.h`` the row kernels and the reductions between them,
``row_coefficients.cpp`` their per-channel coefficients, ``sn_forward.cpp``
and ``sn_backward.cpp`` the passes that run them, ``sn_host.cpp`` what
those share and the instruction set, ``sn_operator.cpp`` the operator's
autograd and registration), which ``native.py`` loads or builds on first
use;
``triton_kernels.py`` the fused Triton GPU kernels and ``triton_fused.py``
their host side; ``ratios.py`` the rule from logits to ratio vectors.
"""
from .native import NativeStatus, native_status
from .operator import (KERNEL_CHOICES, KERNELS_ENV, check_kernels, cpu_isa,
                       cpu_isas, cpu_path_counts, default_kernels,
                       implementation, native_available, route, set_cpu_isa,
                       set_cpu_path, set_default_kernels, switchable_norm,
                       triton_problem)
from .ratios import (RATIO_FNS, TERMS, layer_ratios, mixing_ratio,
                     ratio_without_in)
from .sparsestmax import sparsemax, sparsestmax

__all__ = [
    'KERNEL_CHOICES', 'KERNELS_ENV', 'check_kernels', 'cpu_isa', 'cpu_isas',
    'cpu_path_counts', 'default_kernels', 'set_cpu_isa', 'set_cpu_path',
    'implementation', 'route', 'native_available', 'native_status',
    'NativeStatus', 'set_default_kernels', 'switchable_norm', 'triton_problem',
    'RATIO_FNS', 'TERMS', 'layer_ratios', 'mixing_ratio', 'ratio_without_in',
    'sparsemax', 'sparsestmax'
]
