"""SyncSN: Switchable Normalization with BN statistics shared across ranks."""
import gc
import operator
import os
import socket
import time
import weakref
import zlib
from typing import Optional

import torch.distributed as dist
from mmengine.registry import MODELS

from ..ops.reference import sync_call, sync_layer_names
from .switchable_norm import SwitchableNorm

GROUP_NAMES = ('world', 'node')
# {(the group setting, the default process group's id): the subgroup
# holding this rank, weakly}. Made once per process group: making one is a
# collective, and a ProcessGroup held by a layer would not deep-copy (EMA).
# Weakly, so that destroy_process_group frees it (see hold_group in
# sn_mm.ops.reference), and a later group of the same id makes its own.
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
    ref = _subgroups.get(key)
    subgroup = None if ref is None else ref()
    if subgroup is None:
        blocks = _rank_blocks(group, dist.get_world_size())
        subgroup = dist.new_subgroups_by_enumeration(blocks)[0]
        _subgroups[key] = weakref.ref(subgroup)
    return subgroup


def sharing_group(group):
    """The ProcessGroup over which a layer with the setting ``group`` shares
    batch statistics in this process; None without an initialised process
    group or where the group is this rank alone."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = process_group(group)
    return group if dist.get_world_size(group) > 1 else None


def end_process_group() -> bool:
    """Tear down the default process group once every rank is done with it:
    a barrier (no rank tears down while a peer still talks to it),
    ``destroy_process_group``, then a garbage collection, which frees what
    still holds the group in reference cycles (a runner and its DDP
    wrapper), so that its gloo threads are joined while Python still runs.
    Left to interpreter exit, a gloo worker that releases a finished
    collective's tensors takes the GIL during finalisation and aborts the
    process ('terminate called without an active exception'). Returns
    whether the group was freed. Not after a failure: other ranks may be
    inside a collective, and the barrier would wait for them."""
    if not (dist.is_available() and dist.is_initialized()):
        return True
    world = weakref.ref(dist.group.WORLD)
    dist.barrier()
    # A gloo worker thread may still hold a finished collective whose
    # tensors' Python objects are gone: releasing it takes the GIL, which
    # the group's destructor holds while it joins the workers (a deadlock in
    # destroy_process_group, seen on torch 2.1 with the cores busy). A pause
    # without the GIL lets them release it first.
    time.sleep(0.1)
    dist.destroy_process_group()
    gc.collect()
    return world() is None


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

    Every rank must call each SyncSN layer equally often in training: the
    all-gathers pair by order. Each carries the layer and its call number;
    where they differ across ranks (a branch one rank skipped), every rank
    raises a RuntimeError naming the ranks' layers and calls before any
    statistics are combined. Layers are named by
    :func:`name_sync_layers` (:class:`sn_mm.engine.SNRunner` and
    :func:`sn_mm.models.convert_sync_sn` do it). On CPUs (gloo) the check
    always runs; on GPUs it reads the tags on the host, a synchronisation
    per layer, so it runs under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, PyTorch's
    switch for its own collective checks.

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
                 ratio_groups: int = 1,
                 num_levels: int = 1) -> None:
        super().__init__(num_features, eps, momentum, using_bn, unbiased,
                         kernels, ratio_fn, ratio_groups, num_levels)
        self.group = check_group(group)
        self.sync_name = type(self).__name__
        self.sync_key = 0  # unnamed: only the call numbers are compared
        self.sync_calls = 0

    def _sync_group(self):
        return sharing_group(self.group)

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        self.sync_calls += 1
        with sync_call(self.sync_key, self.sync_calls, self.sync_name):
            return super().forward(x)


def name_sync_layers(model) -> None:
    """Name every SyncSN layer in ``model`` after its place in it, so that
    ranks that call them unequally (a layer one rank skips) are stopped at
    the first all-gather that pairs two layers, with an error naming both
    (:class:`SyncSwitchableNorm`). Unnamed layers are told apart by their
    call numbers only."""
    for name, m in model.named_modules():
        if isinstance(m, SyncSwitchableNorm):
            m.sync_name = name or type(m).__name__
            m.sync_key = zlib.crc32(m.sync_name.encode()) % (1 << 24) or 1
            sync_layer_names[m.sync_key] = m.sync_name
