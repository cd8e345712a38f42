"""SN on GPUs as six Triton kernels: three per forward, three per backward.

Forward: (1) each row's IN moments (Welford, a row split into chunks across
programs where rows are few and long), (2) one program per sample for LN's
statistics and one per channel for BN's, with the running-statistics update,
(3) the mixing (softmax or fixed ratios, computed in the kernel from the
logits) and the normalisation. Backward: (4) each row's gradient sums,
(5) the per-sample and per-channel sums of the mixed statistics' gradients,
grad_weight and grad_bias, (6) the input gradient, and in one program the
ratio-logit gradients. Group SN (logits (G, K)) runs on the same kernels:
each row takes its ratios from its channel's group, each channel's program
leaves its terms of the ratio gradients, and the logit gradients sum them
over each group's channels. Everything between the kernels stays on the
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
against it,
and under ``TRITON_INTERPRET=1`` the kernels run on CPU tensors.
"""
import os
import warnings
from collections import OrderedDict
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import _compat
from .agreement import worst_difference
from .reference import (combine_statistics, reference_forward,
                        switchable_norm_reference, update_running_stats)

FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_TILE = 2048  # elements per (rows x block) tile
_INTERPRET = os.environ.get('TRITON_INTERPRET') == '1'
_MAX_SPLIT = 64
# Sizes take no part in a kernel's specialisation (each distinct
# specialisation is a compile, seconds on first use); strides and the row
# length do: they decide alignment and vector loads.

# -- device helpers -------------------------------------------------------


@triton.jit
def _welford_combine(mean_a, m2_a, n_a, mean_b, m2_b, n_b):
    n = n_a + n_b
    frac = n_b / tl.maximum(n, 1.0)
    delta = mean_b - mean_a
    return mean_a + delta * frac, m2_a + m2_b + delta * delta * n_a * frac, n


@triton.jit
def _row_offsets(r, C, stride_n, stride_c):
    n = r // C
    c = r - n * C
    return n, c, n.to(tl.int64) * stride_n + c.to(tl.int64) * stride_c


@triton.jit
def _row_moments(ws_ptr, r, ok, R, L, chunk, divisor, SPLIT: tl.constexpr):
    """Mean and variance of rows ``r`` from their chunks' partial means and
    centred second moments (Chan et al.'s combination)."""
    if SPLIT == 1:
        mean = tl.load(ws_ptr + r, mask=ok, other=0.0)
        m2 = tl.load(ws_ptr + _ws_m2(R, SPLIT) + r, mask=ok, other=0.0)
    else:
        s = tl.arange(0, SPLIT)
        idx = r[:, None] * SPLIT + s[None, :]
        pm = tl.load(ws_ptr + idx, mask=ok[:, None], other=0.0)
        pm2 = tl.load(
            ws_ptr + _ws_m2(R, SPLIT) + idx, mask=ok[:, None], other=0.0)
        cnt = tl.minimum(tl.maximum(L - s * chunk, 0), chunk).to(tl.float32)
        mean = tl.sum(pm * cnt[None, :], 1) / L
        dev = pm - mean[:, None]
        m2 = tl.sum(pm2 + cnt[None, :] * dev * dev, 1)
    return mean, m2 / divisor


# -- the workspaces -------------------------------------------------------
# A forward's workspace `ws` (float32; R = N x C rows, each in SPLIT
# chunks), plane by plane: the chunks' partial means and partial centred
# second moments (R x SPLIT each); each row's mean_in, var_in, mu and rstd
# (R each, kept for backward); LN's mean and variance (N each); BN's mean
# and variance (C each) and the samples behind them (1); each channel's
# shift, its first value, about which the row means are held (C).
# A backward's `bws`: the chunks' partial sums of g and of g (x - mean_in)
# (R x SPLIT each); the LN statistics' gradients (2 x N); the BN
# statistics' gradients (2 x C); each channel's terms of the ratio
# gradients (5 x C). Each plane's offset is defined once, below; the
# host calls the same functions through their ``.fn``.


@triton.jit
def _ws_m2(R, SPLIT: tl.constexpr):
    return R * SPLIT


@triton.jit
def _ws_rows(R, SPLIT: tl.constexpr):
    """mean_in, var_in, mu, rstd: R each."""
    return 2 * R * SPLIT


@triton.jit
def _ws_ln(R, SPLIT: tl.constexpr):
    """LN mean, LN variance: N each."""
    return 2 * R * SPLIT + 4 * R


@triton.jit
def _ws_bn(R, C, SPLIT: tl.constexpr):
    """BN mean, BN variance: C each; then their sample count."""
    return 2 * R * SPLIT + 4 * R + 2 * (R // C)


@triton.jit
def _ws_shift(R, C, SPLIT: tl.constexpr):
    return 2 * R * SPLIT + 4 * R + 2 * (R // C) + 2 * C + 1


@triton.jit
def _ws_size(R, C, SPLIT: tl.constexpr):
    return 2 * R * SPLIT + 4 * R + 2 * (R // C) + 3 * C + 1


@triton.jit
def _bws_gx(R, SPLIT: tl.constexpr):
    return R * SPLIT


@triton.jit
def _bws_ln(R, SPLIT: tl.constexpr):
    """The LN mean's and variance's gradients: N each."""
    return 2 * R * SPLIT


@triton.jit
def _bws_bn(R, C, SPLIT: tl.constexpr):
    """The BN mean's and variance's gradients: C each."""
    return 2 * R * SPLIT + 2 * (R // C)


@triton.jit
def _bws_parts(R, C, SPLIT: tl.constexpr):
    """Each channel's terms of the ratio gradients: five planes of C."""
    return 2 * R * SPLIT + 2 * (R // C) + 2 * C


@triton.jit
def _bws_size(R, C, SPLIT: tl.constexpr):
    return 2 * R * SPLIT + 2 * (R // C) + 2 * C + 5 * C


@triton.jit
def _group_of(c, C, G, GROUPED: tl.constexpr):
    """The ratio group of channels ``c``: 0 (a scalar, so that the ratios
    are computed once per program) unless the layer is a group SN one."""
    if GROUPED:
        g = c // (C // G)
    else:
        g = 0
    return g


@triton.jit
def _ratios(log_ptr, fixed_ptr, fixed_ratio_ptr, slot, K: tl.constexpr,
            HAS_IN: tl.constexpr, RATIOS_GIVEN: tl.constexpr,
            HAS_FIXED: tl.constexpr):
    """The (IN, LN, BN) ratios of the logit vector(s) at ``log_ptr``: the
    softmax (without IN at one position), the vector itself when
    ``RATIOS_GIVEN`` (SparsestMax's), or the fixed ratios where the layer
    fixed them. BN's is
    0 when K == 2. ``slot`` indexes ``ratio_fixed`` (2, G) flattened: the
    mean's group g is slot g, the variance's G + g. Pointers and slots can
    be blocks (one group per row)."""
    l0 = tl.load(log_ptr).to(tl.float32)
    l1 = tl.load(log_ptr + 1).to(tl.float32)
    zero = l0 * 0.0
    if K == 3:
        l2 = tl.load(log_ptr + 2).to(tl.float32)
    else:
        l2 = zero
    if RATIOS_GIVEN:
        p1 = l1
        p2 = l2
        if HAS_IN:
            p0 = l0
        else:
            p0 = zero
    else:
        top = l1
        if K == 3:
            top = tl.maximum(top, l2)
        if HAS_IN:
            top = tl.maximum(top, l0)
            e0 = tl.exp(l0 - top)
        else:
            e0 = zero
        e1 = tl.exp(l1 - top)
        if K == 3:
            e2 = tl.exp(l2 - top)
        else:
            e2 = zero
        total = e0 + e1 + e2
        p0 = e0 / total
        p1 = e1 / total
        p2 = e2 / total
    if HAS_FIXED:
        fixed = tl.load(fixed_ptr + slot) != 0
        f0 = tl.load(fixed_ratio_ptr + slot * K).to(tl.float32)
        f1 = tl.load(fixed_ratio_ptr + slot * K + 1).to(tl.float32)
        if K == 3:
            f2 = tl.load(fixed_ratio_ptr + slot * K + 2).to(tl.float32)
        else:
            f2 = zero
        if not HAS_IN:  # the rest renormalised, or LN alone
            rest = f1 + f2
            has_rest = rest > 0
            f1 = tl.where(has_rest, f1 / tl.where(has_rest, rest, 1.0), 1.0)
            f2 = tl.where(has_rest, f2 / tl.where(has_rest, rest, 1.0), 0.0)
            f0 = zero
        p0 = tl.where(fixed, f0, p0)
        p1 = tl.where(fixed, f1, p1)
        p2 = tl.where(fixed, f2, p2)
    return p0, p1, p2


@triton.jit
def _ratio_grads(out_ptr, p0, p1, p2, d0, d1, d2, fixed_ptr, slot, ok,
                 K: tl.constexpr, HAS_IN: tl.constexpr,
                 RATIOS_GIVEN: tl.constexpr, HAS_FIXED: tl.constexpr):
    """Stores the logits' gradient from the ratios' (through the softmax's
    Jacobian; as it is for given ratios; none for fixed ones or for IN at
    one position), for a block of groups (``ok``: those that exist)."""
    if RATIOS_GIVEN:
        g0 = d0
        g1 = d1
        g2 = d2
    else:
        dot = p0 * d0 + p1 * d1 + p2 * d2
        g0 = p0 * (d0 - dot)
        g1 = p1 * (d1 - dot)
        g2 = p2 * (d2 - dot)
    if not HAS_IN:
        g0 = g0 * 0.0
    if HAS_FIXED:
        keep = tl.load(fixed_ptr + slot) == 0
        g0 = tl.where(keep, g0, 0.0)
        g1 = tl.where(keep, g1, 0.0)
        g2 = tl.where(keep, g2, 0.0)
    tl.store(out_ptr, g0, mask=ok)
    tl.store(out_ptr + 1, g1, mask=ok)
    if K == 3:
        tl.store(out_ptr + 2, g2, mask=ok)


@triton.jit
def _row_grads(ws_ptr, bws_ptr, r, ok, w, R, SPLIT: tl.constexpr):
    """Per row: the sums of g and g * (x - mu), the gradients of the mixed
    mean and variance, and the saved statistics."""
    if SPLIT == 1:
        s1 = tl.load(bws_ptr + r, mask=ok, other=0.0)
        s2 = tl.load(bws_ptr + _bws_gx(R, SPLIT) + r, mask=ok, other=0.0)
    else:
        s = tl.arange(0, SPLIT)
        idx = r[:, None] * SPLIT + s[None, :]
        s1 = tl.sum(tl.load(bws_ptr + idx, mask=ok[:, None], other=0.0), 1)
        s2 = tl.sum(
            tl.load(
                bws_ptr + _bws_gx(R, SPLIT) + idx, mask=ok[:, None],
                other=0.0), 1)
    base = _ws_rows(R, SPLIT)
    mean_in = tl.load(ws_ptr + base + r, mask=ok, other=0.0)
    var_in = tl.load(ws_ptr + base + R + r, mask=ok, other=0.0)
    mu = tl.load(ws_ptr + base + 2 * R + r, mask=ok, other=0.0)
    rstd = tl.load(ws_ptr + base + 3 * R + r, mask=ok, other=0.0)
    centred = s2 - (mu - mean_in) * s1
    scale = w * rstd
    d_mu = -scale * s1
    d_var = -0.5 * scale * rstd * rstd * centred
    return s1, centred, d_mu, d_var, mean_in, var_in, rstd


# -- forward kernels ------------------------------------------------------


@triton.jit(do_not_specialize=['R', 'C'])
def _moments_kernel(x_ptr, ws_ptr, R, C, L, chunk, sxn, sxc, sxl,
                    SPLIT: tl.constexpr, ROWS: tl.constexpr,
                    BLOCK: tl.constexpr, ONE_STEP: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    s = tl.program_id(1)
    row_ok = r < R
    n, c, base = _row_offsets(r, C, sxn, sxc)
    cols = tl.arange(0, BLOCK)
    start = s * chunk
    # Means are held about their channel's first value (of sample 0): as
    # absolute float32 values, means of 1e4 would round the differences
    # between samples, which BN's variance sums, to 1e-3.
    c_shift = tl.load(
        x_ptr + c.to(tl.int64) * sxc, mask=row_ok, other=0.0).to(tl.float32)
    if s == 0:
        tl.store(
            ws_ptr + _ws_shift(R, C, SPLIT) + c,
            c_shift,
            mask=row_ok & (n == 0))
    if ONE_STEP:
        # The chunk is one tile: an exact two-pass in registers, its sums
        # taken about the chunk's first value, so that they stay small when
        # |mean| >> std and the mean keeps the data's precision.
        pos = start + cols
        ok = row_ok[:, None] & (pos < L)[None, :]
        v = tl.load(
            x_ptr + base[:, None] + pos.to(tl.int64)[None, :] * sxl,
            mask=ok,
            other=0.0).to(tl.float32)
        first = tl.minimum(start, L - 1).to(tl.int64)  # (empty chunks)
        shift = tl.load(
            x_ptr + base + first * sxl, mask=row_ok, other=0.0).to(tl.float32)
        count = tl.minimum(tl.maximum(L - start, 0), BLOCK).to(tl.float32)
        dev = tl.where(ok, v - shift[:, None], 0.0)
        mean_dev = tl.sum(dev, 1) / tl.maximum(count, 1.0)
        d = tl.where(ok, dev - mean_dev[:, None], 0.0)
        mean_r = (shift - c_shift) + mean_dev
        m2_r = tl.sum(d * d, 1)
    else:
        # Long rows: Welford per lane, lanes combined once at the end.
        mean = tl.zeros((ROWS, BLOCK), tl.float32)
        m2 = tl.zeros((ROWS, BLOCK), tl.float32)
        cnt = tl.zeros((ROWS, BLOCK), tl.float32)
        for off in range(0, chunk, BLOCK):
            pos = start + off + cols
            ok = row_ok[:, None] & (pos < L)[None, :]
            v = tl.load(
                x_ptr + base[:, None] + pos.to(tl.int64)[None, :] * sxl,
                mask=ok,
                other=0.0).to(tl.float32) - c_shift[:, None]
            # Each lane takes one value per step and only a row's end
            # masks lanes, so a lane's count is the step's number: one
            # division per step, not per value.
            step = off // BLOCK + 1
            d = v - mean
            mean = tl.where(ok, mean + d * (1.0 / step), mean)
            m2 = tl.where(ok, m2 + d * (v - mean), m2)
            cnt = tl.where(ok, step * 1.0, cnt)
        mean_r, m2_r, _ = tl.reduce((mean, m2, cnt), 1, _welford_combine)
    idx = r * SPLIT + s
    tl.store(ws_ptr + idx, mean_r, mask=row_ok)
    tl.store(ws_ptr + _ws_m2(R, SPLIT) + idx, m2_r, mask=row_ok)


@triton.jit
def _ln_stats(ws_ptr, n, N, C, L, chunk, divisor, SPLIT: tl.constexpr,
              CB: tl.constexpr):
    R = N * C
    out = _ws_ln(R, SPLIT)
    idx = tl.arange(0, CB)
    acc = tl.zeros((CB, ), tl.float32)
    shifts = ws_ptr + _ws_shift(R, C, SPLIT)
    for c0 in range(0, C, CB):
        ok = c0 + idx < C
        mean, _ = _row_moments(ws_ptr, n * C + c0 + idx, ok, R, L, chunk,
                               divisor, SPLIT)
        mean += tl.load(shifts + c0 + idx, mask=ok, other=0.0)
        acc += tl.where(ok, mean, 0.0)
    mean_ln = tl.sum(acc, 0) / C
    acc = tl.zeros((CB, ), tl.float32)
    for c0 in range(0, C, CB):
        ok = c0 + idx < C
        mean, var = _row_moments(ws_ptr, n * C + c0 + idx, ok, R, L, chunk,
                                 divisor, SPLIT)
        mean += tl.load(shifts + c0 + idx, mask=ok, other=0.0)
        dev = mean - mean_ln
        acc += tl.where(ok, var + dev * dev, 0.0)
    tl.store(ws_ptr + out + n, mean_ln)
    tl.store(ws_ptr + out + N + n, tl.sum(acc, 0) / C)


@triton.jit
def _bn_stats(ws_ptr, c, N, C, L, chunk, divisor, SPLIT: tl.constexpr,
              NB: tl.constexpr, LOCAL: tl.constexpr):
    R = N * C
    out = _ws_bn(R, C, SPLIT)
    idx = tl.arange(0, NB)
    acc = tl.zeros((NB, ), tl.float32)
    for n0 in range(0, N, NB):
        ok = n0 + idx < N
        mean, _ = _row_moments(ws_ptr, (n0 + idx) * C + c, ok, R, L, chunk,
                               divisor, SPLIT)
        acc += tl.where(ok, mean, 0.0)
    mean_bn = tl.sum(acc, 0) / N  # about the channel's shift
    acc = tl.zeros((NB, ), tl.float32)
    for n0 in range(0, N, NB):
        ok = n0 + idx < N
        mean, var = _row_moments(ws_ptr, (n0 + idx) * C + c, ok, R, L, chunk,
                                 divisor, SPLIT)
        dev = mean - mean_bn
        acc += tl.where(ok, var + dev * dev, 0.0)
    shift = tl.load(ws_ptr + _ws_shift(R, C, SPLIT) + c)
    tl.store(ws_ptr + out + c, shift + mean_bn)
    if LOCAL:  # this rank's share: the centred second moment, not / N
        tl.store(ws_ptr + out + C + c, tl.sum(acc, 0))
    else:
        tl.store(ws_ptr + out + C + c, tl.sum(acc, 0) / N)


@triton.jit(do_not_specialize=['N', 'C'])
def _stats_kernel(ws_ptr, N, C, L, chunk, divisor, SPLIT: tl.constexpr,
                  CB: tl.constexpr, NB: tl.constexpr, LOCAL: tl.constexpr):
    """Programs 0..N-1: LN's mean and variance of sample n; programs N..:
    BN's of channel c, or with ``LOCAL`` this rank's channel mean and
    centred second moment, for SyncSN to combine across ranks."""
    pid = tl.program_id(0)
    if pid < N:
        _ln_stats(ws_ptr, pid, N, C, L, chunk, divisor, SPLIT, CB)
    else:
        _bn_stats(ws_ptr, pid - N, N, C, L, chunk, divisor, SPLIT, NB, LOCAL)


_FLOAT32_MAX = tl.constexpr(3.4028234663852886e38)


@triton.jit
def _update_running(ws_ptr, rmean_ptr, rvar_ptr, nbt_ptr, bad_ptr, N, C,
                    SPLIT: tl.constexpr, momentum, CB: tl.constexpr,
                    CUMULATIVE: tl.constexpr, COUNT_BAD: tl.constexpr):
    """The running statistics' update from the batch's BN statistics, in
    one program: skipped, and counted at ``bad_ptr``, where any of them is
    not finite."""
    R = N * C
    bn = ws_ptr + _ws_bn(R, C, SPLIT)
    idx = tl.arange(0, CB)
    bad = tl.zeros((CB, ), tl.int32)
    for c0 in range(0, C, CB):
        ok = c0 + idx < C
        m = tl.load(bn + c0 + idx, mask=ok, other=0.0)
        v = tl.load(bn + C + c0 + idx, mask=ok, other=0.0)
        # NaN fails every comparison, infinities this one.
        finite = (tl.abs(m) <= _FLOAT32_MAX) & (tl.abs(v) <= _FLOAT32_MAX)
        bad += tl.where(ok & ~finite, 1, 0)
    if tl.sum(bad, 0) == 0:
        count = tl.load(nbt_ptr) + 1
        if CUMULATIVE:
            mom = 1.0 / count.to(tl.float32)
        else:
            mom = momentum
        for c0 in range(0, C, CB):
            ok = c0 + idx < C
            m = tl.load(bn + c0 + idx, mask=ok, other=0.0)
            v = tl.load(bn + C + c0 + idx, mask=ok, other=0.0)
            rm = tl.load(rmean_ptr + c0 + idx, mask=ok, other=0.0)
            rv = tl.load(rvar_ptr + c0 + idx, mask=ok, other=0.0)
            tl.store(rmean_ptr + c0 + idx, rm * (1 - mom) + mom * m, mask=ok)
            tl.store(rvar_ptr + c0 + idx, rv * (1 - mom) + mom * v, mask=ok)
        tl.store(nbt_ptr, count)
    elif COUNT_BAD:
        tl.store(bad_ptr, tl.load(bad_ptr) + 1)


@triton.jit(do_not_specialize=['N', 'C'])
def _normalize_kernel(x_ptr, y_ptr, ws_ptr, w_ptr, b_ptr, mlog_ptr, vlog_ptr,
                      fixed_ptr, fixed_ratio_ptr, rmean_ptr, rvar_ptr, nbt_ptr,
                      bad_ptr, N, C, G, L, chunk, divisor, eps, momentum, sxn,
                      sxc, sxl, SPLIT: tl.constexpr, ROWS: tl.constexpr,
                      BLOCK: tl.constexpr, K: tl.constexpr,
                      HAS_IN: tl.constexpr, RATIOS_GIVEN: tl.constexpr,
                      HAS_FIXED: tl.constexpr, BN_BATCH: tl.constexpr,
                      UPDATE: tl.constexpr, CB: tl.constexpr,
                      CUMULATIVE: tl.constexpr, COUNT_BAD: tl.constexpr,
                      GROUPED: tl.constexpr):
    # Reverse order: the data the moments pass read last is still in L2.
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    s = tl.num_programs(1) - 1 - tl.program_id(1)
    R = N * C
    r = tile * ROWS + tl.arange(0, ROWS)
    row_ok = r < R
    n, c, base = _row_offsets(r, C, sxn, sxc)
    mean_in, var_in = _row_moments(ws_ptr, r, row_ok, R, L, chunk, divisor,
                                   SPLIT)
    mean_in += tl.load(
        ws_ptr + _ws_shift(R, C, SPLIT) + c, mask=row_ok, other=0.0)
    grp = _group_of(c, C, G, GROUPED)
    wm0, wm1, wm2 = _ratios(mlog_ptr + grp * K, fixed_ptr, fixed_ratio_ptr,
                            grp, K, HAS_IN, RATIOS_GIVEN, HAS_FIXED)
    wv0, wv1, wv2 = _ratios(vlog_ptr + grp * K, fixed_ptr, fixed_ratio_ptr,
                            G + grp, K, HAS_IN, RATIOS_GIVEN, HAS_FIXED)
    stats = _ws_rows(R, SPLIT)
    ln = _ws_ln(R, SPLIT)
    # The mean as the row's plus weighted differences from it (the ratios
    # sum to 1): no |mean|-sized products to round.
    mu = mean_in + wm1 * (
        tl.load(ws_ptr + ln + n, mask=row_ok, other=0.0) - mean_in)
    var = wv0 * var_in + wv1 * tl.load(
        ws_ptr + ln + N + n, mask=row_ok, other=0.0)
    if K == 3:
        if BN_BATCH:
            bn = _ws_bn(R, C, SPLIT)
            mean_bn = tl.load(ws_ptr + bn + c, mask=row_ok, other=0.0)
            var_bn = tl.load(ws_ptr + bn + C + c, mask=row_ok, other=0.0)
        else:
            mean_bn = tl.load(rmean_ptr + c, mask=row_ok, other=0.0)
            var_bn = tl.load(rvar_ptr + c, mask=row_ok, other=0.0)
        mu += wm2 * (mean_bn - mean_in)
        var += wv2 * var_bn
    rstd = 1.0 / tl.sqrt(var + eps)
    scale = tl.load(w_ptr + c, mask=row_ok, other=0.0) * rstd
    shift = tl.load(b_ptr + c, mask=row_ok, other=0.0)
    if s == 0:  # what backward needs, once per row
        tl.store(ws_ptr + stats + r, mean_in, mask=row_ok)
        tl.store(ws_ptr + stats + R + r, var_in, mask=row_ok)
        tl.store(ws_ptr + stats + 2 * R + r, mu, mask=row_ok)
        tl.store(ws_ptr + stats + 3 * R + r, rstd, mask=row_ok)
        if UPDATE:
            if tile == 0:  # no program reads them in training
                _update_running(ws_ptr, rmean_ptr, rvar_ptr, nbt_ptr, bad_ptr,
                                N, C, SPLIT, momentum, CB, CUMULATIVE,
                                COUNT_BAD)
    cols = tl.arange(0, BLOCK)
    start = s * chunk
    for off in range(0, chunk, BLOCK):
        pos = start + off + cols
        ok = row_ok[:, None] & (pos < L)[None, :]
        at = base[:, None] + pos.to(tl.int64)[None, :] * sxl
        v = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
        # x - mu first: no cancellation when |mu| >> std.
        y = (v - mu[:, None]) * scale[:, None] + shift[:, None]
        tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=ok)


# -- backward kernels -----------------------------------------------------


@triton.jit(do_not_specialize=['R', 'C'])
def _grad_sums_kernel(g_ptr, x_ptr, ws_ptr, bws_ptr, R, C, L, chunk, sgn, sgc,
                      sgl, sxn, sxc, sxl, SPLIT: tl.constexpr,
                      ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    s = tl.program_id(1)
    row_ok = r < R
    _, _, xbase = _row_offsets(r, C, sxn, sxc)
    _, _, gbase = _row_offsets(r, C, sgn, sgc)
    mean_in = tl.load(ws_ptr + _ws_rows(R, SPLIT) + r, mask=row_ok, other=0.0)
    cols = tl.arange(0, BLOCK)
    acc_g = tl.zeros((ROWS, BLOCK), tl.float32)
    acc_gx = tl.zeros((ROWS, BLOCK), tl.float32)
    start = s * chunk
    for off in range(0, chunk, BLOCK):
        pos = (start + off + cols).to(tl.int64)
        ok = row_ok[:, None] & (pos < L)[None, :]
        g = tl.load(
            g_ptr + gbase[:, None] + pos[None, :] * sgl, mask=ok,
            other=0.0).to(tl.float32)
        v = tl.load(
            x_ptr + xbase[:, None] + pos[None, :] * sxl, mask=ok,
            other=0.0).to(tl.float32)
        acc_g += g
        acc_gx += g * tl.where(ok, v - mean_in[:, None], 0.0)
    idx = r * SPLIT + s
    tl.store(bws_ptr + idx, tl.sum(acc_g, 1), mask=row_ok)
    tl.store(bws_ptr + _bws_gx(R, SPLIT) + idx, tl.sum(acc_gx, 1), mask=row_ok)


@triton.jit
def _sample_grads(ws_ptr, bws_ptr, w_ptr, mlog_ptr, vlog_ptr, fixed_ptr,
                  fixed_ratio_ptr, n, N, C, G, SPLIT: tl.constexpr,
                  CB: tl.constexpr, K: tl.constexpr, HAS_IN: tl.constexpr,
                  RATIOS_GIVEN: tl.constexpr, HAS_FIXED: tl.constexpr,
                  GROUPED: tl.constexpr):
    """The gradients of sample n's LN mean and variance: the sums over its
    channels of the mixed statistics' gradients, each weighted by its
    channel's LN ratios."""
    R = N * C
    out = _bws_ln(R, SPLIT)
    idx = tl.arange(0, CB)
    acc_mu = tl.zeros((CB, ), tl.float32)
    acc_var = tl.zeros((CB, ), tl.float32)
    for c0 in range(0, C, CB):
        cc = c0 + idx
        ok = cc < C
        w = tl.load(w_ptr + cc, mask=ok, other=0.0)
        _, _, d_mu, d_var, _, _, _ = _row_grads(ws_ptr, bws_ptr, n * C + cc,
                                                ok, w, R, SPLIT)
        grp = _group_of(tl.minimum(cc, C - 1), C, G, GROUPED)
        _, wm1, _ = _ratios(mlog_ptr + grp * K, fixed_ptr, fixed_ratio_ptr,
                            grp, K, HAS_IN, RATIOS_GIVEN, HAS_FIXED)
        _, wv1, _ = _ratios(vlog_ptr + grp * K, fixed_ptr, fixed_ratio_ptr,
                            G + grp, K, HAS_IN, RATIOS_GIVEN, HAS_FIXED)
        acc_mu += tl.where(ok, wm1 * d_mu, 0.0)
        acc_var += tl.where(ok, wv1 * d_var, 0.0)
    tl.store(bws_ptr + out + n, tl.sum(acc_mu, 0))
    tl.store(bws_ptr + out + N + n, tl.sum(acc_var, 0))


@triton.jit
def _channel_grads(ws_ptr, bws_ptr, pg_ptr, w_ptr, rmean_ptr, rvar_ptr,
                   mlog_ptr, vlog_ptr, fixed_ptr, fixed_ratio_ptr, c, N, C, G,
                   SPLIT: tl.constexpr, NB: tl.constexpr, K: tl.constexpr,
                   HAS_IN: tl.constexpr, RATIOS_GIVEN: tl.constexpr,
                   HAS_FIXED: tl.constexpr, BN_BATCH: tl.constexpr,
                   GROUPED: tl.constexpr):
    """Channel c's sums over samples: the BN statistics' gradients,
    grad_weight, grad_bias, and its terms of the ratio gradients (the dot
    products of the mixed statistics' gradients with each normaliser's
    statistics), which _logit_grads sums over each group's channels."""
    R = N * C
    ln = _ws_ln(R, SPLIT)
    bn = _ws_bn(R, C, SPLIT)
    parts = bws_ptr + _bws_parts(R, C, SPLIT) + c
    idx = tl.arange(0, NB)
    w = tl.load(w_ptr + c)
    if K == 3:
        if BN_BATCH:
            mean_bn = tl.load(ws_ptr + bn + c)
            var_bn = tl.load(ws_ptr + bn + C + c)
        else:
            mean_bn = tl.load(rmean_ptr + c)
            var_bn = tl.load(rvar_ptr + c)
    acc_mu = tl.zeros((NB, ), tl.float32)
    acc_var = tl.zeros((NB, ), tl.float32)
    acc_w = tl.zeros((NB, ), tl.float32)
    acc_b = tl.zeros((NB, ), tl.float32)
    acc_ln_m = tl.zeros((NB, ), tl.float32)
    acc_bn_m = tl.zeros((NB, ), tl.float32)
    acc_in_v = tl.zeros((NB, ), tl.float32)
    acc_ln_v = tl.zeros((NB, ), tl.float32)
    for n0 in range(0, N, NB):
        ok = n0 + idx < N
        s1, centred, d_mu, d_var, mean_in, var_in, rstd = _row_grads(
            ws_ptr, bws_ptr, (n0 + idx) * C + c, ok, w, R, SPLIT)
        mean_ln = tl.load(ws_ptr + ln + n0 + idx, mask=ok, other=0.0)
        var_ln = tl.load(ws_ptr + ln + N + n0 + idx, mask=ok, other=0.0)
        acc_mu += tl.where(ok, d_mu, 0.0)
        acc_var += tl.where(ok, d_var, 0.0)
        acc_w += tl.where(ok, centred * rstd, 0.0)
        acc_b += tl.where(ok, s1, 0.0)
        # Means less the row's: a shift common to every ratio term, which
        # the softmax's gradient ignores, without cancellation.
        acc_ln_m += tl.where(ok, d_mu * (mean_ln - mean_in), 0.0)
        acc_in_v += tl.where(ok, d_var * var_in, 0.0)
        acc_ln_v += tl.where(ok, d_var * var_ln, 0.0)
        if K == 3:
            acc_bn_m += tl.where(ok, d_mu * (mean_bn - mean_in), 0.0)
    d_var_c = tl.sum(acc_var, 0)
    # The gradients of the BN mean and variance, weighted by their ratios:
    # what SyncSN all-reduces, as the reference's SyncSN does.
    grp = _group_of(c, C, G, GROUPED)
    _, _, wm2 = _ratios(mlog_ptr + grp * K, fixed_ptr, fixed_ratio_ptr, grp, K,
                        HAS_IN, RATIOS_GIVEN, HAS_FIXED)
    _, _, wv2 = _ratios(vlog_ptr + grp * K, fixed_ptr, fixed_ratio_ptr,
                        G + grp, K, HAS_IN, RATIOS_GIVEN, HAS_FIXED)
    bn_grads = _bws_bn(R, C, SPLIT)
    tl.store(bws_ptr + bn_grads + c, wm2 * tl.sum(acc_mu, 0))
    tl.store(bws_ptr + bn_grads + C + c, wv2 * d_var_c)
    tl.store(pg_ptr + c, tl.sum(acc_w, 0))
    tl.store(pg_ptr + C + c, tl.sum(acc_b, 0))
    tl.store(parts, tl.sum(acc_ln_m, 0))
    tl.store(parts + C, tl.sum(acc_bn_m, 0))
    tl.store(parts + 2 * C, tl.sum(acc_in_v, 0))
    tl.store(parts + 3 * C, tl.sum(acc_ln_v, 0))
    if K == 3:
        tl.store(parts + 4 * C, d_var_c * var_bn)
    else:
        tl.store(parts + 4 * C, 0.0)


@triton.jit(do_not_specialize=['N', 'C'])
def _grad_stats_kernel(ws_ptr, bws_ptr, pg_ptr, w_ptr, rmean_ptr, rvar_ptr,
                       mlog_ptr, vlog_ptr, fixed_ptr, fixed_ratio_ptr, N, C, G,
                       SPLIT: tl.constexpr, CB: tl.constexpr, NB: tl.constexpr,
                       K: tl.constexpr, HAS_IN: tl.constexpr,
                       RATIOS_GIVEN: tl.constexpr, HAS_FIXED: tl.constexpr,
                       BN_BATCH: tl.constexpr, GROUPED: tl.constexpr):
    """Programs 0..N-1: sums over channels of sample n; programs N..: sums
    over samples of channel c (see _sample_grads and _channel_grads)."""
    pid = tl.program_id(0)
    if pid < N:
        _sample_grads(ws_ptr, bws_ptr, w_ptr, mlog_ptr, vlog_ptr, fixed_ptr,
                      fixed_ratio_ptr, pid, N, C, G, SPLIT, CB, K, HAS_IN,
                      RATIOS_GIVEN, HAS_FIXED, GROUPED)
    else:
        _channel_grads(ws_ptr, bws_ptr, pg_ptr, w_ptr, rmean_ptr, rvar_ptr,
                       mlog_ptr, vlog_ptr, fixed_ptr, fixed_ratio_ptr, pid - N,
                       N, C, G, SPLIT, NB, K, HAS_IN, RATIOS_GIVEN, HAS_FIXED,
                       BN_BATCH, GROUPED)


@triton.jit
def _logit_grads(bws_ptr, pg_ptr, mlog_ptr, vlog_ptr, fixed_ptr,
                 fixed_ratio_ptr, N, C, G, SPLIT: tl.constexpr,
                 GB: tl.constexpr, WB: tl.constexpr, K: tl.constexpr,
                 HAS_IN: tl.constexpr, RATIOS_GIVEN: tl.constexpr,
                 HAS_FIXED: tl.constexpr):
    """The logit gradients of every ratio group, GB groups at a time: the
    channels' ratio-gradient terms summed over each group's C / G channels
    (WB at a time)."""
    parts = bws_ptr + _bws_parts(N * C, C, SPLIT)
    width = C // G
    gi = tl.arange(0, GB)
    wi = tl.arange(0, WB)
    for g0 in range(0, G, GB):
        grp = g0 + gi
        gok = grp < G
        a0 = tl.zeros((GB, WB), tl.float32)
        a1 = tl.zeros((GB, WB), tl.float32)
        a2 = tl.zeros((GB, WB), tl.float32)
        a3 = tl.zeros((GB, WB), tl.float32)
        a4 = tl.zeros((GB, WB), tl.float32)
        for j0 in range(0, width, WB):
            ok = gok[:, None] & (j0 + wi < width)[None, :]
            at = parts + grp[:, None] * width + j0 + wi[None, :]
            a0 += tl.load(at, mask=ok, other=0.0)
            a1 += tl.load(at + C, mask=ok, other=0.0)
            a2 += tl.load(at + 2 * C, mask=ok, other=0.0)
            a3 += tl.load(at + 3 * C, mask=ok, other=0.0)
            a4 += tl.load(at + 4 * C, mask=ok, other=0.0)
        safe = tl.minimum(grp, G - 1)
        wm0, wm1, wm2 = _ratios(mlog_ptr + safe * K, fixed_ptr,
                                fixed_ratio_ptr, safe, K, HAS_IN, RATIOS_GIVEN,
                                HAS_FIXED)
        wv0, wv1, wv2 = _ratios(vlog_ptr + safe * K, fixed_ptr,
                                fixed_ratio_ptr, G + safe, K, HAS_IN,
                                RATIOS_GIVEN, HAS_FIXED)
        s0 = tl.sum(a0, 1)
        _ratio_grads(pg_ptr + 2 * C + safe * K, wm0, wm1, wm2, s0 * 0.0, s0,
                     tl.sum(a1, 1), fixed_ptr, safe, gok, K, HAS_IN,
                     RATIOS_GIVEN, HAS_FIXED)
        _ratio_grads(pg_ptr + 2 * C + (G + safe) * K, wv0, wv1, wv2,
                     tl.sum(a2, 1), tl.sum(a3, 1), tl.sum(a4, 1), fixed_ptr,
                     G + safe, gok, K, HAS_IN, RATIOS_GIVEN, HAS_FIXED)


@triton.jit(do_not_specialize=['N', 'C'])
def _input_grad_kernel(g_ptr, x_ptr, dx_ptr, ws_ptr, bws_ptr, pg_ptr, w_ptr,
                       mlog_ptr, vlog_ptr, fixed_ptr, fixed_ratio_ptr, N, C, G,
                       L, chunk, two_over_divisor, sgn, sgc, sgl, sxn, sxc,
                       sxl, SPLIT: tl.constexpr, ROWS: tl.constexpr,
                       BLOCK: tl.constexpr, GB: tl.constexpr, WB: tl.constexpr,
                       K: tl.constexpr, HAS_IN: tl.constexpr,
                       RATIOS_GIVEN: tl.constexpr, HAS_FIXED: tl.constexpr,
                       BN_BATCH: tl.constexpr, SYNC: tl.constexpr,
                       GROUPED: tl.constexpr):
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    s = tl.num_programs(1) - 1 - tl.program_id(1)
    R = N * C
    r = tile * ROWS + tl.arange(0, ROWS)
    row_ok = r < R
    n, c, xbase = _row_offsets(r, C, sxn, sxc)
    _, _, gbase = _row_offsets(r, C, sgn, sgc)
    grp = _group_of(c, C, G, GROUPED)
    wm0, _, _ = _ratios(mlog_ptr + grp * K, fixed_ptr, fixed_ratio_ptr, grp, K,
                        HAS_IN, RATIOS_GIVEN, HAS_FIXED)
    wv0, _, _ = _ratios(vlog_ptr + grp * K, fixed_ptr, fixed_ratio_ptr,
                        G + grp, K, HAS_IN, RATIOS_GIVEN, HAS_FIXED)
    w = tl.load(w_ptr + c, mask=row_ok, other=0.0)
    _, _, d_mu, d_var, mean_in, _, rstd = _row_grads(ws_ptr, bws_ptr, r,
                                                     row_ok, w, R, SPLIT)
    ln_grads = _bws_ln(R, SPLIT)
    # Back through LN's (per sample; the sums carry their ratios) and BN's
    # (per channel) statistics to each row's IN mean and variance (Eq. 5
    # reversed).
    dvar_n = tl.load(bws_ptr + ln_grads + N + n, mask=row_ok, other=0.0) / C
    d_var_in = dvar_n + wv0 * d_var
    d_mean_in = (
        tl.load(bws_ptr + ln_grads + n, mask=row_ok, other=0.0) / C +
        wm0 * d_mu + 2.0 * dvar_n *
        (mean_in -
         tl.load(ws_ptr + _ws_ln(R, SPLIT) + n, mask=row_ok, other=0.0)))
    if K == 3:
        if BN_BATCH:
            bn = _ws_bn(R, C, SPLIT)
            bn_grads = _bws_bn(R, C, SPLIT)
            if SYNC:  # the batch over the group
                count = tl.load(ws_ptr + bn + 2 * C)
            else:
                count = N * 1.0
            dvar_c = tl.load(
                bws_ptr + bn_grads + C + c, mask=row_ok, other=0.0) / count
            d_var_in += dvar_c
            d_mean_in += (
                tl.load(bws_ptr + bn_grads + c, mask=row_ok, other=0.0) / count
                + 2.0 * dvar_c *
                (mean_in - tl.load(ws_ptr + bn + c, mask=row_ok, other=0.0)))
    coef = d_var_in * two_over_divisor
    shift = d_mean_in / L
    scale = w * rstd
    cols = tl.arange(0, BLOCK)
    start = s * chunk
    for off in range(0, chunk, BLOCK):
        pos = (start + off + cols).to(tl.int64)
        ok = row_ok[:, None] & (pos < L)[None, :]
        g = tl.load(
            g_ptr + gbase[:, None] + pos[None, :] * sgl, mask=ok,
            other=0.0).to(tl.float32)
        at = xbase[:, None] + pos[None, :] * sxl
        v = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
        dx = (
            g * scale[:, None] + coef[:, None] * (v - mean_in[:, None]) +
            shift[:, None])
        tl.store(dx_ptr + at, dx.to(dx_ptr.dtype.element_ty), mask=ok)
    if (tile == 0) & (s == 0):  # one program: the ratio-logit gradients
        _logit_grads(bws_ptr, pg_ptr, mlog_ptr, vlog_ptr, fixed_ptr,
                     fixed_ratio_ptr, N, C, G, SPLIT, GB, WB, K, HAS_IN,
                     RATIOS_GIVEN, HAS_FIXED)


# -- host side ------------------------------------------------------------


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
# A detector's layers meet a few hundred (shape, layout) pairs at a few
# image sizes; the bounds hold several of those at once.
_PLANS = _LRU(1024)


def _target_programs(device: torch.device) -> int:
    """Programs that keep every multiprocessor busy (four per SM)."""
    if device.type != 'cuda':
        return 4  # Triton's interpreter: few programs, quick tests
    index = device.index if device.index is not None else \
        torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(
            index).multi_processor_count
    return 4 * _SM_COUNT[index]


def _plan(n: int, c: int, length: int, stride_c: int, stride_l: int,
          device: torch.device):
    """Tile shape, chunks per row and launch grids for one shape and
    layout; cached."""
    key = (n, c, length, stride_c, stride_l, device)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    rows_total = n * c
    if stride_c == 1 and stride_l != 1 and c > 1:
        # channels_last: a tile spans channels, whose values are adjacent.
        rows = min(_pow2(c), 64)
        block = max(min(_TILE // rows, _pow2(length)), 1)
    else:
        block = min(max(_pow2(length), 16), 1024)
        rows = max(1, _TILE // block)
    tiles = triton.cdiv(rows_total, rows)
    split, target = 1, _target_programs(device)
    limit = min(triton.cdiv(length, block), _MAX_SPLIT)
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
        ws=_ws_size.fn(rows_total, c, split),
        bws=_bws_size.fn(rows_total, c, split))
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
# The key holds what that specialisation depends on (the sizes, strides and
# dtypes of the plan, the flags, every pointer's 16-byte alignment).
_DIRECT = {'on': not _INTERPRET}
_COMPILED = _LRU(4096)  # six kernels per plan


def _launch(kernel, key, grid, args, device_index):
    compiled = _COMPILED.get(key)
    if compiled is not None:
        try:
            _compat.launch_directly(compiled, grid, device_index, args)
            return
        except TypeError as err:  # another Triton's launcher: its own path
            _DIRECT['on'] = False
            _COMPILED.clear()
            warnings.warn(f'sn_mm: launching Triton kernels directly failed '
                          f'({err}); using Triton\'s launch path')
    compiled = kernel[grid](*args)
    if key is not None and _DIRECT['on'] and _compat.can_launch_directly(
            compiled):
        _COMPILED[key] = compiled


def logit_blocks(c: int, groups: int):
    """The logit gradients' tile: (groups, channels of a group)."""
    wb = min(_pow2(c // groups), 256)
    return min(_pow2(groups), max(1024 // wb, 1)), wb


def _ratio_groups(mean_logits: Tensor):
    """(G, K): group SN's logits are (G, K), SN's (K,)."""
    if mean_logits.dim() == 2:
        return mean_logits.shape[0], mean_logits.shape[1]
    return 1, mean_logits.shape[0]


def _aligned(*tensors) -> bool:
    return all(t.data_ptr() % 16 == 0 for t in tensors)


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
    key = None
    device_index = -1
    if _DIRECT['on'] and x3.is_cuda and _aligned(
            x3, weight, bias, mean_logits, var_logits, rmean, rvar, count, bad,
            fixed, fixed_r):
        device_index = x3.get_device()
        key = (plan['key'], x3.dtype, groups, k, has_in, ratios_given,
               has_fixed, bn_batch, cumulative, sync, count_bad)
    _launch(_moments_kernel, key and ('m', ) + key, grid,
            (x3, ws, n * c, c, length, chunk, sxn, sxc, sxl, split, rows,
             block, chunk == block), device_index)
    _launch(_stats_kernel, key and ('s', ) + key,
            (n + c if bn_batch else n, 1),
            (ws, n, c, length, chunk, divisor, split, plan['cb'], plan['nb'],
             sync), device_index)
    if sync:
        _combine_over_group(ws, n, c, plan, running_mean, running_var, nbt,
                            momentum, group, nonfinite)
    _launch(_normalize_kernel, key and ('n', ) + key, grid,
            (x3, y, ws, weight, bias, mean_logits, var_logits, fixed, fixed_r,
             rmean, rvar, count, bad, n, c, groups, length, chunk, divisor,
             float(eps), 0. if cumulative else float(momentum), sxn, sxc, sxl,
             split, rows, block, k, has_in, ratios_given, has_fixed, bn_batch,
             update, plan['cb'], cumulative, count_bad, groups > 1),
            device_index)
    if update:
        _bump(running_mean, running_var, nbt,
              *([nonfinite] if count_bad else []))
    return y, ws, plan, key


def _bn_slots(ws, n, c, plan):
    """Views of the BN mean and variance (C each) and the group's sample
    count (1) in the workspace."""
    start = _ws_bn.fn(n * c, c, plan['split'])
    return (ws[start:start + c], ws[start + c:start + 2 * c],
            ws[start + 2 * c:start + 2 * c + 1])


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
    try:
        torch.autograd.graph.increment_version(tensors)
    except TypeError:  # a torch that takes one tensor at a time
        for t in tensors:
            torch.autograd.graph.increment_version(t)


class TritonSwitchableNorm(torch.autograd.Function):
    """SN's forward and backward on the six kernels of this module."""

    @staticmethod
    def forward(ctx, x3, weight, bias, mean_logits, var_logits, state):
        y, ws, plan, key = _forward(x3, weight, bias, mean_logits, var_logits,
                                    *state)
        running_mean, running_var, training = state[0], state[1], state[5]
        ctx.state = state
        ctx.plan = plan
        ctx.key = key  # None: no direct launches (see _launch)
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
         unbiased, ratios_given, group, _) = ctx.state
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
        key = None
        device_index = -1
        # The forward's tensors were aligned if it launched directly.
        if ctx.key is not None and grad_y.data_ptr() % 16 == 0:
            device_index = x3.get_device()
            key = ctx.key + (grad_y.dtype, sgn, sgc, sgl)
        _launch(_grad_sums_kernel, key and ('gs', ) + key, grid,
                (grad_y, x3, ws, bws, n * c, c, length, chunk, sgn, sgc, sgl,
                 sxn, sxc, sxl, split, rows, block), device_index)
        _launch(_grad_stats_kernel, key and ('gt', ) + key, (n + c, 1),
                (ws, bws, pg, weight, rmean, rvar, mean_logits, var_logits,
                 fixed, fixed_r, n, c, groups, split, plan['cb'], plan['nb'],
                 k, has_in, ratios_given, has_fixed, bn_batch, groups > 1),
                device_index)
        if sync:
            # The shared BN statistics collect gradient from every rank.
            start = _bws_bn.fn(n * c, c, split)
            torch.distributed.all_reduce(bws[start:start + 2 * c], group=group)
        _launch(_input_grad_kernel, key and ('ig', ) + key, grid,
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
    """create_graph=True: differentiate a recomputed forward of the
    reference (PyTorch ops, float32), so that every higher derivative is
    exact."""
    x3, weight, bias, mean_logits, var_logits = ctx.saved_tensors[:5]
    (running_mean, running_var, _, ratio_fixed, fixed_ratios, training, _, eps,
     unbiased, ratios_given, group, _) = ctx.state
    if group is not None:
        raise RuntimeError(
            'SyncSN: double backward (create_graph=True) across several '
            'processes is not supported; on one process (or with SN) it '
            'is exact')
    inputs = (x3, weight, bias, mean_logits, var_logits)
    wanted = [i for i, need in enumerate(ctx.needs_input_grad[:5]) if need]
    y = reference_forward(x3.float(), weight, bias, mean_logits, var_logits,
                          running_mean, running_var, training, eps, unbiased,
                          ratio_fixed, fixed_ratios, ratios_given)[0]
    grads = torch.autograd.grad(
        y, [inputs[i] for i in wanted],
        grad_y.float(),
        create_graph=True,
        allow_unused=True)
    result = [None] * 6
    for i, g in zip(wanted, grads):
        result[i] = torch.zeros_like(inputs[i]) if g is None else g
    return tuple(result)


def applies(x: Tensor, weight: Tensor, running_mean: Optional[Tensor]) -> bool:
    """Whether these kernels take a call (the kernel choice aside): a
    non-empty float32/bfloat16/float16 input on a GPU (or any device in
    Triton's interpreter) with float32 parameters and statistics."""
    return ((x.is_cuda or _INTERPRET) and x.dtype in FUSED_DTYPES
            and weight.dtype is torch.float32 and x.numel() > 0
            and (running_mean is None or running_mean.dtype is torch.float32))


_WORKS = {}


def works_on(x: Tensor) -> bool:
    """Whether these kernels compile and agree with the reference on
    ``x``'s device: checked once per device, on a small layer (training
    forward and backward, then eval). Where they do not (a Triton these
    kernels do not compile with, say), SN's default ('auto') runs on
    PyTorch ops there, with a warning saying why; ``kernels='triton'``
    still runs them, so that the error shows."""
    index = x.get_device()
    works = _WORKS.get(index)
    if works is None:
        works = _WORKS[index] = _probe(x.device)
    return works


def _reference_call(x, weight, bias, mean_logits, var_logits, running_mean,
                    running_var, nbt, training):
    return switchable_norm_reference(x, weight, bias, mean_logits, var_logits,
                                     running_mean, running_var, nbt, training,
                                     0.1, 1e-5, True)


_PROBE_PARAMS = ('weight', 'bias', 'mean_weight', 'var_weight')


def _probe(device: torch.device) -> bool:
    gen = torch.Generator().manual_seed(0)
    shape = (3, 4, 3, 5)
    x = torch.randn(shape, generator=gen) * 2 + 1
    grad = torch.randn(shape, generator=gen)
    params = [
        torch.rand(4, generator=gen) + 0.5,
        torch.randn(4, generator=gen),
        torch.randn(3, generator=gen),
        torch.randn(3, generator=gen)
    ]
    results = []
    try:
        with torch.inference_mode(False), torch.enable_grad(), \
                torch.autocast(device.type, enabled=False):
            for fn in (_fused_call, _reference_call):
                xs = x.to(device).requires_grad_()
                ps = [p.to(device).requires_grad_() for p in params]
                running = [
                    torch.zeros(4, device=device),
                    torch.ones(4, device=device),
                    torch.zeros((), dtype=torch.long, device=device)
                ]
                y = fn(xs, *ps, *running, True)
                y.backward(grad.to(device))
                with torch.no_grad():
                    y_eval = fn(xs, *ps, *running, False)
                results.append(
                    dict(
                        output=y,
                        input_grad=xs.grad,
                        **{
                            f'{name} grad': p.grad
                            for name, p in zip(_PROBE_PARAMS, ps)
                        },
                        running_mean=running[0],
                        running_var=running[1],
                        num_batches_tracked=running[2],
                        eval_output=y_eval))
        worst_difference(*results, 1e-3, 'a small layer')
    except Exception as err:  # any failure: the reason goes to the warning
        warnings.warn(
            f'sn_mm: SN\'s fused Triton kernels do not work on '
            f'{device} ({type(err).__name__}: {err}); SN runs on '
            f'PyTorch ops there. kernels=\'triton\' runs them '
            f'anyway.',
            stacklevel=3)
        return False
    return True


def _fused_call(x, weight, bias, mean_logits, var_logits, running_mean,
                running_var, nbt, training):
    return switchable_norm(x, weight, bias, mean_logits, var_logits,
                           running_mean, running_var, nbt, None, None,
                           training, 0.1, 1e-5, True)


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
