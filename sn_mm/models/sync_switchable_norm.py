"""SyncSN: Switchable Normalization with BN statistics shared across ranks."""
import operator
import os
import socket
from typing import Optional

import torch.distributed as dist
import torch.nn as nn
from mmengine.registry import MODELS

from .switchable_norm import SwitchableNorm

GROUP_NAMES = ('world', 'node')
# {(the group setting, the default process group's id): the subgroup
# holding this rank}. Made once per process group: making one is a
# collective, and a ProcessGroup held by a layer would not deep-copy (EMA).
_subgroups = {}


def check_group(group):
    """``group`` if SyncSN can share statistics over it, else a ValueError
    naming the choices."""
    if group is None or group in GROUP_NAMES or (
            dist.is_available() and isinstance(group, dist.ProcessGroup)):
        return group
    try:
        size = operator.index(group)
    except TypeError:
        size = 0
    if isinstance(group, bool) or size < 1:
        raise ValueError(
            f'SyncSN group={group!r}: expected None or \'world\' (all ranks), '
            f'\'node\' (the ranks of each machine), a positive int k (blocks '
            f'of k consecutive ranks) or a torch.distributed ProcessGroup')
    return size


def node_key() -> str:
    """What names this process's machine: torchrun's node rank
    (``GROUP_RANK``, so two launches on one machine are two nodes), else
    Slurm's ``SLURM_NODEID``, else the host name."""
    for name in ('GROUP_RANK', 'SLURM_NODEID'):
        if os.environ.get(name) is not None:
            return f'{name}={os.environ[name]}'
    return socket.gethostname()


def _rank_blocks(group, world: int):
    """The ranks of each subgroup for the setting ``group`` ('node' or a
    block size), made from every rank's answer (a collective)."""
    if group == 'node':
        keys = [None] * world
        dist.all_gather_object(keys, node_key())
        blocks = {}
        for rank, key in enumerate(keys):
            blocks.setdefault(key, []).append(rank)
        return list(blocks.values())
    if world % group:
        raise ValueError(f'SyncSN group={group}: blocks of {group} ranks do '
                         f'not divide the world of {world} ranks')
    return [list(range(s, s + group)) for s in range(0, world, group)]


def process_group(group):
    """The ProcessGroup that the setting ``group`` names for this rank
    (:func:`check_group`'s values); the process group must be
    initialised."""
    if group is None or group == 'world':
        return dist.group.WORLD
    if isinstance(group, dist.ProcessGroup):
        return group
    key = (group, id(dist.group.WORLD))
    if key not in _subgroups:
        blocks = _rank_blocks(group, dist.get_world_size())
        _subgroups[key] = dist.new_subgroups_by_enumeration(blocks)[0]
    return _subgroups[key]


def sharing_group(group):
    """The ProcessGroup over which a layer with the setting ``group`` shares
    batch statistics in this process; None without an initialised process
    group or where the group is this rank alone."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = process_group(group)
    return group if dist.get_world_size(group) > 1 else None


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
        group (str, int or ProcessGroup, optional): Ranks that share
            statistics. None or ``'world'``: every rank. ``'node'``: the
            ranks of each machine (a machine is torchrun's node rank,
            ``GROUP_RANK``, else Slurm's ``SLURM_NODEID``, else the host
            name), as in the paper's settings where each 8-GPU machine
            normalises its own batch. An int k: blocks of k consecutive
            ranks (k divides the world size). A ProcessGroup: itself. The
            named and sized groups are made at the first training forward,
            on every rank together. Default: None.
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
        self.group = check_group(group)

    def _sync_group(self):
        return sharing_group(self.group)


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
