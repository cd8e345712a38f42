"""``init_cfg=dict(type='SNPretrained', ...)``: SN (and Switchable
Whitening) layers started from the norm layers of a BN, GN or SN (SW)
checkpoint."""
import re
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.model import update_init_info
from mmengine.registry import WEIGHT_INITIALIZERS
from mmengine.runner import CheckpointLoader

from ..models import SwitchableNorm, SwitchableWhitening
from ..models.convert import source_logits
from ..models.switchable_norm import to_groups
from .runner import safe_torch_load, trusted_torch_load

RATIO_CHOICES = ('uniform', 'source')
# An SN layer named e.g. 'sn1' (mmcv's build_norm_layer: the norm type's
# abbreviation and a postfix) sits where a BN or GN network has 'bn1'/'gn1'.
_NORM_NAME = re.compile(r'^(?:sn|sw|bn|gn|ln|in|norm)(\d*)$')
_SOURCE_ABBRS = ('sn', 'sw', 'bn', 'gn', 'norm', 'ln', 'in')
_SN_KEYS = ('mean_weight', 'var_weight', 'running_mean', 'running_var',
            'num_batches_tracked', 'ratio_fixed', 'fixed_ratios')


def _source_names(name: str) -> List[str]:
    """Where the source network keeps the norm layer at ``name``."""
    parent, _, last = name.rpartition('.')
    match = _NORM_NAME.match(last)
    if not match:  # e.g. 'downsample.1': the same name in every network
        return [name]
    lead = parent + '.' if parent else ''
    return [name] + [
        f'{lead}{abbr}{match.group(1)}'
        for abbr in _SOURCE_ABBRS if abbr + match.group(1) != last
    ]


def _kind(state: Dict[str, torch.Tensor], src: str) -> str:
    if src + '.sw_mean_weight' in state:
        return 'SW'
    if src + '.mean_weight' in state:
        return 'SN'
    if src + '.running_mean' in state:
        return 'BN'
    return 'GN'  # affine parameters only: GN, LN or IN


def sn_state_from(module: nn.Module,
                  state: Dict[str, torch.Tensor],
                  ratios: str = 'uniform') -> Tuple[dict, dict]:
    """The state dict that starts ``module`` from checkpoint ``state``, and
    a report: each SN layer takes the affine parameters of the norm layer
    at its place (and a BN source's running statistics, an SN source's
    everything); every other entry of the model is taken where the
    checkpoint has it. Raises a ValueError naming every entry whose shape
    does not fit, before anything is loaded."""
    if ratios not in RATIO_CHOICES:
        raise ValueError(f'ratios={ratios!r}: expected one of '
                         f'{", ".join(map(repr, RATIO_CHOICES))}')
    own = module.state_dict()
    plan, sources, used = {}, {}, set()
    layers = {
        n: m
        for n, m in module.named_modules()
        if isinstance(m, (SwitchableNorm, SwitchableWhitening))
    }
    for name, layer in layers.items():
        src = next((s for s in _source_names(name)
                    if s + '.weight' in state and s + '.bias' in state), None)
        if src is None:
            continue
        kind = _kind(state, src)
        sources[name] = (src, kind)
        if isinstance(layer, SwitchableWhitening):
            plan.update(
                sw_entries(layer, name, state, src, kind, ratios, used))
            continue
        keys = ['weight', 'bias'] + (
            list(_SN_KEYS) if kind == 'SN' else
            ['running_mean', 'running_var', 'num_batches_tracked'])
        for key in keys:
            if f'{src}.{key}' in state and f'{name}.{key}' in own:
                plan[f'{name}.{key}'] = to_groups(key, state[f'{src}.{key}'],
                                                  own[f'{name}.{key}'])
                used.add(f'{src}.{key}')
        if ratios == 'uniform' or kind != 'SN':
            shape = layer.mean_weight.shape  # (K,), or (G, K): group SN
            logits = (
                source_logits(kind, shape[-1]) if ratios == 'source' else None)
            if logits is None:
                logits = torch.zeros(shape[-1])
            for key in ('mean_weight', 'var_weight'):
                plan[f'{name}.{key}'] = logits.expand(shape).clone()
    sn_keys = {f'{n}.{k}' for n in layers for k in own_keys(layers[n])}
    for key in own:
        if key not in sn_keys and key in state:
            plan[key] = state[key]
            used.add(key)
    bad = [
        f'{key}: the model has {tuple(own[key].shape)}, the checkpoint '
        f'{tuple(value.shape)}' for key, value in plan.items()
        if tuple(value.shape) != tuple(own[key].shape)
    ]
    if bad:
        raise ValueError('SNPretrained: the checkpoint does not fit the '
                         'model (nothing was loaded): ' + '; '.join(bad))
    report = dict(
        sn_layers={
            n: f'{kind} {src}'
            for n, (src, kind) in sources.items()
        },
        sn_uninitialised=sorted(set(layers) - set(sources)),
        uninitialised=sorted(k for k in own
                             if k not in plan and k not in sn_keys),
        unused=sorted(k for k in state if k not in used))
    new = dict(own)
    new.update({k: v.to(own[k].dtype) for k, v in plan.items()})
    return new, report


def sw_entries(layer: SwitchableWhitening, name: str,
               state: Dict[str, torch.Tensor], src: str, kind: str,
               ratios: str, used: set) -> Dict[str, torch.Tensor]:
    """An SW layer's entries from the norm layer ``src`` (of ``kind``) of a
    checkpoint: an SW source's everything; else its affine parameters, and
    a BN layer's running mean (per whitening group) and running variance as
    a diagonal running covariance. The importance weights start equal
    (``ratios='uniform'``), or at BN's component, else BW's, from a BN
    source (``'source'``)."""
    plan = {}
    keys = own_keys(layer) if kind == 'SW' else ['weight', 'bias']
    for key in keys:
        if f'{src}.{key}' in state:
            plan[f'{name}.{key}'] = state[f'{src}.{key}']
            used.add(f'{src}.{key}')
    if kind == 'BN':
        groups, c = layer.num_groups, layer.num_pergroup
        mean, var = state[f'{src}.running_mean'], state[f'{src}.running_var']
        if mean.numel() == layer.num_features:
            plan[f'{name}.running_mean'] = mean.reshape(groups, c, 1)
            plan[f'{name}.running_cov'] = torch.diag_embed(
                var.reshape(groups, c))
            used.update({f'{src}.running_mean', f'{src}.running_var'})
    if kind != 'SW' or ratios == 'uniform':
        logits = torch.zeros(len(layer.components))
        if ratios == 'source' and kind == 'BN':
            target = 'bn' if 'bn' in layer.components else 'bw'
            logits[layer.components.index(target)] = torch.log(
                torch.tensor((1 - 1e-4) / 1e-4 * (len(logits) - 1)))
        for key in ('sw_mean_weight', 'sw_var_weight'):
            if getattr(layer, key) is not None:
                plan[f'{name}.{key}'] = logits.clone()
    return plan


def own_keys(layer: nn.Module) -> List[str]:
    """The state-dict keys of an SN layer's own parameters and buffers."""
    return [k for k, _ in layer.named_parameters()
            ] + [k for k, v in layer.named_buffers() if v is not None]


@WEIGHT_INITIALIZERS.register_module(name='SNPretrained')
class SNPretrainedInit:
    """Start a model with SN layers from a BN, GN or SN checkpoint, as
    mmengine's ``Pretrained`` does for matching networks. Switchable
    Whitening layers start likewise (:func:`sw_entries`): from a BN layer
    its affine parameters, running mean and, as a diagonal covariance, its
    running variance.

    Every SN layer takes the affine ``weight`` and ``bias`` of the norm
    layer at its place in the checkpoint (``bn1`` or ``gn1`` for ``sn1``;
    ``downsample.1`` stays), and from a BN layer also its running mean and
    variance (from an SN layer, everything). Every other entry of the model
    (convolutions, heads) is taken where the checkpoint has it. Entries whose
    shapes do not fit are refused, naming them, before anything is loaded.
    What was done is logged: each SN layer's source, SN layers without one,
    model entries left as initialised and checkpoint entries unused.

    Args:
        checkpoint (str): A file, or a name mmengine resolves
            (``torchvision://resnet50``, ``open-mmlab://...``, a URL).
        prefix (str, optional): Load only the checkpoint's entries under
            this prefix (e.g. ``'backbone.'`` of a classifier), as
            ``Pretrained``'s. Default: None.
        ratios (str): ``'uniform'`` (default): every layer's ratio logits
            start equal, the paper's initialisation. ``'source'``: they
            start at the source's normaliser as closely as a softmax
            allows: BN's ratio ``1 - 1e-4`` from a BN layer (the SN network
            in eval mode then computes what the BN network computes, within
            1e-3 of its output scale for a ResNet-50), IN's and LN's half of
            it each from a GN, LN or IN layer (GN's group statistics lie
            between the two), and an SN layer's own logits. A group SN layer
            (``ratio_groups`` > 1) starts every group so.
        map_location (str): As ``torch.load``'s. Default: ``'cpu'``.
        trusted (bool): Load a checkpoint holding objects beyond tensors
            (an mmengine training checkpoint of your own) with PyTorch's
            unrestricted loader. Default: False (the safe loader).
    """

    def __init__(self,
                 checkpoint: str,
                 prefix: Optional[str] = None,
                 ratios: str = 'uniform',
                 map_location: str = 'cpu',
                 trusted: bool = False) -> None:
        if ratios not in RATIO_CHOICES:
            raise ValueError(f'SNPretrained: ratios={ratios!r}, expected '
                             f'one of {", ".join(map(repr, RATIO_CHOICES))}')
        self.checkpoint = checkpoint
        self.prefix = prefix
        self.ratios = ratios
        self.map_location = map_location
        self.trusted = trusted
        self.report: Optional[dict] = None

    def _state_dict(self) -> Dict[str, torch.Tensor]:
        try:
            # Untrusted: the safe loader on every torch (before 2.6 its
            # default unpickles anything).
            with (trusted_torch_load() if self.trusted else safe_torch_load()):
                ckpt = CheckpointLoader.load_checkpoint(
                    self.checkpoint, self.map_location)
        except Exception as err:
            if 'weights_only' not in str(err):
                raise
            raise RuntimeError(
                f'SNPretrained: {self.checkpoint} holds objects beyond '
                f'tensors, which the safe loader refuses; for a checkpoint '
                f'you trust (e.g. your own training run) set trusted=True '
                f'in the init_cfg') from err
        state = ckpt.get('state_dict', ckpt)
        state = {re.sub(r'^module\.', '', k): v for k, v in state.items()}
        if self.prefix:
            prefix = self.prefix if self.prefix.endswith('.') else \
                self.prefix + '.'
            state = {
                k[len(prefix):]: v
                for k, v in state.items() if k.startswith(prefix)
            }
            if not state:
                raise ValueError(f'SNPretrained: no entry of '
                                 f'{self.checkpoint} starts with {prefix!r}')
        return state

    def __call__(self, module: nn.Module) -> None:
        new, report = sn_state_from(module, self._state_dict(), self.ratios)
        module.load_state_dict(new)
        self.report = report
        kinds: Dict[str, int] = {}
        for source in report['sn_layers'].values():
            kind = source.split()[0]
            kinds[kind] = kinds.get(kind, 0) + 1
        lines = [
            f'SNPretrained from {self.checkpoint} (ratios='
            f'{self.ratios}): {len(report["sn_layers"])} SN layers from ' +
            (', '.join(f'{n} {k}'
                       for k, n in sorted(kinds.items())) or 'no norm layer')
        ]
        for what, label in (('sn_uninitialised', 'SN layers without a '
                             'source, left as initialised'),
                            ('uninitialised', 'model entries not in the '
                             'checkpoint, left as initialised'),
                            ('unused', 'checkpoint entries unused')):
            if report[what]:
                lines.append(f'  {label} ({len(report[what])}): ' +
                             ', '.join(report[what]))
        print_log('\n'.join(lines), logger='current')
        if hasattr(module, '_params_init_info'):
            update_init_info(
                module,
                init_info=f'SNPretrained: load from '
                f'{self.checkpoint}')
