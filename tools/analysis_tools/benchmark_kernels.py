#!/usr/bin/env python
"""A/B of builds of SN's C++ CPU kernels in one process.

Each candidate is SN's ``csrc/`` at a git revision (``.``: the working
tree; a folder: the sources in it), optionally with cut-offs set by ``-D``
(``SN_ROWS_AT_ONCE=2``: the names are in ``csrc/row_kernels.h`` and
``csrc/sn_host.h``) or ``pad=BYTES`` (that much code linked ahead of
the kernels: the same machine code at other addresses, whose timings show
what code placement alone moves), compiled into
its own operator namespace (``sn_ab_<name>``) beside the others. Every case
(shape, dtype, mode, threads, instruction set) times the candidates in
alternating rounds, each round starting one candidate further along, and
prints the medians, each candidate's ratio to the first (below 1: faster)
and the largest difference of its outputs from the first's in units in the
last place (ulps; the gradients' for ``backward``). Two builds of the same
revision show the noise (an A/A).

With ``--pads P ...``, each candidate is built once per P, linked P
bytes further on (added to its own ``pad``), and its time is the median
over those builds: the same code at several addresses, so that where the
linker happens to put its loops counts less.

With ``--processes K``, the comparison runs in K fresh processes, the k-th
loading and timing the candidates from the k-th on (load order places the
libraries, and with them the code, differently). Each time is the median
over the processes; each ratio the median of the processes' ratios, with
their range: an A/A's range there is the noise between processes, which
one process cannot show. With ``--alone`` too, each of the K rounds runs
each candidate in a process of its own, in turn: the builds cannot move
each other's times, as they can in one process.

With ``--cutoffs REV``, instead each cut-off of the kernels at REV (the
``SN_*`` macros, CUTOFFS below) against other values at the shapes around
it, a table each.

Modes: ``train`` (a training forward that keeps what backward needs),
``backward`` (autograd's backward of it), ``eval`` (a no-grad eval
forward). Calls shorter than ``--fill`` seconds are timed over a loop that
fills it.

Example::

    python tools/analysis_tools/benchmark_kernels.py \\
        --candidate old=HEAD~1 old2=HEAD~1 new=. --rounds 9
    python tools/analysis_tools/benchmark_kernels.py \\
        --candidate new=. rows2=.:SN_ROWS_AT_ONCE=2 --shapes 512x256x7x7
    python tools/analysis_tools/benchmark_kernels.py --processes 3 \\
        --pads 0 32 --candidate old=HEAD~1 old2=HEAD~1:pad=16 new=.
    python tools/analysis_tools/benchmark_kernels.py --cutoffs HEAD \\
        --threads 2 --isa avx512 avx2 --dtypes float32
"""
import argparse
import hashlib
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import tempfile

import torch

from sn_mm.ops.native_flags import CFLAGS, LDFLAGS
from sn_mm.ops.operator import GRAPH_GRADS_SCHEMA, SCHEMA
from sn_mm.testing.precision import ulps_of_largest
from sn_mm.testing.timing import (add_allocator_option, per_call,
                                  run_with_steady_malloc)

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

# Five detector shapes (FPN levels, a backbone stage, RoI features of the
# mask head) and five small ones (RoI box head, stage 5 at batch 1, a
# tiny map, odd sizes).
DETECTOR_SHAPES = [
    '2x256x200x304', '2x512x100x152', '2x1024x50x76', '8x256x56x56',
    '1024x256x14x14'
]
SMALL_SHAPES = [
    '512x256x7x7', '1x2048x7x7', '1x64x8x8', '2x16x70x70', '8x64x24x24'
]
MODES = ('train', 'backward', 'eval')
CSRC = 'sn_mm/ops/csrc'


def csrc_files(rev):
    """{file name: text} of csrc at git revision rev ('.': the tree; a
    folder: the sources in it)."""
    if rev == '.' or osp.isdir(rev):
        folder = osp.join(ROOT, CSRC) if rev == '.' else rev
        return {
            name: open(osp.join(folder, name)).read()
            for name in sorted(os.listdir(folder))
        }
    names = subprocess.run(['git', 'ls-tree', '--name-only', f'{rev}:{CSRC}'],
                           cwd=ROOT,
                           capture_output=True,
                           text=True,
                           check=True).stdout.split()
    return {
        name:
        subprocess.run(['git', 'show', f'{rev}:{CSRC}/{name}'],
                       cwd=ROOT,
                       capture_output=True,
                       text=True,
                       check=True).stdout
        for name in names
    }


def build(name, spec):
    """Compile candidate `spec` ('REV[:NAME=VALUE,...][,pad=BYTES]') into
    namespace sn_ab_<name>; returns its torch.ops namespace."""
    from torch.utils import cpp_extension
    rev, _, settings = spec.partition(':')
    namespace = f'sn_ab_{name}'
    files = {
        file:
        text.replace('(sn_mm,',
                     f'({namespace},').replace('"sn_mm::', f'"{namespace}::')
        for file, text in csrc_files(rev).items()
    }
    defines = [d for d in settings.split(',') if d]
    for pad in [d for d in defines if d.startswith('pad=')]:
        # Code linked ahead of the kernels (the first object): the same
        # machine code at other addresses.
        files['aa_layout_pad.cpp'] = (
            f'__asm__(".text\\n.skip {int(pad[4:])}, 0x90\\n");\n')
        defines.remove(pad)
    flags = list(CFLAGS) + [f'-D{d}' for d in defines]
    key = hashlib.sha1(
        repr((sorted(files.items()), flags,
              torch.__version__)).encode()).hexdigest()[:12]
    folder = osp.join(tempfile.gettempdir(), 'sn_mm_kernel_ab',
                      f'{namespace}_{key}')
    os.makedirs(folder, exist_ok=True)
    for file, text in files.items():
        path = osp.join(folder, file)
        if osp.exists(path) and open(path).read() == text:
            continue  # rewritten, it would be compiled again
        with open(path, 'w') as f:
            f.write(text)
    library = torch.library.Library(namespace, 'DEF')
    library.define(SCHEMA)
    library.define(GRAPH_GRADS_SCHEMA)
    build.libraries.append(library)  # kept alive: it holds the schema
    cpp_extension.load(
        name=f'{namespace}_{key}',
        sources=sorted(
            osp.join(folder, f) for f in files if f.endswith('.cpp')),
        extra_cflags=flags,
        extra_ldflags=list(LDFLAGS),
        build_directory=folder,
        is_python_module=False,
        verbose=False)
    return getattr(torch.ops, namespace)


build.libraries = []


def make_inputs(shape, dtype, mode):
    """The input, parameters and output gradient of a case, one copy that
    every candidate reads, so that where they lie in memory is no
    difference between the candidates."""
    torch.manual_seed(0)
    c = shape[1]
    inputs = [
        torch.randn(shape, dtype=dtype) * 2 + 1,
        torch.rand(c, dtype=dtype) + 0.5,
        torch.randn(c, dtype=dtype) * 0.1,
        torch.randn(3, dtype=dtype),
        torch.randn(3, dtype=dtype)
    ]
    for t in inputs:
        t.requires_grad_(mode != 'eval')
    return inputs, torch.randn(shape, dtype=dtype)  # y's gradient


def make_case(op, inputs, grad, mode):
    """A call of candidate op's kernels on `inputs` (backward: of `grad`),
    and what it computes."""
    x, *params = inputs
    c = x.shape[1]
    running = [torch.zeros(c, dtype=x.dtype), torch.ones(c, dtype=x.dtype)]
    count = torch.zeros((), dtype=torch.long)
    training = mode != 'eval'

    def forward():
        return op.switchable_norm(x, *params, *running, count, None, None,
                                  None, training, 0.1, 1e-5, True, False)

    if mode == 'eval':

        def call():
            with torch.no_grad():
                return forward()

        return call, call
    if mode == 'train':
        return forward, forward
    y = forward()

    def backward():
        return torch.autograd.grad(y, inputs, grad, retain_graph=True)

    return backward, backward


def max_ulps(first, other):
    if isinstance(first, torch.Tensor):
        first, other = [first], [other]
    return max(ulps_of_largest(b, a) for a, b in zip(first, other))


def rotated(items, k):
    """items from the k-th (modulo their number) on, then the others."""
    k %= len(items)
    return items[k:] + items[:k]


def run_case(ops, shape, dtype, mode, rounds, fill, reference):
    """{candidate: (median ms, ulps from candidate `reference`)}."""
    calls, outputs = {}, {}
    inputs, grad = make_inputs(shape, dtype, mode)
    for name, op in ops.items():
        call, result = make_case(op, inputs, grad, mode)
        outputs[name] = result()
        calls[name] = call
    seconds = per_call(calls[next(iter(ops))], 1)
    repeat = max(1, min(200, int(fill / max(seconds, 1e-7))))
    names = list(ops)
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in rotated(names, r):
            times[name].append(per_call(calls[name], repeat))
    return {
        name: (statistics.median(times[name]) * 1e3,
               max_ulps(outputs[reference], outputs[name]))
        for name in names
    }


# --cutoffs: each cut-off (its macro and value in the kernels) against
# other values, at the shapes around it, in the modes it changes.
CUTOFFS = [
    ('SN_SHORT_ROW', 128, [256], ['4x128x10x10', '4x128x14x14'], MODES),
    ('SN_ROWS_AT_ONCE', 4, [2], ['512x256x7x7', '16x256x7x7',
                                 '8x256x56x56'], MODES),
    ('SN_SUMS', 4, [2], ['8x256x56x56', '1x2048x7x7', '2x16x70x70'], MODES),
    ('SN_COEF_ROWS', 256, [1024], ['512x256x7x7',
                                   '1x2048x7x7'], ('backward', )),
    ('SN_TASK_VALUES', 32768, [8192],
     ['16x256x7x7', '1x512x28x28', '2x16x70x70'], MODES),
    ('SN_PARALLEL_SUMS_MIN', 16384, [4096], ['16x256x7x7', '32x128x7x7'],
     ('train', 'backward')),
    ('SN_SAMPLE_MAX_KIB', 512, [2048], ['64x256x28x28',
                                        '8x512x28x28'], ('eval', )),
    ('SN_BLOCK_KIB', 256, [1024], ['1024x256x14x14',
                                   '512x256x7x7'], ('eval', )),
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split('\n\n', 1)[1])
    parser.add_argument(
        '--candidate',
        nargs='+',
        help='NAME=REV[:MACRO=VALUE,...][,pad=BYTES]; the first is the one '
        'the others are compared with')
    parser.add_argument(
        '--cutoffs',
        metavar='REV',
        help='instead, each cut-off of REV (CUTOFFS) against other values '
        'at the shapes around it: one table')
    parser.add_argument(
        '--only',
        nargs='+',
        choices=[c[0] for c in CUTOFFS],
        help='with --cutoffs: these cut-offs only')
    parser.add_argument(
        '--shapes', nargs='+', default=DETECTOR_SHAPES + SMALL_SHAPES)
    parser.add_argument('--dtypes', nargs='+', default=['float32', 'float64'])
    parser.add_argument(
        '--modes', nargs='+', default=list(MODES), choices=MODES)
    parser.add_argument(
        '--threads', nargs='+', type=int, default=[1,
                                                   torch.get_num_threads()])
    parser.add_argument(
        '--isa',
        nargs='+',
        default=None,
        help='instruction sets (default: every one this CPU runs)')
    parser.add_argument('--rounds', type=int, default=9)
    parser.add_argument(
        '--processes',
        type=int,
        default=1,
        help='run the comparison in this many processes, each loading the '
        'candidates in another order; ratios: median and range')
    parser.add_argument(
        '--pads',
        nargs='+',
        type=int,
        default=[0],
        help='build each candidate linked this many bytes further on, once '
        'per value; its time: the median over them (default: 0)')
    parser.add_argument(
        '--alone',
        action='store_true',
        help='with --processes: each candidate in a process of its own, '
        'the candidates in turn (as a user\'s process holds one build); '
        'no ulps')
    # A process of --processes: its load order and where its results go.
    parser.add_argument(
        '--rotate', type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument('--results', help=argparse.SUPPRESS)
    parser.add_argument(
        '--fill',
        type=float,
        default=0.02,
        help='seconds each timing fills (default 0.02)')
    add_allocator_option(parser)
    args = parser.parse_args(argv)
    if not (args.candidate or args.cutoffs):
        parser.error('give --candidate or --cutoffs')
    if args.alone and args.results is None and not (args.candidate
                                                    and args.processes > 1):
        parser.error('--alone needs --candidate and --processes')
    return args


def print_row(cells):
    print('| ' + ' | '.join(cells) + ' |', flush=True)


def print_head(names):
    head = ['shape', 'dtype', 'mode', 'threads', 'isa'] + [
        f'{n} ms' for n in names
    ] + [f'{n}/{names[0]}'
         for n in names[1:]] + [f'{n} ulps' for n in names[1:]]
    print_row(head)
    print('|' + '---|' * len(head))


def case_cells(case, runs, names):
    """A table row: case's cells, then from `runs` (one {name: (ms, ulps)}
    a process) each candidate's median time, its ratios to the first's
    (median, and range over more than one process) and its largest ulps."""
    row = list(case)
    row += [
        f'{statistics.median(run[n][0] for run in runs):.4g}' for n in names
    ]
    for n in names[1:]:
        ratios = [run[n][0] / run[names[0]][0] for run in runs]
        cell = f'{statistics.median(ratios):.3f}'
        if len(ratios) > 1:
            cell += f' ({min(ratios):.3f}-{max(ratios):.3f})'
        row.append(cell)
    for n in names[1:]:
        ulps = [run[n][1] for run in runs if run[n][1] is not None]
        row.append(f'{max(ulps):.0f}' if ulps else '-')
    return row


def placed(spec, pad):
    """Build spec NAME=SOURCE linked `pad` bytes further on than SOURCE
    says (NAME_padPAD=SOURCE with its pad raised; NAME=SOURCE at 0)."""
    name, _, source = spec.partition('=')
    rev, _, settings = source.partition(':')
    defines = [d for d in settings.split(',') if d]
    own = sum(int(d[4:]) for d in defines if d.startswith('pad='))
    defines = [d for d in defines if not d.startswith('pad=')]
    if own + pad:
        defines.append(f'pad={own + pad}')
    name = f'{name}_pad{pad}' if pad else name
    return f'{name}={rev}' + (':' + ','.join(defines) if defines else '')


def compare(args, specs, on_case):
    """Times candidates `specs` (NAME=SOURCE), each at args.pads, at each
    case, built, loaded and timed from the args.rotate-th on; on_case(case
    cells, {name: (ms: median over its pads, ulps from the first)})."""
    builds = {spec: [placed(spec, p) for p in args.pads] for spec in specs}
    order = [b for spec in specs for b in builds[spec]]
    ops = {}
    for spec in rotated(order, args.rotate):
        name, _, source = spec.partition('=')
        if spec not in compare.built:  # a namespace registers once
            compare.built[spec] = build(name, source)
        ops[name] = compare.built[spec]
    first = order[0].partition('=')[0]

    def per_candidate(r):
        return {
            spec.partition('=')[0]:
            (statistics.median(r[b.partition('=')[0]][0]
                               for b in builds[spec]),
             max(r[b.partition('=')[0]][1] for b in builds[spec]))
            for spec in specs
        }

    for isa in args.isa or list(ops[first].cpu_isas()):
        for op in ops.values():
            op.set_cpu_isa(isa)
        for threads in args.threads:
            torch.set_num_threads(threads)
            for shape in args.shapes:
                dims = tuple(int(d) for d in shape.split('x'))
                for dtype in args.dtypes:
                    for mode in args.modes:
                        r = run_case(ops, dims, getattr(torch, dtype), mode,
                                     args.rounds, args.fill, first)
                        on_case([shape, dtype, mode,
                                 str(threads), isa], per_candidate(r))


compare.built = {}


def tables(args):
    """(title, candidate specs, shapes, modes) of each table."""
    if args.candidate:
        return [(f'candidates: {", ".join(args.candidate)}', args.candidate,
                 args.shapes, args.modes)]
    return [(f'\n{macro}: {value} (base) against {others}',
             [f'base={args.cutoffs}'] + [
                 f'{macro[3:].lower()}_{v}={args.cutoffs}:{macro}={v}'
                 for v in others
             ], shapes, list(modes))
            for macro, value, others, shapes, modes in CUTOFFS
            if not args.only or macro in args.only]


def run_child(argv, folder, extra):
    """The results of this tool run in a fresh process with argv + extra."""
    path = osp.join(folder, 'results.json')
    subprocess.run([
        sys.executable,
        osp.abspath(__file__), *argv, '--processes', '1', *extra, '--results',
        path
    ],
                   check=True)
    with open(path) as f:
        return json.load(f)


def over_processes(args, argv):
    """Runs the comparison in args.processes processes (--alone: that many
    rounds of a process per candidate) and prints each table from all of
    them."""
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for k in range(args.processes):
            if not args.alone:
                results.append(run_child(argv, folder, ['--rotate', str(k)]))
                continue
            # A table of one candidate from each process: merged, no ulps.
            alone = [
                run_child(argv, folder, ['--candidate', spec])[0]
                for spec in rotated(args.candidate, k)
            ]
            merged = []
            for c, (case, _) in enumerate(alone[0]):
                times = {}
                for table in alone:
                    for name, (ms, _) in table[c][1].items():
                        times[name] = (ms, None)
                merged.append((case, times))
            results.append([merged])
    runs = (f'{args.processes} rounds of a process per candidate'
            if args.alone else f'{args.processes} processes')
    print(f'torch {torch.__version__}; medians of {args.rounds} rounds in '
          f'{runs} (ratios: median, range)')
    for t, (title, specs, _, _) in enumerate(tables(args)):
        names = [spec.partition('=')[0] for spec in specs]
        print(title)
        print_head(names)
        for c, (case, _) in enumerate(results[0][t]):
            print_row(
                case_cells(case, [process[t][c][1] for process in results],
                           names))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.processes > 1:
        return over_processes(args, argv)
    run_with_steady_malloc(args.allocator)
    if args.results is None:
        print(f'torch {torch.__version__}; medians of {args.rounds} rounds')
    results = []
    for title, specs, shapes, modes in tables(args):
        names = [spec.partition('=')[0] for spec in specs]
        args.shapes, args.modes = shapes, modes
        rows = []

        def on_case(case, r):
            if args.results:
                rows.append((case, r))
            else:
                print_row(case_cells(case, [r], names))

        if args.results is None:
            print(title)
            print_head(names)
        compare(args, specs, on_case)
        results.append(rows)
    if args.results:
        with open(args.results, 'w') as f:
            json.dump(results, f)


if __name__ == '__main__':
    main()
