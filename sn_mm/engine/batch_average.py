"""The paper's inference statistics: BN terms from a batch average."""
import itertools
from typing import Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn as nn

from ..models import SwitchableNorm


@torch.no_grad()
def sn_batch_average(model: nn.Module, batches: Iterable,
                     forward: Callable, num_batches: int) -> int:
    """Set every SN layer's running mean and variance to the average of the
    BN statistics over ``num_batches`` batches (Sec. 3, "Inference").

    The network is frozen: every module is in eval mode except the SN layers,
    which compute batch statistics; nothing is trained and no other buffer
    moves. ``forward(batch)`` runs one batch (e.g. ``model.test_step``).
    In a process group the ranks average together, each feeding its own
    ``num_batches`` batches. A layer that saw no sample keeps its running
    statistics. Returns the number of batches fed on this rank.
    """
    layers = [m for m in model.modules()
              if isinstance(m, SwitchableNorm) and m.using_bn]
    if not layers:
        return 0
    modes = {m: m.training for m in model.modules()}
    saved = {m: (m.running_mean.clone(), m.running_var.clone())
             for m in layers}
    # Per layer: sum of means, sum of variances, number of batches.
    sums = {m: torch.zeros(2 * m.num_features + 1, dtype=torch.float64,
                           device=m.running_mean.device) for m in layers}

    def observer(layer):
        def observe(mean, var, has_samples):
            w = has_samples.to(torch.float64)
            sums[layer] += torch.cat([mean.double() * w, var.double() * w,
                                      w.reshape(1)])
        return observe

    model.eval()
    for m in layers:
        m.train()
        m.bn_observer = observer(m)
    try:
        seen = 0
        for batch in itertools.islice(batches, num_batches):
            forward(batch)
            seen += 1
    finally:
        for m, training in modes.items():
            m.training = training
        for m in layers:
            m.bn_observer = None
            m.running_mean.copy_(saved[m][0])
            m.running_var.copy_(saved[m][1])

    packed = torch.cat([sums[m] for m in layers])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(packed)
    offset = 0
    for m in layers:
        c = m.num_features
        chunk = packed[offset:offset + 2 * c + 1]
        offset += 2 * c + 1
        if chunk[-1] > 0:
            m.running_mean.copy_(chunk[:c] / chunk[-1])
            m.running_var.copy_(chunk[c:2 * c] / chunk[-1])
    return seen
