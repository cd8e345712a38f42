"""Row kernels of SN: every full-size pass over the data goes through these.

Each works on a contiguous (N, C, L) tensor, one row per (n, c). The native
CPU extension (``sn_mm._ext``, built by ``pip install -e .``) runs them in
one pass each, in parallel over rows; without it, plain PyTorch does the same
computation.
"""
import torch

try:
    from .. import _ext
except ImportError:  # not built: pure PyTorch
    _ext = None


def native_available() -> bool:
    return _ext is not None


def _native(x: torch.Tensor) -> bool:
    return (_ext is not None and x.device.type == 'cpu'
            and x.dtype in (torch.float32, torch.float64)
            and not torch.is_grad_enabled())


def row_moments(x, correction: int, use_native: bool = True):
    """Per-row (mean, variance) of x (N, C, L), variance with
    ``correction`` (0 or 1) subtracted from the divisor."""
    if use_native and _native(x):
        return tuple(_ext.row_moments(x, correction))
    var, mean = torch.var_mean(x, dim=-1, correction=correction)
    return mean, var


def row_affine(x, scale, shift, use_native: bool = True):
    """x * scale + shift, with scale and shift per row (N, C)."""
    if use_native and _native(x):
        return _ext.row_affine(x, scale.contiguous(), shift.contiguous())
    return torch.addcmul(shift.unsqueeze(-1), x, scale.unsqueeze(-1))


def row_grad_sums(grad, x, use_native: bool = True):
    """Per-row (sum of grad, sum of grad * x)."""
    if use_native and _native(x):
        return tuple(_ext.row_grad_sums(grad.contiguous(), x))
    return grad.sum(-1), torch.linalg.vecdot(grad, x, dim=-1)


def row_input_grad(grad, x, scale, a, b, use_native: bool = True):
    """grad * scale + a * x + b, with scale, a and b per row (N, C)."""
    if use_native and _native(x):
        return _ext.row_input_grad(grad.contiguous(), x, scale.contiguous(),
                                   a.contiguous(), b.contiguous())
    out = torch.addcmul(b.unsqueeze(-1), x, a.unsqueeze(-1))
    return out.addcmul_(grad, scale.unsqueeze(-1))
