"""SN's six kernels in plain PyTorch ops.

The reference implementation of every kernel: it runs on any device and
dtype, stays differentiable (double backward records through it), and the
native (``csrc/sn_kernels.cpp``) and Triton (``triton_kernels.py``) versions
are tested against it. The input is a contiguous (N, C, L) tensor, one row
per (n, c); ``sn_function.py`` composes the kernels into SN's passes.
"""
from typing import Tuple

import torch
from torch import Tensor


def row_moments(x: Tensor, correction: int) -> Tuple[Tensor, Tensor]:
    """Per-row (mean, variance) of x (N, C, L), variance with
    ``correction`` (0 or 1) subtracted from the divisor."""
    var, mean = torch.var_mean(x, dim=-1, correction=correction)
    return mean, var


def moment_reductions(mean_in: Tensor,
                      var_in: Tensor) -> Tuple[Tensor, ...]:
    """From IN's (N, C) moments, Eq. 5's reuse: per sample the means over
    channels of ``mean_in`` and of ``sq = var_in + mean_in**2`` (N, 1), and
    per channel their sums over samples (C,)."""
    sq = torch.addcmul(var_in, mean_in, mean_in)
    return (mean_in.mean(1, keepdim=True), sq.mean(1, keepdim=True),
            mean_in.sum(0), sq.sum(0))


def normalize(x: Tensor, mean_in: Tensor, var_in: Tensor, wm_in: Tensor,
              wv_in: Tensor, mu_n: Tensor, var_n: Tensor, mu_c: Tensor,
              var_c: Tensor, weight: Tensor, bias: Tensor,
              eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    """Mixes the statistics per row (n, c),
    ``mu = wm_in * mean_in + mu_n[n] + mu_c[c]`` (likewise the variance,
    ``mu_n``/``var_n`` (N, 1) the weighted LN terms, ``mu_c``/``var_c`` (C,)
    the weighted BN terms), and returns ``(y, mu, rstd)`` with
    ``rstd = 1 / sqrt(var + eps)`` and ``y = (x - mu) * rstd * weight +
    bias``."""
    mu = torch.addcmul(mu_n + mu_c, mean_in, wm_in)
    var = torch.addcmul(var_n + var_c, var_in, wv_in)
    rstd = (var + eps).rsqrt()
    scale = weight * rstd
    shift = torch.addcmul(bias, mu, scale, value=-1)
    y = torch.addcmul(shift.unsqueeze(-1), x, scale.unsqueeze(-1))
    return y, mu, rstd


def row_grad_sums(grad: Tensor, x: Tensor) -> Tuple[Tensor, Tensor]:
    """Per-row (sum of grad, sum of grad * x)."""
    return grad.sum(-1), torch.linalg.vecdot(grad, x, dim=-1)


def grad_reductions(sum_g: Tensor, sum_gx: Tensor, mu: Tensor, rstd: Tensor,
                    weight: Tensor, mean_in: Tensor,
                    var_in: Tensor) -> Tuple[Tensor, ...]:
    """From the row sums of the output gradient, with ``scale = weight *
    rstd`` and the gradients of the mixed statistics ``d_mu = -scale *
    sum_g`` and ``d_var = -scale * rstd**2 / 2 * (sum_gx - mu * sum_g)``:
    returns grad_weight (C,), grad_bias (C,), the sums of d_mu and d_var
    over channels (N, 1) and over samples (C,), and their dot products with
    IN's mean and variance (2,)."""
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
               dsq_c: Tensor, dmean_c: Tensor, correction: int) -> Tensor:
    """The input gradient. ``dsq_*`` and ``dmean_*`` are the gradients that
    reach each row's ``sq = var_in + mean_in**2`` and ``mean_in`` through
    the LN (N, 1) and BN (C,) statistics; IN's own part comes from d_mu and
    d_var (see grad_reductions) with weights ``wm_in``/``wv_in``. Through
    ``var_in = sum (x - mean_in)**2 / (L - correction)`` and
    ``mean_in = mean(x)`` this gives ``dx = grad * scale + a * x + b`` with
    ``a`` and ``b`` per row."""
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
    return out.addcmul(grad, scale.unsqueeze(-1))
