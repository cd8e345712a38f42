"""Compiles the fused Triton SN kernels (sn_mm/ops/triton_kernels.py) for
NVIDIA GPUs without one: Triton lowers them to PTX and ptxas assembles a
cubin, so type and lowering errors that the interpreter lets through show
up here. Run as a script without TRITON_INTERPRET set (the tests do);
prints one line per kernel and case."""
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sn_mm.ops import triton_fused as tf
from sn_mm.ops import triton_kernels as tk

FLOATS = ('divisor', 'eps', 'momentum', 'two_over_divisor')
DATA = ('x_ptr', 'y_ptr', 'g_ptr', 'dx_ptr')


def signature_of(kernel, constexprs, floats, pointer_types):
    """Triton's signature for ``kernel``: constexprs as given, pointers
    float32 unless ``pointer_types`` names them, ``floats`` as fp32 scalars,
    other arguments int32."""
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = 'constexpr'
        elif name.endswith('_ptr'):
            signature[name] = pointer_types.get(name, '*fp32')
        elif name in floats:
            signature[name] = 'fp32'
        else:
            signature[name] = 'i32'
    return signature


def compile_source(kernel, signature, constexprs, arch):
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget('cuda', arch, 32))


def compile_kernel(kernel, constexprs, data_type, arch):
    pointers = {name: '*' + data_type for name in DATA}
    pointers.update(fixed_ptr='*i1', nbt_ptr='*i64', bad_ptr='*i64')
    return compile_source(kernel,
                          signature_of(kernel, constexprs, FLOATS, pointers),
                          constexprs, arch)


def blocks(c, groups):
    gb, wb = tf.logit_blocks(c, groups)
    return dict(GB=gb, WB=wb)


def main():
    # (N, C, L, stride_c, stride_l): contiguous long rows (split), RoI
    # rows, channels_last, one position.
    shapes = [(2, 256, 60800, 60800, 1), (16, 256, 49, 49, 1),
              (8, 256, 3136, 1, 256), (4, 64, 1, 1, 1)]
    # Group SN: two groups, or one per channel (a group's tile of 1).
    for (n, c, length, sc, sl), groups in zip(shapes, (2, 2, 32, 64)):
        # (The CPU's plan: fewer chunks per row than a GPU's, the same code.)
        plan = tf._plan(n, c, length, sc, sl, tf.torch.device('cpu'))
        tiles = dict(
            SPLIT=plan['split'], ROWS=plan['rows'], BLOCK=plan['block'])
        flags = dict(
            K=3,
            HAS_IN=length > 1,
            RATIOS_GIVEN=False,
            HAS_FIXED=True,
            BN_BATCH=True,
            GROUPED=False)
        # Group SN: the kernels that take each row's ratios from its group.
        grouped = dict(flags, GROUPED=True)
        cases = [
            ('moments_kernel',
             dict(tiles, ONE_STEP=plan['chunk'] == plan['block'])),
            ('stats_kernel',
             dict(
                 SPLIT=plan['split'],
                 CB=plan['cb'],
                 NB=plan['nb'],
                 LOCAL=False)),
            ('normalize_kernel',
             dict(
                 tiles,
                 UPDATE=True,
                 CB=plan['cb'],
                 CUMULATIVE=length == 1,
                 COUNT_BAD=True,
                 **flags)),
            ('grad_sums_kernel', tiles),
            ('grad_stats_kernel',
             dict(SPLIT=plan['split'], CB=plan['cb'], NB=plan['nb'], **flags)),
            ('input_grad_kernel',
             dict(tiles, SYNC=True, **flags, **blocks(c, 1))),
            ('normalize_kernel',
             dict(
                 tiles,
                 UPDATE=True,
                 CB=plan['cb'],
                 CUMULATIVE=False,
                 COUNT_BAD=True,
                 **grouped)),
            ('grad_stats_kernel',
             dict(
                 SPLIT=plan['split'], CB=plan['cb'], NB=plan['nb'],
                 **grouped)),
            ('input_grad_kernel',
             dict(tiles, SYNC=False, **grouped, **blocks(c, groups))),
        ]
        for name, constexprs in cases:
            for data_type in ('fp32', 'bf16'):
                compiled = compile_kernel(
                    getattr(tk, name), constexprs, data_type, 90)
                print(
                    f'{name} {n}x{c}x{length} {data_type} '
                    f'grouped={constexprs.get("GROUPED", False)} sm_90 '
                    f'cubin={len(compiled.asm["cubin"])}',
                    flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
