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
        sq = torch.addcmul(var_in, mean_in, mean_in)
        mean_ln = mean_in.mean(1, keepdim=True)
        var_ln_raw = sq.mean(1, keepdim=True) - mean_ln.square()
        var_ln = var_ln_raw.clamp_min(0)

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
        if not has_in:
            mean_logits, var_logits = mean_logits[1:], var_logits[1:]
        wm = F.softmax(mean_logits, 0)
        wv = F.softmax(var_logits, 0)
        # The (N, 1) LN and (C,) BN terms first, then one full (N, C) op
        # with the IN term: the statistics cost a few passes over N x C.
        k = 1 if has_in else 0
        mu = wm[k] * mean_ln
        var = wv[k] * var_ln
        if using_bn:
            mu = mu + wm[k + 1] * mean_bn
            var = var + wv[k + 1] * var_bn
        if has_in:
            mu = torch.addcmul(mu, mean_in, wm[0])
            var = torch.addcmul(var, var_in, wv[0])
        else:
            mu, var = mu.expand(n, c), var.expand(n, c)
        rstd = (var + eps).rsqrt_()
        scale = weight * rstd
        y = row_affine(x, scale, torch.addcmul(bias, mu, scale, value=-1),
                       use_native)

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
        centred = torch.addcmul(s2, mu, s1, value=-1)  # sum g * (x - mu)
        scale = weight * rstd
        grad_weight = torch.linalg.vecdot(centred, rstd, dim=0)
        grad_bias = s1.sum(0)
        d_mu = -scale * s1
        d_var = (-0.5 * scale) * rstd.square() * centred
        # Row and column sums once: the LN and BN terms need only these.
        d_mu_n, d_var_n = d_mu.sum(1, keepdim=True), d_var.sum(1, keepdim=True)
        d_mu_c, d_var_c = d_mu.sum(0), d_var.sum(0)

        # Ratio vectors: d loss / d w_k, then through the softmax.
        d_wm = [(d_mu_n * mean_ln).sum()]
        d_wv = [(d_var_n * var_ln).sum()]
        if mean_bn is not None:
            d_wm.append((d_mu_c * mean_bn).sum())
            d_wv.append((d_var_c * var_bn).sum())
        if has_in:
            d_wm.insert(0, torch.linalg.vecdot(d_mu.flatten(),
                                               mean_in.flatten(), dim=0))
            d_wv.insert(0, torch.linalg.vecdot(d_var.flatten(),
                                               var_in.flatten(), dim=0))
        d_wm, d_wv = torch.stack(d_wm), torch.stack(d_wv)
        grad_mean_logits = wm * (d_wm - (wm * d_wm).sum())
        grad_var_logits = wv * (d_wv - (wv * d_wv).sum())
        if not has_in:  # the IN logit took no part
            grad_mean_logits = torch.cat([grad_mean_logits.new_zeros(1),
                                          grad_mean_logits])
            grad_var_logits = torch.cat([grad_var_logits.new_zeros(1),
                                         grad_var_logits])

        # Back through the statistics to IN's moments (Eq. 5 reversed),
        # gathering the (N, 1) and (C,) parts before touching (N, C).
        k = 1 if has_in else 0
        g_var_ln = wv[k] * d_var_n * ln_pos
        d_sq = g_var_ln / c  # (N, 1)
        d_mean = (wm[k] * d_mu_n - 2 * mean_ln * g_var_ln) / c  # (N, 1)
        if bn_batch:
            g_bn = torch.cat([wm[k + 1] * d_mu_c, wv[k + 1] * d_var_c])
            if group is not None:
                # The shared statistics collect gradient from every rank.
                dist.all_reduce(g_bn, group=group)
            g_bn = g_bn * has  # running statistics took the place: no grad
            g_mean_bn, g_var_bn = g_bn[:c], g_bn[c:] * bn_pos
            d_sq = d_sq + g_var_bn / total  # (N, C) from here
            d_mean = d_mean + (g_mean_bn - 2 * mean_bn * g_var_bn) / total
        d_sq = d_sq.expand(n, c)
        if has_in:
            d_var_in = torch.addcmul(d_sq, d_var, wv[0])
            d_mean_in = torch.addcmul(d_mean, d_mu, wm[0])
        else:
            d_var_in = d_sq
            d_mean_in = d_mean.expand(n, c)
        d_mean_in = torch.addcmul(d_mean_in, mean_in, d_sq, value=2)

        # var_in = sum (x - mean_in)^2 / (L - correction), mean_in = mean(x).
        a = d_var_in * (2 / max(length - correction, 1))
        b = torch.addcmul(d_mean_in / length, a, mean_in, value=-1)
        if x.numel():
            grad_x = row_input_grad(grad_y, x, scale, a, b, use_native)
        else:
            grad_x = torch.zeros_like(x)
        return (grad_x, grad_weight, grad_bias, grad_mean_logits,
                grad_var_logits) + (None, ) * 8
