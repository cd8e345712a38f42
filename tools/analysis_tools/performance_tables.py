"""Runs every command behind docs/performance.md's tables, one after
another, at one commit on one machine, and keeps each one's output.

Each run writes ``OUT/NAME.txt``: a header (date, commit, machine, the
command) and the command's output, so that a table and its heading come
from one file. Commands for an instruction set this CPU lacks are skipped
and said to be; the oldest leg's rows run on ``.venv-oldest`` (make
venv-oldest) where it exists. The whole list takes hours on a
2-core VM: run it on an otherwise idle machine, since every figure is a
time. ``--list`` prints the commands; ``--only`` runs some of them.
"""
import argparse
import datetime
import os
import os.path as osp
import platform
import shlex
import subprocess
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
MAIN_PY = osp.join(ROOT, '.venv', 'bin', 'python')
OLDEST_PY = osp.join(ROOT, '.venv-oldest', 'bin', 'python')
NORM = 'tools/analysis_tools/benchmark_norm.py'
PATHS = 'tools/analysis_tools/benchmark_paths.py'
KERNELS = 'tools/analysis_tools/benchmark_kernels.py'

# (name, venv, instruction set the command needs or None, arguments):
# the order of docs/performance.md.
COMMANDS = [
    ('layers-avx512', 'main', 'avx512', [
        NORM, '--repeats', '9', '--cpu-isa', 'avx512', '--skip-detector',
        '--skip-resnet', '--threads', '2'
    ]),
    ('layers-avx2', 'main', 'avx2', [
        NORM, '--repeats', '9', '--cpu-isa', 'avx2', '--skip-detector',
        '--skip-resnet', '--threads', '2'
    ]),
    ('layers-baseline', 'main', 'baseline', [
        NORM, '--repeats', '7', '--cpu-isa', 'baseline', '--skip-detector',
        '--skip-resnet', '--threads', '2'
    ]),
    ('kernels-ab', 'main', 'avx512', [
        KERNELS, '--processes', '3', '--pads', '0', '32', '--candidate',
        'old=c5bbb69', 'old2=c5bbb69:pad=16', 'new=e554328', '--rounds', '9',
        '--fill', '0.03', '--isa', 'avx512', 'avx2'
    ]),
    ('kernels-ab-baseline', 'main', None, [
        KERNELS, '--processes', '3', '--pads', '0', '32', '--candidate',
        'old=c5bbb69', 'old2=c5bbb69:pad=16', 'new=e554328', '--isa',
        'baseline', '--threads', '2', '--dtypes', 'float32', '--rounds', '9',
        '--fill', '0.03'
    ]),
    ('kernels-ab-oldest', 'oldest', 'avx512', [
        KERNELS, '--processes', '3', '--pads', '0', '32', '--candidate',
        'old=c5bbb69', 'old2=c5bbb69:pad=16', 'new=e554328', '--rounds', '9',
        '--fill', '0.03', '--isa', 'avx512', 'avx2', '--threads', '2',
        '--dtypes', 'float32', '--shapes', '2x256x200x304', '8x256x56x56',
        '512x256x7x7', '1x2048x7x7', '1x64x8x8', '2x16x70x70', '8x64x24x24'
    ]),
    ('cutoffs', 'main', 'avx512', [
        KERNELS, '--cutoffs', 'e554328', '--rounds', '9', '--fill', '0.03',
        '--threads', '2', '--isa', 'avx512', 'avx2', '--dtypes', 'float32'
    ]),
    ('cutoffs-sample-max', 'main', 'avx512', [
        KERNELS, '--processes', '3', '--cutoffs', 'e554328', '--only',
        'SN_SAMPLE_MAX_KIB', '--rounds', '9', '--fill', '0.03', '--threads',
        '2', '--isa', 'avx512', 'avx2', '--dtypes', 'float32'
    ]),
    ('paths', 'main', 'avx512',
     [PATHS, '--rounds', '7', '--threads', '2', '--isa', 'avx512', 'avx2']),
    ('paths-baseline', 'main', 'baseline',
     [PATHS, '--rounds', '7', '--threads', '2', '--isa', 'baseline']),
    ('paths-models', 'main', 'avx512',
     [PATHS, '--models', '--rounds', '3', '--isa', 'avx512', '--threads',
      '2']),
    ('resnet-avx512', 'main', 'avx512', [
        NORM, '--repeats', '21', '--cpu-isa', 'avx512', '--shapes', '6',
        '--skip-detector', '--threads', '2'
    ]),
    ('resnet-avx2', 'main', 'avx2', [
        NORM, '--repeats', '21', '--cpu-isa', 'avx2', '--shapes', '6',
        '--skip-detector', '--threads', '2'
    ]),
    ('detector-avx512', 'main', 'avx512', [
        NORM, '--repeats', '4', '--cpu-isa', 'avx512', '--shapes', '6',
        '--skip-resnet', '--threads', '2'
    ]),
    ('detector-avx2', 'main', 'avx2', [
        NORM, '--repeats', '4', '--cpu-isa', 'avx2', '--shapes', '6',
        '--skip-resnet', '--threads', '2'
    ]),
    ('oldest-resnet', 'oldest', None, [
        NORM, '--repeats', '21', '--shapes', '6', '--skip-detector',
        '--threads', '2'
    ]),
    ('oldest-detector', 'oldest', None, [
        NORM, '--repeats', '4', '--shapes', '6', '--skip-resnet', '--threads',
        '2'
    ]),
    ('numerics', 'main', None, [
        'tools/analysis_tools/precision_norm.py', '--steps', '3', '--start',
        'layer'
    ]),
    ('fuse', 'main', None,
     ['tools/analysis_tools/benchmark_fuse.py', '--repeats', '9']),
    ('compile', 'main', None,
     ['tools/analysis_tools/benchmark_compile.py', '--repeats', '7']),
    ('shared-heads', 'main', None, [
        'tools/analysis_tools/shared_head_study.py', '--seeds', '0', '1', '2',
        '3', '4'
    ]),
    ('group-sn', 'main', None,
     [NORM, '--group-sn', '--repeats', '7', '--threads', '2']),
    ('sw-avx512', 'main', 'avx512',
     [NORM, '--sw', '--repeats', '5', '--threads', '2', '--cpu-isa',
      'avx512']),
    ('sw-avx2', 'main', 'avx2',
     [NORM, '--sw', '--repeats', '5', '--threads', '2', '--cpu-isa', 'avx2']),
]
PYTHONS = {'main': MAIN_PY, 'oldest': OLDEST_PY}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        '--out',
        help='folder for the outputs (default: '
        'work_dirs/performance/COMMIT)')
    parser.add_argument(
        '--only',
        nargs='+',
        choices=[name for name, *_ in COMMANDS],
        metavar='NAME',
        help='run only these (names as --list prints them)')
    parser.add_argument(
        '--list', action='store_true', help='print the commands and exit')
    return parser.parse_args(argv)


def commit() -> str:
    """The short commit, marked when the tree differs from it."""

    def git(*args):
        return subprocess.run(['git', *args],
                              cwd=ROOT,
                              capture_output=True,
                              text=True).stdout.strip()

    dirty = git('status', '--porcelain', '--untracked-files=no')
    return git('rev-parse', '--short', 'HEAD') + ('+changes' if dirty else '')


def machine() -> str:
    """The CPU's model name, family and model, and the core count."""
    fields = {}
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                key, _, value = line.partition(':')
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get('model name', platform.processor() or 'unknown CPU')
    return (f'{name}, family {fields.get("cpu family", "?")} model '
            f'{fields.get("model", "?")}, {os.cpu_count()} cores')


def available_isas():
    try:
        from sn_mm.ops import cpu_isas
    except ImportError:
        return []
    return list(cpu_isas())


def run_streamed(line, path, header, name):
    """Run ``line``, printing each output line as it comes (prefixed with
    ``name``) and writing it after ``header`` to ``path``; the exit code and
    the seconds it took."""
    start = time.monotonic()
    with open(path, 'w') as f:
        f.write(header)
        process = subprocess.Popen(
            line,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=dict(os.environ, PYTHONUNBUFFERED='1'))
        for text in process.stdout:
            f.write(text)
            f.flush()
            print(f'{name}| {text}', end='', flush=True)
        returncode = process.wait()
        took = time.monotonic() - start
        f.write(f'\nexit: {returncode}, {took:.0f} s\n')
    return returncode, took


def command_line(venv, args):
    return [PYTHONS[venv], *args]


def main(argv=None):
    args = parse_args(argv)
    chosen = [c for c in COMMANDS if not args.only or c[0] in args.only]
    if args.list:
        for name, venv, _, cmd in chosen:
            print(f'{name}: {venv}: python {shlex.join(cmd)}')
        return
    out = args.out or osp.join(ROOT, 'work_dirs', 'performance', commit())
    os.makedirs(out, exist_ok=True)
    isas = available_isas()
    header = (f'date: {datetime.date.today()}\ncommit: {commit()}\n'
              f'machine: {machine()}\n')
    for name, venv, isa, cmd in chosen:
        if isa is not None and isa not in isas:
            print(f'{name}: skipped, this CPU runs {isas} and not {isa}')
            continue
        if not osp.exists(PYTHONS[venv]):
            print(f'{name}: skipped, no {PYTHONS[venv]}')
            continue
        line = command_line(venv, cmd)
        path = osp.join(out, f'{name}.txt')
        returncode, took = run_streamed(
            line, path, header + f'command: python {shlex.join(cmd)}\n'
            f'venv: {venv}\n\n', name)
        print(f'{name}: exit {returncode}, {took:.0f} s -> {path}', flush=True)
        if returncode:
            sys.exit(f'performance_tables: {name} failed (see {path})')


if __name__ == '__main__':
    main()
