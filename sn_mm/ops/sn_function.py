"""SN's forward and analytic backward (the paper's Appendix) as one autograd
Function, for one device or a process group (SyncSN).

Saved for backward: the input and per-(n, c) statistics only. The input
gradient folds into ``dx = g * scale + a * x + b`` with per-row ``a`` and
``b``, so backward is one reduction pass and one elementwise pass over the
data. SyncSN adds one all-reduce in forward (BN sums and sample count) and
one in backward (the gradients of the shared BN statistics).
"""
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from .kernels import TORCH


def _in_weights(wm: Tensor, wv: Tensor, has_in: bool):
    """IN's mean and variance ratios; zero where IN takes no part."""
    return (wm[0], wv[0]) if has_in else (wm.new_zeros(()), ) * 2


class SwitchableNormFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor,
                mean_logits: Tensor, var_logits: Tensor,
                running_mean: Optional[Tensor], running_var: Optional[Tensor],
                training: bool, has_in: bool, correction: int, eps: float,
                group, kernels):
        """x: contiguous (N, C, L); ``kernels``: the kernel set chosen for
        this call (:func:`sn_mm.ops.select_kernels`), kept for backward.
        Returns the output and the BN mean and variance used (None without a
        BN branch) and whether the batch (over the group) had samples, for
        the running-statistics update."""
        n, c, _ = x.shape
        using_bn = running_mean is not None
        if x.numel():
            mean_in, var_in = kernels.row_moments(x, correction)
        else:
            mean_in = var_in = x.new_zeros(n, c)
        mean_ln, sq_ln, sum_mean, sum_sq = kernels.moment_reductions(
            mean_in, var_in)
        var_ln_raw = sq_ln - mean_ln.square()
        var_ln = var_ln_raw.clamp_min(0)

        mean_bn = var_bn = bn_pos = has = total = None
        if using_bn:
            if training:
                packed = torch.cat([sum_mean, sum_sq, x.new_full((1, ), n)])
                if group is not None:
                    dist.all_reduce(packed, group=group)
                total = packed[-1].clamp_min(1)
                has = packed[-1] > 0
                mean_bn = packed[:c] / total
                var_bn_raw = packed[c:2 * c] / total - mean_bn.square()
                bn_pos = var_bn_raw >= 0
                # No sample anywhere: the running statistics stand in.
                mean_bn = torch.where(has, mean_bn, running_mean)
                var_bn = torch.where(has, var_bn_raw.clamp_min(0),
                                     running_var)
            else:
                mean_bn, var_bn = running_mean, running_var
        if not has_in:
            mean_logits, var_logits = mean_logits[1:], var_logits[1:]
        wm = F.softmax(mean_logits, 0)
        wv = F.softmax(var_logits, 0)
        # The weighted LN (N, 1) and BN (C,) terms; the kernel adds IN's.
        k = 1 if has_in else 0
        wm_in, wv_in = _in_weights(wm, wv, has_in)
        if using_bn:
            mu_c, var_c = wm[k + 1] * mean_bn, wv[k + 1] * var_bn
        else:
            mu_c = var_c = x.new_zeros(c)
        y, mu, rstd = kernels.normalize(x, mean_in, var_in, wm_in, wv_in,
                                        wm[k] * mean_ln, wv[k] * var_ln, mu_c,
                                        var_c, weight, bias, eps)

        ctx.meta = (has_in, using_bn and training, correction, group,
                    kernels)
        ctx.save_for_backward(x, weight, wm, wv, mean_in, var_in, mean_ln,
                              var_ln, var_ln_raw >= 0, mean_bn, var_bn,
                              bn_pos, has, total, mu, rstd)
        if not (using_bn and training):
            return y, None, None, None
        ctx.mark_non_differentiable(mean_bn, var_bn, has)
        return y, mean_bn, var_bn, has

    @staticmethod
    def backward(ctx, grad_y, *_):
        (x, weight, wm, wv, mean_in, var_in, mean_ln, var_ln, ln_pos, mean_bn,
         var_bn, bn_pos, has, total, mu, rstd) = ctx.saved_tensors
        has_in, bn_batch, correction, group, kernels = ctx.meta
        if torch.is_grad_enabled():  # create_graph: record differentiably
            kernels = TORCH
        n, c, _ = x.shape
        grad_y = grad_y.contiguous()
        if x.numel():
            s1, s2 = kernels.row_grad_sums(grad_y, x)
        else:
            s1 = s2 = x.new_zeros(n, c)
        (grad_weight, grad_bias, d_mu_n, d_var_n, d_mu_c, d_var_c,
         dots_in) = kernels.grad_reductions(s1, s2, mu, rstd, weight, mean_in,
                                            var_in)

        # Ratio vectors: d loss / d w_k, then through the softmax.
        d_wm = [(d_mu_n * mean_ln).sum()]
        d_wv = [(d_var_n * var_ln).sum()]
        if mean_bn is not None:
            d_wm.append((d_mu_c * mean_bn).sum())
            d_wv.append((d_var_c * var_bn).sum())
        if has_in:
            d_wm.insert(0, dots_in[0])
            d_wv.insert(0, dots_in[1])
        d_wm, d_wv = torch.stack(d_wm), torch.stack(d_wv)
        grad_mean_logits = wm * (d_wm - (wm * d_wm).sum())
        grad_var_logits = wv * (d_wv - (wv * d_wv).sum())
        if not has_in:  # the IN logit took no part
            grad_mean_logits = torch.cat([grad_mean_logits.new_zeros(1),
                                          grad_mean_logits])
            grad_var_logits = torch.cat([grad_var_logits.new_zeros(1),
                                         grad_var_logits])

        # Back through the LN (N, 1) and BN (C,) statistics to each row's
        # IN moments (Eq. 5 reversed): the gradients reaching its
        # sq = var_in + mean_in^2 and its mean_in.
        k = 1 if has_in else 0
        g_var_ln = wv[k] * d_var_n * ln_pos
        dsq_n = g_var_ln / c
        dmean_n = (wm[k] * d_mu_n - 2 * mean_ln * g_var_ln) / c
        if bn_batch:
            g_bn = torch.cat([wm[k + 1] * d_mu_c, wv[k + 1] * d_var_c])
            if group is not None:
                # The shared statistics collect gradient from every rank.
                dist.all_reduce(g_bn, group=group)
            g_bn = g_bn * has  # running statistics took the place: no grad
            g_mean_bn, g_var_bn = g_bn[:c], g_bn[c:] * bn_pos
            dsq_c = g_var_bn / total
            dmean_c = (g_mean_bn - 2 * mean_bn * g_var_bn) / total
        else:
            dsq_c = dmean_c = x.new_zeros(c)
        wm_in, wv_in = _in_weights(wm, wv, has_in)
        if x.numel():
            grad_x = kernels.input_grad(grad_y, x, s1, s2, mu, rstd, weight,
                                        mean_in, wm_in, wv_in, dsq_n, dmean_n,
                                        dsq_c, dmean_c, correction)
        else:
            grad_x = torch.zeros_like(x)
        return (grad_x, grad_weight, grad_bias, grad_mean_logits,
                grad_var_logits) + (None, ) * 8
