"""The paper's inference statistics: BN terms from a batch average."""
import itertools
import time
from typing import Callable, Iterable, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from ..models import SwitchableNorm


@torch.no_grad()
def sn_batch_average(
        model: nn.Module,
        batches: Iterable,
        forward: Callable,
        num_batches: int,
        progress: Optional[Callable[[int, int], None]] = None) -> int:
    """Set every SN layer's running mean and variance to the average of the
    BN statistics over ``num_batches`` batches (Sec. 3, "Inference").

    The network is frozen: every module is in eval mode except the SN layers,
    which compute batch statistics; nothing is trained and no other buffer
    moves. ``forward(batch)`` runs one batch (e.g. ``model.test_step``).

    Each SN layer averages by itself, as PyTorch's norm layers do with
    ``momentum=None`` (a cumulative average counted in
    ``num_batches_tracked``; batches without samples are not counted). In a
    process group the ranks' averages are then combined, weighted by the
    batches each counted, so every rank ends with the average over all
    ranks' batches (each rank feeds its own ``num_batches``). A layer that
    saw no sample anywhere keeps its running statistics. A layer that
    keeps each FPN level's statistics (``num_levels > 1``) averages each
    level's over that level's calls. Returns the number
    of batches fed on this rank. ``progress(done, num_batches)``, if given,
    is called after each batch (e.g. a :class:`BatchAverageProgress`).
    """
    layers = [
        m for m in model.modules()
        if isinstance(m, SwitchableNorm) and m.using_bn
    ]
    if not layers:
        return 0
    modes = {m: m.training for m in model.modules()}
    saved = {
        m: (m.momentum, m.running_mean.clone(), m.running_var.clone(),
            m.num_batches_tracked.clone())
        for m in layers
    }

    model.eval()
    for m in layers:
        m.train()
        m.momentum = None
        m.num_batches_tracked.zero_()
    try:
        seen = 0
        for batch in itertools.islice(batches, num_batches):
            forward(batch)
            seen += 1
            if progress is not None:
                progress(seen, num_batches)
    finally:
        for m, training in modes.items():
            m.training = training
        for m in layers:
            m.momentum = saved[m][0]

    _combine(layers, saved)
    return seen


def _combine(layers, saved) -> None:
    """Each layer's (and level's) averages over every rank's batches,
    weighted by the batches each counted; ``saved`` statistics where no
    rank counted one."""
    # Per layer and level: count * average of the mean and of the
    # variance, count.
    packed = torch.cat([
        torch.cat([
            m.running_mean.double().view(-1, m.num_features),
            m.running_var.double().view(-1, m.num_features),
            m.running_mean.new_ones(m.num_levels, 1, dtype=torch.float64)
        ], 1).mul(m.num_batches_tracked.double().view(-1, 1)).flatten()
        for m in layers
    ])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(packed)
    offset = 0
    for m in layers:
        c = m.num_features
        size = m.num_levels * (2 * c + 1)
        rows = packed[offset:offset + size].view(m.num_levels, 2 * c + 1)
        offset += size
        _, mean, var, count = saved[m]
        mean, var = mean.view(-1, c), var.view(-1, c)
        counted = rows[:, -1:] > 0
        mean = torch.where(counted, rows[:, :c] / rows[:, -1:].clamp_min(1),
                           mean.double())
        var = torch.where(counted,
                          rows[:, c:2 * c] / rows[:, -1:].clamp_min(1),
                          var.double())
        m.running_mean.copy_(mean.view_as(m.running_mean))
        m.running_var.copy_(var.view_as(m.running_var))
        m.num_batches_tracked.copy_(count)


class BatchAverageProgress:
    """Logs a batch average's progress on this rank: batches done of the
    total, the rate and the time left, every ``interval`` batches (default:
    every 5%) and at the end, through ``log`` (default: mmengine's current
    logger)."""

    def __init__(self,
                 total: int,
                 interval: Optional[int] = None,
                 log: Optional[Callable[[str], None]] = None) -> None:
        self.interval = interval or max(1, total // 20)
        if log is None:
            from mmengine.logging import print_log

            def log(message):
                print_log(message, logger='current')

        self.log = log
        self.start = time.perf_counter()
        self.rank = dist.get_rank() if dist.is_available() and \
            dist.is_initialized() else 0

    def __call__(self, done: int, total: int) -> None:
        if done % self.interval and done != total:
            return
        seconds = time.perf_counter() - self.start
        rate = done / seconds if seconds > 0 else float('inf')
        left = (total - done) / rate if rate > 0 else 0.
        self.log(f'SN batch average, rank {self.rank}: {done}/{total} '
                 f'batches ({100 * done / total:.0f}%), {rate:.2f} '
                 f'batches/s, {left:.0f} s left')
