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

from . import row_affine, row_grad_sums, row_input_grad, row_moments


class SwitchableNormFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor,
                mean_logits: Tensor, var_logits: Tensor,
                running_mean: Optional[Tensor], running_var: Optional[Tensor],
                training: bool, has_in: bool, correction: int, eps: float,
                group, use_native: bool):
        """x: contiguous (N, C, L). Returns the output and the BN mean and
        variance used (None without a BN branch) and whether the batch (over
        the group) had samples, for the running-statistics update."""
        n, c, length = x.shape
        using_bn = running_mean is not None
        if x.numel():
            mean_in, var_in = row_moments(x, correction, use_native)
        else:
            mean_in = var_in = x.new_zeros(n, c)
        sq = var_in + mean_in.square()
        mean_ln = mean_in.mean(1, keepdim=True)
        var_ln_raw = sq.mean(1, keepdim=True) - mean_ln.square()
        var_ln = var_ln_raw.clamp_min(0)

        means, variances = [mean_ln], [var_ln]
        mean_bn = var_bn = bn_pos = has = total = None
        if using_bn:
            if training:
                packed = torch.cat([mean_in.sum(0), sq.sum(0),
                                    x.new_full((1, ), n)])
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
            means.append(mean_bn.expand(n, c))
            variances.append(var_bn.expand(n, c))
        if has_in:
            means.insert(0, mean_in)
            variances.insert(0, var_in)
        else:
            mean_logits, var_logits = mean_logits[1:], var_logits[1:]
        wm = F.softmax(mean_logits, 0)
        wv = F.softmax(var_logits, 0)
        mu = sum(w * m for w, m in zip(wm, means))
        var = sum(w * v for w, v in zip(wv, variances))
        rstd = torch.rsqrt(var + eps)
        scale = weight * rstd
        y = row_affine(x, scale, bias - mu * scale, use_native)

        ctx.meta = (has_in, using_bn and training, correction, group,
                    use_native)
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
        has_in, bn_batch, correction, group, use_native = ctx.meta
        n, c, length = x.shape
        grad_y = grad_y.contiguous()
        if x.numel():
            s1, s2 = row_grad_sums(grad_y, x, use_native)
        else:
            s1 = s2 = x.new_zeros(n, c)
        centred = s2 - mu * s1  # sum over the row of g * (x - mu)
        grad_weight = (centred * rstd).sum(0)
        grad_bias = s1.sum(0)
        d_mu = -weight * rstd * s1
        d_var = -0.5 * weight * rstd.pow(3) * centred

        # Ratio vectors: d loss / d w_k, then through the softmax.
        means = [mean_ln.expand(n, c)]
        variances = [var_ln.expand(n, c)]
        if mean_bn is not None:
            means.append(mean_bn.expand(n, c))
            variances.append(var_bn.expand(n, c))
        if has_in:
            means.insert(0, mean_in)
            variances.insert(0, var_in)
        d_wm = torch.stack([(d_mu * m).sum() for m in means])
        d_wv = torch.stack([(d_var * v).sum() for v in variances])
        grad_mean_logits = wm * (d_wm - (wm * d_wm).sum())
        grad_var_logits = wv * (d_wv - (wv * d_wv).sum())
        if not has_in:  # the IN logit took no part
            grad_mean_logits = torch.cat([grad_mean_logits.new_zeros(1),
                                          grad_mean_logits])
            grad_var_logits = torch.cat([grad_var_logits.new_zeros(1),
                                         grad_var_logits])

        # Back through the statistics to IN's moments (Eq. 5 reversed).
        k = 0
        if has_in:
            d_mean_in = wm[0] * d_mu
            d_var_in = wv[0] * d_var
            k = 1
        else:
            d_mean_in = torch.zeros_like(d_mu)
            d_var_in = torch.zeros_like(d_var)
        g_mean_ln = wm[k] * d_mu.sum(1, keepdim=True)
        g_var_ln = wv[k] * d_var.sum(1, keepdim=True) * ln_pos
        d_sq = (g_var_ln / c).expand(n, c)
        d_mean_in = d_mean_in + (g_mean_ln - 2 * mean_ln * g_var_ln) / c
        if bn_batch:
            g_bn = torch.cat([wm[k + 1] * d_mu.sum(0),
                              wv[k + 1] * d_var.sum(0)])
            if group is not None:
                # The shared statistics collect gradient from every rank.
                dist.all_reduce(g_bn, group=group)
            g_bn = g_bn * has  # running statistics took the place: no grad
            g_mean_bn, g_var_bn = g_bn[:c], g_bn[c:] * bn_pos
            d_sq = d_sq + g_var_bn / total
            d_mean_in = d_mean_in + (g_mean_bn -
                                     2 * mean_bn * g_var_bn) / total
        d_var_in = d_var_in + d_sq
        d_mean_in = d_mean_in + 2 * mean_in * d_sq

        # var_in = sum (x - mean_in)^2 / (L - correction), mean_in = mean(x).
        a = 2 * d_var_in / max(length - correction, 1)
        b = d_mean_in / length - a * mean_in
        if x.numel():
            grad_x = row_input_grad(grad_y, x, weight * rstd, a, b,
                                    use_native)
        else:
            grad_x = torch.zeros_like(x)
        return (grad_x, grad_weight, grad_bias, grad_mean_logits,
                grad_var_logits) + (None, ) * 8
