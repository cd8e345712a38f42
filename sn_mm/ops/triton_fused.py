"""SN on GPUs: the host side of the six fused Triton kernels
(:mod:`sn_mm.ops.triton_kernels`, three per forward, three per backward):
their plans and launches, the autograd Function, SyncSN's exchange between
the passes and the self-check. Everything between the kernels stays on the
device and nothing is computed by a chain of small PyTorch ops: on a GPU
each such op is a kernel launch, which at small shapes costs more than the
data.

The input can be float32, bfloat16 or float16 (statistics in float32, the
output in the input's dtype, so bf16 autocast keeps its bytes) and can be
contiguous or channels_last (the kernels take strides; the output and the
input gradient keep the input's layout). Parameters and running statistics
are float32. A double backward (``create_graph=True``) recomputes the
forward from differentiable PyTorch ops, as on the other kernel paths.

The same formulas as the reference (:mod:`sn_mm.ops.reference`: stable LN/BN
variances from IN's moments by Chan et al.'s combination, gradients about the
row mean); the tests check every output, running statistic and gradient
against it, and under ``TRITON_INTERPRET=1`` the kernels run on CPU
tensors.
"""
import os
import warnings
from collections import OrderedDict
from typing import Optional

import torch
import triton
from torch import Tensor

from . import _compat
from . import triton_kernels as kernels
from .reference import (combine_statistics, graph_grads, held_group,
                        hold_group, update_running_stats)

FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_TILE = 2048  # elements per (rows x block) tile
_INTERPRET = os.environ.get('TRITON_INTERPRET') == '1'
_MAX_SPLIT = 64


def _pow2(v: int) -> int:
    return 1 << max(int(v) - 1, 0).bit_length()


class _LRU(OrderedDict):
    """A dict that keeps its ``size`` most recently used entries: with
    mmdet's keep-ratio resizing nearly every batch brings new input sizes,
    so a cache keyed on exact sizes must forget."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def get(self, key, default=None):
        value = super().get(key, default)
        if value is not default:
            self.move_to_end(key)
        return value

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if len(self) > self.size:
            self.popitem(last=False)


_SM_COUNT = {}
# Plans as for a device of this many programs instead of this one's (None:
# this device's): the tests run an H100's or H200's plans in Triton's
# interpreter (plan_as_for).
_TARGET = {'programs': None}
# A detector's layers meet a few hundred (shape, layout) pairs at a few
# image sizes; the bounds hold several of those at once.
_PLANS = _LRU(1024)


def plan_as_for(programs: Optional[int]) -> Optional[int]:
    """Plan every call as for a device that keeps ``programs`` programs
    busy (four per SM: 528 for an H100's or H200's 132 SMs); None: as for
    the device at hand. Returns the previous setting. The tests run a
    GPU's plans (rows split across programs, empty trailing chunks, the
    large tiles) in Triton's interpreter with it."""
    previous = _TARGET['programs']
    _TARGET['programs'] = programs
    return previous


def _target_programs(device: torch.device) -> int:
    """Programs that keep every multiprocessor busy (four per SM)."""
    if _TARGET['programs'] is not None:
        return _TARGET['programs']
    if device.type != 'cuda':
        return 4  # Triton's interpreter: few programs, quick tests
    index = device.index if device.index is not None else \
        torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(
            index).multi_processor_count
    return 4 * _SM_COUNT[index]


# The forward calls whose plan split rows across programs or took tiles
# across channels (channels_last), and the launches that skipped Triton's
# launch path: for the tests, which assert that theirs ran. The two plan
# layouts can be switched off, for A/B timings
# (tools/analysis_tools/benchmark_paths.py --device cuda) and tests.
_PATHS = dict(split_rows=0, channels_last_tiles=0, direct_launch=0)
_PLAN_PATHS_ON = dict(split_rows=True, channels_last_tiles=True)


def path_counts() -> dict:
    """How many calls took each of the Triton host side's special paths
    since the process began."""
    return dict(_PATHS)


def set_path(name: str, enabled: bool) -> bool:
    """Let plans take layout ``name`` ('split_rows', 'channels_last_tiles')
    where it applies (the default), or never: one program per row chunk
    of a whole row, tiles along the rows, which compute the same. Returns
    whether it was on."""
    if name not in _PLAN_PATHS_ON:
        raise ValueError(f'unknown Triton path {name!r} (expected one of '
                         f'{", ".join(map(repr, _PLAN_PATHS_ON))})')
    # The plans' keys hold the switches: switching back and forth (an A/B)
    # finds each side's plans and direct launches where it left them.
    was_on = _PLAN_PATHS_ON[name]
    _PLAN_PATHS_ON[name] = enabled
    return was_on


def _plan(n: int, c: int, length: int, stride_c: int, stride_l: int,
          device: torch.device):
    """Tile shape, chunks per row and launch grids for one shape and
    layout; cached."""
    key = (n, c, length, stride_c, stride_l, device, _TARGET['programs'],
           *_PLAN_PATHS_ON.values())
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    rows_total = n * c
    channels_last = (
        _PLAN_PATHS_ON['channels_last_tiles'] and stride_c == 1
        and stride_l != 1 and c > 1)
    if channels_last:
        # channels_last: a tile spans channels, whose values are adjacent.
        rows = min(_pow2(c), 64)
        block = max(min(_TILE // rows, _pow2(length)), 1)
    else:
        block = min(max(_pow2(length), 16), 1024)
        rows = max(1, _TILE // block)
    tiles = triton.cdiv(rows_total, rows)
    split, target = 1, _target_programs(device)
    limit = min(
        triton.cdiv(length, block),
        _MAX_SPLIT if _PLAN_PATHS_ON['split_rows'] else 1)
    while split * 2 <= limit and tiles * split < target:
        split *= 2
    chunk = triton.cdiv(triton.cdiv(length, split), block) * block
    cb = min(_pow2(c), max(4096 // split, 16))
    nb = min(_pow2(n), max(4096 // split, 16))
    plan = dict(
        key=key,
        rows=rows,
        block=block,
        split=split,
        chunk=chunk,
        cb=cb,
        nb=nb,
        grid=(tiles, split),
        channels_last=channels_last,
        ws=kernels.ws_at.fn(kernels.WS_END, rows_total, c, split),
        bws=kernels.bws_at.fn(kernels.BWS_END, rows_total, c, split))
    _PLANS[key] = plan
    return plan


def _dense(x3: Tensor) -> Tensor:
    """x3 itself when its elements are non-overlapping and dense
    (contiguous or channels_last), else a contiguous copy: outputs take its
    strides."""
    n, c, length = x3.shape
    sn, sc, sl = x3.stride()
    if (sl == 1 and sc == length and sn == c * length) or (
            sc == 1 and sl == c
            and sn == c * length) or length == 1 and (sc == 1 and sn == c):
        return x3
    return x3.contiguous()


# Launching: after a kernel's first launch through Triton (which compiles
# it), later launches with the same specialisation call the compiled kernel
# directly. Triton's own launch path re-derives the specialisation from every
# argument on every call, which at small shapes costs more than the kernel.
# The key (direct_key) holds what that specialisation depends on: the plan
# (sizes and strides), the flags, the dtype of every tensor argument (one
# compile per pointer type) and that every pointer is 16-byte aligned.
_DIRECT = {'on': not _INTERPRET, 'warned': False}
# key -> [compiled kernel, launched directly before], or _THROUGH_TRITON:
# the first direct launch for the key failed, Triton's path serves it.
_COMPILED = _LRU(4096)  # six kernels per plan
_THROUGH_TRITON = 'through Triton'


def direct_key(plan, flags, tensors):
    """The direct-launch key of a call with these compile-time ``flags``
    and tensor arguments, or None where the call cannot launch directly
    (off, not on CUDA, a pointer not 16-byte aligned)."""
    if not (_DIRECT['on'] and tensors[0].is_cuda and all(t.data_ptr() % 16 == 0
                                                         for t in tensors)):
        return None
    return (plan['key'], flags, tuple(t.dtype for t in tensors))


def _launch(kernel, key, grid, args, device_index):
    entry = None if key is None else _COMPILED.get(key)
    if entry is not None and entry is not _THROUGH_TRITON:
        if entry[1]:
            _compat.launch_directly(entry[0], grid, device_index, args)
            _PATHS['direct_launch'] += 1
            return
        try:
            _compat.launch_directly(entry[0], grid, device_index, args)
        except Exception as err:  # this Triton's launcher, for this key
            _COMPILED[key] = entry = _THROUGH_TRITON
            if not _DIRECT['warned']:
                _DIRECT['warned'] = True
                warnings.warn(f'sn_mm: launching a Triton kernel directly '
                              f'failed ({type(err).__name__}: {err}); its '
                              f'calls take Triton\'s launch path')
        else:
            entry[1] = True
            _PATHS['direct_launch'] += 1
            return
    compiled = kernel[grid](*args)
    if key is not None and entry is None and _compat.can_launch_directly(
            compiled):
        _COMPILED[key] = [compiled, False]


def logit_blocks(c: int, groups: int):
    """The logit gradients' tile: (groups, channels of a group)."""
    wb = min(_pow2(c // groups), 256)
    return min(_pow2(groups), max(1024 // wb, 1)), wb


def _ratio_groups(mean_logits: Tensor):
    """(G, K): group SN's logits are (G, K), SN's (K,)."""
    if mean_logits.dim() == 2:
        return mean_logits.shape[0], mean_logits.shape[1]
    return 1, mean_logits.shape[0]


def _forward(x3,
             weight,
             bias,
             mean_logits,
             var_logits,
             running_mean,
             running_var,
             nbt,
             ratio_fixed,
             fixed_ratios,
             training,
             momentum,
             eps,
             unbiased,
             ratios_given,
             group=None,
             nonfinite=None):
    n, c, length = x3.shape
    sxn, sxc, sxl = x3.stride()
    plan = _plan(n, c, length, sxc, sxl, x3.device)
    split, chunk, grid = plan['split'], plan['chunk'], plan['grid']
    rows, block = plan['rows'], plan['block']
    _PATHS['split_rows'] += split > 1
    _PATHS['channels_last_tiles'] += plan['channels_last']
    has_in = length > 1
    divisor = float(max(length - (1 if unbiased and has_in else 0), 1))
    using_bn = running_mean is not None
    bn_batch = using_bn and training
    sync = bn_batch and group is not None
    groups, k = _ratio_groups(mean_logits)
    ws = torch.empty(plan['ws'], device=x3.device, dtype=torch.float32)
    y = torch.empty_strided(
        x3.shape, x3.stride(), dtype=x3.dtype, device=x3.device)
    cumulative = momentum is None
    rmean = running_mean if using_bn else ws
    rvar = running_var if using_bn else ws
    update = bn_batch and not sync  # SyncSN updates after its all-gather
    count = nbt if update else ws
    count_bad = update and nonfinite is not None
    bad = nonfinite if count_bad else ws
    has_fixed = ratio_fixed is not None
    fixed = ratio_fixed if has_fixed else ws
    fixed_r = fixed_ratios if has_fixed else ws
    key = direct_key(plan, (groups, k, has_in, ratios_given, has_fixed,
                            bn_batch, cumulative, sync, count_bad),
                     (x3, y, ws, weight, bias, mean_logits, var_logits, rmean,
                      rvar, count, bad, fixed, fixed_r))
    device_index = -1 if key is None else x3.get_device()
    _launch(kernels.moments_kernel, key and ('m', ) + key, grid,
            (x3, ws, n * c, c, length, chunk, sxn, sxc, sxl, split, rows,
             block, chunk == block), device_index)
    _launch(kernels.stats_kernel, key and ('s', ) + key,
            (n + c if bn_batch else n, 1),
            (ws, n, c, length, chunk, divisor, split, plan['cb'], plan['nb'],
             sync), device_index)
    if sync:
        _combine_over_group(ws, n, c, plan, running_mean, running_var, nbt,
                            momentum, group, nonfinite)
    _launch(kernels.normalize_kernel, key and ('n', ) + key, grid,
            (x3, y, ws, weight, bias, mean_logits, var_logits, fixed, fixed_r,
             rmean, rvar, count, bad, n, c, groups, length, chunk, divisor,
             float(eps), 0. if cumulative else float(momentum), sxn, sxc, sxl,
             split, rows, block, k, has_in, ratios_given, has_fixed, bn_batch,
             update, plan['cb'], cumulative, count_bad, groups > 1),
            device_index)
    if update:
        _bump(running_mean, running_var, nbt,
              *([nonfinite] if count_bad else []))
    return y, ws, plan


def _bn_slots(ws, n, c, plan):
    """Views of the BN mean and variance (C each) and the group's sample
    count (1) in the workspace."""
    start = kernels.ws_at.fn(kernels.WS_BN, n * c, c, plan['split'])
    var, count = (
        start + kernels.stat_at.fn(stat, c)
        for stat in (kernels.STAT_VAR, kernels.STAT_COUNT))
    return ws[start:var], ws[var:count], ws[count:count + 1]


def _combine_over_group(ws,
                        n,
                        c,
                        plan,
                        running_mean,
                        running_var,
                        nbt,
                        momentum,
                        group,
                        nonfinite=None):
    """SyncSN: this rank's channel means and centred second moments,
    combined with every rank's by one all-gather (as the reference's SyncSN
    does, so that ranks on either path interoperate); the running statistics
    updated from the result."""
    mean_c, m2_c, count = _bn_slots(ws, n, c, plan)
    total, mean_bn, var_bn = combine_statistics(n, mean_c, m2_c, group)
    mean_c.copy_(mean_bn)
    m2_c.copy_(var_bn)
    count.copy_(total.reshape(1))
    update_running_stats(running_mean, running_var, nbt, momentum, mean_bn,
                         var_bn, total > 0, nonfinite)


def _bump(*tensors):
    # Written in place by a kernel: autograd's version counters must see it.
    _compat.increment_versions(tensors)


class TritonSwitchableNorm(torch.autograd.Function):
    """SN's forward and backward on the six kernels of this module."""

    @staticmethod
    def forward(ctx, x3, weight, bias, mean_logits, var_logits, state):
        y, ws, plan = _forward(x3, weight, bias, mean_logits, var_logits,
                               *state)
        running_mean, running_var, training = state[0], state[1], state[5]
        # The process group (SyncSN's, index 10) held weakly (hold_group).
        ctx.state = state[:10] + (hold_group(state[10]), ) + state[11:]
        ctx.plan = plan
        # Eval's BN term reads the running statistics: saved, so that a
        # change before backward is caught by autograd's version check.
        bn_eval = running_mean is not None and not training
        ctx.save_for_backward(x3, weight, bias, mean_logits, var_logits, ws,
                              running_mean if bn_eval else None,
                              running_var if bn_eval else None)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        if torch.is_grad_enabled():
            return _recorded_backward(ctx, grad_y)
        (x3, weight, _, mean_logits, var_logits, ws, rmean,
         rvar) = ctx.saved_tensors
        (running_mean, _, _, ratio_fixed, fixed_ratios, training, _, _,
         unbiased, ratios_given, group_ref, _) = ctx.state
        group = held_group(group_ref)
        plan = ctx.plan
        n, c, length = x3.shape
        split, chunk = plan['split'], plan['chunk']
        has_in = length > 1
        divisor = max(length - (1 if unbiased and has_in else 0), 1)
        bn_batch = running_mean is not None and training
        sync = bn_batch and group is not None
        groups, k = _ratio_groups(mean_logits)
        sgn, sgc, sgl = grad_y.stride()
        sxn, sxc, sxl = x3.stride()
        bws = torch.empty(plan['bws'], device=x3.device, dtype=torch.float32)
        pg = torch.empty(
            2 * c + 2 * groups * k, device=x3.device, dtype=torch.float32)
        gb, wb = logit_blocks(c, groups)
        dx = torch.empty_strided(
            x3.shape, x3.stride(), dtype=x3.dtype, device=x3.device)
        if rmean is None:
            rmean = rvar = ws
        has_fixed = ratio_fixed is not None
        fixed = ratio_fixed if has_fixed else ws
        fixed_r = fixed_ratios if has_fixed else ws
        grid, rows, block = plan['grid'], plan['rows'], plan['block']
        key = direct_key(plan, (groups, k, has_in, ratios_given, has_fixed,
                                bn_batch, sync, sgn, sgc, sgl),
                         (grad_y, x3, dx, ws, bws, pg, weight, mean_logits,
                          var_logits, rmean, rvar, fixed, fixed_r))
        device_index = -1 if key is None else x3.get_device()
        _launch(kernels.grad_sums_kernel, key and ('gs', ) + key, grid,
                (grad_y, x3, ws, bws, n * c, c, length, chunk, sgn, sgc, sgl,
                 sxn, sxc, sxl, split, rows, block), device_index)
        _launch(kernels.grad_stats_kernel, key and ('gt', ) + key, (n + c, 1),
                (ws, bws, pg, weight, rmean, rvar, mean_logits, var_logits,
                 fixed, fixed_r, n, c, groups, split, plan['cb'], plan['nb'],
                 k, has_in, ratios_given, has_fixed, bn_batch, groups > 1),
                device_index)
        if sync:
            # The shared BN statistics collect gradient from every rank.
            start = kernels.bws_at.fn(kernels.BWS_BN, n * c, c, split)
            end = start + kernels.stat_at.fn(kernels.STAT_COUNT, c)
            torch.distributed.all_reduce(bws[start:end], group=group)
        _launch(kernels.input_grad_kernel, key and ('ig', ) + key, grid,
                (grad_y, x3, dx, ws, bws, pg, weight, mean_logits, var_logits,
                 fixed, fixed_r, n, c, groups, length, chunk, 2.0 / divisor,
                 sgn, sgc, sgl, sxn, sxc, sxl, split, rows, block, gb, wb, k,
                 has_in, ratios_given, has_fixed, bn_batch, sync, groups > 1),
                device_index)
        logits = groups * k
        return (dx, pg[:c], pg[c:2 * c],
                pg[2 * c:2 * c + logits].view(mean_logits.shape),
                pg[2 * c + logits:].view(var_logits.shape), None)


def _recorded_backward(ctx, grad_y):
    """create_graph=True: the reference's gradients, as a graph."""
    (running_mean, running_var, _, ratio_fixed, fixed_ratios, training, _, eps,
     unbiased, ratios_given, group_ref, _) = ctx.state
    if group_ref is not None:
        raise RuntimeError(
            'SyncSN: double backward (create_graph=True) across several '
            'processes is not supported; on one process (or with SN) it '
            'is exact')
    return (*graph_grads(grad_y, ctx.saved_tensors[:5],
                         ctx.needs_input_grad[:5], running_mean, running_var,
                         training, eps, unbiased, ratio_fixed, fixed_ratios,
                         ratios_given), None)


def applies(x: Tensor, weight: Tensor, running_mean: Optional[Tensor]) -> bool:
    """Whether these kernels take a call (the kernel choice aside): a
    non-empty float32/bfloat16/float16 input on a GPU (or any device in
    Triton's interpreter) with float32 parameters and statistics."""
    return ((x.is_cuda or _INTERPRET) and x.dtype in FUSED_DTYPES
            and weight.dtype is torch.float32 and x.numel() > 0
            and (running_mean is None or running_mean.dtype is torch.float32))


def switchable_norm(x: Tensor,
                    weight: Tensor,
                    bias: Tensor,
                    mean_logits: Tensor,
                    var_logits: Tensor,
                    running_mean: Optional[Tensor],
                    running_var: Optional[Tensor],
                    nbt: Optional[Tensor],
                    ratio_fixed: Optional[Tensor],
                    fixed_ratios: Optional[Tensor],
                    training: bool,
                    momentum: Optional[float],
                    eps: float,
                    unbiased: bool,
                    ratios_given: bool = False,
                    group=None,
                    nonfinite_batches: Optional[Tensor] = None) -> Tensor:
    """SN of ``x`` (N, C, *) on these kernels; in training with a BN branch
    the running statistics and ``nbt`` are updated in place (a batch with
    non-finite BN statistics is counted in ``nonfinite_batches`` instead).
    Arguments as :func:`sn_mm.ops.switchable_norm`'s (``ratios_given``: the
    logits are the ratio vectors, e.g. SparsestMax's; ``group``: SyncSN's
    process group, whose ranks share the BN statistics)."""
    shape = x.shape
    n, c = shape[0], shape[1]
    x3 = _dense(x.reshape(n, c, x.numel() // (n * c)))
    state = (running_mean, running_var, nbt, ratio_fixed, fixed_ratios,
             training, momentum, eps, unbiased, ratios_given, group,
             nonfinite_batches)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or bias.requires_grad
                                    or mean_logits.requires_grad
                                    or var_logits.requires_grad):
        y = TritonSwitchableNorm.apply(x3, weight, bias, mean_logits,
                                       var_logits, state)
    else:
        y = _forward(x3, weight, bias, mean_logits, var_logits, *state)[0]
    return y.reshape(shape)
