"""SN's six fused Triton kernels, and the helpers and workspace layout
they share; the host side that plans and launches them, the autograd
Function and the SyncSN exchange are in :mod:`sn_mm.ops.triton_fused`.

Forward: (1) each row's IN moments (a row split into chunks across programs
where rows are few and long; a chunk of one tile in two passes over
registers, a longer one by Welford's update per lane), (2) one program per
sample for LN's statistics and one per channel for BN's, with the running-
statistics update, (3) the mixing (softmax or fixed ratios, computed in the
kernel from the logits) and the normalisation. Backward: (4) each row's
gradient sums, (5) the per-sample and per-channel sums of the mixed
statistics' gradients, grad_weight and grad_bias, (6) the input gradient,
and in one program the ratio-logit gradients. Group SN (logits (G, K)) runs
on the same kernels: each row takes its ratios from its channel's group,
each channel's program leaves its terms of the ratio gradients, and the
logit gradients sum them over each group's channels.

Statistics are float32 whatever the input's dtype; the kernels take
strides, so that contiguous and channels_last inputs need no copy.
"""
import triton
import triton.language as tl

# Triton specialises a kernel on its integer arguments (divisible by 16 or
# not, equal to 1 or not), and each specialisation is a compile, seconds on
# first use. The counts that change with the batch (R, N, C) are exempt
# (do_not_specialize); strides and the row length are not: they decide
# alignment and vector loads.

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
        m2 = tl.load(
            ws_ptr + ws_at(WS_M2, R, 1, SPLIT) + r, mask=ok, other=0.0)
    else:
        s = tl.arange(0, SPLIT)
        idx = _chunk_at(r[:, None], s[None, :], SPLIT)
        pm = tl.load(ws_ptr + idx, mask=ok[:, None], other=0.0)
        pm2 = tl.load(
            ws_ptr + ws_at(WS_M2, R, 1, SPLIT) + idx,
            mask=ok[:, None],
            other=0.0)
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
# gradients (5 x C). Each plane's size is stated once, in ws_at and
# bws_at; the host calls them too, through their ``.fn``.

# The planes of each, in order: ws_at(WS_LN, ...) is where LN's statistics
# start, ws_at(WS_END, ...) the workspace's size.
WS_M2 = tl.constexpr(1)
WS_ROWS = tl.constexpr(2)
WS_LN = tl.constexpr(3)
WS_BN = tl.constexpr(4)
WS_SHIFT = tl.constexpr(5)
WS_END = tl.constexpr(6)
BWS_GX = tl.constexpr(1)
BWS_LN = tl.constexpr(2)
BWS_BN = tl.constexpr(3)
BWS_PARTS = tl.constexpr(4)
BWS_END = tl.constexpr(5)


@triton.jit
def ws_at(plane: tl.constexpr, R, C, SPLIT: tl.constexpr):
    """Where ``plane`` starts in a forward's workspace: the sizes of the
    planes before it, each stated once (C may be any value before WS_BN)."""
    at = R * 0
    if plane > 0:  # the chunks' partial means
        at += R * SPLIT
    if plane > 1:  # their partial centred second moments
        at += R * SPLIT
    if plane > 2:  # mean_in, var_in, mu, rstd
        at += 4 * R
    if plane > 3:  # LN's mean and variance
        at += 2 * (R // C)
    if plane > 4:  # BN's mean and variance, their sample count
        at += 2 * C + 1
    if plane > 5:  # the channels' shifts
        at += C
    return at


@triton.jit
def bws_at(plane: tl.constexpr, R, C, SPLIT: tl.constexpr):
    """Where ``plane`` starts in a backward's workspace (C may be any value
    before BWS_BN)."""
    at = R * 0
    if plane > 0:  # the chunks' partial sums of g
        at += R * SPLIT
    if plane > 1:  # and of g (x - mean_in)
        at += R * SPLIT
    if plane > 2:  # the LN mean's and variance's gradients
        at += 2 * (R // C)
    if plane > 3:  # the BN mean's and variance's gradients
        at += 2 * C
    if plane > 4:  # each channel's terms of the ratio gradients
        at += 5 * C
    return at


# Inside the LN and BN planes, and their gradients' planes, the statistics
# lie one after another, each ``size`` long (N for LN, C for BN): the means,
# the variances, then (BN's forward plane only) the sample count, 1 long.
STAT_MEAN = tl.constexpr(0)
STAT_VAR = tl.constexpr(1)
STAT_COUNT = tl.constexpr(2)


@triton.jit
def stat_at(stat: tl.constexpr, size):
    """Where ``stat`` starts inside an LN or BN plane of ``size`` samples
    or channels."""
    at = size * 0
    if stat > 0:  # the means
        at += size
    if stat > 1:  # the variances
        at += size
    return at


@triton.jit
def _chunk_at(r, s, SPLIT: tl.constexpr):
    """Where row r's chunk s sits in a plane of R x SPLIT partials."""
    return r * SPLIT + s


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
        s2 = tl.load(
            bws_ptr + bws_at(BWS_GX, R, 1, SPLIT) + r, mask=ok, other=0.0)
    else:
        s = tl.arange(0, SPLIT)
        idx = _chunk_at(r[:, None], s[None, :], SPLIT)
        s1 = tl.sum(tl.load(bws_ptr + idx, mask=ok[:, None], other=0.0), 1)
        s2 = tl.sum(
            tl.load(
                bws_ptr + bws_at(BWS_GX, R, 1, SPLIT) + idx,
                mask=ok[:, None],
                other=0.0), 1)
    base = ws_at(WS_ROWS, R, 1, SPLIT)
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
def moments_kernel(x_ptr, ws_ptr, R, C, L, chunk, sxn, sxc, sxl,
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
            ws_ptr + ws_at(WS_SHIFT, R, C, SPLIT) + c,
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
    idx = _chunk_at(r, s, SPLIT)
    tl.store(ws_ptr + idx, mean_r, mask=row_ok)
    tl.store(ws_ptr + ws_at(WS_M2, R, 1, SPLIT) + idx, m2_r, mask=row_ok)


@triton.jit
def _ln_stats(ws_ptr, n, N, C, L, chunk, divisor, SPLIT: tl.constexpr,
              CB: tl.constexpr):
    R = N * C
    out = ws_at(WS_LN, R, 1, SPLIT)
    idx = tl.arange(0, CB)
    acc = tl.zeros((CB, ), tl.float32)
    shifts = ws_ptr + ws_at(WS_SHIFT, R, C, SPLIT)
    # The channels' means about the first channel's shift: the shifts'
    # differences are exact and the means' keep their precision (as
    # absolute float32 values, means of 1e4 would round them to 1e-3).
    shift0 = tl.load(shifts)
    for c0 in range(0, C, CB):
        ok = c0 + idx < C
        mean, _ = _row_moments(ws_ptr, n * C + c0 + idx, ok, R, L, chunk,
                               divisor, SPLIT)
        mean += tl.load(shifts + c0 + idx, mask=ok, other=0.0) - shift0
        acc += tl.where(ok, mean, 0.0)
    mean_ln = tl.sum(acc, 0) / C
    acc = tl.zeros((CB, ), tl.float32)
    for c0 in range(0, C, CB):
        ok = c0 + idx < C
        mean, var = _row_moments(ws_ptr, n * C + c0 + idx, ok, R, L, chunk,
                                 divisor, SPLIT)
        mean += tl.load(shifts + c0 + idx, mask=ok, other=0.0) - shift0
        dev = mean - mean_ln
        acc += tl.where(ok, var + dev * dev, 0.0)
    tl.store(ws_ptr + out + n, shift0 + mean_ln)
    tl.store(ws_ptr + out + stat_at(STAT_VAR, N) + n, tl.sum(acc, 0) / C)


@triton.jit
def _bn_stats(ws_ptr, c, N, C, L, chunk, divisor, SPLIT: tl.constexpr,
              NB: tl.constexpr, LOCAL: tl.constexpr):
    R = N * C
    out = ws_at(WS_BN, R, C, SPLIT)
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
    shift = tl.load(ws_ptr + ws_at(WS_SHIFT, R, C, SPLIT) + c)
    tl.store(ws_ptr + out + c, shift + mean_bn)
    if LOCAL:  # this rank's share: the centred second moment, not / N
        tl.store(ws_ptr + out + stat_at(STAT_VAR, C) + c, tl.sum(acc, 0))
    else:
        tl.store(ws_ptr + out + stat_at(STAT_VAR, C) + c, tl.sum(acc, 0) / N)


@triton.jit(do_not_specialize=['N', 'C'])
def stats_kernel(ws_ptr, N, C, L, chunk, divisor, SPLIT: tl.constexpr,
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
    bn = ws_ptr + ws_at(WS_BN, R, C, SPLIT)
    idx = tl.arange(0, CB)
    bad = tl.zeros((CB, ), tl.int32)
    for c0 in range(0, C, CB):
        ok = c0 + idx < C
        m = tl.load(bn + c0 + idx, mask=ok, other=0.0)
        v = tl.load(bn + stat_at(STAT_VAR, C) + c0 + idx, mask=ok, other=0.0)
        # NaN fails every comparison, infinities this one.
        finite = (tl.abs(m) <= _FLOAT32_MAX) & (tl.abs(v) <= _FLOAT32_MAX)
        bad += tl.where(ok & (finite == 0), 1, 0)
    if tl.sum(bad, 0) == 0:
        count = tl.load(nbt_ptr) + 1
        if CUMULATIVE:
            mom = 1.0 / count.to(tl.float32)
        else:
            mom = momentum
        for c0 in range(0, C, CB):
            ok = c0 + idx < C
            m = tl.load(bn + c0 + idx, mask=ok, other=0.0)
            v = tl.load(
                bn + stat_at(STAT_VAR, C) + c0 + idx, mask=ok, other=0.0)
            rm = tl.load(rmean_ptr + c0 + idx, mask=ok, other=0.0)
            rv = tl.load(rvar_ptr + c0 + idx, mask=ok, other=0.0)
            tl.store(rmean_ptr + c0 + idx, rm * (1 - mom) + mom * m, mask=ok)
            tl.store(rvar_ptr + c0 + idx, rv * (1 - mom) + mom * v, mask=ok)
        tl.store(nbt_ptr, count)
    elif COUNT_BAD:
        tl.store(bad_ptr, tl.load(bad_ptr) + 1)


@triton.jit(do_not_specialize=['N', 'C'])
def normalize_kernel(x_ptr, y_ptr, ws_ptr, w_ptr, b_ptr, mlog_ptr, vlog_ptr,
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
        ws_ptr + ws_at(WS_SHIFT, R, C, SPLIT) + c, mask=row_ok, other=0.0)
    grp = _group_of(c, C, G, GROUPED)
    wm0, wm1, wm2 = _ratios(mlog_ptr + grp * K, fixed_ptr, fixed_ratio_ptr,
                            grp, K, HAS_IN, RATIOS_GIVEN, HAS_FIXED)
    wv0, wv1, wv2 = _ratios(vlog_ptr + grp * K, fixed_ptr, fixed_ratio_ptr,
                            G + grp, K, HAS_IN, RATIOS_GIVEN, HAS_FIXED)
    stats = ws_at(WS_ROWS, R, 1, SPLIT)
    ln = ws_at(WS_LN, R, 1, SPLIT)
    # The mean as the row's plus weighted differences from it (the ratios
    # sum to 1): no |mean|-sized products to round.
    mu = mean_in + wm1 * (
        tl.load(ws_ptr + ln + n, mask=row_ok, other=0.0) - mean_in)
    var = wv0 * var_in + wv1 * tl.load(
        ws_ptr + ln + stat_at(STAT_VAR, N) + n, mask=row_ok, other=0.0)
    if K == 3:
        if BN_BATCH:
            bn = ws_at(WS_BN, R, C, SPLIT)
            mean_bn = tl.load(ws_ptr + bn + c, mask=row_ok, other=0.0)
            var_bn = tl.load(
                ws_ptr + bn + stat_at(STAT_VAR, C) + c, mask=row_ok, other=0.0)
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
def grad_sums_kernel(g_ptr, x_ptr, ws_ptr, bws_ptr, R, C, L, chunk, sgn, sgc,
                     sgl, sxn, sxc, sxl, SPLIT: tl.constexpr,
                     ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    s = tl.program_id(1)
    row_ok = r < R
    _, _, xbase = _row_offsets(r, C, sxn, sxc)
    _, _, gbase = _row_offsets(r, C, sgn, sgc)
    mean_in = tl.load(
        ws_ptr + ws_at(WS_ROWS, R, 1, SPLIT) + r, mask=row_ok, other=0.0)
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
    idx = _chunk_at(r, s, SPLIT)
    tl.store(bws_ptr + idx, tl.sum(acc_g, 1), mask=row_ok)
    tl.store(
        bws_ptr + bws_at(BWS_GX, R, 1, SPLIT) + idx,
        tl.sum(acc_gx, 1),
        mask=row_ok)


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
    out = bws_at(BWS_LN, R, 1, SPLIT)
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
    tl.store(bws_ptr + out + stat_at(STAT_VAR, N) + n, tl.sum(acc_var, 0))


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
    ln = ws_at(WS_LN, R, 1, SPLIT)
    bn = ws_at(WS_BN, R, C, SPLIT)
    parts = bws_ptr + bws_at(BWS_PARTS, R, C, SPLIT) + c
    idx = tl.arange(0, NB)
    w = tl.load(w_ptr + c)
    if K == 3:
        if BN_BATCH:
            mean_bn = tl.load(ws_ptr + bn + c)
            var_bn = tl.load(ws_ptr + bn + stat_at(STAT_VAR, C) + c)
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
        var_ln = tl.load(
            ws_ptr + ln + stat_at(STAT_VAR, N) + n0 + idx, mask=ok, other=0.0)
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
    bn_grads = bws_at(BWS_BN, R, C, SPLIT)
    tl.store(bws_ptr + bn_grads + c, wm2 * tl.sum(acc_mu, 0))
    tl.store(bws_ptr + bn_grads + stat_at(STAT_VAR, C) + c, wv2 * d_var_c)
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
def grad_stats_kernel(ws_ptr, bws_ptr, pg_ptr, w_ptr, rmean_ptr, rvar_ptr,
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
    parts = bws_ptr + bws_at(BWS_PARTS, N * C, C, SPLIT)
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
def input_grad_kernel(g_ptr, x_ptr, dx_ptr, ws_ptr, bws_ptr, pg_ptr, w_ptr,
                      mlog_ptr, vlog_ptr, fixed_ptr, fixed_ratio_ptr, N, C, G,
                      L, chunk, two_over_divisor, sgn, sgc, sgl, sxn, sxc, sxl,
                      SPLIT: tl.constexpr, ROWS: tl.constexpr,
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
    ln_grads = bws_at(BWS_LN, R, 1, SPLIT)
    # Back through LN's (per sample; the sums carry their ratios) and BN's
    # (per channel) statistics to each row's IN mean and variance (Eq. 5
    # reversed).
    dvar_n = tl.load(
        bws_ptr + ln_grads + stat_at(STAT_VAR, N) + n, mask=row_ok,
        other=0.0) / C
    d_var_in = dvar_n + wv0 * d_var
    d_mean_in = (
        tl.load(bws_ptr + ln_grads + n, mask=row_ok, other=0.0) / C +
        wm0 * d_mu + 2.0 * dvar_n * (mean_in - tl.load(
            ws_ptr + ws_at(WS_LN, R, 1, SPLIT) + n, mask=row_ok, other=0.0)))
    if K == 3:
        if BN_BATCH:
            bn = ws_at(WS_BN, R, C, SPLIT)
            bn_grads = bws_at(BWS_BN, R, C, SPLIT)
            if SYNC:  # the batch over the group
                count = tl.load(ws_ptr + bn + stat_at(STAT_COUNT, C))
            else:
                count = N * 1.0
            dvar_c = tl.load(
                bws_ptr + bn_grads + stat_at(STAT_VAR, C) + c,
                mask=row_ok,
                other=0.0) / count
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
