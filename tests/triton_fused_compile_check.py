"""Compiles the fused Triton SN kernels (sn_mm/ops/triton_kernels.py) for
NVIDIA GPUs without one: Triton lowers them to PTX and ptxas assembles a
cubin, so type and lowering errors that the interpreter lets through show
up here. Run as a script without TRITON_INTERPRET set (the tests do);
prints one line per kernel and case.

Without arguments, a cross-section (the suite's check): 72 compiles, each
of its 9 kernel cases for every architecture from sm_70 (V100) to sm_120
(RTX 50), in fp32 or bf16 (:func:`rotated_arch`). A case this Triton
refuses (an architecture newer than it targets is not tried: its LLVM
would abort) is printed as refused, with the reason; the exit status is 1
where SN's self-check on such a GPU would not refuse it too
(:func:`sn_mm.ops.triton_targets.target_problem`), so that its first
training step would fail. With ``--all``, every
combination of compile-time flags the host code (triton_fused.py) can
produce, on an H100's or H200's plans (528 programs), for sm_80, sm_90 and,
where this Triton targets it, sm_100, each named in the output; ``--jobs``
compiles in that many processes."""
import argparse
import itertools
import sys
from concurrent.futures import ProcessPoolExecutor

from sn_mm.ops import _compat
from sn_mm.ops import triton_fused as tf
from sn_mm.ops import triton_kernels as tk
from sn_mm.ops import triton_targets


def blocks(c, groups):
    gb, wb = tf.logit_blocks(c, groups)
    return dict(GB=gb, WB=wb)


def sample():
    # (N, C, L, stride_c, stride_l): contiguous long rows (split), RoI
    # rows, channels_last, one position; group SN with two groups, or one
    # per channel (a group's tile of 1).
    shapes = [(2, 256, 60800, 60800, 1), (16, 256, 49, 49, 1),
              (8, 256, 3136, 1, 256), (4, 64, 1, 1, 1)]
    compiled, refused = 0, []
    for shape_index, (shape, groups) in enumerate(zip(shapes, (2, 2, 32, 64))):
        n, c, length = shape[:3]
        # SN's kernels, then the three that group SN runs differently.
        cases = triton_targets.call_cases(shape) + [
            case for case in triton_targets.call_cases(shape, groups)
            if case[1].get('GROUPED')
        ]
        for k, (name, constexprs) in enumerate(cases):
            for d, data_type in enumerate(('fp32', 'bf16')):
                arch = rotated_arch(k, shape_index, d)
                what = (f'{name} {n}x{c}x{length} {data_type} '
                        f'grouped={constexprs.get("GROUPED", False)} '
                        f'sm_{arch}')
                kernel, refusal = triton_targets.try_compile(
                    getattr(tk, name), constexprs, data_type, arch)
                if refusal is not None:  # named below, never skipped
                    refused.append((what, arch, data_type))
                    print(f'{what} refused: {refusal}', flush=True)
                    continue
                compiled += 1
                print(f'{what} cubin={len(kernel.asm["cubin"])}', flush=True)
    return report_refusals(compiled, refused)


DTYPES_BY_NAME = {
    name: dtype
    for dtype, name in triton_targets.TRITON_DTYPES.items()
}


def report_refusals(compiled, refused):
    """Exit status 0 where every refused (architecture, dtype) is one that
    SN's self-check refuses too (SN then runs on PyTorch ops there); 1
    where one is not: that GPU's first training step would fail."""
    unforeseen = [
        what
        for what, arch, data_type in refused if triton_targets.target_problem(
            arch, DTYPES_BY_NAME[data_type]) is None
    ]
    version = '.'.join(map(str, _compat.triton_version()))
    print(f'Triton {version}: {compiled} compiled, {len(refused)} refused; '
          f'{len(refused) - len(unforeseen)} of the refused where SN\'s '
          'self-check (triton_targets.target_problem) runs SN on PyTorch '
          'ops')
    for what in unforeseen:
        print(
            f'NOT FORESEEN: {what} fails, but the self-check compiles',
            flush=True)
    return 1 if unforeseen else 0


# The NVIDIA architectures users train on: V100, T4, A100, A10/RTX 30,
# RTX 40/L4, H100/H200, B200, RTX 50.
ARCHS = (70, 75, 80, 86, 89, 90, 100, 120)


def rotated_arch(kernel_case, shape_index, dtype_index):
    """The architecture one case of the cross-section compiles for: over
    the 4 shapes and 2 dtypes (8 combinations) each of the 9 kernel cases
    meets every architecture once, so that every architecture compiles
    every kernel case, in both dtypes across them, at one compile a case."""
    return ARCHS[(kernel_case + 2 * shape_index + dtype_index) % len(ARCHS)]


# -- every combination ---------------------------------------------------
# The plans (N, C, L, stride_c, stride_l) of a GPU of 528 programs: rows
# split into chunks, the last ones empty (1x64x224x224), RoI rows,
# channels_last tiles, one position (no IN term) contiguous and
# channels_last (a tile of one position: BLOCK=1).
GPU_PROGRAMS = 4 * 132
PLANS = {
    'split_rows': (2, 256, 60800, 60800, 1),
    'empty_chunks': (1, 64, 50176, 50176, 1),
    'roi_rows': (16, 256, 49, 49, 1),
    'channels_last': (8, 256, 3136, 1, 256),
    'one_position': (4, 64, 1, 1, 1),
    'one_position_channels_last': (4, 64, 1, 1, 64),
}
# The flag-dependent kernels get every flag combination on one plan with
# the IN term and one without (HAS_IN is L > 1, the plan's); the others get
# the first combination.
FLAG_PLANS = ('split_rows', 'one_position')
DTYPES = ('fp32', 'bf16', 'fp16')
# What the BN term allows, as the host sets it: K = 3 logits with a BN
# term (2 without); BN_BATCH = BN in training; the update in the normalize
# kernel unless SyncSN (which updates after its all-gather); the non-finite
# count only with an update.
BN_SETTINGS = [
    dict(K=2, BN_BATCH=False, UPDATE=False, COUNT_BAD=False, SYNC=False),
    dict(K=3, BN_BATCH=False, UPDATE=False, COUNT_BAD=False, SYNC=False),
    dict(K=3, BN_BATCH=True, UPDATE=False, COUNT_BAD=False, SYNC=True),
    dict(K=3, BN_BATCH=True, UPDATE=True, COUNT_BAD=False, SYNC=False),
    dict(K=3, BN_BATCH=True, UPDATE=True, COUNT_BAD=True, SYNC=False),
]
FREE = ('RATIOS_GIVEN', 'HAS_FIXED', 'GROUPED', 'CUMULATIVE')


def gpu_plans():
    previous = tf.plan_as_for(GPU_PROGRAMS)
    try:
        return {
            name: (shape, tf._plan(*shape, tf.torch.device('cpu')))
            for name, shape in PLANS.items()
        }
    finally:
        tf.plan_as_for(previous)


def keep(kernel, flags):
    """The kernel's own constexprs of ``flags``."""
    return {k: v for k, v in flags.items() if k in kernel.arg_names}


def all_cases():
    """(kernel name, constexprs, data dtype) of every compile."""
    cases = []
    for plan_name, ((n, c, length, _, _), plan) in gpu_plans().items():
        tiles = dict(
            SPLIT=plan['split'], ROWS=plan['rows'], BLOCK=plan['block'])
        stats_tiles = dict(SPLIT=plan['split'], CB=plan['cb'], NB=plan['nb'])
        for dtype in DTYPES:
            cases.append(
                (tk.moments_kernel,
                 dict(tiles, ONE_STEP=plan['chunk'] == plan['block']), dtype))
            cases.append((tk.grad_sums_kernel, tiles, dtype))
        for local in (False, True):
            cases.append((tk.stats_kernel, dict(stats_tiles,
                                                LOCAL=local), 'fp32'))
        combos = list(
            itertools.product(BN_SETTINGS, *([(False, True)] * len(FREE))))
        if plan_name not in FLAG_PLANS:
            combos = combos[-1:]
        for bn, *free in combos:
            flags = dict(bn, HAS_IN=length > 1, **dict(zip(FREE, free)))
            groups = 2 if flags['GROUPED'] else 1
            by_kernel = [
                (tk.normalize_kernel, dict(tiles, CB=plan['cb'],
                                           **flags), DTYPES),
                (tk.input_grad_kernel, dict(tiles, **flags,
                                            **blocks(c, groups)), DTYPES),
                (tk.grad_stats_kernel, dict(stats_tiles, **flags), ('fp32', )),
            ]
            for kernel, constexprs, dtypes in by_kernel:
                for dtype in dtypes:
                    cases.append((kernel, keep(kernel, constexprs), dtype))
    # The flags a kernel does not take repeat its cases: each once.
    unique, seen = [], set()
    for kernel, constexprs, dtype in cases:
        key = (kernel.__name__, tuple(sorted(constexprs.items())), dtype)
        if key not in seen:
            seen.add(key)
            unique.append((kernel.__name__, constexprs, dtype))
    return unique


def compile_case(args):
    name, constexprs, dtype, arch = args
    compiled = triton_targets.compile_kernel(
        getattr(tk, name), constexprs, dtype, arch)
    flags = ' '.join(f'{k}={int(v) if isinstance(v, bool) else v}'
                     for k, v in sorted(constexprs.items()))
    return (f'{name} sm_{arch} {dtype} {flags} '
            f'cubin={len(compiled.asm["cubin"])}')


def targets():
    """sm_80 and sm_90, and sm_100 where this Triton targets it."""
    return tuple(
        arch for arch in (80, 90, 100)
        if _compat.untargeted_capability(arch) is None)


def every_combination(jobs):
    cases = [(*case, arch) for arch in targets() for case in all_cases()]
    print(f'{len(cases)} compiles', flush=True)
    with ProcessPoolExecutor(jobs) as pool:
        for line in pool.map(compile_case, cases, chunksize=4):
            print(line, flush=True)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument(
        '--all',
        action='store_true',
        help='every flag combination the host can produce, sm_80, sm_90 and '
        'sm_100')
    parser.add_argument('--jobs', type=int, default=1)
    args = parser.parse_args(argv)
    return every_combination(args.jobs) if args.all else sample()


if __name__ == '__main__':
    sys.exit(main())
