"""SyncSN: Switchable Normalization with BN statistics shared across ranks."""
from typing import Optional

import torch.distributed as dist
import torch.nn as nn
from mmengine.registry import MODELS

from .switchable_norm import SwitchableNorm


@MODELS.register_module('SyncSN')
class SyncSwitchableNorm(SwitchableNorm):
    """Switchable Normalization whose BN term is computed over all ranks.

    SN's computation split at its collective boundary: one all-gather in
    forward between the statistics and the normalisation (each rank's
    sample count, channel means and centred second moments, combined with
    Chan et al.'s parallel formula) and one all-reduce in backward (the
    gradients of the shared BN statistics). The ratio logits' gradients are
    reduced by DDP, as every parameter's. So BN statistics are weighted by
    every rank's number of samples, ranks may hold different numbers of
    samples (zero included), and gradients equal those of
    :class:`SwitchableNorm` on the concatenated batch. Without an
    initialised process group, or with a group of one rank, it computes
    exactly what :class:`SwitchableNorm` does.

    Args:
        group (ProcessGroup, optional): Ranks that share statistics.
            Default: the whole world.
        Others: as :class:`SwitchableNorm`.
    """

    def __init__(self,
                 num_features: int,
                 eps: float = 1e-5,
                 momentum: Optional[float] = 0.1,
                 using_bn: bool = True,
                 unbiased: bool = True,
                 group: Optional[object] = None,
                 kernels: Optional[str] = None,
                 ratio_fn: str = 'softmax',
                 ratio_groups: int = 1) -> None:
        super().__init__(num_features, eps, momentum, using_bn, unbiased,
                         kernels, ratio_fn, ratio_groups)
        self.group = group

    def _sync_group(self):
        if not (dist.is_available() and dist.is_initialized()
                and dist.get_world_size(self.group) > 1):
            return None
        return self.group if self.group is not None else dist.group.WORLD


def _swap_norm(module: nn.Module, old_type: type, make_new) -> nn.Module:
    """Replace, recursively, every layer of exactly ``old_type`` by
    ``make_new(layer)``, handing over the same Parameter objects so that an
    optimizer built before the swap still updates the new layers."""
    if type(module) is old_type:
        new = make_new(module)
        new.weight = module.weight
        new.bias = module.bias
        new.mean_weight = module.mean_weight
        new.var_weight = module.var_weight
        new.ratio_fixed = module.ratio_fixed
        new.fixed_ratios = module.fixed_ratios
        new.radius = module.radius
        if module.using_bn:
            new.running_mean = module.running_mean
            new.running_var = module.running_var
            new.num_batches_tracked = module.num_batches_tracked
            new.nonfinite_batches = module.nonfinite_batches
        new.train(module.training)
        return new
    for name, child in module.named_children():
        new_child = _swap_norm(child, old_type, make_new)
        if new_child is not child:
            module.add_module(name, new_child)
    return module


def convert_sync_sn(module: nn.Module, group=None) -> nn.Module:
    """Turn every :class:`SwitchableNorm` in ``module`` into a
    :class:`SyncSwitchableNorm` sharing its parameters and buffers, like
    ``nn.SyncBatchNorm.convert_sync_batchnorm``. Returns the converted module
    (a new object only where ``module`` itself is an SN layer)."""
    return _swap_norm(
        module, SwitchableNorm, lambda m: SyncSwitchableNorm(
            m.num_features,
            m.eps,
            m.momentum,
            m.using_bn,
            m.unbiased,
            group=group,
            kernels=m.kernels,
            ratio_fn=m.ratio_fn,
            ratio_groups=m.ratio_groups))


def revert_sync_sn(module: nn.Module) -> nn.Module:
    """Turn every :class:`SyncSwitchableNorm` in ``module`` back into a
    :class:`SwitchableNorm`, e.g. to test on one process or the CPU."""
    return _swap_norm(
        module, SyncSwitchableNorm, lambda m: SwitchableNorm(
            m.num_features, m.eps, m.momentum, m.using_bn, m.unbiased, m.
            kernels, m.ratio_fn, m.ratio_groups))
