"""SN in plain, differentiable PyTorch ops: the reference implementation.

It runs on any device and dtype. It is what ``kernels='torch'`` runs, what
``torch.compile``, ``torch.export``, ``torch.jit.trace`` and ONNX export
trace, what an exact double backward differentiates (the C++ and Triton
operators recompute their forward through it when a graph of the gradient
is wanted), and what SyncSN runs across processes where no kernel takes
the input (its all-gather is the kernels' too). The C++ and
Triton kernels are tested against it.

Statistics (Eq. 5 of the paper): IN's per-row moments, then LN's and BN's
from them. Every quantity that could be the small difference of two large
numbers when an input is far from zero (|mean| >> std) is computed centred:
variances of means about their own mean (Chan et al.'s parallel formula),
the output as ``(x - mu) * scale``.
"""
import contextlib
import math
import os
import weakref
from typing import Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from .ratios import mixing_ratio


def hold_group(group):
    """A weak reference to the process group ``group`` (None stays None),
    for an autograd graph to keep until its backward.

    A graph can outlive ``destroy_process_group``: user code may keep a
    loss, and after a backward that raised, autograd's queue in that thread
    keeps the graph until the thread's next backward. Held strongly, the
    group (and gloo's worker threads) would then live on into interpreter
    exit, where a worker that releases a finished collective's tensors
    takes the GIL during finalisation and aborts the process ('terminate
    called without an active exception')."""
    return None if group is None else weakref.ref(group)


def held_group(ref, who: str = 'SyncSN'):
    """The process group :func:`hold_group` refers to; a RuntimeError if it
    has been destroyed since the forward."""
    if ref is None:
        return None
    group = ref()
    if group is None:
        raise RuntimeError(f'{who}: the process group of this forward was '
                           'destroyed before its backward')
    return group


# The SyncSN call whose statistics the next all-gather carries: (layer key,
# call number, layer name), set by SyncSwitchableNorm's forward.
_sync_call: Optional[Tuple[int, int, str]] = None
# {layer key: name}, the same on every rank (the same model), for messages.
sync_layer_names = {}
# Tags are float32-exact integers.
_TAG_RANGE = 1 << 24


@contextlib.contextmanager
def sync_call(key: int, count: int, name: str):
    """Tag the all-gathers inside the block with the SyncSN layer ``key``
    and its call number ``count``."""
    global _sync_call
    outer, _sync_call = _sync_call, (key, count % _TAG_RANGE, name)
    try:
        yield
    finally:
        _sync_call = outer


def _check_calls(device) -> bool:
    """Whether to compare the ranks' call tags: on the host always; on a
    GPU, where reading them waits for the all-gather (a synchronisation per
    layer), under PyTorch's own collective checks
    (TORCH_DISTRIBUTED_DEBUG=DETAIL)."""
    return device.type == 'cpu' or os.environ.get('TORCH_DISTRIBUTED_DEBUG',
                                                  '').upper() == 'DETAIL'


def _unequal_calls(tags: Tensor, name: str) -> RuntimeError:
    per_rank = []
    for rank, (key, count) in enumerate(tags.long().tolist()):
        layer = sync_layer_names.get(key, f'an unnamed SyncSN layer ({key})')
        per_rank.append(f'rank {rank}: {layer!r} call {count}')
    return RuntimeError(
        f'SyncSN {name!r}: the ranks called SyncSN layers unequally, and '
        f'this all-gather paired different calls ({"; ".join(per_rank)}); '
        'their statistics were not combined. In training every rank must '
        'call each SyncSN layer as often as the others (a branch that one '
        'rank skips must run on every rank, or use SN there)')


class _SyncStatistics(torch.autograd.Function):
    """SyncSN's collectives: in forward one all-gather of every rank's
    (count, channel means, centred second moments, and, where
    :func:`_check_calls` says, the layer and call they belong to, which must
    agree), combined by Chan et al.'s parallel
    formula; in backward one all-reduce of the gradients of
    the shared BN mean and variance (2C values, as the Triton kernels'), from
    which each rank takes its own statistics' part."""

    @staticmethod
    def forward(ctx, mean_c: Tensor, m2_c: Tensor, n: int, group):
        call = _sync_call
        # Tags only where they are compared: on a GPU they would cost a
        # host-to-device copy per call for nothing.
        tagged = call is not None and _check_calls(mean_c.device)
        local = torch.cat([mean_c.new_full((1, ), n), mean_c, m2_c])
        if tagged:  # (float32 or wider holds them exactly)
            wide = local.to(torch.promote_types(local.dtype, torch.float32))
            local = torch.cat([wide, wide.new_tensor(call[:2])])
        gathered = [
            torch.empty_like(local) for _ in range(dist.get_world_size(group))
        ]
        dist.all_gather(gathered, local, group=group)
        stats = torch.stack(gathered)
        if tagged:
            tags = stats[:, -2:]
            if not bool((tags == tags[:1]).all()):
                raise _unequal_calls(tags, call[2])
            stats = stats[:, :-2].to(mean_c.dtype)
        c = mean_c.numel()
        counts, means, m2s = stats[:, :1], stats[:, 1:c + 1], stats[:, c + 1:]
        total = counts.sum()
        # About the first rank's means, as in_moments shifts: the ranks'
        # differences keep their precision.
        base = means[0]
        dev = (counts * (means - base)).sum(0) / total.clamp_min(1)
        mean = base + dev
        m2 = m2s.sum(0) + (counts * (means - base - dev).square()).sum(0)
        ctx.group, ctx.n = hold_group(group), n
        ctx.save_for_backward(mean_c, mean, total)
        ctx.mark_non_differentiable(total)
        return total, mean, m2 / total.clamp_min(1)

    @staticmethod
    def backward(ctx, _, grad_mean, grad_var):
        if torch.is_grad_enabled():
            raise RuntimeError(
                'SyncSN: double backward (create_graph=True) across several '
                'processes is not supported; on one process (or with SN) it '
                'is exact')
        mean_c, mean, total = ctx.saved_tensors
        zeros = torch.zeros_like(mean)
        shared = torch.cat([
            zeros if grad_mean is None else grad_mean,
            zeros if grad_var is None else grad_var
        ])
        dist.all_reduce(shared, group=held_group(ctx.group))
        grad_mean, grad_var = shared.chunk(2)
        # mean = sum_r n_r mean_r / N; var = (sum_r m2_r + sum_r n_r
        # (mean_r - mean)^2) / N, whose weighted deviations sum to zero.
        scale = ctx.n / total.clamp_min(1)
        return (scale * (grad_mean + 2 * (mean_c - mean) * grad_var),
                grad_var / total.clamp_min(1), None, None)


def combine_statistics(n: int, mean_c: Tensor, m2_c: Tensor, group):
    """The batch's (over ``group``'s ranks) sample count and BN mean and
    variance from each rank's count ``n``, channel means and centred second
    moments."""
    if group is None:
        count = mean_c.new_full((), n)
        return count, mean_c, m2_c / count.clamp_min(1)
    return _SyncStatistics.apply(mean_c, m2_c, n, group)


def in_moments(x3: Tensor, correction: int):
    """Per-row (mean, variance) of ``x3`` (N, C, L), the means taken about
    a per-channel shift, each channel's first value (of sample 0), which is
    returned too: so the means keep the precision of their differences
    between samples and between channels, which BN's and LN's variances
    sum (held as absolute float32 values, means of 1e4 would round those
    differences to 1e-3)."""
    if not x3.numel():
        # Zeros that stay in the graph: an empty batch's statistics still
        # carry (zero) gradients, and SyncSN's backward collective needs
        # every rank's to.
        zeros = x3.sum(-1)
        return zeros, zeros, zeros.sum(0)
    # A constant: the moments' value and gradient do not depend on it.
    shift = x3[0, :, 0].detach()
    var, mean = torch.var_mean(
        x3 - shift.unsqueeze(-1), dim=-1, correction=correction)
    return mean, var, shift


def ln_moments(dmean_in: Tensor, var_in: Tensor, shift: Tensor):
    """LN's (N, 1) mean and variance from IN's (means about ``shift``, as
    :func:`in_moments` gives them), ``var_ln = mean_c(var_in) +
    mean_c((mean_in - mean_ln)**2)``: the released ``mean(var_in +
    mean_in**2) - mean**2`` without its cancellation. The channels' means
    are compared about the first channel's shift: the shifts' differences
    are exact, and the means' differences keep their precision."""
    if not dmean_in.shape[0]:
        empty = dmean_in.new_zeros(0, 1)
        return empty, empty
    var_mean_ln, mean_ln = torch.var_mean(
        dmean_in + (shift - shift[0]), 1, correction=0, keepdim=True)
    return shift[0] + mean_ln, var_in.mean(1, keepdim=True) + var_mean_ln


def bn_moments(mean_in: Tensor, var_in: Tensor, shift: Tensor, group):
    """BN's sample count, (C,) mean and variance over the batch (and the
    ranks of ``group``), from IN's moments, the means taken about
    ``shift`` (see :func:`in_moments`)."""
    n, c = mean_in.shape
    if n:
        var_mean_c, mean_c = torch.var_mean(mean_in, 0, correction=0)
        m2_c = var_in.sum(0) + var_mean_c * n
    else:  # zeros in the graph (see in_moments)
        mean_c, m2_c = mean_in.sum(0), var_in.sum(0)
    return combine_statistics(n, mean_c + shift, m2_c, group)


def reference_forward(x3: Tensor,
                      weight: Tensor,
                      bias: Tensor,
                      mean_logits: Tensor,
                      var_logits: Tensor,
                      running_mean: Optional[Tensor],
                      running_var: Optional[Tensor],
                      training: bool,
                      eps: float,
                      unbiased: bool,
                      ratio_fixed: Optional[Tensor] = None,
                      fixed_ratios: Optional[Tensor] = None,
                      ratios_given: bool = False,
                      group=None):
    """SN of ``x3`` (N, C, L) in the dtype of its arguments. Returns the
    output and, with a BN branch in training, the BN mean, variance and
    whether the batch (over ``group``) had a sample, for the running
    statistics' update (else three Nones). ``running_mean`` None: no BN
    branch; in training they stand in for a batch without samples.
    ``ratio_fixed``/``fixed_ratios``: fixed ratios; ``ratios_given``: the
    logits are the ratio vectors (see :func:`mixing_ratio`). Logits (G, K):
    group SN, channel c mixing with row ``c // (C / G)``'s ratios."""
    n, c, length = x3.shape
    has_in = length > 1
    bn_batch = running_mean is not None and training
    # One position has no variance: Bessel's correction would divide by 0.
    dmean_in, var_in, shift = in_moments(x3, 1 if unbiased and has_in else 0)
    mean_in = dmean_in + shift
    mean_ln, var_ln = ln_moments(dmean_in, var_in, shift)
    mean_bn = var_bn = has = None
    if bn_batch:
        total, mean_bn, var_bn = bn_moments(dmean_in, var_in, shift, group)
        has = total > 0
        mean_bn = torch.where(has, mean_bn, running_mean)
        var_bn = torch.where(has, var_bn, running_var)
    fixed = (None, None) if ratio_fixed is None else ratio_fixed
    values = (None, None) if fixed_ratios is None else fixed_ratios
    wm = mixing_ratio(mean_logits, fixed[0], values[0], has_in, ratios_given)
    wv = mixing_ratio(var_logits, fixed[1], values[1], has_in, ratios_given)
    if wm.dim() == 2:  # group SN: each channel takes its group's ratios
        wm = wm.repeat_interleave(c // wm.shape[0], 0)
        wv = wv.repeat_interleave(c // wv.shape[0], 0)
    # The mixed mean as one statistic plus weighted differences from it
    # (the ratios sum to 1): the ratio gradients are then sums of small
    # differences, not of |mean|-sized terms that cancel in float32.
    means, variances = [mean_ln], [var_ln]
    if has_in:
        means.insert(0, mean_in)
        variances.insert(0, var_in)
    if running_mean is not None:
        bn = (mean_bn, var_bn) if training else (running_mean, running_var)
        means.append(bn[0])
        variances.append(bn[1])
    # (One term: its ratio, 1, multiplies it, so that the logits are still
    # inputs of the output and take a zero gradient.)
    mu = means[0] if len(means) > 1 else wm[..., 0] * means[0]
    var = wv[..., 0] * variances[0]
    for j in range(1, len(means)):
        mu = mu + wm[..., j] * (means[j] - means[0])
        var = var + wv[..., j] * variances[j]
    scale = weight * (var + eps).rsqrt()
    y = torch.addcmul(
        bias.unsqueeze(-1), x3 - mu.unsqueeze(-1), scale.unsqueeze(-1))
    return y, mean_bn, var_bn, has


@torch.no_grad()
def update_running_stats(running_mean: Tensor,
                         running_var: Tensor,
                         num_batches_tracked: Tensor,
                         momentum: Optional[float],
                         mean_bn: Tensor,
                         var_bn: Tensor,
                         has_samples: Tensor,
                         nonfinite_batches: Optional[Tensor] = None) -> None:
    """Moving (or, with ``momentum=None``, cumulative) average of the BN
    statistics; untouched when the (possibly synchronised) batch held no
    sample, or when any of its statistics is not finite (an overflow, a NaN
    in the input), which ``nonfinite_batches`` counts. The checks gate the
    update on the device, not by a Python branch: SyncSN learns the count
    there and must not wait for it."""
    finite = torch.isfinite(mean_bn).all() & torch.isfinite(var_bn).all()
    if nonfinite_batches is not None:
        nonfinite_batches.add_((has_samples & ~finite).long())
    update = has_samples & finite
    num_batches_tracked.add_(update.long())
    if momentum is None:
        m = update / num_batches_tracked.clamp_min(1).to(mean_bn.dtype)
    else:
        m = momentum * update.to(mean_bn.dtype)
    for running, batch in ((running_mean, mean_bn), (running_var, var_bn)):
        new = running * (1 - m) + (m * batch).to(running.dtype)
        running.copy_(torch.where(update, new, running))


def _as(t: Optional[Tensor], dtype) -> Optional[Tensor]:
    # No cast where none is needed: tracers would record one.
    return t if t is None or t.dtype == dtype else t.to(dtype)


def switchable_norm_reference(
        x: Tensor,
        weight: Tensor,
        bias: Tensor,
        mean_logits: Tensor,
        var_logits: Tensor,
        running_mean: Optional[Tensor],
        running_var: Optional[Tensor],
        num_batches_tracked: Optional[Tensor],
        training: bool,
        momentum: Optional[float],
        eps: float,
        unbiased: bool,
        ratio_fixed: Optional[Tensor] = None,
        fixed_ratios: Optional[Tensor] = None,
        ratios_given: bool = False,
        group=None,
        nonfinite_batches: Optional[Tensor] = None) -> Tensor:
    """SN of ``x`` (N, C, *) on the reference, the running statistics
    updated in training; arguments as :func:`sn_mm.ops.switchable_norm`'s.
    Statistics in float32 at least (fp16/bf16 sums lose too much); the
    output in ``x``'s dtype."""
    shape = x.shape
    # (torch.promote_types(x.dtype, torch.float32), which Dynamo 2.1 cannot
    # trace)
    dtype = torch.float64 if x.dtype is torch.float64 else torch.float32
    # A view where it can be: channels_last in gives channels_last out.
    x3 = _as(x.reshape(shape[0], shape[1], math.prod(shape[2:])), dtype)
    y, mean_bn, var_bn, has = reference_forward(x3, _as(weight, dtype),
                                                _as(bias, dtype),
                                                _as(mean_logits, dtype),
                                                _as(var_logits, dtype),
                                                _as(running_mean, dtype),
                                                _as(running_var,
                                                    dtype), training, eps,
                                                unbiased, ratio_fixed,
                                                _as(fixed_ratios, dtype),
                                                ratios_given, group)
    if mean_bn is not None:
        update_running_stats(running_mean, running_var,
                             num_batches_tracked, momentum, mean_bn.detach(),
                             var_bn.detach(), has, nonfinite_batches)
    return _as(y.reshape(shape), x.dtype)


def graph_grads(grad_y: Tensor, inputs, wanted, *args) -> list:
    """A backward that records a graph (``create_graph=True``): the
    gradients of SN's output for ``grad_y`` with respect to those of
    ``inputs`` = (x (N, C, *), weight, bias, mean_logits, var_logits) that
    are ``wanted`` (the others None), from a recomputed reference forward,
    so that every higher derivative is exact. ``args``:
    :func:`reference_forward`'s from ``running_mean`` on; x is computed in
    the parameters' dtype."""
    x = inputs[0]
    n, c = x.shape[0], x.shape[1]
    x3 = _as(x.reshape(n, c, math.prod(x.shape[2:])), inputs[1].dtype)
    y = reference_forward(x3, *inputs[1:], *args)[0]
    asked = [t for t, want in zip(inputs, wanted) if want]
    grads = iter(
        torch.autograd.grad(
            y,
            asked,
            grad_y.reshape(y.shape).to(y.dtype),
            create_graph=True,
            allow_unused=True))
    result = []
    for t, want in zip(inputs, wanted):
        g = next(grads) if want else None
        result.append(torch.zeros_like(t) if want and g is None else g)
    return result
