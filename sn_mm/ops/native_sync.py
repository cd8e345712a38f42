"""SyncSN across processes on the C++ kernels.

SN's CPU operator split at its two collectives, as the Triton kernels are
on GPUs: in forward this process's statistics (``sn_mm::sync_statistics``),
one all-gather of every rank's BN count, channel means and centred second
moments (:func:`sn_mm.ops.reference.combine_statistics`, the reference's
own, so that ranks on either path interoperate), then the normalisation
(``sn_mm::sync_normalize``); in backward the row sums and the parameter
gradients (``sn_mm::sync_grad_sums``), one all-reduce of the BN statistics'
gradients (2 x C values), then the input's gradient
(``sn_mm::sync_input_grad``).
"""
import torch
import torch.distributed as dist
from torch import Tensor

from .reference import combine_statistics, update_running_stats

_OPS = torch.ops.sn_mm


class NativeSyncSN(torch.autograd.Function):
    """SyncSN's training forward and backward on the C++ kernels."""

    @staticmethod
    def forward(ctx, x, weight, bias, mean_logits, var_logits, state):
        (running_mean, running_var, nbt, ratio_fixed, fixed_ratios, momentum,
         eps, unbiased, ratios_given, group, nonfinite) = state
        ws, mean_c, m2_c = _OPS.sync_statistics(x, unbiased)
        total, mean_bn, var_bn = combine_statistics(x.shape[0], mean_c, m2_c,
                                                    group)
        update_running_stats(running_mean, running_var, nbt, momentum, mean_bn,
                             var_bn, total > 0, nonfinite)
        y = _OPS.sync_normalize(x, ws, mean_bn, var_bn, weight, bias,
                                mean_logits, var_logits, ratio_fixed,
                                fixed_ratios, eps, unbiased, ratios_given)
        ctx.save_for_backward(x, weight, mean_logits, var_logits, ws,
                              ratio_fixed, fixed_ratios)
        ctx.settings = (int(total), unbiased, ratios_given, group)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        if torch.is_grad_enabled():
            raise RuntimeError(
                'SyncSN: double backward (create_graph=True) across several '
                'processes is not supported; on one process (or with SN) it '
                'is exact')
        (x, weight, mean_logits, var_logits, ws, ratio_fixed,
         fixed_ratios) = ctx.saved_tensors
        total, unbiased, ratios_given, group = ctx.settings
        (sums, bn_grads, grad_weight, grad_bias, grad_mean,
         grad_var) = _OPS.sync_grad_sums(grad_y, x, ws, weight, mean_logits,
                                         var_logits, ratio_fixed, fixed_ratios,
                                         unbiased, ratios_given)
        # The shared BN statistics collect gradient from every rank.
        dist.all_reduce(bn_grads, group=group)
        grad_x = _OPS.sync_input_grad(grad_y, x, ws, sums, bn_grads, weight,
                                      mean_logits, var_logits, ratio_fixed,
                                      fixed_ratios, total, unbiased,
                                      ratios_given)
        return grad_x, grad_weight, grad_bias, grad_mean, grad_var, None


def switchable_norm(x: Tensor, weight: Tensor, bias: Tensor,
                    mean_logits: Tensor, var_logits: Tensor,
                    running_mean: Tensor, running_var: Tensor,
                    num_batches_tracked: Tensor, ratio_fixed, fixed_ratios,
                    momentum, eps: float, unbiased: bool, ratios_given: bool,
                    group, nonfinite_batches) -> Tensor:
    """SyncSN in training with a BN term, its statistics shared by
    ``group``'s ranks (arguments as :func:`sn_mm.ops.switchable_norm`'s)."""
    return NativeSyncSN.apply(
        x, weight, bias, mean_logits, var_logits,
        (running_mean, running_var, num_batches_tracked, ratio_fixed,
         fixed_ratios, momentum, eps, unbiased, ratios_given, group,
         nonfinite_batches))
