"""Switchable Normalization (Luo et al., TPAMI), registered as ``'SN'``."""
import warnings
from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.registry import MODELS

from torch import Tensor

from ..ops import check_kernels
from ..ops import functional as sn_functional
from ..ops.functional import (RATIO_FNS, fused_applies, is_tracing,
                              switchable_norm, triton_fused_applies)
from ..ops.native_kernels import switchable_norm_op
from ..ops.sparsestmax import sparsestmax

# torch.fx records the whole layer as one call (its shape checks and
# branches would otherwise stop symbolic tracing).
torch.fx.wrap('switchable_norm')

# Order of the logits in ``mean_weight``/``var_weight``; it is the order of the
# authors' released code, so their checkpoints load as they are.
TERMS = ('in', 'ln', 'bn')


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
            :mod:`sn_mm.ops.kernels`). None follows the global default
            (:func:`sn_mm.ops.set_default_kernels`, ``$SN_MM_KERNELS``,
            else ``'auto'``). Default: None.
        ratio_fn (str): How the ratios come from the logits: ``'softmax'``
            (SN) or ``'sparsestmax'`` (Sparse SN, Shao et al., CVPR 2019:
            :func:`sn_mm.ops.sparsestmax` at the layer's ``radius`` buffer,
            which :class:`sn_mm.engine.SSNRadiusHook` grows from 0 to 1 over
            training; in training, a ratio vector that has become one-hot
            is fixed, as below). Default: ``'softmax'``.

    Fixed ratios: :meth:`fix_ratios` gives the mean and/or variance ratio
    vectors instead of ``softmax(logits)`` (e.g. the one-hot hard ratios of
    :func:`sn_mm.harden_sn`). They live in the buffers ``ratio_fixed`` (2,)
    and ``fixed_ratios`` (2, K), so they survive saving, loading, resuming
    and SyncSN conversion, take no gradient and never move.
    """

    _abbr_ = 'sn'

    def __init__(self,
                 num_features: int,
                 eps: float = 1e-5,
                 momentum: Optional[float] = 0.1,
                 using_bn: bool = True,
                 unbiased: bool = True,
                 kernels: Optional[str] = None,
                 ratio_fn: str = 'softmax') -> None:
        super().__init__()
        if ratio_fn not in RATIO_FNS:
            raise ValueError(f'unknown ratio_fn {ratio_fn!r} (choose from '
                             f'{", ".join(map(repr, RATIO_FNS))})')
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.using_bn = using_bn
        self.unbiased = unbiased
        self.kernels = None if kernels is None else check_kernels(kernels)
        self.ratio_fn = ratio_fn
        num_terms = 3 if using_bn else 2
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.mean_weight = nn.Parameter(torch.ones(num_terms))
        self.var_weight = nn.Parameter(torch.ones(num_terms))
        if using_bn:
            self.register_buffer('running_mean', torch.zeros(num_features))
            self.register_buffer('running_var', torch.ones(num_features))
            self.register_buffer('num_batches_tracked',
                                 torch.tensor(0, dtype=torch.long))
        else:
            self.register_buffer('running_mean', None)
            self.register_buffer('running_var', None)
            self.register_buffer('num_batches_tracked', None)
        self.register_buffer('ratio_fixed', torch.zeros(2, dtype=torch.bool))
        self.register_buffer('fixed_ratios',
                             torch.full((2, num_terms), 1. / num_terms))
        # SparsestMax's radius: state (saved, resumed), not a parameter.
        self.register_buffer('radius', torch.zeros(()) if
                             ratio_fn == 'sparsestmax' else None)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata,
                              strict, missing_keys, unexpected_keys,
                              error_msgs):
        # Checkpoints from the released code and from earlier sn_mm versions
        # have no batch counter; as nn.BatchNorm does, start it at 0.
        key = prefix + 'num_batches_tracked'
        if self.using_bn and key not in state_dict:
            state_dict[key] = torch.tensor(0, dtype=torch.long)
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
            state_dict[prefix + 'radius'] = state_dict[
                prefix + 'radius'].reshape(())
        super()._load_from_state_dict(state_dict, prefix, local_metadata,
                                      strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # -- forward ------------------------------------------------------------
    def _sync_group(self):
        """The process group sharing BN statistics; None on one device."""
        return None

    def forward(self, x: Tensor) -> Tensor:
        # The common case, one native operator call, kept lean: at small
        # shapes (batch-1 inference, RoI heads) Python's own cost per call is
        # what SN pays over GroupNorm. (x.size(1), not x.shape: that builds
        # a new object; wrong shapes take the checked path below.)
        params, buffers = self._parameters, self._buffers
        weight = params['weight']
        if (self.ratio_fn == 'softmax'
                and fused_applies(x, weight, self._kernel_choice())
                and x.dim() >= 2 and x.size(1) == self.num_features
                and self._sync_group() is None):
            momentum = self.momentum
            return switchable_norm_op(
                x, weight, params['bias'], params['mean_weight'],
                params['var_weight'], buffers['running_mean'],
                buffers['running_var'], buffers['num_batches_tracked'],
                buffers['ratio_fixed'], buffers['fixed_ratios'],
                self.training, -1. if momentum is None else momentum,
                self.eps, self.unbiased, False)
        # Likewise on GPUs: the fused Triton kernels, called directly.
        if (isinstance(x, Tensor) and x.is_cuda
                and self.ratio_fn == 'softmax' and x.dim() >= 2
                and x.size(1) == self.num_features
                and self._sync_group() is None
                and triton_fused_applies(x, weight, buffers['running_mean'],
                                         self._kernel_choice())):
            return sn_functional._triton_fused.switchable_norm(
                x, weight, params['bias'], params['mean_weight'],
                params['var_weight'], buffers['running_mean'],
                buffers['running_var'], buffers['num_batches_tracked'],
                buffers['ratio_fixed'], buffers['fixed_ratios'],
                self.training, self.momentum, self.eps, self.unbiased)
        # Under torch.compile/export the kernel setting plays no part.
        kernels = None if is_tracing() else self._kernel_choice()
        return switchable_norm(
            x, self.weight, self.bias, self.mean_weight, self.var_weight,
            self.running_mean, self.running_var, self.num_batches_tracked,
            self.training, self.momentum, self.eps, self.unbiased, kernels,
            self._sync_group(), type(self).__name__, self.ratio_fixed,
            self.fixed_ratios, self.ratio_fn, self.radius)

    # -- fixed ratios -------------------------------------------------------
    def _check_ratio(self, ratio, stat: str) -> Tensor:
        k = self.fixed_ratios.shape[1]
        ratio = torch.as_tensor(ratio, dtype=torch.float64).flatten()
        if ratio.numel() != k:
            raise ValueError(f'{stat} ratio: expected {k} values '
                             f'({", ".join(TERMS[:k])}), got {ratio.numel()}')
        if not torch.isfinite(ratio).all() or (ratio < 0).any() or abs(
                float(ratio.sum()) - 1) > 1e-6:
            raise ValueError(f'{stat} ratio must be non-negative and sum to '
                             f'1, got {ratio.tolist()}')
        return ratio

    @torch.no_grad()
    def fix_ratios(self, mean=None, var=None) -> None:
        """Use the given ratio vectors (K values each, non-negative, summing
        to 1, in the order IN, LN[, BN]) for the mean and/or the variance
        instead of the softmax of the logits; ``None`` leaves that one as it
        is. Exact zeros stay exact."""
        for row, (stat, ratio) in enumerate((('mean', mean), ('var', var))):
            if ratio is None:
                continue
            ratio = self._check_ratio(ratio, stat)
            self.fixed_ratios[row].copy_(ratio.to(self.fixed_ratios))
            self.ratio_fixed[row] = True

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

    def _kernel_choice(self) -> Optional[str]:
        # Looked up without nn.Module.__getattr__, whose AttributeError on
        # every forward would cost more than the lookup.
        legacy = self.__dict__.get('use_native_kernels',
                                   getattr(type(self), 'use_native_kernels',
                                           None))
        if legacy is None:
            return self.kernels
        # The attribute of sn_mm < 0.2, still honoured.
        mapping = {True: self.kernels, False: 'torch', 'triton': 'triton'}
        if not any(legacy is k or legacy == k for k in mapping):
            raise ValueError(
                f'use_native_kernels={legacy!r} (replaced by kernels=\'auto\''
                f' | \'native\' | \'triton\' | \'torch\')')
        warnings.warn('SwitchableNorm.use_native_kernels is deprecated: use '
                      'kernels=\'auto\' | \'native\' | \'triton\' | '
                      '\'torch\' (norm_cfg, the attribute, or '
                      'sn_mm.ops.set_default_kernels)', DeprecationWarning)
        return mapping[legacy if isinstance(legacy, str) else bool(legacy)]

    # -- introspection ------------------------------------------------------
    def ratios(self) -> Dict[str, Dict[str, float]]:
        """The ratios the layer mixes with, e.g. ``{'mean': {'in': ..,
        'ln': .., 'bn': ..}, 'var': {...}}``: the softmax (or SparsestMax at
        the current radius) of the learned logits, or the fixed ratios where
        fixed. Inputs without IN (see the class docstring) renormalise the
        remaining terms at run time."""
        result = {}
        for row, (key, logits) in enumerate((('mean', self.mean_weight),
                                             ('var', self.var_weight))):
            if bool(self.ratio_fixed[row]):
                probs = self.fixed_ratios[row].tolist()
            elif self.radius is not None:
                probs = sparsestmax(logits.detach().double(),
                                    self.radius.double()).tolist()
            else:
                probs = F.softmax(logits.detach().float(), 0).tolist()
            result[key] = dict(zip(TERMS, probs))
        return result

    def fixed(self) -> Dict[str, bool]:
        """Which of the mean and variance ratios are fixed."""
        return dict(mean=bool(self.ratio_fixed[0]),
                    var=bool(self.ratio_fixed[1]))

    def extra_repr(self) -> str:
        def fmt(ratio: Dict[str, float]) -> str:
            return ', '.join(f'{k}={v:.3f}' for k, v in ratio.items())

        ratios = self.ratios()
        return (f'{self.num_features}, eps={self.eps}, '
                f'momentum={self.momentum}, using_bn={self.using_bn}, '
                f'unbiased={self.unbiased}, '
                + (f'kernels={self.kernels!r}, ' if self.kernels else '') +
                (f'ratio_fn={self.ratio_fn!r}, radius='
                 f'{float(self.radius):.3f}, ' if self.radius is not None
                 else '') +
                f'mean_ratios=({fmt(ratios["mean"])}), '
                f'var_ratios=({fmt(ratios["var"])})')
