"""SN in detection heads that run once per FPN level: each level's own BN
statistics.

RetinaNet's, FCOS's, ATSS's and GFL's heads (mmdet's dense heads) run one
stack of convs on every FPN level. In training an SN layer there normalises
each level with that level's batch statistics, but one set of running
statistics would be updated by every level in turn, and at test time each
level normalised with the blend: on the toy RetinaNet that costs bbox AP
(docs/layer_reference.md, "Heads shared across FPN levels"). So such layers
keep a set per level (:meth:`SwitchableNorm.set_levels`).
"""
from typing import Dict, List, Tuple

import torch
import torch.nn as nn

from .switchable_norm import SwitchableNorm


def head_levels(module: nn.Module) -> int:
    """The number of FPN levels a dense head runs on (its prior generator's),
    0 for any other module."""
    generator = getattr(module, 'prior_generator', None)
    levels = getattr(generator, 'num_levels', 0)
    channels = getattr(module, 'in_channels', None)
    return levels if isinstance(levels, int) and isinstance(channels,
                                                            int) else 0


@torch.no_grad()
def shared_sn_layers(head: nn.Module,
                     num_levels: int) -> List[Tuple[str, SwitchableNorm]]:
    """(name, layer) of the SN layers with a BN term that one forward of
    ``head`` on ``num_levels`` feature maps calls more than once: found by
    running it, in eval mode, on small random features (nothing it holds
    changes)."""
    layers = {
        m: name
        for name, m in head.named_modules()
        if isinstance(m, SwitchableNorm) and m.using_bn
    }
    if not layers:
        return []
    calls = dict.fromkeys(layers, 0)

    def count(module, _):
        calls[module] += 1

    handles = [m.register_forward_pre_hook(count) for m in layers]
    modes = {m: m.training for m in head.modules()}
    levels = {m: m.level for m in layers}
    generator = torch.Generator().manual_seed(0)
    param = next(head.parameters())
    feats = tuple(
        torch.randn(1, head.in_channels, 4, 4, generator=generator).to(param)
        for _ in range(num_levels))
    head.eval()
    try:
        head(feats)
    finally:
        for handle in handles:
            handle.remove()
        for m, training in modes.items():
            m.training = training
        for m, level in levels.items():
            m.level = level
    return [(name, m) for m, name in layers.items() if calls[m] > 1]


def start_levels(head: nn.Module, _) -> None:
    """A shared head's forward pre-hook: its SN layers start at level 0
    (module-level, so that models with it deep-copy and pickle)."""
    for m in head.modules():
        if isinstance(m, SwitchableNorm) and m.num_levels > 1:
            m.start_levels()


def keep_level_statistics(model: nn.Module) -> Dict[str, Tuple[int, int]]:
    """Every SN layer with a BN term in a head that runs once per FPN level
    keeps each level's BN statistics (:meth:`SwitchableNorm.set_levels`),
    and the head's forward starts them at the first level. Returns
    ``{head name: (levels, SN layers)}`` of the heads changed. A head whose
    trial forward fails is left as it is."""
    changed = {}
    for name, head in model.named_modules():
        levels = head_levels(head)
        if levels < 2:
            continue
        try:
            shared = shared_sn_layers(head, levels)
        except Exception:  # a head that needs more than its features
            continue
        if not shared:
            continue
        for _, layer in shared:
            layer.set_levels(levels)
        if start_levels not in head._forward_pre_hooks.values():
            head.register_forward_pre_hook(start_levels)
        changed[name] = (levels, len(shared))
    return changed
