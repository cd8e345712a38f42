"""Switchable Whitening (Pan, Zhan, Shi, Tang, Luo, ICCV 2019), registered
as ``'SW'`` and ``'SyncSW'``.

SW mixes whitenings (batch whitening BW, instance whitening IW, over groups
of ``num_pergroup`` channels) and standardisations (BN, IN, LN) with learned
importance weights, then whitens with the inverse square root of the mixed
covariance, which Newton's iteration approximates on the trace-normalised
matrix.

Parameter and buffer names are those of the authors' release
(``sw_mean_weight``, ``sw_var_weight``, ``weight``, ``bias``,
``running_mean`` (G, c, 1), ``running_cov`` (G, c, c)), so that their
checkpoints load as they are. Where the release is inconsistent, SW here
decides as follows (each tested in ``tests/test_switchable_whitening.py``):

- ``sw_type=5``: the release mixes the BN and IN variances with the BW and
  IW weights (``var_weight[0]`` and ``[1]``), so that the BN and IN
  variance weights (``[2]``, ``[3]``) take no gradient; here each of the five
  components has its own weight in the covariance as in the mean (the
  paper's Eq. 7).
- SyncSW's batch mean and covariance are over all ranks' samples, each
  rank weighted by its count (the release averages the ranks' statistics,
  so that ranks with different batch sizes count alike, and an empty rank
  would contribute NaNs).
"""
import math
import operator
from typing import Dict, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from mmengine.registry import MODELS
from torch import Tensor

from ..ops._compat import (DYNAMO_TRACES_FUNCTION_CTX, in_onnx_export,
                           is_compiling, jit_is_tracing)
from ..ops.reference import held_group, hold_group
from .norm_eval import keep_norm_eval_everywhere
from .sync_switchable_norm import check_group, sharing_group

# The components of each sw_type, in the order of the release's importance
# weights.
SW_COMPONENTS = {
    2: ('bw', 'iw'),
    3: ('bw', 'iw', 'ln'),
    5: ('bw', 'iw', 'bn', 'in', 'ln'),
}
# Undefined on inputs with one value per channel and sample ((N, C), or a
# single spatial position): their instance statistics are the value itself.
INSTANCE_COMPONENTS = ('iw', 'in')


def _positive_int(value, name: str, minimum: int = 1) -> int:
    try:
        number = operator.index(value)
    except TypeError:
        number = minimum - 1
    if isinstance(value, bool) or number < minimum:
        raise ValueError(f'{name} must be an integer >= {minimum}, got '
                         f'{value!r}')
    return number


class _AllReduceSum(torch.autograd.Function):
    """Sum over a group's ranks; its gradient is the ranks' gradients summed
    the same way (so it differentiates again)."""

    @staticmethod
    def forward(ctx, tensor: Tensor, group) -> Tensor:
        ctx.group = hold_group(group)
        total = tensor.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _AllReduceSum.apply(grad.contiguous(),
                                   held_group(ctx.group, 'SyncSW')), None


def _all_reduce(tensor: Tensor, group) -> Tensor:
    """Sum over the ranks of ``group``, differentiable; the tensor itself
    without a group."""
    return tensor if group is None else _AllReduceSum.apply(tensor, group)


def batch_moments(mean_in: Tensor, cov_in: Tensor, length: int, group=None):
    """The batch mean (G, c) and biased covariance (G, c, c) over every
    sample of ``group``'s ranks (of this process without one), from the
    instance means (N, G, c) and covariances (N, G, c, c) of ``length``
    positions each, as the release's ``cov_bn`` (Eq. 5's reuse, whitened:
    the mean of the instance covariances plus the covariance of the instance
    means, exact and without the cancellation of raw moments)."""
    groups, c = mean_in.shape[1:]
    count = mean_in.new_full((1, ), float(mean_in.shape[0] * length))
    sums = _all_reduce(
        torch.cat([mean_in.sum(0).flatten() * length, count]), group)
    total = sums[-1:].clamp(min=1)
    mean_bn = (sums[:-1] / total).view(groups, c)
    dev = mean_in - mean_bn
    m2 = (cov_in.sum(0) + torch.einsum('ngi,ngj->gij', dev, dev)) * length
    cov_bn = _all_reduce(m2, group) / total
    return mean_bn, cov_bn, sums[-1]


def plain_ops() -> bool:
    """Whether SW runs on plain PyTorch ops instead of its autograd
    Functions (which compute the same): under the tracers that cannot
    record those, Dynamo before torch 2.5, ``torch.jit.trace`` and the
    TorchScript ONNX exporter (which would record a Python op)."""
    if is_compiling():  # (Dynamo cannot trace the other two queries)
        return not DYNAMO_TRACES_FUNCTION_CTX
    return jit_is_tracing() or in_onnx_export()


def newton_whitening(cov_n: Tensor, iterations: int) -> Tensor:
    """The release's Newton iteration for cov^(-1/2) on the trace-normalised
    covariances ``cov_n`` (B, c, c): P <- 1.5 P - 0.5 P^3 cov_n from P = I
    (the first step, from I, is 1.5 I - 0.5 cov_n without a product). The
    caller scales the result by trace(cov)^(-1/2)."""
    eye = torch.eye(cov_n.shape[-1], dtype=cov_n.dtype, device=cov_n.device)
    if iterations == 0:
        return eye.expand_as(cov_n)
    p = torch.add(1.5 * eye, cov_n, alpha=-0.5)
    for _ in range(iterations - 1):
        p_cubed = torch.bmm(torch.bmm(p, p), p)
        p = torch.baddbmm(p, p_cubed, cov_n, beta=1.5, alpha=-0.5)
    return p


class _CentredMoments(torch.autograd.Function):
    """Rows (B, c, L) -> centred rows, their means (B, c), covariances
    (B, c, c) over L, and the centred rows with a row of ones under them
    (B, c + 1, L; the centred rows are a view of it), so that a product with
    it adds a per-row constant in the same pass.

    Autograd through the plain ops would take two full-size products for
    the covariance, a full-size negation for the mean and a sum of three
    full-size gradients; this backward is one product (with K = c + 1) into
    the incoming gradient. Written in differentiable ops on the saved
    centred rows (an output) where a graph is being built, so that it
    differentiates again."""

    @staticmethod
    def forward(ctx, rows: Tensor):
        batch, c, length = rows.shape
        with_ones = rows.new_empty(batch, c + 1, length)
        with_ones[:, c].fill_(1)
        centred = with_ones[:, :c]
        mean = rows.mean(-1)
        if is_compiling():  # no strided out= under Dynamo
            centred.copy_(rows - mean[..., None])
        else:
            torch.sub(rows, mean[..., None], out=centred)
        cov = torch.bmm(centred, centred.transpose(1, 2)) / length
        ctx.mark_non_differentiable(with_ones)
        # No zero-filled gradient for with_ones (nor for unused outputs).
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(with_ones, centred)
        return centred, mean, cov, with_ones

    @staticmethod
    def backward(ctx, g_centred, g_mean, g_cov, _):
        with_ones, centred = ctx.saved_tensors
        batch, c, length = centred.shape
        # The centring's gradient removes each row's mean gradient; the
        # mean's adds its own gradient / L to every position.
        shift = centred.new_zeros(batch, c) if g_mean is None \
            else g_mean / length
        if g_centred is None:
            g_centred = torch.zeros_like(centred)
        else:
            shift = shift - g_centred.mean(-1)
        g_cov = centred.new_zeros(batch, c, c) if g_cov is None \
            else (g_cov + g_cov.transpose(1, 2)) / length
        if torch.is_grad_enabled():  # double backward: out of place
            return torch.baddbmm(g_centred, g_cov, centred) + shift[..., None]
        # g_centred is _Transform's fresh product (nothing else takes the
        # centred rows), so it is accumulated into in place.
        return g_centred.baddbmm_(
            torch.cat([g_cov, shift[..., None]], -1), with_ones)


class _Transform(torch.autograd.Function):
    """transform @ centred + shift, batched: (B, c, c), (B, c, 1),
    (B, c, L) -> (B, c, L), as one product of [transform | shift] with the
    centred rows over a row of ones (``with_ones``, from
    :class:`_CentredMoments`), without a pass for the shift."""

    @staticmethod
    def forward(ctx, transform: Tensor, shift: Tensor, centred: Tensor,
                with_ones: Tensor):
        ctx.save_for_backward(transform, centred)
        return torch.bmm(torch.cat([transform, shift], -1), with_ones)

    @staticmethod
    def backward(ctx, grad: Tensor):
        transform, centred = ctx.saved_tensors
        need_transform, need_shift, need_centred, _ = ctx.needs_input_grad
        return (torch.bmm(grad, centred.transpose(1, 2)) if need_transform else
                None, grad.sum(-1, keepdim=True) if need_shift else None,
                torch.bmm(transform.transpose(1, 2), grad)
                if need_centred else None, None)


@MODELS.register_module('SW')
class SwitchableWhitening(nn.Module):
    """Switchable Whitening over inputs of shape (N, C, *).

    The channels fall into ``C / num_pergroup`` groups of ``num_pergroup``
    consecutive channels; each group is whitened with the inverse square
    root of the mixture of its covariances: batch (BW, over N and the
    positions), instance (IW, per sample) and, by ``sw_type``, LN's variance
    (times the identity) and BN's and IN's (the diagonals). The mean is
    mixed likewise. Then a per-channel affine transform.

    On inputs with one value per channel and sample ((N, C), or one spatial
    position) the instance components are undefined (the authors advise SW
    without IW there): they are left out of both softmaxes.

    Args:
        num_features (int): Number of channels C.
        num_pergroup (int): Channels per whitening group; divides C.
            Default: 16.
        sw_type (int): 2: BW + IW; 3: BW + IW + LN; 5: BW + IW + BN + IN +
            LN. Default: 2.
        T (int): Newton iterations. Default: 5.
        tie_weight (bool): One importance-weight vector for the mean and
            the covariance (no ``sw_var_weight``). Default: False.
        eps (float): Added to the mixed covariance's diagonal. Default: 1e-5.
        momentum (float): PyTorch's convention, as SN's and BN's: the
            batch's weight, ``running = (1 - momentum) * running + momentum
            * batch``. The release writes the running value's weight (its
            0.9 is this 0.1). Default: 0.1.
        affine (bool): Per-channel ``weight`` and ``bias``. Default: True.

    The whitening runs in float32 under autocast (and in float32 for half
    inputs): Newton's iteration in half precision does not converge. A
    training batch whose batch statistics are not all finite leaves the
    running statistics as they were and is counted in
    ``nonfinite_batches``. ``norm_eval=True`` in an OpenMMLab backbone keeps
    SW layers in eval mode, as it keeps BN layers.
    """

    _abbr_ = 'sw'

    def __init__(self,
                 num_features: int,
                 num_pergroup: int = 16,
                 sw_type: int = 2,
                 T: int = 5,
                 tie_weight: bool = False,
                 eps: float = 1e-5,
                 momentum: float = 0.1,
                 affine: bool = True) -> None:
        super().__init__()
        if sw_type not in SW_COMPONENTS:
            raise ValueError(f'unknown sw_type {sw_type!r}: expected 2 (BW + '
                             f'IW), 3 (BW + IW + LN) or 5 (BW + IW + BN + IN '
                             f'+ LN)')
        num_features = _positive_int(num_features, 'num_features')
        num_pergroup = _positive_int(num_pergroup, 'num_pergroup')
        if num_features % num_pergroup:
            raise ValueError(f'num_pergroup={num_pergroup} must divide '
                             f'num_features={num_features} (the channels '
                             f'are whitened in groups of num_pergroup)')
        if not eps > 0:
            raise ValueError(f'eps must be > 0, got {eps!r}')
        if not 0 <= momentum <= 1:
            raise ValueError(f'momentum must be in [0, 1] (the weight of the '
                             f'batch, as in PyTorch\'s norms), got '
                             f'{momentum!r}')
        keep_norm_eval_everywhere(SwitchableWhitening)
        self.num_features = num_features
        self.num_pergroup = num_pergroup
        self.num_groups = num_features // num_pergroup
        self.sw_type = sw_type
        self.T = _positive_int(T, 'T', minimum=0)
        self.tie_weight = bool(tie_weight)
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        k = len(SW_COMPONENTS[sw_type])
        self.sw_mean_weight = nn.Parameter(torch.ones(k))
        if self.tie_weight:
            self.register_parameter('sw_var_weight', None)
        else:
            self.sw_var_weight = nn.Parameter(torch.ones(k))
        if affine:
            self.weight = nn.Parameter(torch.ones(num_features))
            self.bias = nn.Parameter(torch.zeros(num_features))
        else:
            self.register_parameter('weight', None)
            self.register_parameter('bias', None)
        # Zeros, as the release's reset_parameters leaves them.
        self.register_buffer('running_mean',
                             torch.zeros(self.num_groups, num_pergroup, 1))
        self.register_buffer(
            'running_cov',
            torch.zeros(self.num_groups, num_pergroup, num_pergroup))
        self.register_buffer('nonfinite_batches',
                             torch.tensor(0, dtype=torch.long))

    @property
    def components(self):
        """The names of the mixed components, in the weights' order."""
        return SW_COMPONENTS[self.sw_type]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # The release's checkpoints do not count non-finite batches.
        state_dict.setdefault(prefix + 'nonfinite_batches',
                              torch.tensor(0, dtype=torch.long))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _sync_group(self):
        """The process group sharing the batch statistics; None here."""
        return None

    def importance_weights(self, instance: bool = True):
        """The mean's and the covariance's importance weights (softmaxes of
        the logits), with the instance components at 0 where ``instance`` is
        False."""
        logits = [
            self.sw_mean_weight,
            self.sw_mean_weight if self.tie_weight else self.sw_var_weight
        ]
        weights = []
        for logit in logits:
            logit = logit.float() if logit.dtype in (torch.float16,
                                                     torch.bfloat16) else logit
            if not instance:
                keep = torch.tensor(
                    [c not in INSTANCE_COMPONENTS for c in self.components],
                    device=logit.device)
                logit = logit.masked_fill(~keep, float('-inf'))
            weights.append(torch.softmax(logit, 0))
        return weights[0], weights[1]

    def ratios(self) -> Dict[str, Dict[str, float]]:
        """The importance weights, e.g. ``{'mean': {'bw': .., 'iw': ..},
        'var': {...}}`` (``var``: the covariance's)."""
        with torch.no_grad():
            wm, wv = self.importance_weights()
        return {
            stat: dict(zip(self.components, map(float, w)))
            for stat, w in (('mean', wm), ('var', wv))
        }

    def _check_input(self, x: Tensor) -> None:
        if x.dim() < 2 or x.shape[1] != self.num_features:
            raise ValueError(
                f'{type(self).__name__} expected an input of shape (N, '
                f'{self.num_features}, *), got {tuple(x.shape)}')
        if not x.is_floating_point():
            raise TypeError(f'{type(self).__name__} expected a floating-'
                            f'point input, got {x.dtype}')

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        compute = torch.float32 if x.dtype in (torch.float16,
                                               torch.bfloat16) else x.dtype
        with torch.autocast(x.device.type, enabled=False):
            y = self._whiten(
                x.to(compute),
                self._sync_group() if self.training else None)
        return y.to(x.dtype)

    def _whiten(self, x: Tensor, group) -> Tensor:
        """The whitened, affine-transformed input, as one batched product
        per group and sample: y = A (x - mean_in) + shift with
        A = diag(weight) cov^(-1/2) and shift = A (mean_in - mean) + bias,
        in PyTorch ops that keep the centred rows for backward."""
        n, g, c = x.shape[0], self.num_groups, self.num_pergroup
        rows = x.reshape(n * g, c, math.prod(x.shape[2:]))
        if plain_ops():
            mean_in = rows.mean(-1)
            centred = rows - mean_in[..., None]
            cov_in = torch.bmm(centred, centred.transpose(1, 2)) / \
                rows.shape[-1]
            transform, shift = self._transform(
                mean_in, cov_in, n=n, length=rows.shape[-1], group=group)
            return torch.baddbmm(shift, transform, centred).reshape(x.shape)
        centred, mean_in, cov_in, with_ones = _CentredMoments.apply(rows)
        transform, shift = self._transform(
            mean_in, cov_in, n=n, length=rows.shape[-1], group=group)
        y = _Transform.apply(transform, shift, centred, with_ones)
        return y.reshape(x.shape)

    def _transform(self, mean_in, cov_in, *, n, length, group):
        """The transform (N x G, c, c) and shift (N x G, c, 1) from the
        instance means (N x G, c) and covariances (N x G, c, c) and the
        parameters; in training the running statistics are updated."""
        g, c = self.num_groups, self.num_pergroup
        dtype = mean_in.dtype
        mean_in = mean_in.view(n, g, c)
        cov_in = cov_in.view(n, g, c, c)
        if self.training:
            mean_bn, cov_bn, count = batch_moments(mean_in, cov_in, length,
                                                   group)
            self._update_running(mean_bn, cov_bn, count)
        else:
            mean_bn = self.running_mean[..., 0].to(dtype)
            cov_bn = self.running_cov.to(dtype)
        instance = length > 1
        wm, wv = self.importance_weights(instance)
        weights = {
            name: (wm[k].to(dtype), wv[k].to(dtype))
            for k, name in enumerate(self.components)
            if instance or name not in INSTANCE_COMPONENTS
        }

        def mixed(which, terms):
            """The sum of weight x statistic over the present components
            (0 when none is); ``which``: 0 the mean's weights, 1 the
            covariance's."""
            total = 0
            for names, stat in terms:
                for name in names:
                    if name in weights:
                        total = total + weights[name][which] * stat
            return total

        # Diagonals and diagonal matrices as products with the identity:
        # ONNX has no diagonal before opset 13 and no diag_embed.
        eye = torch.eye(c, dtype=dtype, device=mean_in.device)

        def var(cov):
            return (cov * eye).sum(-1)

        mean_terms = [(('bw', 'bn'), mean_bn), (('iw', 'in'), mean_in)]
        diag_terms = [(('bn', ), var(cov_bn)), (('in', ), var(cov_in))]
        if 'ln' in self.components:
            mean_ln, var_ln = self._ln_statistics(mean_in, var(cov_in), length)
            mean_terms.append((('ln', ), mean_ln))
            diag_terms.append((('ln', ), var_ln))
        mean = mixed(0, mean_terms)
        # The covariance: BW's and IW's matrices plus a diagonal (BN's, IN's
        # and LN's variances and eps), scaled by 1 / trace for Newton's
        # iteration, the trace taken from the parts.
        diag = torch.as_tensor(
            self.eps + mixed(1, diag_terms),
            dtype=dtype,
            device=mean_in.device)
        diag = diag.expand(diag.shape[:-2] + (g, c))
        r_trace = 1 / (mixed(1, [(('bw', ), var(cov_bn).sum(-1)),
                                 (('iw', ), var(cov_in).sum(-1))]) +
                       diag.sum(-1))[..., None, None]
        cov_n = (diag * r_trace[..., 0]).unsqueeze(-1) * eye + \
            weights['bw'][1] * r_trace * cov_bn
        if 'iw' in weights:
            cov_n = torch.addcmul(cov_n, weights['iw'][1] * r_trace, cov_in)
        lead = cov_n.shape[:-3]  # (N, ) or (1, ) or () without instances
        transform = newton_whitening(
            cov_n.expand(lead + (g, c, c)).reshape(-1, c, c),
            self.T).view(lead + (g, c, c))
        scale = r_trace.sqrt()
        if self.affine:
            scale = self.weight.to(dtype).view(g, c, 1) * scale
        transform = scale * transform
        shift = torch.matmul(transform, (mean_in - mean)[..., None])
        if self.affine:
            shift = shift + self.bias.to(dtype).view(g, c, 1)
        transform = transform.expand(n, g, c, c).reshape(n * g, c, c)
        return transform, shift.reshape(n * g, c, 1)

    def _ln_statistics(self, mean_in, var_in, length):
        """LN's mean and variance, both (N, 1, 1), the variance
        Bessel-corrected over a sample's C x L values as the release's
        ``x.var``, from the instance means and variances (N, G, c)."""
        n = mean_in.shape[0]
        flat_mean = mean_in.reshape(n, self.num_features)
        mean_ln = flat_mean.mean(1)
        var_in = var_in.reshape(n, self.num_features)
        values = flat_mean.shape[1] * length
        m2 = (var_in.sum(1) + ((flat_mean - mean_ln[:, None])**2).sum(1)) * \
            length
        var_ln = m2 / max(values - 1, 1)
        return mean_ln.view(n, 1, 1), var_ln.view(n, 1, 1)

    @torch.no_grad()
    def _update_running(self, mean_bn: Tensor, cov_bn: Tensor,
                        count: Tensor) -> None:
        """Moving averages, ``momentum`` the batch's weight, unless the
        batch is empty or its statistics are not all finite (those are
        counted instead)."""
        finite = torch.isfinite(mean_bn).all() & torch.isfinite(cov_bn).all()
        bad = ~finite & (count > 0)
        take = finite & (count > 0)
        m = self.momentum
        new_mean = (1 - m) * self.running_mean + m * mean_bn[..., None].to(
            self.running_mean.dtype)
        new_cov = (1 - m) * self.running_cov + m * cov_bn.to(
            self.running_cov.dtype)
        self.running_mean.copy_(torch.where(take, new_mean, self.running_mean))
        self.running_cov.copy_(torch.where(take, new_cov, self.running_cov))
        self.nonfinite_batches.add_(bad.long())

    def extra_repr(self) -> str:
        return (f'{self.num_features}, num_pergroup={self.num_pergroup}, '
                f'sw_type={self.sw_type}, T={self.T}, '
                f'tie_weight={self.tie_weight}, eps={self.eps}, '
                f'momentum={self.momentum}, affine={self.affine}')


@MODELS.register_module('SyncSW')
class SyncSwitchableWhitening(SwitchableWhitening):
    """Switchable Whitening whose batch statistics (BW's mean and
    covariance, and BN's from them) are over every rank's samples.

    Each rank's count, sum and centred second moments are summed over the
    ranks (two differentiable all-reduces in forward, their transposes in
    backward), so ranks may hold different numbers of samples, zero
    included, and outputs and gradients equal those of
    :class:`SwitchableWhitening` on the concatenated batch. Without an
    initialised process group, or in eval, it computes what
    :class:`SwitchableWhitening` does.

    Args:
        group: Ranks that share statistics, as :class:`SyncSwitchableNorm`'s
            (None or ``'world'``, ``'node'``, an int k, a ProcessGroup).
        Others: as :class:`SwitchableWhitening`.
    """

    def __init__(self,
                 num_features: int,
                 num_pergroup: int = 16,
                 sw_type: int = 2,
                 T: int = 5,
                 tie_weight: bool = False,
                 eps: float = 1e-5,
                 momentum: float = 0.1,
                 affine: bool = True,
                 group: Optional[object] = None) -> None:
        super().__init__(num_features, num_pergroup, sw_type, T, tie_weight,
                         eps, momentum, affine)
        self.group = check_group(group)

    def _sync_group(self):
        return sharing_group(self.group)
