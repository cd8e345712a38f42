"""SN importance ratios, and Switchable Whitening's importance weights, from
a model or a checkpoint's state dict."""
from collections import OrderedDict
from typing import Mapping, Union

import torch
import torch.nn as nn

from .models import SwitchableNorm, SwitchableWhitening
from .models.switchable_whitening import SW_COMPONENTS
from .ops.ratios import TERMS, Ratios, state_dict_ratios


def sn_ratios(source: Union[nn.Module, Mapping[str, torch.Tensor]],
              per_group: bool = False) -> 'OrderedDict[str, Ratios]':
    """Each SN layer's ratios (softmax of its logits -- SparsestMax at the
    stored radius for a Sparse SN layer -- or its fixed ratios),
    in network order, keyed by layer name. ``source`` is a model or a state
    dict (any key prefix). A group SN layer gives its groups' average, or
    with ``per_group`` one entry per group, keyed ``'<layer>[g]'``."""
    if isinstance(source, nn.Module):
        items = [(name, m.group_ratios() if per_group else m.ratios())
                 for name, m in source.named_modules()
                 if isinstance(m, SwitchableNorm)]
    else:
        items = list(state_dict_ratios(source, per_group).items())
    if not per_group:
        return OrderedDict(items)
    result = OrderedDict()
    for name, groups in items:
        if len(groups) == 1:
            result[name] = groups[0]
        else:
            result.update((f'{name}[{g}]', r) for g, r in enumerate(groups))
    return result


# Switchable Whitening's components, in the order of sw_type=5's weights.
SW_TERMS = SW_COMPONENTS[5]


def sw_weights(
    source: Union[nn.Module, Mapping[str, torch.Tensor]]
) -> 'OrderedDict[str, Ratios]':
    """Each Switchable Whitening layer's importance weights for the mean and
    the covariance (``'var'``), e.g. ``{'mean': {'bw': .., 'iw': ..},
    'var': {...}}``, in network order, keyed by layer name. ``source`` is a
    model or a state dict (a key ending in ``.sw_mean_weight``; any key
    prefix; without ``.sw_var_weight``, tied weights)."""
    if isinstance(source, nn.Module):
        return OrderedDict((name, m.ratios())
                           for name, m in source.named_modules()
                           if isinstance(m, SwitchableWhitening))
    result = OrderedDict()
    for key, mean_logits in source.items():
        if not key.endswith('.sw_mean_weight'):
            continue
        layer = key[:-len('.sw_mean_weight')]
        var_logits = source.get(f'{layer}.sw_var_weight')
        names = SW_COMPONENTS.get(mean_logits.numel())
        if names is None:
            continue
        result[layer] = {
            stat: dict(zip(names,
                           torch.softmax(logits.double(), 0).tolist()))
            for stat, logits in (('mean', mean_logits), (
                'var', mean_logits if var_logits is None else var_logits))
        }
    return result


def average_ratios(ratios: Mapping[str, Ratios], terms=TERMS) -> Ratios:
    """Model average of each ratio (``terms``: SN's, or :data:`SW_TERMS`);
    a layer without a term counts 0 for it."""
    n = max(len(ratios), 1)
    return {
        stat: {
            t: sum(r[stat].get(t, 0.) for r in ratios.values()) / n
            for t in terms
        }
        for stat in ('mean', 'var')
    }


def symmetric_kl(p: Mapping[str, float],
                 q: Mapping[str, float],
                 eps: float = 1e-12) -> float:
    """KL(p||q) + KL(q||p) between two ratio vectors (the paper's Fig. 7c)."""
    keys = list(dict.fromkeys([*p, *q]))
    a = torch.tensor([p.get(k, 0.) for k in keys], dtype=torch.float64) + eps
    b = torch.tensor([q.get(k, 0.) for k in keys], dtype=torch.float64) + eps
    return float(((a - b) * (a.log() - b.log())).sum())
