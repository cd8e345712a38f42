"""SN's kernels: every pass over the data and over the (N, C) statistics.

The input is a contiguous (N, C, L) tensor, one row per (n, c). Each kernel
has up to three implementations that compute the same thing:

* the native CPU extension (``sn_mm._ext``, built by ``pip install -e .``;
  one pass each, parallel over rows), used for float32/float64 on the CPU;
* Triton kernels for the four full-size passes (``triton_kernels.py``),
  used for float32 on GPUs when the environment sets
  ``SN_MM_GPU_KERNELS=triton`` (so far checked in Triton's interpreter
  only, hence not the default);
* plain PyTorch, used everywhere else: other devices and dtypes, while
  autograd records, when the extension is not built, or when asked
  (``use_native=False``).

``use_native='triton'`` forces the Triton kernels (on CPU tensors under
``TRITON_INTERPRET=1``). ``sn_function.py`` composes the kernels into SN's
forward and backward.
"""
import os
from typing import Tuple

import torch
from torch import Tensor

try:
    from .. import _ext
except ImportError:  # not built: pure PyTorch
    _ext = None

GPU_KERNELS_ENV = 'SN_MM_GPU_KERNELS'
_triton = None


def native_available() -> bool:
    return _ext is not None


def _triton_kernels():
    global _triton
    if _triton is None:
        try:
            from . import triton_kernels
        except ImportError as err:
            raise RuntimeError(
                f'SN\'s Triton kernels were asked for ({GPU_KERNELS_ENV}='
                f'{os.environ.get(GPU_KERNELS_ENV)!r} or use_native='
                f'\'triton\') but Triton cannot be imported: {err}') from err
        _triton = triton_kernels
    return _triton


def _gpu_kernels() -> str:
    choice = os.environ.get(GPU_KERNELS_ENV, 'torch')
    if choice not in ('torch', 'triton'):
        raise ValueError(f'{GPU_KERNELS_ENV}={choice!r}: expected \'torch\' '
                         f'(the default) or \'triton\'')
    return choice


def _backend(x: Tensor, use_native) -> str:
    if use_native not in (True, False, 'triton'):
        raise ValueError(f'use_native_kernels={use_native!r}: expected True, '
                         f'False or \'triton\'')
    gpu_kernels = _gpu_kernels()  # checked everywhere, used on GPUs
    if not use_native or torch.is_grad_enabled():
        return 'torch'
    if use_native == 'triton' or (x.is_cuda and gpu_kernels == 'triton'):
        # Empty tensors stay in PyTorch: no kernel takes a null pointer.
        return ('triton' if x.dtype == torch.float32 and x.numel() else
                'torch')
    if (_ext is not None and x.device.type == 'cpu'
            and x.dtype in (torch.float32, torch.float64)):
        return 'native'
    return 'torch'


def _native(x: Tensor, use_native) -> bool:
    return _backend(x, use_native) == 'native'


def row_moments(x: Tensor, correction: int,
                use_native: bool = True) -> Tuple[Tensor, Tensor]:
    """Per-row (mean, variance) of x (N, C, L), variance with
    ``correction`` (0 or 1) subtracted from the divisor."""
    backend = _backend(x, use_native)
    if backend == 'native':
        return tuple(_ext.row_moments(x, correction))
    if backend == 'triton':
        return _triton_kernels().row_moments(x, correction)
    var, mean = torch.var_mean(x, dim=-1, correction=correction)
    return mean, var


def moment_reductions(mean_in: Tensor, var_in: Tensor,
                      use_native: bool = True) -> Tuple[Tensor, ...]:
    """From IN's (N, C) moments, Eq. 5's reuse: per sample the means over
    channels of ``mean_in`` and of ``sq = var_in + mean_in**2`` (N, 1), and
    per channel their sums over samples (C,)."""
    if _native(mean_in, use_native):
        return tuple(_ext.moment_reductions(mean_in, var_in))
    sq = torch.addcmul(var_in, mean_in, mean_in)
    return (mean_in.mean(1, keepdim=True), sq.mean(1, keepdim=True),
            mean_in.sum(0), sq.sum(0))


def normalize(x: Tensor, mean_in: Tensor, var_in: Tensor, wm_in: Tensor,
              wv_in: Tensor, mu_n: Tensor, var_n: Tensor, mu_c: Tensor,
              var_c: Tensor, weight: Tensor, bias: Tensor, eps: float,
              use_native: bool = True) -> Tuple[Tensor, Tensor, Tensor]:
    """Mixes the statistics per row (n, c),
    ``mu = wm_in * mean_in + mu_n[n] + mu_c[c]`` (likewise the variance,
    ``mu_n``/``var_n`` (N, 1) the weighted LN terms, ``mu_c``/``var_c`` (C,)
    the weighted BN terms), and returns ``(y, mu, rstd)`` with
    ``rstd = 1 / sqrt(var + eps)`` and ``y = (x - mu) * rstd * weight +
    bias``."""
    backend = _backend(x, use_native)
    if backend == 'native':
        return tuple(_ext.normalize(x, mean_in, var_in, float(wm_in),
                                    float(wv_in), mu_n, var_n, mu_c, var_c,
                                    weight, bias, eps))
    if backend == 'triton':
        return _triton_kernels().normalize(x, mean_in, var_in, wm_in, wv_in,
                                           mu_n, var_n, mu_c, var_c, weight,
                                           bias, eps)
    mu = torch.addcmul(mu_n + mu_c, mean_in, wm_in)
    var = torch.addcmul(var_n + var_c, var_in, wv_in)
    rstd = (var + eps).rsqrt_()
    scale = weight * rstd
    shift = torch.addcmul(bias, mu, scale, value=-1)
    y = torch.addcmul(shift.unsqueeze(-1), x, scale.unsqueeze(-1))
    return y, mu, rstd


def row_grad_sums(grad: Tensor, x: Tensor,
                  use_native: bool = True) -> Tuple[Tensor, Tensor]:
    """Per-row (sum of grad, sum of grad * x)."""
    backend = _backend(x, use_native)
    if backend == 'native':
        return tuple(_ext.row_grad_sums(grad, x))
    if backend == 'triton':
        return _triton_kernels().row_grad_sums(grad, x)
    return grad.sum(-1), torch.linalg.vecdot(grad, x, dim=-1)


def grad_reductions(sum_g: Tensor, sum_gx: Tensor, mu: Tensor, rstd: Tensor,
                    weight: Tensor, mean_in: Tensor, var_in: Tensor,
                    use_native: bool = True) -> Tuple[Tensor, ...]:
    """From the row sums of the output gradient, with ``scale = weight *
    rstd`` and the gradients of the mixed statistics ``d_mu = -scale *
    sum_g`` and ``d_var = -scale * rstd**2 / 2 * (sum_gx - mu * sum_g)``:
    returns grad_weight (C,), grad_bias (C,), the sums of d_mu and d_var
    over channels (N, 1) and over samples (C,), and their dot products with
    IN's mean and variance (2,)."""
    if _native(sum_g, use_native):
        return tuple(_ext.grad_reductions(sum_g, sum_gx, mu, rstd, weight,
                                          mean_in, var_in))
    centred = torch.addcmul(sum_gx, mu, sum_g, value=-1)
    scale = weight * rstd
    d_mu = -scale * sum_g
    d_var = (-0.5 * scale) * rstd.square() * centred
    dots = torch.stack([torch.linalg.vecdot(d_mu.flatten(),
                                            mean_in.flatten(), dim=0),
                        torch.linalg.vecdot(d_var.flatten(),
                                            var_in.flatten(), dim=0)])
    return (torch.linalg.vecdot(centred, rstd, dim=0), sum_g.sum(0),
            d_mu.sum(1, keepdim=True), d_var.sum(1, keepdim=True),
            d_mu.sum(0), d_var.sum(0), dots)


def input_grad(grad: Tensor, x: Tensor, sum_g: Tensor, sum_gx: Tensor,
               mu: Tensor, rstd: Tensor, weight: Tensor, mean_in: Tensor,
               wm_in: Tensor, wv_in: Tensor, dsq_n: Tensor, dmean_n: Tensor,
               dsq_c: Tensor, dmean_c: Tensor, correction: int,
               use_native: bool = True) -> Tensor:
    """The input gradient. ``dsq_*`` and ``dmean_*`` are the gradients that
    reach each row's ``sq = var_in + mean_in**2`` and ``mean_in`` through
    the LN (N, 1) and BN (C,) statistics; IN's own part comes from d_mu and
    d_var (see grad_reductions) with weights ``wm_in``/``wv_in``. Through
    ``var_in = sum (x - mean_in)**2 / (L - correction)`` and
    ``mean_in = mean(x)`` this gives ``dx = grad * scale + a * x + b`` with
    ``a`` and ``b`` per row."""
    backend = _backend(x, use_native)
    if backend == 'native':
        return _ext.input_grad(grad, x, sum_g, sum_gx, mu, rstd, weight,
                               mean_in, float(wm_in), float(wv_in), dsq_n,
                               dmean_n, dsq_c, dmean_c, correction)
    if backend == 'triton':
        return _triton_kernels().input_grad(
            grad, x, sum_g, sum_gx, mu, rstd, weight, mean_in, wm_in, wv_in,
            dsq_n, dmean_n, dsq_c, dmean_c, correction)
    length = x.shape[-1]
    scale = weight * rstd
    centred = torch.addcmul(sum_gx, mu, sum_g, value=-1)
    d_mu = -scale * sum_g
    d_var = (-0.5 * scale) * rstd.square() * centred
    d_sq = dsq_n + dsq_c
    d_var_in = torch.addcmul(d_sq, d_var, wv_in)
    d_mean_in = torch.addcmul(dmean_n + dmean_c, d_mu, wm_in)
    d_mean_in = torch.addcmul(d_mean_in, mean_in, d_sq, value=2)
    a = d_var_in * (2 / max(length - correction, 1))
    b = torch.addcmul(d_mean_in / length, a, mean_in, value=-1)
    out = torch.addcmul(b.unsqueeze(-1), x, a.unsqueeze(-1))
    return out.addcmul_(grad, scale.unsqueeze(-1))
