"""Hard ratios (the paper's Sec. 5): each SN layer's ratios replaced by the
one-hot argmax of its current ones, one normaliser for the mean and one for
the variance, then finetuned."""
from collections import OrderedDict
from typing import Mapping, MutableMapping

import torch
import torch.nn as nn

from ..ops.ratios import state_dict_ratios
from .switchable_norm import SwitchableNorm


def _one_hot_argmax(ratio: torch.Tensor) -> torch.Tensor:
    """One-hot of the largest of each vector (ties: the first) of (..., K)
    ratios."""
    return torch.zeros_like(ratio).scatter(
        -1, torch.argmax(ratio, -1, keepdim=True), 1.)


def _hard_ratios(groups) -> torch.Tensor:
    """(2, K) one-hot ratios of a layer's :func:`group_ratios`, (2, G, K)
    for group SN: each group's argmax."""
    hard = torch.stack([
        _one_hot_argmax(
            torch.tensor([list(g[stat].values()) for g in groups]))
        for stat in ('mean', 'var')
    ])
    return hard[:, 0] if len(groups) == 1 else hard


@torch.no_grad()
def harden_sn(model: nn.Module) -> int:
    """Fix every SN (and SyncSN) layer's mean and variance ratios to the
    one-hot argmax of the ratios it mixes with now (ties: the first of IN,
    LN, BN); group SN layers each group's to its own. Returns how many
    layers changed (a layer already fixed to its argmax does not count)."""
    changed = 0
    for m in model.modules():
        if not isinstance(m, SwitchableNorm):
            continue
        hard = _hard_ratios(m.group_ratios())
        before = (m.ratio_fixed.clone(), m.fixed_ratios.clone())
        m.fix_ratios(mean=hard[0], var=hard[1])
        if not (torch.equal(before[0], m.ratio_fixed)
                and torch.equal(before[1], m.fixed_ratios)):
            changed += 1
    return changed


@torch.no_grad()
def harden_state_dict(state: MutableMapping[str, torch.Tensor]) -> int:
    """:func:`harden_sn` on a state dict (a training checkpoint's or a
    converted backbone's, any key prefix): for every SN layer (a key ending
    in ``.mean_weight`` with its ``.var_weight``) it writes ``ratio_fixed``
    and ``fixed_ratios`` entries. Returns how many layers changed."""
    changed = 0
    for layer, groups in state_dict_ratios(state, per_group=True).items():
        hard = _hard_ratios(groups).to(state[f'{layer}.mean_weight'].dtype)
        fixed = torch.ones(hard.shape[:-1], dtype=torch.bool)
        old = (state.get(f'{layer}.ratio_fixed'),
               state.get(f'{layer}.fixed_ratios'))
        if not (old[0] is not None and torch.equal(old[0], fixed)
                and torch.equal(old[1].to(hard.dtype), hard)):
            changed += 1
        state[f'{layer}.ratio_fixed'] = fixed
        state[f'{layer}.fixed_ratios'] = hard
    return changed


def hard_choices(
    ratios: Mapping[str, Mapping[str, Mapping[str, float]]]
) -> 'OrderedDict[str, dict]':
    """Per layer, the normaliser with the largest ratio for the mean and for
    the variance, e.g. ``{'backbone.sn1': {'mean': 'bn', 'var': 'in'}}``."""
    return OrderedDict((layer, {
        stat: max(r[stat], key=r[stat].get)
        for stat in ('mean', 'var')
    }) for layer, r in ratios.items())
