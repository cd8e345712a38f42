"""SN's full-size passes as Triton kernels, for float32 on GPUs.

The same four kernels as the C++ extension (sn_mm/ops/csrc/sn_kernels.cpp),
with the same arguments as their PyTorch versions in ``torch_kernels.py``;
the (N, C) reductions between them stay in PyTorch. Each program takes a tile of
``ROWS`` rows and walks along them ``BLOCK`` elements at a time, so that
short rows (7 x 7 RoI features) fill a tile with many rows and long rows
(high-resolution feature maps) loop.

Everything is float32 (the layer computes in float32 at least); the mixing
weights arrive as a tensor, so nothing waits on the device. Under
``TRITON_INTERPRET=1`` the kernels also run on CPU tensors, which is how the
test-suite checks them on machines without a GPU.
"""
from typing import Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

_MIN_BLOCK = 16  # no degenerate (rows, 1) tiles for one-position inputs
_MAX_BLOCK = 1024
_TILE = 2048  # elements per tile, rows x block


def _config(length: int) -> Tuple[int, int]:
    block = min(max(triton.next_power_of_2(length), _MIN_BLOCK), _MAX_BLOCK)
    rows = max(1, _TILE // block)
    return rows, block


@triton.jit
def _moments_kernel(x_ptr, mean_ptr, var_ptr, rows, length, divisor,
                    ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = r < rows
    base = r.to(tl.int64)[:, None] * length
    cols = tl.arange(0, BLOCK)
    # Deviations from the row's first value: small partial sums when
    # |mean| >> std, so the mean keeps the data's precision.
    shift = tl.load(x_ptr + r.to(tl.int64) * length, mask=row_ok, other=0.0)
    acc = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    for start in range(0, length, BLOCK):
        c = start + cols
        ok = row_ok[:, None] & (c < length)[None, :]
        v = tl.load(x_ptr + base + c[None, :], mask=ok, other=0.0)
        acc += tl.where(ok, v - shift[:, None], 0.0)
    mean = shift + tl.sum(acc, axis=1) / length
    # Second pass about the mean: exact centring, as on the CPU.
    acc = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    for start in range(0, length, BLOCK):
        c = start + cols
        ok = row_ok[:, None] & (c < length)[None, :]
        v = tl.load(x_ptr + base + c[None, :], mask=ok, other=0.0)
        d = tl.where(ok, v - mean[:, None], 0.0)
        acc += d * d
    tl.store(mean_ptr + r, mean, mask=row_ok)
    tl.store(var_ptr + r, tl.sum(acc, axis=1) / divisor, mask=row_ok)


@triton.jit
def _normalize_kernel(x_ptr, y_ptr, mean_in_ptr, var_in_ptr, mu_n_ptr,
                      var_n_ptr, mu_c_ptr, var_c_ptr, weight_ptr, bias_ptr,
                      w_in_ptr, mu_ptr, rstd_ptr, eps, rows, channels, length,
                      ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = r < rows
    n = r // channels
    c = r % channels
    wm_in = tl.load(w_in_ptr)
    wv_in = tl.load(w_in_ptr + 1)
    mu = (wm_in * tl.load(mean_in_ptr + r, mask=row_ok, other=0.0) +
          tl.load(mu_n_ptr + n, mask=row_ok, other=0.0) +
          tl.load(mu_c_ptr + c, mask=row_ok, other=0.0))
    var = (wv_in * tl.load(var_in_ptr + r, mask=row_ok, other=0.0) +
           tl.load(var_n_ptr + n, mask=row_ok, other=1.0) +
           tl.load(var_c_ptr + c, mask=row_ok, other=0.0))
    rstd = 1.0 / tl.sqrt(var + eps)
    scale = tl.load(weight_ptr + c, mask=row_ok, other=0.0) * rstd
    shift = tl.load(bias_ptr + c, mask=row_ok, other=0.0)
    tl.store(mu_ptr + r, mu, mask=row_ok)
    tl.store(rstd_ptr + r, rstd, mask=row_ok)
    base = r.to(tl.int64)[:, None] * length
    cols = tl.arange(0, BLOCK)
    for start in range(0, length, BLOCK):
        cc = start + cols
        ok = row_ok[:, None] & (cc < length)[None, :]
        v = tl.load(x_ptr + base + cc[None, :], mask=ok, other=0.0)
        # x - mu first: no cancellation when |mu| >> std.
        tl.store(y_ptr + base + cc[None, :],
                 (v - mu[:, None]) * scale[:, None] + shift[:, None], mask=ok)


@triton.jit
def _grad_sums_kernel(g_ptr, x_ptr, mean_in_ptr, sum_g_ptr, sum_gxc_ptr, rows,
                      length, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = r < rows
    m = tl.load(mean_in_ptr + r, mask=row_ok, other=0.0)
    base = r.to(tl.int64)[:, None] * length
    cols = tl.arange(0, BLOCK)
    acc_g = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    acc_gx = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    for start in range(0, length, BLOCK):
        c = start + cols
        ok = row_ok[:, None] & (c < length)[None, :]
        g = tl.load(g_ptr + base + c[None, :], mask=ok, other=0.0)
        v = tl.load(x_ptr + base + c[None, :], mask=ok, other=0.0)
        acc_g += g
        acc_gx += g * tl.where(ok, v - m[:, None], 0.0)
    tl.store(sum_g_ptr + r, tl.sum(acc_g, axis=1), mask=row_ok)
    tl.store(sum_gxc_ptr + r, tl.sum(acc_gx, axis=1), mask=row_ok)


@triton.jit
def _input_grad_kernel(g_ptr, x_ptr, dx_ptr, sum_g_ptr, sum_gxc_ptr, mu_ptr,
                       rstd_ptr, weight_ptr, mean_in_ptr, w_in_ptr,
                       dvar_n_ptr, dmean_n_ptr, center_n_ptr, dvar_c_ptr,
                       dmean_c_ptr, center_c_ptr, two_over_divisor, rows,
                       channels, length, ROWS: tl.constexpr,
                       BLOCK: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = r < rows
    n = r // channels
    c = r % channels
    wm_in = tl.load(w_in_ptr)
    wv_in = tl.load(w_in_ptr + 1)
    s1 = tl.load(sum_g_ptr + r, mask=row_ok, other=0.0)
    s2 = tl.load(sum_gxc_ptr + r, mask=row_ok, other=0.0)
    mu = tl.load(mu_ptr + r, mask=row_ok, other=0.0)
    rstd = tl.load(rstd_ptr + r, mask=row_ok, other=0.0)
    mean_in = tl.load(mean_in_ptr + r, mask=row_ok, other=0.0)
    scale = tl.load(weight_ptr + c, mask=row_ok, other=0.0) * rstd
    # The formulas of torch_kernels.input_grad, per row.
    d_mu = -scale * s1
    d_var = -0.5 * scale * rstd * rstd * (s2 - (mu - mean_in) * s1)
    dvar_n = tl.load(dvar_n_ptr + n, mask=row_ok, other=0.0)
    dvar_c = tl.load(dvar_c_ptr + c, mask=row_ok, other=0.0)
    d_var_in = dvar_n + dvar_c + wv_in * d_var
    d_mean_in = (tl.load(dmean_n_ptr + n, mask=row_ok, other=0.0) +
                 tl.load(dmean_c_ptr + c, mask=row_ok, other=0.0) +
                 wm_in * d_mu + 2.0 * (
                     (mean_in - tl.load(center_n_ptr + n, mask=row_ok,
                                        other=0.0)) * dvar_n +
                     (mean_in - tl.load(center_c_ptr + c, mask=row_ok,
                                        other=0.0)) * dvar_c))
    coef_x = d_var_in * two_over_divisor
    shift = d_mean_in / length
    base = r.to(tl.int64)[:, None] * length
    cols = tl.arange(0, BLOCK)
    for start in range(0, length, BLOCK):
        cc = start + cols
        ok = row_ok[:, None] & (cc < length)[None, :]
        g = tl.load(g_ptr + base + cc[None, :], mask=ok, other=0.0)
        v = tl.load(x_ptr + base + cc[None, :], mask=ok, other=0.0)
        tl.store(dx_ptr + base + cc[None, :],
                 g * scale[:, None] + coef_x[:, None] * (v - mean_in[:, None])
                 + shift[:, None], mask=ok)


def _check(x: Tensor, name: str) -> None:
    # Empty inputs never get here (kernels.py keeps them in PyTorch): their
    # null data pointers cannot be handed to a kernel.
    if (x.dtype != torch.float32 or x.dim() != 3 or not x.is_contiguous()
            or not x.numel()):
        raise ValueError(f'{name}: expected a non-empty contiguous float32 '
                         f'(N, C, L) tensor, got {x.dtype} {tuple(x.shape)}')


def _grid(rows: int, tile_rows: int):
    return (triton.cdiv(rows, tile_rows), )


def row_moments(x: Tensor, correction: int) -> Tuple[Tensor, Tensor]:
    _check(x, 'row_moments')
    n, c, length = x.shape
    mean = x.new_empty(n, c)
    var = x.new_empty(n, c)
    rows, block = _config(length)
    _moments_kernel[_grid(n * c, rows)](x, mean, var, n * c, length,
                                        float(max(length - correction, 1)),
                                        ROWS=rows, BLOCK=block)
    return mean, var


def normalize(x: Tensor, mean_in: Tensor, var_in: Tensor, wm_in: Tensor,
              wv_in: Tensor, mu_n: Tensor, var_n: Tensor, mu_c: Tensor,
              var_c: Tensor, weight: Tensor, bias: Tensor,
              eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    _check(x, 'normalize')
    n, c, length = x.shape
    y = torch.empty_like(x)
    mu = x.new_empty(n, c)
    rstd = x.new_empty(n, c)
    rows, block = _config(length)
    w_in = torch.stack([wm_in, wv_in]).to(x)
    _normalize_kernel[_grid(n * c, rows)](
        x, y, mean_in.contiguous(), var_in.contiguous(), mu_n.contiguous(),
        var_n.contiguous(), mu_c.contiguous(), var_c.contiguous(),
        weight.contiguous(), bias.contiguous(), w_in, mu, rstd, eps, n * c,
        c, length, ROWS=rows, BLOCK=block)
    return y, mu, rstd


def row_grad_sums(grad: Tensor, x: Tensor,
                  mean_in: Tensor) -> Tuple[Tensor, Tensor]:
    _check(x, 'row_grad_sums')
    _check(grad, 'row_grad_sums')
    n, c, length = x.shape
    sum_g = x.new_empty(n, c)
    sum_gxc = x.new_empty(n, c)
    rows, block = _config(length)
    _grad_sums_kernel[_grid(n * c, rows)](grad, x, mean_in.contiguous(),
                                          sum_g, sum_gxc, n * c, length,
                                          ROWS=rows, BLOCK=block)
    return sum_g, sum_gxc


def input_grad(grad: Tensor, x: Tensor, sum_g: Tensor, sum_gxc: Tensor,
               mu: Tensor, rstd: Tensor, weight: Tensor, mean_in: Tensor,
               wm_in: Tensor, wv_in: Tensor, dvar_n: Tensor, dmean_n: Tensor,
               center_n: Tensor, dvar_c: Tensor, dmean_c: Tensor,
               center_c: Tensor, correction: int) -> Tensor:
    _check(x, 'input_grad')
    _check(grad, 'input_grad')
    n, c, length = x.shape
    dx = torch.empty_like(x)
    rows, block = _config(length)
    w_in = torch.stack([wm_in, wv_in]).to(x)
    _input_grad_kernel[_grid(n * c, rows)](
        grad, x, dx, sum_g.contiguous(), sum_gxc.contiguous(),
        mu.contiguous(), rstd.contiguous(), weight.contiguous(),
        mean_in.contiguous(), w_in, dvar_n.contiguous(), dmean_n.contiguous(),
        center_n.contiguous(), dvar_c.contiguous(), dmean_c.contiguous(),
        center_c.contiguous(),
        2.0 / max(length - correction, 1), n * c, c, length, ROWS=rows,
        BLOCK=block)
    return dx
