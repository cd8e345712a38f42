"""The paper's inference statistics: BN terms from a batch average."""
import itertools
from typing import Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn as nn

from ..models import SwitchableNorm


@torch.no_grad()
def sn_batch_average(model: nn.Module, batches: Iterable, forward: Callable,
                     num_batches: int) -> int:
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
    saw no sample anywhere keeps its running statistics. Returns the number
    of batches fed on this rank.
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
    finally:
        for m, training in modes.items():
            m.training = training
        for m in layers:
            m.momentum = saved[m][0]

    # Per layer: count * average of the mean and of the variance, count.
    packed = torch.cat([
        torch.cat([
            m.running_mean.double(),
            m.running_var.double(),
            torch.ones(1, dtype=torch.float64, device=m.running_mean.device)
        ]) * m.num_batches_tracked.double() for m in layers
    ])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(packed)
    offset = 0
    for m in layers:
        c = m.num_features
        chunk = packed[offset:offset + 2 * c + 1]
        offset += 2 * c + 1
        _, mean, var, count = saved[m]
        if chunk[-1] > 0:
            mean, var = chunk[:c] / chunk[-1], chunk[c:2 * c] / chunk[-1]
        m.running_mean.copy_(mean)
        m.running_var.copy_(var)
        m.num_batches_tracked.copy_(count)
    return seen
