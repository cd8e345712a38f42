"""SN's forward and analytic backward (the paper's Appendix) as one autograd
Function, for one device or a process group (SyncSN).

Saved for backward: the input and per-(n, c) statistics only. The input
gradient folds into ``dx = g * scale + a * (x - mean_in) + b`` with per-row
``a`` and ``b``, so backward is one reduction pass and one elementwise pass
over the data. SyncSN adds one all-gather in forward (each rank's sample
count, BN means and centred second moments, combined with Chan et al.'s
parallel formula) and one all-reduce in backward (the gradients of the
shared BN statistics).

Double backward (``create_graph=True``, e.g. a gradient penalty) is exact:
the backward then recomputes the forward from differentiable PyTorch ops and
differentiates that, a slower route used only when a graph of the gradient
is asked for. Across processes (SyncSN with a group of more than one rank)
it raises instead: the collectives are not differentiable.
"""
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from .kernels import TORCH


def _bn_statistics(n: int, mean_c: Tensor, m2_c: Tensor, group):
    """The batch's (over the group's) sample count and BN mean and variance
    from each rank's count, channel means and centred second moments."""
    count = mean_c.new_full((1, ), n)
    if group is None:
        return count[0], mean_c, m2_c / count.clamp_min(1)
    local = torch.cat([count, mean_c, m2_c])
    gathered = [torch.empty_like(local)
                for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, local, group=group)
    stats = torch.stack(gathered)
    c = mean_c.numel()
    counts, means, m2s = stats[:, :1], stats[:, 1:c + 1], stats[:, c + 1:]
    total = counts.sum()
    mean = (counts * means).sum(0) / total.clamp_min(1)
    m2 = m2s.sum(0) + (counts * (means - mean).square()).sum(0)
    return total, mean, m2 / total.clamp_min(1)


def ratio_without_in(ratio: Tensor) -> Tensor:
    """A ratio vector (IN first) for an input without IN: the other terms
    renormalised, or LN alone where the vector selected IN alone (LN is the
    other per-sample statistic)."""
    rest = ratio[1:]
    total = rest.sum()
    ln_only = torch.zeros_like(rest)
    ln_only[0] = 1
    return torch.where(total > 0, rest / total.clamp_min(1e-30), ln_only)


def mixing_ratios(logits: Tensor, fixed: Optional[Tensor],
                  fixed_ratio: Optional[Tensor], has_in: bool,
                  given: bool = False) -> Tensor:
    """The ratio vector a layer mixes with: ``softmax(logits)``, or where
    ``fixed`` (a bool scalar tensor) is set, ``fixed_ratio`` itself (exact
    zeros stay exact). Without IN (one position) the IN term is left out and
    the rest renormalised (:func:`ratio_without_in`). ``given``: ``logits``
    already is the ratio vector (e.g. SparsestMax's), used as it is; without
    IN its IN entry is dropped (the caller renormalised the rest). No branch
    on tensor values: nothing waits on the device and tracers see one
    graph."""
    if given:
        soft = logits if has_in else logits[1:]
    else:
        soft = torch.softmax(logits if has_in else logits[1:], 0)
    if fixed is None:
        return soft
    if not has_in:
        fixed_ratio = ratio_without_in(fixed_ratio)
    return torch.where(fixed, fixed_ratio, soft)


def sn_forward(kernels, x: Tensor, weight: Tensor, bias: Tensor,
               mean_logits: Tensor, var_logits: Tensor,
               running_mean: Optional[Tensor], running_var: Optional[Tensor],
               training: bool, has_in: bool, correction: int, eps: float,
               group, fixed: Optional[Tensor] = None,
               fixed_ratios: Optional[Tensor] = None,
               ratios_given: bool = False):
    """SN's forward from ``kernels``; with the PyTorch kernels and autograd
    recording, a differentiable composite. ``fixed`` (2,) bool and
    ``fixed_ratios`` (2, K): the mean and variance ratios given instead of
    the softmax where set (None: none). ``ratios_given``: the "logits" are
    the ratio vectors themselves (see :func:`mixing_ratios`). Returns the
    output, the BN mean, variance and sample count used (None without a BN
    branch or in eval), and what backward needs."""
    n, c, _ = x.shape
    if x.numel():
        mean_in, var_in = kernels.row_moments(x, correction)
    else:
        mean_in = var_in = x.new_zeros(n, c)
    mean_ln, var_ln, mean_c, m2_c = kernels.moment_reductions(mean_in,
                                                              var_in)
    mean_bn = var_bn = has = total = None
    if running_mean is not None:
        if training:
            total, mean_bn, var_bn = _bn_statistics(n, mean_c, m2_c, group)
            has = total > 0
            # No sample anywhere: the running statistics stand in.
            mean_bn = torch.where(has, mean_bn, running_mean)
            var_bn = torch.where(has, var_bn, running_var)
        else:
            mean_bn, var_bn = running_mean, running_var
    wm = mixing_ratios(mean_logits, None if fixed is None else fixed[0],
                       None if fixed is None else fixed_ratios[0], has_in,
                       ratios_given)
    wv = mixing_ratios(var_logits, None if fixed is None else fixed[1],
                       None if fixed is None else fixed_ratios[1], has_in,
                       ratios_given)
    # The weighted LN (N, 1) and BN (C,) terms; the kernel adds IN's.
    k = 1 if has_in else 0
    wm_in, wv_in = (wm[0], wv[0]) if has_in else (wm.new_zeros(()), ) * 2
    if mean_bn is not None:
        mu_c, var_c = wm[k + 1] * mean_bn, wv[k + 1] * var_bn
    else:
        mu_c = var_c = x.new_zeros(c)
    y, mu, rstd = kernels.normalize(x, mean_in, var_in, wm_in, wv_in,
                                    wm[k] * mean_ln, wv[k] * var_ln, mu_c,
                                    var_c, weight, bias, eps)
    saved = (wm, wv, mean_in, var_in, mean_ln, var_ln, mean_bn, var_bn, has,
             total, mu, rstd)
    return y, saved


class SwitchableNormFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor,
                mean_logits: Tensor, var_logits: Tensor,
                running_mean: Optional[Tensor], running_var: Optional[Tensor],
                training: bool, has_in: bool, correction: int, eps: float,
                group, kernels, fixed: Optional[Tensor] = None,
                fixed_ratios: Optional[Tensor] = None,
                ratios_given: bool = False):
        """x: (N, C, L), its rows contiguous for the native and Triton
        kernels (the PyTorch ones take any strides); ``kernels``: the kernel
        set chosen for
        this call (:func:`sn_mm.ops.select_kernels`), kept for backward.
        ``fixed``/``fixed_ratios``: see :func:`sn_forward`; fixed ratios
        take no gradient. ``ratios_given``: ``mean_logits``/``var_logits``
        are the ratio vectors themselves (their gradient is returned as it
        is, without the softmax's Jacobian; it is defined up to a constant
        shift, which any ratio function onto the simplex ignores). Returns
        the output and the BN mean and variance used (None without a BN
        branch) and whether the batch (over the group) had samples, for the
        running-statistics update."""
        y, saved = sn_forward(kernels, x, weight, bias, mean_logits,
                              var_logits, running_mean, running_var, training,
                              has_in, correction, eps, group, fixed,
                              fixed_ratios, ratios_given)
        (wm, wv, mean_in, var_in, mean_ln, var_ln, mean_bn, var_bn, has,
         total, mu, rstd) = saved
        bn_batch = running_mean is not None and training
        ctx.meta = (has_in, bn_batch, training, correction, eps, group,
                    kernels)
        # For a double backward's recomputation only. Not saved tensors: the
        # layer updates them in place after this call, and they are
        # constants to the output (or, in a batch without samples, left
        # untouched by that update).
        ctx.running = (running_mean, running_var)
        ctx.fixed = (fixed, fixed_ratios)
        ctx.ratios_given = ratios_given
        ctx.save_for_backward(x, weight, bias, mean_logits, var_logits, wm,
                              wv, mean_in, var_in, mean_ln, var_ln, mean_bn,
                              var_bn, has, total, mu, rstd)
        if not bn_batch:
            return y, None, None, None
        ctx.mark_non_differentiable(mean_bn, var_bn, has)
        return y, mean_bn, var_bn, has

    @staticmethod
    def backward(ctx, grad_y, *_):
        if torch.is_grad_enabled():
            return SwitchableNormFunction._backward_recorded(ctx, grad_y)
        (x, weight, _, _, _, wm, wv, mean_in, var_in, mean_ln, var_ln,
         mean_bn, var_bn, has, total, mu, rstd) = ctx.saved_tensors
        has_in, bn_batch, _, correction, _, group, kernels = ctx.meta
        n, c, _ = x.shape
        if kernels is not TORCH:  # (PyTorch's ops take any strides)
            grad_y = grad_y.contiguous()
        if x.numel():
            s1, s2 = kernels.row_grad_sums(grad_y, x, mean_in)
        else:
            s1 = s2 = x.new_zeros(n, c)
        mean_c = mean_bn if mean_bn is not None else x.new_zeros(c)
        (grad_weight, grad_bias, d_mu_n, d_var_n, d_mu_c, d_var_c,
         dots) = kernels.grad_reductions(s1, s2, mu, rstd, weight, mean_in,
                                         var_in, mean_ln, mean_c)

        # Ratio vectors: d loss / d w_k (the mean terms less a per-row shift
        # common to all, see grad_reductions), then through the softmax.
        d_wm = [dots[0]]
        d_wv = [(d_var_n * var_ln).sum()]
        if mean_bn is not None:
            d_wm.append(dots[1])
            d_wv.append((d_var_c * var_bn).sum())
        if has_in:
            d_wm.insert(0, dots[0].new_zeros(()))
            d_wv.insert(0, dots[2])
        d_wm, d_wv = torch.stack(d_wm), torch.stack(d_wv)
        if ctx.ratios_given:
            grad_mean_logits, grad_var_logits = d_wm, d_wv
        else:
            grad_mean_logits = wm * (d_wm - (wm * d_wm).sum())
            grad_var_logits = wv * (d_wv - (wv * d_wv).sum())
        fixed, _ = ctx.fixed
        if fixed is not None:  # fixed ratios do not depend on the logits
            grad_mean_logits = grad_mean_logits * ~fixed[0]
            grad_var_logits = grad_var_logits * ~fixed[1]
        if not has_in:  # the IN logit took no part
            grad_mean_logits = torch.cat([grad_mean_logits.new_zeros(1),
                                          grad_mean_logits])
            grad_var_logits = torch.cat([grad_var_logits.new_zeros(1),
                                         grad_var_logits])

        # Back through the LN (N, 1) and BN (C,) statistics to each row's IN
        # mean and variance (Eq. 5 reversed).
        k = 1 if has_in else 0
        dvar_n = wv[k] * d_var_n / c
        dmean_n = wm[k] * d_mu_n / c
        if bn_batch:
            g_bn = torch.cat([wm[k + 1] * d_mu_c, wv[k + 1] * d_var_c])
            if group is not None:
                # The shared statistics collect gradient from every rank.
                dist.all_reduce(g_bn, group=group)
            g_bn = g_bn * has / total.clamp_min(1)  # no sample: no gradient
            dmean_c, dvar_c, center_c = g_bn[:c], g_bn[c:], mean_bn
        else:
            dmean_c = dvar_c = center_c = x.new_zeros(c)
        wm_in, wv_in = (wm[0], wv[0]) if has_in else (wm.new_zeros(()), ) * 2
        if x.numel():
            grad_x = kernels.input_grad(grad_y, x, s1, s2, mu, rstd, weight,
                                        mean_in, wm_in, wv_in, dvar_n,
                                        dmean_n, mean_ln, dvar_c, dmean_c,
                                        center_c, correction)
        else:
            grad_x = torch.zeros_like(x)
        return (grad_x, grad_weight, grad_bias, grad_mean_logits,
                grad_var_logits) + (None, ) * 11

    @staticmethod
    def _backward_recorded(ctx, grad_y):
        """Backward with a graph (create_graph=True): differentiate a
        recomputed differentiable forward, so that every higher derivative
        is exact."""
        x, weight, bias, mean_logits, var_logits = ctx.saved_tensors[:5]
        running_mean, running_var = ctx.running
        has_in, _, training, correction, eps, group, _ = ctx.meta
        if group is not None:
            raise RuntimeError(
                'SyncSN: double backward (create_graph=True) across several '
                'processes is not supported; on one process (or with SN) it '
                'is exact')
        inputs = (x, weight, bias, mean_logits, var_logits)
        wanted = [i for i, need in enumerate(ctx.needs_input_grad[:5])
                  if need]
        y, _ = sn_forward(TORCH, x, weight, bias, mean_logits, var_logits,
                          running_mean, running_var, training, has_in,
                          correction, eps, None, *ctx.fixed,
                          ctx.ratios_given)
        grads = torch.autograd.grad(y, [inputs[i] for i in wanted], grad_y,
                                    create_graph=True, allow_unused=True)
        result = [None] * 5
        for i, g in zip(wanted, grads):
            result[i] = torch.zeros_like(inputs[i]) if g is None else g
        return tuple(result) + (None, ) * 11
