"""From a layer's ratio logits to the ratio vectors it mixes with.

The one rule, in PyTorch ops, that the reference implementation, the layer's
introspection, the analysis tools, the converters and ``fuse_conv_sn`` use.
The C++ and Triton kernels apply the same rule on their devices, inside the
call: computed here with autograd, the two ratio vectors would cost as much
as a whole C++ training call at a small shape such as 1x64x8x8;
tests/test_ratio_rule.py runs every combination of the kernels' flags
against this module instead:

* ``softmax(logits)``, or SparsestMax of the logits for Sparse SN;
* where a ratio vector is fixed (``ratio_fixed[row]``), ``fixed_ratios[row]``
  itself, exact zeros included;
* where IN is undefined (one spatial position), the IN term left out and the
  rest renormalised (LN alone where the vector selected IN alone).

Group SN (``ratio_groups=G > 1``) has one such vector per group of channels:
logits (G, K), fixed ratios (G, K) per statistic with a flag per group, and
the rule applied to each row.
"""
from typing import Dict, List, Optional

import torch
from torch import Tensor

from .sparsestmax import is_one_hot, sparsestmax

# Order of the logits in ``mean_weight``/``var_weight``: the order of the
# authors' released code, so that their checkpoints load as they are.
TERMS = ('in', 'ln', 'bn')
RATIO_FNS = ('softmax', 'sparsestmax')
STATS = ('mean', 'var')

Ratios = Dict[str, Dict[str, float]]  # {'mean': {'in': .., ...}, 'var': ..}


def ratio_without_in(ratio: Tensor) -> Tensor:
    """A ratio vector (IN first) for an input without IN: the other terms
    renormalised, or LN alone where the vector selected IN alone (LN is the
    other per-sample statistic)."""
    rest = ratio[..., 1:]
    total = rest.sum(-1, keepdim=True)
    ln_only = torch.zeros_like(rest)
    ln_only[..., 0] = 1
    return torch.where(total > 0, rest / total.clamp_min(1e-30), ln_only)


def mixing_ratio(logits: Tensor,
                 fixed: Optional[Tensor],
                 fixed_ratio: Optional[Tensor],
                 has_in: bool,
                 ratios_given: bool = False) -> Tensor:
    """The ratio vector one statistic is mixed with: ``softmax(logits)``, or
    where ``fixed`` (a bool scalar tensor) is set, ``fixed_ratio``. Without
    IN the IN term is left out (:func:`ratio_without_in`). ``ratios_given``:
    ``logits`` already is the ratio vector (SparsestMax's, see
    :func:`sparsest_ratios`), used as it is. Group SN: logits (G, K) and
    fixed_ratio (G, K) with ``fixed`` (G,) give (G, K) ratios, row by row.
    No branch on tensor values: nothing waits on the device and tracers see
    one graph."""
    if ratios_given:
        soft = logits if has_in else logits[..., 1:]
    else:
        soft = torch.softmax(logits if has_in else logits[..., 1:], -1)
    if fixed is None:
        return soft
    if not has_in:
        fixed_ratio = ratio_without_in(fixed_ratio)
    return torch.where(fixed.unsqueeze(-1), fixed_ratio, soft)


def sparsest_ratios(mean_logits: Tensor, var_logits: Tensor, radius: Tensor,
                    ratio_fixed: Tensor, fixed_ratios: Tensor, training: bool,
                    has_in: bool):
    """Sparse SN's two ratio vectors: SparsestMax of each logit vector at
    ``radius`` (in float64: the one-hot test must not miss by a rounding).
    In training, a vector that has become one-hot is fixed in place (as SSN
    does, to the argmax of its logits), by tensor ops so that nothing waits
    on the device. Without IN the IN entry is zeroed and the rest
    renormalised. The results go to the kernels as given ratios."""
    ratios = []
    for row, logits in enumerate((mean_logits, var_logits)):
        p = _sparsest_rows(logits.double(), radius.double())
        if training:
            with torch.no_grad():
                newly = _one_hot_rows(p) & ~ratio_fixed[row]
                hot = torch.zeros_like(fixed_ratios[row]).scatter(
                    -1, torch.argmax(p, -1, keepdim=True), 1.)
                fixed_ratios[row].copy_(
                    torch.where(newly.unsqueeze(-1), hot, fixed_ratios[row]))
                ratio_fixed[row] |= newly
        p = p.to(logits.dtype)
        if not has_in:
            p = torch.cat([torch.zeros_like(p[..., :1]),
                           ratio_without_in(p)], -1)
        ratios.append(p)
    return ratios


def _sparsest_rows(logits: Tensor, radius: Tensor) -> Tensor:
    """SparsestMax of a logit vector (K,), or of each row of (G, K)."""
    if logits.dim() == 1:
        return sparsestmax(logits, radius)
    return torch.vmap(sparsestmax, in_dims=(0, None))(logits, radius)


def _one_hot_rows(p: Tensor) -> Tensor:
    if p.dim() == 1:
        return is_one_hot(p)
    return torch.vmap(is_one_hot)(p)


@torch.no_grad()
def layer_ratios(mean_logits: Tensor,
                 var_logits: Tensor,
                 ratio_fixed: Optional[Tensor] = None,
                 fixed_ratios: Optional[Tensor] = None,
                 radius: Optional[Tensor] = None) -> Ratios:
    """A layer's ratios as numbers, ``{'mean': {'in': .., 'ln': ..[, 'bn':
    ..]}, 'var': {...}}``: its fixed ratios where fixed, else SparsestMax at
    ``radius`` (Sparse SN) or the softmax of the logits. Works on a layer's
    tensors and on a state dict's alike. Group SN: the average over the
    groups (every group has as many channels); :func:`group_ratios` gives
    each group's."""
    groups = group_ratios(mean_logits, var_logits, ratio_fixed, fixed_ratios,
                          radius)
    if len(groups) == 1:
        return groups[0]
    return {
        stat: {
            term: sum(g[stat][term] for g in groups) / len(groups)
            for term in groups[0][stat]
        }
        for stat in STATS
    }


@torch.no_grad()
def group_ratios(mean_logits: Tensor,
                 var_logits: Tensor,
                 ratio_fixed: Optional[Tensor] = None,
                 fixed_ratios: Optional[Tensor] = None,
                 radius: Optional[Tensor] = None) -> 'List[Ratios]':
    """:func:`layer_ratios` of each group of a group SN layer (logits (G,
    K)), in channel order; one entry for an SN layer."""
    rows = []
    ratios_given = radius is not None
    for row, logits in enumerate((mean_logits, var_logits)):
        logits = logits.detach().double().reshape(-1, logits.shape[-1])
        if ratios_given:
            logits = _sparsest_rows(logits, radius.double().flatten()[0])
        fixed = fixed_ratio = None
        if ratio_fixed is not None:
            fixed = ratio_fixed[row].reshape(-1)
            fixed_ratio = fixed_ratios[row].double().reshape(logits.shape)
        rows.append(
            mixing_ratio(logits, fixed, fixed_ratio, True,
                         ratios_given).tolist())
    return [{
        stat: dict(zip(TERMS, rows[i][g]))
        for i, stat in enumerate(STATS)
    } for g in range(len(rows[0]))]


def state_dict_ratios(state, per_group: bool = False) -> 'Dict[str, Ratios]':
    """:func:`layer_ratios` of every SN layer in a state dict (a key ending
    in ``.mean_weight`` with its ``.var_weight``; any key prefix), in the
    dict's order, keyed by layer name; with ``per_group``,
    :func:`group_ratios` (a list per layer)."""
    ratio_fn = group_ratios if per_group else layer_ratios
    result = {}
    for key, logits in state.items():
        if not key.endswith('.mean_weight'):
            continue
        layer = key[:-len('.mean_weight')]
        var_logits = state.get(f'{layer}.var_weight')
        if var_logits is None:
            continue
        result[layer] = ratio_fn(logits, var_logits,
                                 state.get(f'{layer}.ratio_fixed'),
                                 state.get(f'{layer}.fixed_ratios'),
                                 state.get(f'{layer}.radius'))
    return result
