"""SN in any PyTorch model: :func:`convert_sn` turns a model's BatchNorm,
SyncBatchNorm and GroupNorm layers into SN layers that carry their
weights, as ``nn.SyncBatchNorm.convert_sync_batchnorm`` does for BN, and
:func:`revert_sn` turns hardened SN layers back; and the
ratios an SN layer starts with when it replaces such a layer, which
``SNPretrained`` (sn_mm/engine/pretrained.py) uses too."""
import math
from typing import Optional

import torch
import torch.nn as nn

from .fuse import hard_ratio_terms
from .switchable_norm import SwitchableNorm
from .switchable_whitening import SwitchableWhitening, SyncSwitchableWhitening
from .sync_switchable_norm import SyncSwitchableNorm, name_sync_layers

RATIO_CHOICES = ('uniform', 'source', 'fixed')
# With ratios='source': the source's term's ratio (softmax logits cannot
# make it exactly 1); the other terms share what is left.
SOURCE_RATIO = 1 - 1e-4
_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def source_logits(kind: str, terms: int) -> Optional[torch.Tensor]:
    """Logits (``terms`` of them: IN, LN[, BN]) whose softmax puts
    SOURCE_RATIO on the term of a ``kind`` ('BN' or 'GN') source: BN for BN;
    for GN, whose group statistics lie between IN's and LN's, half of it on
    each. None where the layer has no such term (BN without a BN term)."""
    rest = 1 - SOURCE_RATIO
    if kind == 'BN':
        if terms < 3:
            return None
        ratios = [rest / 2, rest / 2, SOURCE_RATIO]
    else:
        ratios = [SOURCE_RATIO / 2] * 2 + [rest] * (terms - 2)
        ratios = [r / sum(ratios) for r in ratios]
    return torch.tensor([math.log(r) for r in ratios])


def _fixed_ratio(layer: nn.Module, name: str) -> list:
    """The ratio vector (IN, LN, BN) with which SN computes what ``layer``
    does in eval; a ValueError where there is none."""
    if isinstance(layer, _BN):
        if not layer.track_running_stats:
            raise ValueError(f"convert_sn(ratios='fixed'): {name} keeps no "
                             'running statistics, so no ratio makes SN '
                             'compute it in eval')
        return [0., 0., 1.]
    if layer.num_groups == layer.num_channels:
        return [1., 0., 0.]  # InstanceNorm
    if layer.num_groups == 1:
        return [0., 1., 0.]  # LayerNorm over (C, H, W)
    raise ValueError(f"convert_sn(ratios='fixed'): {name} is GroupNorm with "
                     f'{layer.num_groups} groups of {layer.num_channels} '
                     "channels, which no SN ratio reproduces (use 'source' "
                     "or 'uniform')")


def _sn_for(layer: nn.Module, name: str, ratios: str, sync: bool, group,
            **sn_kwargs) -> SwitchableNorm:
    is_bn = isinstance(layer, _BN)
    channels = layer.num_features if is_bn else layer.num_channels
    # Variances as PyTorch's norms take them (divided by the count), so
    # that fixed ratios reproduce the source.
    kwargs = {'eps': layer.eps, 'unbiased': False, **sn_kwargs}
    if is_bn:
        kwargs.setdefault('momentum', layer.momentum)
    if sync:
        sn = SyncSwitchableNorm(channels, group=group, **kwargs)
    else:
        sn = SwitchableNorm(channels, **kwargs)
    with torch.no_grad():
        if layer.affine:
            sn.weight.copy_(layer.weight)
            sn.bias.copy_(layer.bias)
        if is_bn and layer.track_running_stats and sn.using_bn:
            sn.running_mean.copy_(layer.running_mean)
            sn.running_var.copy_(layer.running_var)
            sn.num_batches_tracked.copy_(layer.num_batches_tracked)
        shape = sn.mean_weight.shape  # (K,), or (G, K): group SN
        if ratios == 'source':
            logits = source_logits('BN' if is_bn else 'GN', shape[-1])
            if logits is not None:
                sn.mean_weight.copy_(logits.expand(shape))
                sn.var_weight.copy_(logits.expand(shape))
    if ratios == 'fixed':
        ratio = _fixed_ratio(layer, name)[:shape[-1]]
        if sum(ratio) == 0:
            raise ValueError(f"convert_sn(ratios='fixed'): {name} needs "
                             'the BN term, which using_bn=False removes')
        sn.fix_ratios(mean=ratio, var=ratio)
    # The source's device and dtype (a float64 model stays float64).
    like = next(iter([*layer.parameters(), *layer.buffers()]), None)
    if like is not None:
        sn.to(like.device)
        if like.is_floating_point():
            sn.to(like.dtype)
    sn.train(layer.training)
    return sn


def convert_sn(module: nn.Module,
               ratios: str = 'uniform',
               sync: bool = False,
               group=None,
               **sn_kwargs) -> nn.Module:
    """Every BatchNorm (1d/2d/3d, SyncBatchNorm) and GroupNorm in ``module``
    replaced by a :class:`SwitchableNorm` (``sync``: a
    :class:`SyncSwitchableNorm` sharing BN statistics over ``group``) that
    carries its affine parameters and, from BN, its running statistics and
    momentum; returns the converted module (a new object only where
    ``module`` itself is such a layer), like
    ``nn.SyncBatchNorm.convert_sync_batchnorm``.

    Args:
        ratios: the ratios each SN layer starts with: 'uniform' (the
            paper's start), 'source' (softmax logits that put 1 - 1e-4 on
            the source's term: BN's; for GN, half each on IN's and LN's, as
            ``SNPretrained`` does), or 'fixed' (the source's term fixed,
            ``fix_ratios``: SN then computes what a BN layer computes in
            eval, and what GroupNorm with 1 or C groups computes; other
            GroupNorm layers raise a ValueError naming them).
        sn_kwargs: further arguments of every SN layer (``ratio_groups``,
            ``using_bn``, ``kernels``, ...); ``unbiased`` is False unless
            given, variances divided by their count as in PyTorch's norms
            (the released SN divides by count - 1).

    Example::

        import torchvision
        from sn_mm import convert_sn
        model = convert_sn(torchvision.models.resnet50(), ratios='source')
    """
    if ratios not in RATIO_CHOICES:
        raise ValueError(f'ratios={ratios!r}: expected one of '
                         f'{", ".join(map(repr, RATIO_CHOICES))}')
    return _convert(module, '', ratios, sync, group, sn_kwargs)


def _convert(module, name, ratios, sync, group, sn_kwargs):
    if isinstance(module, _BN + (nn.GroupNorm, )):
        return _sn_for(module, name or type(module).__name__, ratios, sync,
                       group, **sn_kwargs)
    for child_name, child in module.named_children():
        new = _convert(child, f'{name}.{child_name}' if name else child_name,
                       ratios, sync, group, sn_kwargs)
        if new is not child:
            setattr(module, child_name, new)
    return module


def revert_sn(module: nn.Module, bn_type: type = nn.BatchNorm2d) -> nn.Module:
    """The way back for hardened layers: every SN layer whose mean and
    variance ratios are fixed to one and the same term (``harden_sn``,
    ``fix_ratios``, ``convert_sn(ratios='fixed')``) becomes the PyTorch
    norm that computes it, carrying its parameters: BN's term a ``bn_type``
    layer (BatchNorm2d by default) with the running statistics, equal in
    eval; with ``unbiased=False`` (as ``convert_sn`` makes them), IN's term
    ``GroupNorm(C, C)`` and LN's ``GroupNorm(1, C)``, equal always. Other
    layers stay SN. Returns the module (a new object where ``module`` is
    such a layer)."""
    if isinstance(module, SwitchableNorm):
        return _plain_norm(module, bn_type) or module
    for name, child in module.named_children():
        new = revert_sn(child, bn_type)
        if new is not child:
            setattr(module, name, new)
    return module


def _plain_norm(layer: SwitchableNorm, bn_type: type):
    terms = hard_ratio_terms(layer)
    if terms is None or terms[0] != terms[1]:
        return None
    c = layer.num_features
    if terms[0] == 'bn':
        norm = bn_type(c, eps=layer.eps, momentum=layer.momentum)
        with torch.no_grad():
            norm.running_mean.copy_(layer.running_mean)
            norm.running_var.copy_(layer.running_var)
            norm.num_batches_tracked.copy_(layer.num_batches_tracked)
    elif layer.unbiased:
        return None  # IN's and LN's variances divided by count - 1
    else:
        norm = nn.GroupNorm(c if terms[0] == 'in' else 1, c, eps=layer.eps)
    with torch.no_grad():
        norm.weight.copy_(layer.weight)
        norm.bias.copy_(layer.bias)
    return norm.to(layer.weight.device,
                   layer.weight.dtype).train(layer.training)


def _swap(module: nn.Module, swaps: dict) -> nn.Module:
    """Replace, recursively, every layer whose exact type is a key of
    ``swaps`` by ``swaps[type](layer)``, handing over the same Parameter
    and buffer objects, so that an optimizer built before the swap still
    updates the new layers."""
    make_new = swaps.get(type(module))
    if make_new is not None:
        new = make_new(module)
        for name, param in module.named_parameters(recurse=False):
            setattr(new, name, param)
        for name, buffer in module.named_buffers(recurse=False):
            setattr(new, name, buffer)
        new.train(module.training)
        return new
    for name, child in module.named_children():
        new_child = _swap(child, swaps)
        if new_child is not child:
            module.add_module(name, new_child)
    return module


def _sn_args(m: SwitchableNorm) -> dict:
    return dict(
        num_features=m.num_features,
        eps=m.eps,
        momentum=m.momentum,
        using_bn=m.using_bn,
        unbiased=m.unbiased,
        kernels=m.kernels,
        ratio_fn=m.ratio_fn,
        ratio_groups=m.ratio_groups,
        num_levels=m.num_levels)


def _sw_args(m: SwitchableWhitening) -> dict:
    return dict(
        num_features=m.num_features,
        num_pergroup=m.num_pergroup,
        sw_type=m.sw_type,
        T=m.T,
        tie_weight=m.tie_weight,
        eps=m.eps,
        momentum=m.momentum,
        affine=m.affine)


def convert_sync_sn(module: nn.Module, group=None) -> nn.Module:
    """Turn every :class:`SwitchableNorm` in ``module`` into a
    :class:`SyncSwitchableNorm`, and every :class:`SwitchableWhitening`
    into a :class:`SyncSwitchableWhitening`, sharing batch statistics over
    ``group`` and keeping the layer's parameters and buffers, like
    ``nn.SyncBatchNorm.convert_sync_batchnorm``; SyncSN layers are named
    after their place in ``module`` (:func:`name_sync_layers`). Returns the
    converted module (a new object only where ``module`` itself is such a
    layer)."""
    module = _swap(
        module, {
            SwitchableNorm:
            lambda m: SyncSwitchableNorm(**_sn_args(m), group=group),
            SwitchableWhitening:
            lambda m: SyncSwitchableWhitening(**_sw_args(m), group=group),
        })
    name_sync_layers(module)
    return module


def revert_sync_sn(module: nn.Module) -> nn.Module:
    """Turn every :class:`SyncSwitchableNorm` in ``module`` back into a
    :class:`SwitchableNorm`, and every :class:`SyncSwitchableWhitening` into
    a :class:`SwitchableWhitening`, e.g. to test on one process or the
    CPU."""
    return _swap(
        module, {
            SyncSwitchableNorm: lambda m: SwitchableNorm(**_sn_args(m)),
            SyncSwitchableWhitening:
            lambda m: SwitchableWhitening(**_sw_args(m)),
        })
