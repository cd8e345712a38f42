"""Switchable Normalization (Luo et al., TPAMI), registered as ``'SN'``."""
import math
from typing import Dict, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.registry import MODELS

from torch import Tensor

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
        momentum (float): PyTorch's convention, ``running = (1 - momentum) *
            running + momentum * batch``. The released code's 0.9 is our 0.1.
        using_bn (bool): Include the BN branch (3 logits and running
            statistics) or not (2 logits, IN and LN). Default: True.
        unbiased (bool): Bessel-corrected IN variance, as the released
            implementation (and its checkpoints) use; LN and BN variances are
            then derived from it. False gives the paper's Eq. 4 estimators.
            Default: True.
    """

    _abbr_ = 'sn'

    def __init__(self,
                 num_features: int,
                 eps: float = 1e-5,
                 momentum: float = 0.1,
                 using_bn: bool = True,
                 unbiased: bool = True) -> None:
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.using_bn = using_bn
        self.unbiased = unbiased
        num_terms = 3 if using_bn else 2
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.mean_weight = nn.Parameter(torch.ones(num_terms))
        self.var_weight = nn.Parameter(torch.ones(num_terms))
        if using_bn:
            self.register_buffer('running_mean', torch.zeros(num_features))
            self.register_buffer('running_var', torch.ones(num_features))
        else:
            self.register_buffer('running_mean', None)
            self.register_buffer('running_var', None)

    # -- input checks -------------------------------------------------------
    def _check_input(self, x: Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(
                f'{type(self).__name__} expects an input of shape (N, C, *) '
                f'with C={self.num_features}, got a {x.dim()}D tensor of '
                f'shape {tuple(x.shape)}')
        if x.shape[1] != self.num_features:
            raise ValueError(
                f'{type(self).__name__} was built for {self.num_features} '
                f'channels, got an input with {x.shape[1]} channels (shape '
                f'{tuple(x.shape)})')

    # -- batch statistics ---------------------------------------------------
    def _reduce_bn_sums(self, sums: Tensor) -> Tensor:
        """Sum ``[sum_n mean_in, sum_n (var_in + mean_in^2), N]`` over the
        devices that share BN statistics. One device here; SyncSN overrides
        this with a differentiable all-reduce."""
        return sums

    def _bn_statistics(self, mean_in: Tensor,
                       sq_in: Tensor) -> Tuple[Tensor, Tensor]:
        """BN mean and variance (C,) for a training step, updating the running
        statistics. Falls back to the running statistics, untouched, when the
        (possibly synchronised) batch holds no sample."""
        num_channels = mean_in.shape[1]
        count = mean_in.new_full((1, ), mean_in.shape[0])
        sums = self._reduce_bn_sums(
            torch.cat([mean_in.sum(0), sq_in.sum(0), count]))
        total = sums[-1]
        running_mean = self.running_mean.to(mean_in.dtype)
        running_var = self.running_var.to(mean_in.dtype)
        has_samples = total > 0
        mean_bn = sums[:num_channels] / total.clamp_min(1)
        var_bn = (sums[num_channels:2 * num_channels] / total.clamp_min(1) -
                  mean_bn.square()).clamp_min(0)
        # torch.where rather than a Python branch: SyncSN learns the global
        # count on the device and must not wait for it on the host.
        mean_bn = torch.where(has_samples, mean_bn, running_mean)
        var_bn = torch.where(has_samples, var_bn, running_var)
        with torch.no_grad():
            m = self.momentum * has_samples.to(mean_in.dtype)
            self.running_mean.mul_(1 - m).add_(
                (m * mean_bn.detach()).to(self.running_mean.dtype))
            self.running_var.mul_(1 - m).add_(
                (m * var_bn.detach()).to(self.running_var.dtype))
        return mean_bn, var_bn

    def _mixing_logits(self, has_in: bool) -> Tuple[Tensor, Tensor]:
        if has_in:
            return self.mean_weight, self.var_weight
        return self.mean_weight[1:], self.var_weight[1:]

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        if torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type, enabled=False):
                return self._forward(x)
        return self._forward(x)

    def _forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        # Statistics in fp32 at least (fp16/bf16 sums lose too much).
        compute_dtype = torch.promote_types(x.dtype, torch.float32)
        spatial = math.prod(shape[2:])
        x3 = x.reshape(shape[0], shape[1], spatial).to(compute_dtype)
        has_in = spatial > 1
        if x3.numel() == 0:
            # Empty (N, C, 0) statistics that still connect to the graph.
            var_in = mean_in = x3.sum(-1)
        else:
            # A single position has zero variance; Bessel's correction would
            # divide by zero there, so it applies only where IN is defined.
            correction = 1 if (self.unbiased and has_in) else 0
            var_in, mean_in = torch.var_mean(x3, dim=-1, correction=correction)

        # Eq. 5: LN and BN from IN's first and second moments.
        sq_in = var_in + mean_in.square()
        mean_ln = mean_in.mean(1, keepdim=True)
        var_ln = (sq_in.mean(1, keepdim=True) - mean_ln.square()).clamp_min(0)

        means = [mean_ln]
        variances = [var_ln]
        if self.using_bn:
            if self.training:
                mean_bn, var_bn = self._bn_statistics(mean_in, sq_in)
            else:
                mean_bn = self.running_mean.to(compute_dtype)
                var_bn = self.running_var.to(compute_dtype)
            means.append(mean_bn.expand_as(mean_in))
            variances.append(var_bn.expand_as(var_in))
        if has_in:
            means.insert(0, mean_in)
            variances.insert(0, var_in)

        mean_logits, var_logits = self._mixing_logits(has_in)
        mean_ratio = F.softmax(mean_logits.to(compute_dtype), 0)
        var_ratio = F.softmax(var_logits.to(compute_dtype), 0)
        mean = sum(r * m for r, m in zip(mean_ratio, means))
        var = sum(r * v for r, v in zip(var_ratio, variances))

        # Fold normalisation and affine into one scale and shift per (n, c),
        # so the full-size work is a single multiply-add.
        scale = self.weight.to(compute_dtype) * torch.rsqrt(var + self.eps)
        shift = self.bias.to(compute_dtype) - mean * scale
        out = torch.addcmul(shift.unsqueeze(-1), x3, scale.unsqueeze(-1))
        return out.reshape(shape).to(x.dtype)

    # -- introspection ------------------------------------------------------
    def ratios(self) -> Dict[str, Dict[str, float]]:
        """Softmax ratios of the learned logits, e.g. ``{'mean': {'in': ..,
        'ln': .., 'bn': ..}, 'var': {...}}``. Inputs without IN (see the class
        docstring) renormalise the remaining terms at run time."""
        result = {}
        for key, logits in (('mean', self.mean_weight),
                            ('var', self.var_weight)):
            probs = F.softmax(logits.detach().float(), 0).tolist()
            result[key] = dict(zip(TERMS, probs))
        return result

    def extra_repr(self) -> str:
        def fmt(ratio: Dict[str, float]) -> str:
            return ', '.join(f'{k}={v:.3f}' for k, v in ratio.items())

        ratios = self.ratios()
        return (f'{self.num_features}, eps={self.eps}, '
                f'momentum={self.momentum}, using_bn={self.using_bn}, '
                f'unbiased={self.unbiased}, '
                f'mean_ratios=({fmt(ratios["mean"])}), '
                f'var_ratios=({fmt(ratios["var"])})')
