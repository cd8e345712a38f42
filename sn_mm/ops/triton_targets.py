"""Where SN's fused Triton kernels run: the GPUs and dtypes this Triton
compiles them for, found by compiling them ahead of time (no GPU needed:
Triton lowers a kernel to PTX and its bundled ptxas assembles a cubin for
the architecture named), and the self-check that SN's default runs on a
GPU before it uses them there.

Triton 3.0 (torch 2.4), for one, cannot compile bfloat16 for GPUs older
than sm_80 (V100, T4): its PTX converts with ``cvt.f32.bf16``, which ptxas
takes from sm_80 on. :func:`target_problem` finds such a refusal before a
training step meets it; :func:`works_on` then runs SN on PyTorch ops on
that GPU for that dtype and says so once.
``tests/triton_fused_compile_check.py`` compiles every kernel case with
:func:`compile_kernel`.
"""
import contextlib
import io
import warnings
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from . import _compat
from . import triton_fused as tf
from . import triton_kernels as tk
from .agreement import worst_difference
from .reference import switchable_norm_reference

# Triton's names of the data dtypes the kernels read and write.
TRITON_DTYPES = {
    torch.float32: 'fp32',
    torch.bfloat16: 'bf16',
    torch.float16: 'fp16'
}
# The pointers to the data (input, output and their gradients) take the data
# dtype; the other pointers are fp32 but for the ones in _OTHER_POINTERS;
# the scalars in _FLOAT_SCALARS are fp32, the other scalars int32.
_FLOAT_SCALARS = ('divisor', 'eps', 'momentum', 'two_over_divisor')
_DATA_POINTERS = ('x_ptr', 'y_ptr', 'g_ptr', 'dx_ptr')
_OTHER_POINTERS = dict(fixed_ptr='*i1', nbt_ptr='*i64', bad_ptr='*i64')


def kernel_signature(kernel, constexprs: dict, data_type: str) -> dict:
    """Triton's signature of ``kernel`` reading and writing ``data_type``
    ('fp32', 'bf16' or 'fp16'), the names in ``constexprs`` compile-time."""
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = 'constexpr'
        elif name in _DATA_POINTERS:
            signature[name] = '*' + data_type
        elif name.endswith('_ptr'):
            signature[name] = _OTHER_POINTERS.get(name, '*fp32')
        elif name in _FLOAT_SCALARS:
            signature[name] = 'fp32'
        else:
            signature[name] = 'i32'
    return signature


def compile_kernel(kernel, constexprs: dict, data_type: str, capability: int):
    """``kernel`` compiled for sm_``capability`` with ``constexprs``, its
    data in ``data_type``; raises what Triton raises where it cannot."""
    return _compat.compile_for_gpu(
        kernel, kernel_signature(kernel, constexprs, data_type), constexprs,
        capability)


def call_cases(shape: Tuple[int, int, int, int, int],
               groups: int = 1) -> List[Tuple[str, Dict]]:
    """(kernel name, compile-time flags) of each kernel an SN training step
    of ``shape`` (N, C, L, stride_c, stride_l) with a BN term runs,
    forward and backward; with ``groups`` > 1 ratio groups (group SN), the
    normalize, BN-statistics and input-gradient kernels as group SN runs
    them instead."""
    n, c, length, stride_c, stride_l = shape
    # (The CPU's plan: fewer chunks per row than a GPU's, the same code.)
    plan = tf._plan(n, c, length, stride_c, stride_l, torch.device('cpu'))
    tiles = dict(SPLIT=plan['split'], ROWS=plan['rows'], BLOCK=plan['block'])
    stats_tiles = dict(SPLIT=plan['split'], CB=plan['cb'], NB=plan['nb'])
    flags = dict(
        K=3,
        HAS_IN=length > 1,
        RATIOS_GIVEN=False,
        HAS_FIXED=True,
        BN_BATCH=True,
        GROUPED=groups > 1)
    gb, wb = tf.logit_blocks(c, groups)
    return [
        ('moments_kernel',
         dict(tiles, ONE_STEP=plan['chunk'] == plan['block'])),
        ('stats_kernel', dict(stats_tiles, LOCAL=False)),
        ('normalize_kernel',
         dict(
             tiles,
             UPDATE=True,
             CB=plan['cb'],
             CUMULATIVE=length == 1,
             COUNT_BAD=True,
             **flags)),
        ('grad_sums_kernel', tiles),
        ('grad_stats_kernel', dict(stats_tiles, **flags)),
        ('input_grad_kernel',
         dict(tiles, SYNC=groups == 1, GB=gb, WB=wb, **flags)),
    ]


# A small layer's step: what the self-check of a new GPU runs.
_PROBE_SHAPE = (3, 4, 15, 15, 1)
_PROBLEMS: Dict[Tuple[int, torch.dtype], Optional[str]] = {}


def target_problem(capability: int, dtype: torch.dtype) -> Optional[str]:
    """Why this Triton cannot compile SN's kernels for sm_``capability``
    (``75`` for a T4) reading and writing ``dtype``, or None where it
    compiles each of them (found once per target and dtype; Triton keeps
    the compiled kernels in its cache)."""
    key = (capability, dtype)
    if key not in _PROBLEMS:
        _PROBLEMS[key] = _compat.untargeted_capability(
            capability) or _first_refusal(capability, dtype)
    return _PROBLEMS[key]


def _first_refusal(capability: int, dtype: torch.dtype) -> Optional[str]:
    for name, constexprs in call_cases(_PROBE_SHAPE):
        _, refusal = try_compile(
            getattr(tk, name), constexprs, TRITON_DTYPES[dtype], capability)
        if refusal is not None:
            return (f'Triton {".".join(map(str, _compat.triton_version()))} '
                    f'cannot compile {name} for sm_{capability} in {dtype}: '
                    f'{refusal}')
    return None


def try_compile(kernel, constexprs: dict, data_type: str, capability: int):
    """(``kernel`` compiled as :func:`compile_kernel` compiles it, None), or
    (None, why this Triton refuses it). An architecture newer than this
    Triton targets is not tried (its LLVM would abort the process)."""
    untargeted = _compat.untargeted_capability(capability)
    if untargeted is not None:
        return None, untargeted
    try:
        # (Triton prints a refused kernel's whole PTX.)
        with contextlib.redirect_stdout(io.StringIO()):
            return compile_kernel(kernel, constexprs, data_type,
                                  capability), None
    except Exception as err:  # whatever Triton or ptxas refuses
        return None, f'{type(err).__name__}: {_first_error(err)}'


def _first_error(err: Exception) -> str:
    """The line of ``err`` that says what was refused: ptxas's first error
    (it prints one per offending instruction), else the first line naming
    an error, else the first line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    for wanted in (lambda line: line.startswith('ptxas') and
                   ('error' in line or 'fatal' in line),
                   lambda line: 'error' in line.lower(), lambda line: True):
        found = [line for line in lines if wanted(line)]
        if found:
            return found[0]
    return ''


# -- the self-check of a GPU -------------------------------------------
_WORKS = {}


def works_on(x: Tensor) -> bool:
    """Whether these kernels compile and agree with the reference on
    ``x``'s device for ``x``'s dtype, checked once per device and dtype
    (:func:`self_check`). Where they do not, SN's default ('auto') runs on
    PyTorch ops there for that dtype, with a warning saying why;
    ``kernels='triton'`` still runs them, so that the error shows."""
    key = (x.get_device(), x.dtype)
    works = _WORKS.get(key)
    if works is None:
        works = _WORKS[key] = self_check(x.device, _capability(x.device),
                                         x.dtype)
    return works


def _capability(device: torch.device) -> Optional[int]:
    if device.type != 'cuda':
        return None  # Triton's interpreter: nothing is compiled
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def self_check(device: torch.device, capability: Optional[int],
               dtype: torch.dtype) -> bool:
    """Whether SN's default may run these kernels on ``device`` for
    ``dtype`` inputs: each kernel compiles for sm_``capability``
    (:func:`target_problem`; None: not compiled,
    as in Triton's interpreter), and a small layer in ``dtype`` (training
    forward and backward, then eval) on ``device`` agrees with the
    reference. Where not, a warning names the device, the dtype and the
    reason, and the result is False."""
    problem = None
    if capability is not None:
        problem = target_problem(capability, dtype)
    if problem is None:
        problem = _probe(device, dtype)
    if problem is None:
        return True
    where = device if capability is None else f'{device} (sm_{capability})'
    warnings.warn(
        f'sn_mm: SN\'s fused Triton kernels do not work on {where} for '
        f'{dtype} inputs ({problem}); SN runs on PyTorch ops there for '
        f'them. kernels=\'triton\' runs them anyway.',
        stacklevel=4)
    return False


def _reference_call(x, weight, bias, mean_logits, var_logits, running_mean,
                    running_var, nbt, training):
    return switchable_norm_reference(x, weight, bias, mean_logits, var_logits,
                                     running_mean, running_var, nbt, training,
                                     0.1, 1e-5, True)


_PROBE_PARAMS = ('weight', 'bias', 'mean_weight', 'var_weight')


def _probe(device: torch.device,
           dtype: torch.dtype = torch.float32) -> Optional[str]:
    """None where the kernels agree with the reference on a small layer
    of ``dtype`` inputs on ``device``, else what went wrong."""
    gen = torch.Generator().manual_seed(0)
    shape = (3, 4, 3, 5)
    x = (torch.randn(shape, generator=gen) * 2 + 1).to(dtype)
    grad = torch.randn(shape, generator=gen).to(dtype)
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
        # (bf16 and fp16 keep 8 and 11 bits of the output.)
        tol = 1e-3 if dtype == torch.float32 else 3e-2
        worst_difference(*results, tol, 'a small layer')
    except Exception as err:  # any failure: the reason goes to the warning
        return f'{type(err).__name__}: {err}'
    return None


def _fused_call(x, weight, bias, mean_logits, var_logits, running_mean,
                running_var, nbt, training):
    return tf.switchable_norm(x, weight, bias, mean_logits, var_logits,
                              running_mean, running_var, nbt, None, None,
                              training, 0.1, 1e-5, True)
