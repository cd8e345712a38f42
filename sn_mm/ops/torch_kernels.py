"""SN's six kernels in plain PyTorch ops.

The reference implementation of every kernel: it runs on any device and
dtype, is differentiable (SN's double backward records through it), and the
native (``csrc/sn_kernels.cpp``) and Triton (``triton_kernels.py``) versions
are tested against it. The input is a contiguous (N, C, L) tensor, one row
per (n, c); ``sn_function.py`` composes the kernels into SN's passes.

Every quantity that could be the small difference of two large numbers when
an input is far from zero (|mean| >> std) is computed centred instead:
variances of means about their own mean (Chan et al.'s parallel formula),
gradient sums about the row mean, the output as ``(x - mu) * scale``.
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
    """LN and BN statistics from IN's (N, C) moments (Eq. 5's reuse):
    per sample ``mean_ln`` and ``var_ln = mean_c(var_in) + mean_c((mean_in
    - mean_ln)**2)`` (N, 1); per channel ``mean_c = mean_n(mean_in)`` and
    ``m2_c = sum_n(var_in) + sum_n((mean_in - mean_c)**2)`` (C,), the BN
    variance times the number of samples. Algebraically the released
    ``mean(var_in + mean_in**2) - mean**2``, without its cancellation."""
    n, c = mean_in.shape
    if n == 0:
        zeros = mean_in.new_zeros(c)
        return mean_in.new_zeros(0, 1), mean_in.new_zeros(0, 1), zeros, zeros
    var_mean_ln, mean_ln = torch.var_mean(mean_in, 1, correction=0,
                                          keepdim=True)
    var_ln = var_in.mean(1, keepdim=True) + var_mean_ln
    var_mean_c, mean_c = torch.var_mean(mean_in, 0, correction=0)
    m2_c = var_in.sum(0) + var_mean_c * n
    return mean_ln, var_ln, mean_c, m2_c


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
    y = torch.addcmul(bias.unsqueeze(-1), x - mu.unsqueeze(-1),
                      scale.unsqueeze(-1))
    return y, mu, rstd


def row_grad_sums(grad: Tensor, x: Tensor,
                  mean_in: Tensor) -> Tuple[Tensor, Tensor]:
    """Per-row (sum of grad, sum of grad * (x - mean_in))."""
    return grad.sum(-1), torch.linalg.vecdot(grad, x - mean_in.unsqueeze(-1),
                                             dim=-1)


def _mixed_grads(sum_g, sum_gxc, mu, rstd, weight, mean_in):
    """Per row: sum g * (x - mu), and the gradients of the mixed mean and
    variance."""
    centred = torch.addcmul(sum_gxc, mu - mean_in, sum_g, value=-1)
    scale = weight * rstd
    d_mu = -scale * sum_g
    d_var = (-0.5 * scale) * rstd.square() * centred
    return centred, d_mu, d_var


def grad_reductions(sum_g: Tensor, sum_gxc: Tensor, mu: Tensor, rstd: Tensor,
                    weight: Tensor, mean_in: Tensor, var_in: Tensor,
                    mean_ln: Tensor, mean_c: Tensor) -> Tuple[Tensor, ...]:
    """From the row sums of the output gradient (``sum_gxc = sum g * (x -
    mean_in)``), with ``scale = weight * rstd`` and the gradients of the
    mixed statistics ``d_mu = -scale * sum_g`` and ``d_var = -scale *
    rstd**2 / 2 * sum g * (x - mu)``: returns grad_weight (C,), grad_bias
    (C,), the sums of d_mu and d_var over channels (N, 1) and over samples
    (C,), and three dot products (3,) for the ratio gradients: d_mu with
    ``mean_ln - mean_in`` and with ``mean_c - mean_in`` (the LN and BN means
    less a per-row shift common to every term, which the softmax gradient
    ignores), and d_var with ``var_in``."""
    centred, d_mu, d_var = _mixed_grads(sum_g, sum_gxc, mu, rstd, weight,
                                        mean_in)
    dots = torch.stack([
        torch.linalg.vecdot(d_mu.flatten(), (mean_ln - mean_in).flatten(),
                            dim=0),
        torch.linalg.vecdot(d_mu.flatten(), (mean_c - mean_in).flatten(),
                            dim=0),
        torch.linalg.vecdot(d_var.flatten(), var_in.flatten(), dim=0)])
    return (torch.linalg.vecdot(centred, rstd, dim=0), sum_g.sum(0),
            d_mu.sum(1, keepdim=True), d_var.sum(1, keepdim=True),
            d_mu.sum(0), d_var.sum(0), dots)


def input_grad(grad: Tensor, x: Tensor, sum_g: Tensor, sum_gxc: Tensor,
               mu: Tensor, rstd: Tensor, weight: Tensor, mean_in: Tensor,
               wm_in: Tensor, wv_in: Tensor, dvar_n: Tensor, dmean_n: Tensor,
               center_n: Tensor, dvar_c: Tensor, dmean_c: Tensor,
               center_c: Tensor, correction: int) -> Tensor:
    """The input gradient. ``dvar_*`` and ``dmean_*`` are the gradients that
    reach each row's ``var_in`` and ``mean_in`` through the LN (N, 1) and BN
    (C,) statistics, whose variances also depend on ``mean_in`` through its
    deviation from ``center_*`` (the LN and BN means). IN's own part comes
    from d_mu and d_var (see grad_reductions) with weights ``wm_in`` /
    ``wv_in``. Through ``var_in = sum (x - mean_in)**2 / (L - correction)``
    and ``mean_in = mean(x)`` this gives ``dx = grad * scale + a * (x -
    mean_in) + b`` with ``a`` and ``b`` per row."""
    length = x.shape[-1]
    _, d_mu, d_var = _mixed_grads(sum_g, sum_gxc, mu, rstd, weight, mean_in)
    d_var_in = torch.addcmul(dvar_n + dvar_c, d_var, wv_in)
    d_mean_in = torch.addcmul(dmean_n + dmean_c, d_mu, wm_in)
    d_mean_in = d_mean_in + 2 * ((mean_in - center_n) * dvar_n +
                                 (mean_in - center_c) * dvar_c)
    a = d_var_in * (2 / max(length - correction, 1))
    b = d_mean_in / length
    out = torch.addcmul(b.unsqueeze(-1), x - mean_in.unsqueeze(-1),
                        a.unsqueeze(-1))
    return out.addcmul(grad, (weight * rstd).unsqueeze(-1))
