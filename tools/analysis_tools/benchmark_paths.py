#!/usr/bin/env python
"""A/B of the C++ kernels' special paths, per instruction set.

Each special path (``sn_mm.ops.cpu_path_counts``: short rows taken several
at a time, eval by sample, one sample's reductions inside its passes) is
timed on and off at the detector shapes where it applies, SN's eval forward
and (where the path applies there) training forward+backward, in alternating
rounds (each round starting one candidate further along), under every
instruction set this CPU runs (or those given). Prints one table: the median
times, the ratio off/on (above 1: the path pays) and the calls that took the
path, which must be more than zero with it on and zero with it off.

Example::

    python tools/analysis_tools/benchmark_paths.py --rounds 5
    python tools/analysis_tools/benchmark_paths.py --isa avx2 --path by_sample
"""
import argparse
import json
import os
import sys

import torch

from sn_mm import SwitchableNorm
from sn_mm.ops import (cpu_isa, cpu_isas, cpu_path_counts, native_available,
                       set_cpu_isa, set_cpu_path)
from sn_mm.testing.timing import calls_filling, median_times, timed

# Each path and the shapes of benchmark_norm.py where it applies.
PATH_SHAPES = {
    'short_rows': [(512, 256, 7, 7), (16, 256, 7, 7), (1, 2048, 7, 7),
                   (1, 64, 8, 8)],
    'by_sample': [(1024, 256, 14, 14), (512, 256, 7, 7)],
    'one_sample': [(1, 2048, 7, 7), (1, 512, 28, 28), (1, 256, 7, 7),
                   (1, 64, 8, 8)],
}
# by_sample applies where there are no batch BN statistics: eval.
MODES = {
    'short_rows': ('eval', 'train'),
    'by_sample': ('eval', ),
    'one_sample': ('eval', 'train')
}
TOY_SHAPES = {
    'short_rows': [(8, 16, 7, 7)],
    'by_sample': [(8, 64, 24, 24)],
    'one_sample': [(1, 64, 24, 24)]
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--rounds',
        type=int,
        default=5,
        help='alternating rounds (medians; at least 3)')
    parser.add_argument(
        '--isa',
        nargs='*',
        default=None,
        help='instruction sets (default: every one this '
        'CPU runs)')
    parser.add_argument(
        '--path',
        nargs='*',
        choices=list(PATH_SHAPES),
        default=None,
        help='paths (default: all)')
    parser.add_argument('--threads', type=int, default=None)
    parser.add_argument(
        '--toy', action='store_true', help='small shapes (to test the tool)')
    parser.add_argument('--json', default=None)
    return parser.parse_args(argv)


def calls(shape, mode):
    """A call of SN at ``shape`` in ``mode`` ('eval' or 'train')."""
    torch.manual_seed(0)
    layer = SwitchableNorm(shape[1]).train(mode == 'train')
    x = torch.randn(shape, requires_grad=mode == 'train')
    grad = torch.randn(shape)
    if mode == 'eval':

        def call():
            with torch.no_grad():
                layer(x)
    else:

        def call():
            x.grad = None  # no accumulation into the previous gradient
            layer(x).backward(grad)

    return call


def ab(path, shape, mode, rounds):
    """Median seconds with the path on and off, and the calls that took it
    in each."""
    call = calls(shape, mode)
    call()  # warm-up
    # Calls under a millisecond are timed over as many as fill one (as in
    # benchmark_norm.py): one 20-microsecond call's time is mostly noise.
    repeat = calls_filling(timed(call))
    taken = {}

    def variant(on):

        def run():
            set_cpu_path(path, on)
            before = cpu_path_counts()[path]
            for _ in range(repeat):
                call()
            taken[on] = taken.get(on, 0) + cpu_path_counts()[path] - before

        return run

    fns = {'on': variant(True), 'off': variant(False)}
    for fn in fns.values():
        fn()  # warm-up
    times = median_times(fns, rounds)
    set_cpu_path(path, True)
    return (times['on'] / repeat, times['off'] / repeat, taken.get(True, 0),
            taken.get(False, 0))


def main(argv=None):
    args = parse_args(argv)
    if not native_available():
        sys.exit('benchmark_paths: the C++ kernels were not built')
    if args.threads:
        torch.set_num_threads(args.threads)
    isas = args.isa or cpu_isas()
    paths = args.path or list(PATH_SHAPES)
    shapes = TOY_SHAPES if args.toy else PATH_SHAPES
    before = cpu_isa()
    print(f'torch {torch.__version__}, {torch.get_num_threads()} threads, '
          f'{os.cpu_count()} CPUs; instruction sets this CPU runs: '
          f'{", ".join(cpu_isas())}; medians of {args.rounds} alternating '
          'rounds\n')
    print('| path | instruction set | shape | mode | on ms | off ms | '
          'off / on | calls on path (on, off) |')
    print('|---|---|---|---|---|---|---|---|')
    rows = []
    try:
        for isa in isas:
            set_cpu_isa(isa)
            for path in paths:
                for shape in shapes[path]:
                    for mode in MODES[path]:
                        on, off, n_on, n_off = ab(path, shape, mode,
                                                  args.rounds)
                        row = dict(
                            path=path,
                            isa=isa,
                            shape='x'.join(map(str, shape)),
                            mode=mode,
                            on_ms=on * 1e3,
                            off_ms=off * 1e3,
                            gain=off / on,
                            taken_on=n_on,
                            taken_off=n_off)
                        rows.append(row)
                        print(
                            f'| {path} | {isa} | {row["shape"]} | {mode} '
                            f'| {row["on_ms"]:.3f} | {row["off_ms"]:.3f} '
                            f'| {row["gain"]:.2f} | {n_on}, {n_off} |',
                            flush=True)
    finally:
        set_cpu_isa(before)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == '__main__':
    main()
