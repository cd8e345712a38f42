#!/usr/bin/env python
"""A/B of SN's special paths: the C++ kernels' per instruction set, or
the Triton plans' on a GPU.

Each special path of the C++ kernels (``sn_mm.ops.cpu_path_counts``: short
rows taken several at a time, eval by sample) is timed on and off at the
detector shapes where it applies, SN's eval forward and (where the path
applies there) training forward+backward, in alternating rounds (each
round starting one candidate further along), under every instruction set
this CPU runs (or those given; where no call takes the path, its row says
so and holds no times; the --json rows leave it out).
With ``--triton``, instead the Triton plans' layouts
(``sn_mm.ops.triton_fused.path_counts``: rows split across programs, tiles
across channels for channels_last inputs) on the GPU, at the detector shapes
where this GPU's plan takes them (in Triton's interpreter on a CPU with
``TRITON_INTERPRET=1 --toy``, to test the tool). Prints one table: the
median times, the ratio off/on (above 1: the path pays) and the calls that
took the path, which must be more than zero with it on and zero with it
off.

With ``--models``, instead each path on and off in the model-level figures
(mmdet ResNet-50 batch-1 eval, the Mask R-CNN R50-FPN training step, and
Mask R-CNN inference, where the RoI heads run in eval over 1000 proposals:
by_sample's only model), with the SN calls that took it per model call and
the share of the call's time spent in the SN calls that take it (forward
and backward, from the profiler): the most the path could save in that
model, which a model's time moving by several percent between rounds
cannot show.

Example::

    python tools/analysis_tools/benchmark_paths.py --rounds 5
    python tools/analysis_tools/benchmark_paths.py --models --rounds 9
    python tools/analysis_tools/benchmark_paths.py --isa avx2 --path by_sample
    python tools/analysis_tools/benchmark_paths.py --triton --rounds 5
"""
import argparse
import importlib.util
import json
import os
import sys

import torch

from sn_mm import SwitchableNorm
from sn_mm.ops import (cpu_isa, cpu_isas, cpu_path_counts, native_available,
                       set_cpu_isa, set_cpu_path)
from sn_mm.testing.timing import (add_allocator_option, calls_filling,
                                  gradient_clearer, median_times,
                                  run_with_steady_malloc, timed)

# Each path and the shapes of benchmark_norm.py where it applies.
PATH_SHAPES = {
    'short_rows': [(512, 256, 7, 7), (16, 256, 7, 7), (1, 2048, 7, 7)],
    'by_sample': [(1024, 256, 14, 14), (512, 256, 7, 7)],
}
# The Triton plans' layouts: split rows where the GPU's plan splits them
# (decided per shape at run time), channels_last tiles on channels_last
# inputs.
TRITON_PATH_SHAPES = {
    'split_rows': [(2, 256, 200, 304), (2, 512, 100, 152), (2, 1024, 50, 76),
                   (8, 256, 56, 56), (1, 64, 8, 8), (1, 512, 28, 28),
                   (2, 256, 25, 38)],
    'channels_last_tiles': [(8, 256, 56, 56), (512, 256, 7, 7), (1, 64, 8, 8)],
}
TRITON_TOY_SHAPES = {
    'split_rows': [(1, 2, 32, 33)],  # two rows of 1056: split in two
    'channels_last_tiles': [(2, 8, 5, 6)]
}
# The model-level figures: their names, benchmark_norm.py's factories and
# the norm_cfg.
MODELS = {
    'resnet': ('ResNet-50 eval, batch 1', 'resnet_eval_call', dict(type='SN')),
    'step': ('Mask R-CNN train step, 2 x 512x512', 'detector_step_call',
             dict(type='SN', requires_grad=True)),
    # by_sample's: eval with many samples, the RoI heads at inference.
    'inference': ('Mask R-CNN inference, 1 x 800x1216', 'detector_test_call',
                  dict(type='SN')),
}
# by_sample applies where there are no batch BN statistics: eval.
MODES = {
    'short_rows': ('eval', 'train'),
    'by_sample': ('eval', ),
}
TOY_SHAPES = {
    'short_rows': [(16, 16, 7, 7)],
    'by_sample': [(8, 64, 24, 24)],
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
        choices=list(PATH_SHAPES) + list(TRITON_PATH_SHAPES),
        default=None,
        help='paths (default: all of the side timed)')
    parser.add_argument(
        '--triton',
        action='store_true',
        help='the Triton plans\' layouts on the GPU (float32) instead')
    parser.add_argument('--threads', type=int, default=None)
    parser.add_argument(
        '--toy', action='store_true', help='small shapes (to test the tool)')
    parser.add_argument(
        '--models',
        action='store_true',
        help='instead, each path on and off in the model-level figures: '
        'mmdet ResNet-50 batch-1 eval (224x224), the Mask R-CNN R50-FPN '
        'training step (2 x 512x512) and its inference (1 x 800x1216), SN '
        'in every norm layer')
    parser.add_argument(
        '--model',
        nargs='*',
        choices=list(MODELS),
        help='with --models, these only (default: all)')
    parser.add_argument('--json', default=None)
    add_allocator_option(parser)
    return parser.parse_args(argv)


def calls(shape, mode, device='cpu', channels_last=False, kernels=None):
    """A call of SN at ``shape`` in ``mode`` ('eval' or 'train')."""
    torch.manual_seed(0)
    layer = SwitchableNorm(
        shape[1], kernels=kernels).train(mode == 'train').to(device)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(shape, device=device).to(memory_format=fmt)
    x.requires_grad_(mode == 'train')
    grad = torch.randn(shape, device=device).to(memory_format=fmt)
    if mode == 'eval':

        def call():
            with torch.no_grad():
                layer(x)
    else:
        no_grads = gradient_clearer(x, *layer.parameters())

        def call():
            no_grads()
            layer(x).backward(grad)

    return call


class CppPaths:
    """The C++ kernels' special paths: switch and counts."""
    switch = staticmethod(set_cpu_path)
    counts = staticmethod(cpu_path_counts)


class TritonPaths:
    """The Triton plans' layouts: switch and counts."""

    @staticmethod
    def switch(path, on):
        from sn_mm.ops import triton_fused
        return triton_fused.set_path(path, on)

    @staticmethod
    def counts():
        from sn_mm.ops import triton_fused
        return triton_fused.path_counts()


def ab(path, shape, mode, rounds, side=CppPaths, **call_args):
    """Median seconds with the path on and off, and the calls that took it
    in each."""
    call = calls(shape, mode, **call_args)
    call()  # warm-up
    # Calls under a millisecond are timed over as many as fill one (as in
    # benchmark_norm.py): one 20-microsecond call's time is mostly noise.
    repeat = calls_filling(timed(call))
    taken = {}

    def variant(on):

        def run():
            side.switch(path, on)
            before = side.counts()[path]
            for _ in range(repeat):
                call()
            taken[on] = taken.get(on, 0) + side.counts()[path] - before

        return run

    fns = {'on': variant(True), 'off': variant(False)}
    was_on = side.switch(path, True)
    for fn in fns.values():
        fn()  # warm-up
    times = median_times(fns, rounds)
    side.switch(path, was_on)
    return (times['on'] / repeat, times['off'] / repeat, taken.get(True, 0),
            taken.get(False, 0))


def triton_device() -> str:
    from sn_mm.ops import triton_problem
    if triton_problem() is not None:
        sys.exit(f'benchmark_paths --triton: {triton_problem()}')
    if torch.cuda.is_available():
        return 'cuda'
    if os.environ.get('TRITON_INTERPRET') != '1':
        sys.exit('benchmark_paths --triton: needs a GPU (or '
                 'TRITON_INTERPRET=1, to test the tool)')
    return 'cpu'


def applies(path, shape, device) -> bool:
    """Whether this device's plan for ``shape`` (channels_last for the
    tiles) takes Triton path ``path``."""
    from sn_mm.ops import triton_fused
    n, c = shape[:2]
    length = 1
    for d in shape[2:]:
        length *= d
    if path == 'channels_last_tiles':
        return c > 1 and length > 1
    return triton_fused._plan(n, c, length, length, 1,
                              torch.device(device))['split'] > 1


def triton_rows(args):
    """The Triton plans' A/B rows."""
    device = triton_device()
    paths = [
        p for p in args.path or TRITON_PATH_SHAPES if p in TRITON_PATH_SHAPES
    ]
    shapes = TRITON_TOY_SHAPES if args.toy else TRITON_PATH_SHAPES
    name = torch.cuda.get_device_name() if device == 'cuda' else \
        "Triton's interpreter"
    print(f'torch {torch.__version__}, {name}, float32; medians of '
          f'{args.rounds} alternating rounds\n')
    print_header()
    rows = []
    for path in paths:
        for shape in shapes[path]:
            if not applies(path, shape, device):
                continue
            for mode in ('eval', 'train'):
                on, off, n_on, n_off = ab(
                    path,
                    shape,
                    mode,
                    args.rounds,
                    side=TritonPaths,
                    device=device,
                    channels_last=path == 'channels_last_tiles',
                    kernels='triton')
                rows.append(
                    print_row(path, 'triton', shape, mode, on, off, n_on,
                              n_off))
    return rows


def print_header():
    print('| path | instruction set | shape | mode | on ms | off ms | '
          'off / on | calls on path (on, off) |')
    print('|---|---|---|---|---|---|---|---|')


def print_row(path, isa, shape, mode, on, off, n_on, n_off) -> dict:
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
    print(
        f'| {path} | {isa} | {row["shape"]} | {mode} '
        f'| {row["on_ms"]:.3f} | {row["off_ms"]:.3f} '
        f'| {row["gain"]:.2f} | {n_on}, {n_off} |',
        flush=True)
    return row


def print_not_taken(path, isa, shape, mode) -> None:
    """A row for a path no call took, on or off (at this shape and
    instruction set it does not apply)."""
    print(
        f'| {path} | {isa} | {"x".join(map(str, shape))} | {mode} '
        '| - | - | - | 0, 0: not taken |',
        flush=True)


def main(argv=None):
    args = parse_args(argv)
    run_with_steady_malloc(args.allocator)
    if args.triton:
        rows = triton_rows(args)
    elif args.models:
        rows = model_rows(args)
    else:
        rows = cpu_rows(args)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(rows, f, indent=1)
    return rows


def cpu_rows(args):
    """The C++ kernels' A/B rows."""
    if not native_available():
        sys.exit('benchmark_paths: the C++ kernels were not built')
    if args.threads:
        torch.set_num_threads(args.threads)
    isas = args.isa or cpu_isas()
    paths = [p for p in args.path or PATH_SHAPES if p in PATH_SHAPES]
    shapes = TOY_SHAPES if args.toy else PATH_SHAPES
    before = cpu_isa()
    print(f'torch {torch.__version__}, {torch.get_num_threads()} threads, '
          f'{os.cpu_count()} CPUs; instruction sets this CPU runs: '
          f'{", ".join(cpu_isas())}; medians of {args.rounds} alternating '
          'rounds\n')
    print_header()
    rows = []
    try:
        for isa in isas:
            set_cpu_isa(isa)
            for path in paths:
                for shape in shapes[path]:
                    for mode in MODES[path]:
                        on, off, n_on, n_off = ab(path, shape, mode,
                                                  args.rounds)
                        if n_on == n_off == 0:
                            # Said rather than left out, so that a path
                            # that stops applying where it should shows.
                            print_not_taken(path, isa, shape, mode)
                            continue
                        rows.append(
                            print_row(path, isa, shape, mode, on, off, n_on,
                                      n_off))
    finally:
        set_cpu_isa(before)
    return rows


def benchmark_norm():
    """tools/analysis_tools/benchmark_norm.py, whose model calls the model
    rows time."""
    path = os.path.join(
        os.path.dirname(os.path.abspath(__file__)), 'benchmark_norm.py')
    spec = importlib.util.spec_from_file_location('benchmark_norm', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_ab(path, call, rounds):
    """:func:`ab` for a model call: median seconds with the path on and off
    and the SN calls that took it per model call, in each."""
    taken = {}

    def variant(on):

        def run():
            set_cpu_path(path, on)
            before = cpu_path_counts()[path]
            call()
            taken[on] = cpu_path_counts()[path] - before

        return run

    was_on = set_cpu_path(path, True)
    fns = {'on': variant(True), 'off': variant(False)}
    for fn in fns.values():
        fn()  # warm-up
    times = median_times(fns, rounds)
    share = on_path_seconds(fns['on'], path) / times['on']
    set_cpu_path(path, was_on)
    return times['on'], times['off'], taken[True], taken[False], share


def on_path_seconds(call, path) -> float:
    """Seconds of one ``call`` spent in the SN calls (forward and their
    backward) that take ``path``: the most the path could save there, were
    it to make those calls free. From the profiler's events (whose overhead
    lengthens the model's many small operators, not these), each SN forward
    matched to its module call (whose path count tells whether it took the
    path) and to its backward by autograd's sequence number."""
    from torch.profiler import profile
    took = []

    def before(module, args):
        if isinstance(module, SwitchableNorm):
            took.append(cpu_path_counts()[path])

    def after(module, args, output):
        if isinstance(module, SwitchableNorm):
            took[-1] = cpu_path_counts()[path] > took[-1]

    hooks = [
        torch.nn.modules.module.register_module_forward_pre_hook(before),
        torch.nn.modules.module.register_module_forward_hook(after)
    ]
    try:
        with profile() as prof:
            call()
    finally:
        for h in hooks:
            h.remove()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    forwards = [
        e for e in events if e.name == 'sn_mm::switchable_norm' and (
            e.cpu_parent is None or e.cpu_parent.name != e.name)
    ]
    if len(forwards) != len(took):
        raise RuntimeError(f'benchmark_paths: {len(forwards)} SN operator '
                           f'calls for {len(took)} SN layer calls')
    on_path = {e.sequence_nr for e, t in zip(forwards, took) if t}
    seconds = sum(e.cpu_time_total for e, t in zip(forwards, took) if t)
    seconds += sum(
        e.cpu_time_total for e in events
        if e.name == 'torch::autograd::CppNode<SwitchableNormBackward>'
        and e.sequence_nr in on_path)
    return seconds / 1e6


def model_rows(args):
    """Each path on and off in the two model-level figures, under every
    instruction set given (default: this CPU's best)."""
    if not native_available():
        sys.exit('benchmark_paths: the C++ kernels were not built')
    if args.threads:
        torch.set_num_threads(args.threads)
    bench = benchmark_norm()
    models = {
        name: getattr(bench, factory)(norm)
        for key, (name, factory, norm) in MODELS.items()
        if not args.model or key in args.model
    }
    paths = [p for p in args.path or PATH_SHAPES if p in PATH_SHAPES]
    before = cpu_isa()
    print(f'torch {torch.__version__}, {torch.get_num_threads()} threads; '
          f'medians of {args.rounds} alternating rounds\n')
    print('| path | instruction set | model | on ms | off ms | off / on | '
          'SN time on path, % of the call | '
          'SN calls on path per model call (on, off) |')
    print('|---|---|---|---|---|---|---|---|')
    rows = []
    try:
        for isa in args.isa or cpu_isas()[:1]:
            set_cpu_isa(isa)
            for path in paths:
                for model, call in models.items():
                    on, off, n_on, n_off, share = model_ab(
                        path, call, args.rounds)
                    row = dict(
                        path=path,
                        isa=isa,
                        model=model,
                        on_ms=on * 1e3,
                        off_ms=off * 1e3,
                        gain=off / on,
                        taken_on=n_on,
                        taken_off=n_off,
                        on_path_percent=100 * share)
                    rows.append(row)
                    print(
                        f'| {path} | {isa} | {model} | {on * 1e3:.1f} | '
                        f'{off * 1e3:.1f} | {off / on:.3f} | '
                        f'{100 * share:.2f} | {n_on}, {n_off} |',
                        flush=True)
    finally:
        set_cpu_isa(before)
    return rows


if __name__ == '__main__':
    main()
