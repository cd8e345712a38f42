"""Switchable Normalization (Luo et al., TPAMI), registered as ``'SN'``."""
import operator
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from mmengine.registry import MODELS
from torch import Tensor

from ..ops import check_kernels, switchable_norm
from ..ops._compat import in_backward, own_tensors
from ..ops.operator import is_tracing
from ..ops.ratios import RATIO_FNS, TERMS, group_ratios, layer_ratios
from .norm_eval import keep_norm_eval_everywhere


def positive_int(value, name: str) -> int:
    """``value`` as an int (numpy's too), or a ValueError naming ``name``
    where it is not a positive integer."""
    try:
        count = operator.index(value)
    except TypeError:
        count = 0
    if isinstance(value, bool) or count < 1:
        raise ValueError(f'{name} must be a positive integer, got {value!r}')
    return count


def check_arguments(num_features, eps, momentum, ratio_groups=1) -> None:
    """ValueErrors naming an argument that cannot work."""
    count = positive_int(num_features, 'num_features')
    if not eps > 0:  # (NaN too)
        raise ValueError(f'eps must be > 0, got {eps!r}')
    if momentum is not None and not 0 <= momentum <= 1:
        raise ValueError(f'momentum must be in [0, 1] (or None for a '
                         f'cumulative average), got {momentum!r}')
    if count % positive_int(ratio_groups, 'ratio_groups'):
        raise ValueError(f'ratio_groups={ratio_groups} must divide '
                         f'num_features={num_features}')


def check_levels(num_levels, using_bn) -> None:
    """A ValueError naming a ``num_levels`` that cannot work."""
    if positive_int(num_levels, 'num_levels') > 1 and not using_bn:
        raise ValueError('num_levels > 1 keeps BN running statistics per '
                         'level; this layer has no BN term (using_bn=False)')


# The ratio entries of an SN layer and the dimension a group SN layer adds
# to each: the logits are (G, K), the fixed ratios (2, G[, K]).
GROUP_DIMS = {
    'mean_weight': 0,
    'var_weight': 0,
    'ratio_fixed': 1,
    'fixed_ratios': 1
}


def to_groups(name: str, value: Tensor, own: Tensor) -> Tensor:
    """An SN layer's ratio entry ``name`` (one vector per statistic) for
    every group of a group SN layer whose entry is ``own``; anything else as
    it is."""
    if name not in GROUP_DIMS or value.dim() != own.dim() - 1:
        return value
    return value.unsqueeze(GROUP_DIMS[name]).expand_as(own).clone()


# torch.fx records the whole layer as one call (its shape checks and
# branches would otherwise stop symbolic tracing).
torch.fx.wrap('switchable_norm')


@MODELS.register_module('SN')
class SwitchableNorm(nn.Module):
    """Switchable Normalization over inputs of shape (N, C, *).

    Per layer, the instance (IN), layer (LN) and batch (BN) means and
    variances are mixed with two softmax-weighted ratio vectors and the result
    is used to normalise the input, followed by a per-channel affine
    transform. LN and BN statistics are derived from IN's in one pass over the
    data (Eq. 5 of the paper).

    Where IN is undefined -- a 2D (N, C) input or a single spatial position,
    e.g. after global pooling -- the IN logit is left out of both softmaxes
    and the layer mixes LN and BN only (LN alone with ``using_bn=False``).

    Args:
        num_features (int): Number of channels C.
        eps (float): Added to the mixed variance. Default: 1e-5.
        momentum (float, optional): PyTorch's convention, ``running = (1 -
            momentum) * running + momentum * batch``. The released code's 0.9
            is our 0.1. ``None``: the cumulative average over the batches
            seen (counted in ``num_batches_tracked``), as in
            ``nn.BatchNorm2d``. Default: 0.1.
        using_bn (bool): Include the BN branch (3 logits and running
            statistics) or not (2 logits, IN and LN). Default: True.
        unbiased (bool): Bessel-corrected IN variance, as the released
            implementation (and its checkpoints) use; LN and BN variances are
            then derived from it. False gives the paper's Eq. 4 estimators.
            Default: True.
        kernels (str, optional): Which implementation computes the layer:
            ``'auto'``, ``'native'``, ``'triton'`` or ``'torch'`` (see
            :mod:`sn_mm.ops.operator`). None follows the global default
            (:func:`sn_mm.ops.set_default_kernels`, ``$SN_MM_KERNELS``,
            else ``'auto'``). Default: None.
        ratio_fn (str): How the ratios come from the logits: ``'softmax'``
            (SN) or ``'sparsestmax'`` (Sparse SN, Shao et al., CVPR 2019:
            :func:`sn_mm.ops.sparsestmax` at the layer's ``radius`` buffer,
            which :class:`sn_mm.engine.SSNRadiusHook` grows from 0 to 1 over
            training; in training, a ratio vector that has become one-hot
            is fixed, as below). Default: ``'softmax'``.
        ratio_groups (int): Group SN (the paper's Sec. 3, "Variants of
            SN"): the channels fall into G groups of C / G consecutive
            channels, and channel c of group g = c // (C / G) mixes the IN,
            LN and BN statistics (SN's own: LN still over all channels of a
            sample) with ``softmax(mean_weight[g])`` and
            ``softmax(var_weight[g])``; the logits then have shape (G, K).
            G = 1 is SN (logits (K,)); G = C gives every channel its own
            ratios. A checkpoint with one ratio vector per statistic
            (SN's, e.g. the released backbones) starts every group from
            it. Default: 1.
        num_levels (int): BN running statistics kept for each of L levels
            of a head that mmdet runs once per FPN level (RetinaNet's,
            FCOS's, ATSS's, GFL's): the layer's k-th call in a forward of
            the head normalises level k with level k's statistics, in
            training as at test time, instead of one blend of all levels'.
            :class:`sn_mm.engine.SNRunner` sets it on such heads
            (:func:`sn_mm.models.keep_level_statistics`); the statistics are
            then (L, C) and ``num_batches_tracked`` (L,). Default: 1.

    Non-finite batches: a training batch whose BN statistics are not all
    finite (a NaN or an overflow in the input, e.g. the step that
    mixed-precision training's loss scaler then skips) leaves the running
    statistics and ``num_batches_tracked`` as they were and is counted in
    the buffer ``nonfinite_batches`` instead (:class:`sn_mm.engine.SNRatioHook`
    logs it); the output is what the statistics give.

    ``norm_eval=True`` in an OpenMMLab backbone (mmdet's, mmseg's,
    mmpretrain's, mmaction2's) keeps SN layers in eval mode in training, as
    it keeps BN layers (:mod:`sn_mm.models.norm_eval`).

    Fixed ratios: :meth:`fix_ratios` gives the mean and/or variance ratio
    vectors instead of ``softmax(logits)`` (e.g. the one-hot hard ratios of
    :func:`sn_mm.harden_sn`). They live in the buffers ``ratio_fixed`` (2,)
    and ``fixed_ratios`` (2, K), so they survive saving, loading, resuming
    and SyncSN conversion, take no gradient and never move (group SN:
    ``ratio_fixed`` (2, G), ``fixed_ratios`` (2, G, K), one per group).
    """

    _abbr_ = 'sn'

    def __init__(self,
                 num_features: int,
                 eps: float = 1e-5,
                 momentum: Optional[float] = 0.1,
                 using_bn: bool = True,
                 unbiased: bool = True,
                 kernels: Optional[str] = None,
                 ratio_fn: str = 'softmax',
                 ratio_groups: int = 1,
                 num_levels: int = 1) -> None:
        super().__init__()
        if ratio_fn not in RATIO_FNS:
            raise ValueError(f'unknown ratio_fn {ratio_fn!r} (choose from '
                             f'{", ".join(map(repr, RATIO_FNS))})')
        check_arguments(num_features, eps, momentum, ratio_groups)
        check_levels(num_levels, using_bn)
        # The backbone building this layer freezes it under norm_eval=True.
        keep_norm_eval_everywhere(SwitchableNorm)
        self.ratio_groups = int(ratio_groups)
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.using_bn = using_bn
        self.unbiased = unbiased
        self.kernels = None if kernels is None else check_kernels(kernels)
        self.ratio_fn = ratio_fn
        num_terms = 3 if using_bn else 2
        # SN's logits are (K,), as in the released checkpoints.
        groups = () if self.ratio_groups == 1 else (self.ratio_groups, )
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.mean_weight = nn.Parameter(torch.ones(*groups, num_terms))
        self.var_weight = nn.Parameter(torch.ones(*groups, num_terms))
        self.num_levels = int(num_levels)
        self.level = 0  # the level the next call normalises
        if using_bn:
            levels = () if self.num_levels == 1 else (self.num_levels, )
            self.register_buffer('running_mean',
                                 torch.zeros(*levels, num_features))
            self.register_buffer('running_var',
                                 torch.ones(*levels, num_features))
            self.register_buffer('num_batches_tracked',
                                 torch.zeros(levels, dtype=torch.long))
            self.register_buffer('nonfinite_batches',
                                 torch.tensor(0, dtype=torch.long))
        else:
            self.register_buffer('running_mean', None)
            self.register_buffer('running_var', None)
            self.register_buffer('num_batches_tracked', None)
            self.register_buffer('nonfinite_batches', None)
        self.register_buffer('ratio_fixed',
                             torch.zeros(2, *groups, dtype=torch.bool))
        self.register_buffer(
            'fixed_ratios', torch.full((2, *groups, num_terms),
                                       1. / num_terms))
        # SparsestMax's radius: state (saved, resumed), not a parameter.
        self.register_buffer(
            'radius',
            torch.zeros(()) if ratio_fn == 'sparsestmax' else None)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                              missing_keys, unexpected_keys, error_msgs):
        # The released checkpoints have no batch counters, nor any checkpoint
        # saved without the non-finite count that one; as nn.BatchNorm does,
        # start them at 0.
        for name in ('num_batches_tracked', 'nonfinite_batches'):
            if self.using_bn and prefix + name not in state_dict:
                state_dict[prefix + name] = torch.zeros_like(
                    getattr(self, name))
        self._match_levels(state_dict, prefix)
        self._expand_to_groups(state_dict, prefix)
        # Nor do they have fixed ratios: none fixed.
        if prefix + 'ratio_fixed' not in state_dict:
            state_dict[prefix + 'ratio_fixed'] = torch.zeros_like(
                self.ratio_fixed)
            state_dict[prefix + 'fixed_ratios'] = self.fixed_ratios.new_full(
                self.fixed_ratios.shape, 1. / self.fixed_ratios.shape[1])
        # A converted or SN checkpoint loaded into a Sparse SN layer: the
        # radius starts where the layer's is (SSNRadiusHook sets it).
        if self.radius is not None and prefix + 'radius' not in state_dict:
            state_dict[prefix + 'radius'] = self.radius.clone()
        elif self.radius is not None:  # SSN's own checkpoints store (1,)
            state_dict[prefix + 'radius'] = state_dict[prefix +
                                                       'radius'].reshape(())
        super()._load_from_state_dict(state_dict, prefix, local_metadata,
                                      strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _match_levels(self, state_dict, prefix) -> None:
        """Per-level running statistics (L, C) in the checkpoint make this
        layer keep L levels; one set (C,) starts each of this layer's
        levels."""
        mean = state_dict.get(prefix + 'running_mean')
        if not self.using_bn or mean is None:
            return
        if mean.dim() == 2 and self.running_mean.dim() == 1:
            self.set_levels(mean.shape[0])
        elif mean.dim() == 1 and self.num_levels > 1:
            for name in ('running_mean', 'running_var', 'num_batches_tracked'):
                own = getattr(self, name)
                state_dict[prefix + name] = state_dict[prefix + name].expand(
                    own.shape).clone()

    @torch.no_grad()
    def set_levels(self, num_levels: int) -> None:
        """Keep BN running statistics for each of ``num_levels`` levels
        of a head shared across FPN levels: the k-th call after
        :meth:`start_levels` (or k modulo ``num_levels``) uses and updates
        level k's. Each level starts from the layer's current statistics
        (an L-level layer keeps their average). 1: one set again."""
        check_levels(num_levels, self.using_bn)
        num_levels = int(num_levels)
        if num_levels == self.num_levels:
            return
        if self.num_levels > 1:
            self.running_mean = self.running_mean.mean(0)
            self.running_var = self.running_var.mean(0)
            self.num_batches_tracked = self.num_batches_tracked.max()
        if num_levels > 1:
            for name in ('running_mean', 'running_var', 'num_batches_tracked'):
                own = getattr(self, name)
                setattr(self, name, own.expand(num_levels, *own.shape).clone())
        self.num_levels = num_levels
        self.level = 0

    def start_levels(self) -> None:
        """The next call normalises the first level (a shared head's
        forward begins)."""
        self.level = 0

    def _expand_to_groups(self, state_dict, prefix) -> None:
        """An SN checkpoint's single ratio vector per statistic (and its
        fixed ratios) into every group of a group SN layer."""
        for name in GROUP_DIMS:
            if prefix + name in state_dict:
                state_dict[prefix + name] = to_groups(
                    name, state_dict[prefix + name], getattr(self, name))

    # -- forward ------------------------------------------------------------
    def _sync_group(self):
        """The process group sharing BN statistics; None on one device."""
        return None

    def forward(self, x: Tensor) -> Tensor:
        # The dicts, not attribute lookups through nn.Module.__getattr__: at
        # small shapes Python's cost per call is what SN pays over GN.
        params, buffers = own_tensors(self)
        running_mean = buffers['running_mean']
        running_var = buffers['running_var']
        num_batches_tracked = buffers['num_batches_tracked']
        if self.num_levels > 1:
            level = self.level
            # Activation checkpointing's recomputation is the same call.
            if is_tracing() or not in_backward():
                self.level = (level + 1) % self.num_levels
            running_mean, running_var, num_batches_tracked = (
                running_mean[level], running_var[level],
                num_batches_tracked[level])
        return switchable_norm(x, params['weight'], params['bias'],
                               params['mean_weight'], params['var_weight'],
                               running_mean, running_var, num_batches_tracked,
                               self.training, self.momentum, self.eps,
                               self.unbiased, self.kernels,
                               self._sync_group() if self.training else None,
                               type(self).__name__, buffers['ratio_fixed'],
                               buffers['fixed_ratios'], self.ratio_fn,
                               buffers['radius'], buffers['nonfinite_batches'])

    # -- fixed ratios -------------------------------------------------------
    def _check_ratio(self, ratio, stat: str) -> Tensor:
        """The ratio as (K,), or (G, K) for group SN (a (K,) vector then
        applies to every group)."""
        k, groups = self.fixed_ratios.shape[-1], self.ratio_groups
        ratio = torch.as_tensor(ratio, dtype=torch.float64)
        if groups == 1 or ratio.dim() < 2:
            ratio = ratio.flatten()
        if tuple(ratio.shape) not in ((k, ), (groups, k)):
            per_group = f' (or {groups} x {k})' if groups > 1 else ''
            raise ValueError(
                f'{stat} ratio: expected {k} values{per_group} '
                f'({", ".join(TERMS[:k])}), got shape {tuple(ratio.shape)}')
        if not torch.isfinite(ratio).all() or (ratio < 0).any() or (
                ratio.sum(-1) - 1).abs().max() > 1e-6:
            raise ValueError(f'{stat} ratio must be non-negative and sum to '
                             f'1, got {ratio.tolist()}')
        return ratio.expand(self.fixed_ratios.shape[1:])

    @torch.no_grad()
    def fix_ratios(self, mean=None, var=None) -> None:
        """Use the given ratio vectors (K values each, non-negative, summing
        to 1, in the order IN, LN[, BN]) for the mean and/or the variance
        instead of the softmax of the logits; ``None`` leaves that one as it
        is. Exact zeros stay exact. Group SN: one vector for every group, or
        (G, K), a vector per group."""
        for row, (stat, ratio) in enumerate((('mean', mean), ('var', var))):
            if ratio is None:
                continue
            ratio = self._check_ratio(ratio, stat)
            self.fixed_ratios[row].copy_(ratio.to(self.fixed_ratios))
            self.ratio_fixed[row] = True  # (every group)

    @torch.no_grad()
    def set_radius(self, radius: float) -> None:
        """SparsestMax's radius (0 to 1), for ``ratio_fn='sparsestmax'``."""
        if self.radius is None:
            raise RuntimeError('set_radius: this layer uses '
                               f'ratio_fn={self.ratio_fn!r}, which has no '
                               'radius')
        if not 0 <= radius <= 1:
            raise ValueError(f'radius must be in [0, 1], got {radius}')
        self.radius.fill_(radius)

    @torch.no_grad()
    def unfix_ratios(self) -> None:
        """Back to learned (softmax) ratios for the mean and the variance."""
        self.ratio_fixed.zero_()

    # -- introspection ------------------------------------------------------
    def ratios(self) -> Dict[str, Dict[str, float]]:
        """The ratios the layer mixes with, e.g. ``{'mean': {'in': ..,
        'ln': .., 'bn': ..}, 'var': {...}}``: the softmax (or SparsestMax at
        the current radius) of the learned logits, or the fixed ratios where
        fixed. Inputs without IN (see the class docstring) renormalise the
        remaining terms at run time."""
        return layer_ratios(self.mean_weight, self.var_weight,
                            self.ratio_fixed, self.fixed_ratios, self.radius)

    def group_ratios(self) -> List[Dict[str, Dict[str, float]]]:
        """Each group's ratios, in channel order (:meth:`ratios` gives
        their average); one entry for SN."""
        return group_ratios(self.mean_weight, self.var_weight,
                            self.ratio_fixed, self.fixed_ratios, self.radius)

    def fixed(self) -> Dict[str, bool]:
        """Which of the mean and variance ratios are fixed (group SN: in
        every group)."""
        return dict(
            mean=bool(self.ratio_fixed[0].all()),
            var=bool(self.ratio_fixed[1].all()))

    def extra_repr(self) -> str:

        def fmt(ratio: Dict[str, float]) -> str:
            return ', '.join(f'{k}={v:.3f}' for k, v in ratio.items())

        ratios = self.ratios()
        return (f'{self.num_features}, eps={self.eps}, '
                f'momentum={self.momentum}, using_bn={self.using_bn}, '
                f'unbiased={self.unbiased}, ' +
                (f'kernels={self.kernels!r}, ' if self.kernels else '') +
                (f'ratio_groups={self.ratio_groups}, ' if self.ratio_groups > 1
                 else '') + (f'num_levels={self.num_levels}, '
                             if self.num_levels > 1 else '') +
                (f'ratio_fn={self.ratio_fn!r}, radius='
                 f'{float(self.radius):.3f}, ' if self.radius is not None else
                 '') + f'mean_ratios=({fmt(ratios["mean"])}), '
                f'var_ratios=({fmt(ratios["var"])})')
