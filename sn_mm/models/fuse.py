"""Folding SN away for inference: the counterpart of mmcv's
``fuse_conv_bn`` for SN layers with hard (one-hot) fixed ratios."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from ..ops import switchable_norm
from ..ops.ratios import TERMS
from .switchable_norm import SwitchableNorm


def hard_ratio_terms(layer: SwitchableNorm) -> Optional[Tuple[str, str]]:
    """(mean term, variance term), e.g. ('bn', 'in'), if both of the
    layer's ratios are fixed and one-hot (group SN: the same in every
    group); otherwise None. (Groups that select differently keep their
    layer: channels folded into the conv would change the LN statistics
    the other groups take over all channels.)"""
    if not bool(layer.ratio_fixed.all()):
        return None
    terms = []
    for ratios in layer.fixed_ratios:
        rows = ratios.reshape(-1, ratios.shape[-1])
        if not (rows == rows[0]).all():
            return None
        row = rows[0]
        ones = (row == 1).nonzero().flatten()
        if len(ones) != 1 or int((row == 0).sum()) != row.numel() - 1:
            return None
        terms.append(TERMS[int(ones[0])])
    return tuple(terms)


class SNAffine(nn.Module):
    """An SN layer whose ratios are BN for both mean and variance, in eval
    mode: ``x * scale + shift`` per channel."""

    def __init__(self, scale: Tensor, shift: Tensor) -> None:
        super().__init__()
        self.register_buffer('scale', scale)
        self.register_buffer('shift', shift)

    def forward(self, x: Tensor) -> Tensor:
        shape = (1, -1) + (1, ) * (x.dim() - 2)
        return torch.addcmul(self.shift.view(shape), x, self.scale.view(shape))


class SelectedNorm(nn.Module):
    """An SN layer with hard fixed ratios other than BN/BN, in eval mode: it
    normalises with the one statistic selected for the mean and the one for
    the variance (SN's eval with one-hot ratios, on SN's kernels: one pass
    for IN's moments where IN or LN is selected, one to normalise), and
    holds nothing for training."""

    def __init__(self, layer: SwitchableNorm, terms: Tuple[str, str]):
        super().__init__()
        self.mean_term, self.var_term = terms
        self.eps = layer.eps
        self.unbiased = layer.unbiased
        self.kernels = layer.kernels
        self.weight = layer.weight
        self.bias = layer.bias
        # The logits play no part (both ratios are fixed); SN's function
        # takes them for their shape.
        self.register_buffer('logits', torch.zeros_like(layer.mean_weight))
        self.register_buffer('ratio_fixed', torch.ones_like(layer.ratio_fixed))
        self.register_buffer('fixed_ratios', layer.fixed_ratios.clone())
        self.register_buffer('running_mean', layer.running_mean)
        self.register_buffer('running_var', layer.running_var)

    def extra_repr(self) -> str:
        return f'mean={self.mean_term}, var={self.var_term}, eps={self.eps}'

    def forward(self, x: Tensor) -> Tensor:
        return switchable_norm(x, self.weight, self.bias, self.logits,
                               self.logits, self.running_mean,
                               self.running_var, None, False, None, self.eps,
                               self.unbiased, self.kernels, None,
                               type(self).__name__, self.ratio_fixed,
                               self.fixed_ratios)


@torch.no_grad()
def _fold_into_conv(conv: nn.Conv2d, scale: Tensor, shift: Tensor) -> None:
    conv.weight.mul_(scale.view(-1, *([1] * (conv.weight.dim() - 1))))
    bias = conv.bias if conv.bias is not None else torch.zeros_like(shift)
    conv.bias = nn.Parameter(bias * scale + shift)


@torch.no_grad()
def fuse_conv_sn(module: nn.Module) -> nn.Module:
    """Fold SN layers with hard fixed ratios away, for eval (as mmcv's
    ``fuse_conv_bn`` does for BN):

    - a layer whose mean and variance ratios are both exactly BN is the
      per-channel affine of its running statistics: folded into the
      ``nn.Conv2d`` registered just before it in the same parent (the
      layout of mmcv's ConvModule and mmdet/mmseg's ResNets), or, with no
      such conv, replaced by :class:`SNAffine`;
    - any other layer whose ratios are both fixed and one-hot becomes a
      :class:`SelectedNorm`, computing only the statistics it selected;
    - group SN layers are treated so when every group selected the same
      normalisers;
    - layers with learned (or soft fixed) ratios, and layers keeping each
      FPN level's statistics (``num_levels > 1``), stay as they are.

    Returns ``module``, changed in place. Use the result in eval mode only.
    """
    last_conv = None
    for name, child in list(module.named_children()):
        if isinstance(child, SwitchableNorm):
            terms = hard_ratio_terms(child) if child.num_levels == 1 else None
            if terms == ('bn', 'bn'):
                scale = child.weight * torch.rsqrt(child.running_var +
                                                   child.eps)
                shift = child.bias - child.running_mean * scale
                if (last_conv is not None
                        and last_conv.out_channels == child.num_features):
                    _fold_into_conv(last_conv, scale, shift)
                    setattr(module, name, nn.Identity())
                else:
                    setattr(
                        module, name,
                        SNAffine(scale.detach().clone(),
                                 shift.detach().clone()))
            elif terms is not None:
                setattr(module, name, SelectedNorm(child, terms))
            last_conv = None
        elif isinstance(child, nn.Conv2d):
            last_conv = child
        else:
            fuse_conv_sn(child)
            last_conv = None
    return module
