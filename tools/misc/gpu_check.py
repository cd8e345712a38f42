#!/usr/bin/env python
"""SN on an NVIDIA GPU: the whole check as one prepared script.

``make gpu-check`` runs it. Made for a GPU machine that is lent for minutes
at a time and has PyTorch, Triton, pytest and numpy but no mmengine and no
package registry: it installs the pure-Python wheels that ``make
gpu-wheels`` put in ``gpu_wheels/`` (mmengine and what the image lacks)
into a temporary folder, imports sn_mm from the working tree (no build: on
a GPU SN runs on Triton or PyTorch ops) and then

1. runs the GPU tests, ``tests/test_cuda.py`` and
   ``tests/test_sync_sn_triton.py`` (SyncSN in two processes on the one
   GPU; pytest marker ``cuda``);
2. runs 200 training steps of SN layers over input sizes that change
   every batch (``sn_mm.testing.varying_sizes``): Triton compilations per
   step, the host caches' and the device memory's growth;
3. runs ``tools/analysis_tools/benchmark_norm.py --device cuda``: the layers
   at the detector shapes in float32 and bf16 with the bandwidth column and
   its two-read ceiling, the host cost per call, the kernels per call, and
   a ResNet-50 training step; then ``--group-sn``: group SN (2 and 32
   ratio groups) against SN at every shape;
4. runs ``tools/analysis_tools/benchmark_paths.py --triton``: each of the
   Triton plans' layouts (split rows, channels_last tiles) on and off
   where it applies.

It prints one summary, writes every result to a JSON file (after each
phase, so that a run stopped at its time limit keeps what it measured) and
exits 1 if a check fails. Without a GPU it says so and runs both on the
CPU at toy sizes (``SN_MM_TEST_DEVICE=cpu``, ``--toy``), so that it is
tested before GPU minutes are spent.
"""
import argparse
import glob
import importlib.util
import json
import os
import os.path as osp
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
# The GPU tests, and SyncSN in two processes on the one GPU.
TEST_FILES = ('test_cuda.py', 'test_sync_sn_triton.py')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--wheels',
        default=osp.join(ROOT, 'gpu_wheels'),
        help='folder of carried wheels (make gpu-wheels); '
        'skipped with a note where it does not exist')
    parser.add_argument(
        '--out',
        default=None,
        help='JSON file (default: $OUT/gpu_check.json if '
        '$OUT is set, else work_dirs/gpu_check.json)')
    parser.add_argument(
        '--repeats',
        type=int,
        default=None,
        help='timed repeats per measurement (default: 6 '
        'on a GPU, 1 on the CPU)')
    parser.add_argument(
        '--skip-bench', action='store_true', help='the tests only')
    parser.add_argument(
        '--select',
        default=None,
        help='run only the GPU tests whose names match this pytest -k '
        'expression (a rerun of the ones that failed)')
    return parser.parse_args(argv)


def install_wheels(folder):
    """pip-installs the wheels (no index, no dependencies) into a temporary
    folder; returns the folder and what it installed."""
    wheels = sorted(glob.glob(osp.join(folder, '*.whl')))
    if not wheels:
        return None, []
    target = tempfile.mkdtemp(prefix='sn_mm_wheels_')
    subprocess.run([
        sys.executable, '-m', 'pip', 'install', '-q', '--no-index',
        '--no-deps', '--no-compile', '--no-cache-dir', '--target', target,
        *wheels
    ],
                   check=True)
    return target, [osp.basename(w) for w in wheels]


def run_tests(env, select=None):
    """``pytest -m cuda`` on TEST_FILES in a process of its own (only the
    tests matching the ``-k`` expression ``select`` where given); each test
    case as a check (name, ok, detail, seconds)."""
    junit = osp.join(tempfile.mkdtemp(prefix='sn_mm_gpu_tests_'), 'j.xml')
    subprocess.run([
        sys.executable, '-m', 'pytest', '-q', '-m', 'cuda', '-rfEs',
        f'--junitxml={junit}', *(['-k', select] if select else []),
        *[osp.join(ROOT, 'tests', f) for f in TEST_FILES]
    ],
                   cwd=ROOT,
                   env=env)
    checks = []
    if not osp.exists(junit):
        return [
            dict(
                check='tests/test_cuda.py',
                ok=False,
                detail='pytest wrote no report',
                seconds=0)
        ]
    for case in ET.parse(junit).iter('testcase'):
        failed = case.find('failure')
        if failed is None:
            failed = case.find('error')
        skipped = case.find('skipped')
        detail = ('skipped: ' +
                  skipped.get('message', '') if skipped is not None else
                  (failed.get('message', '') if failed is not None else ''))
        checks.append(
            dict(
                check=case.get('name'),
                ok=failed is None,
                detail=detail.splitlines()[0][:300] if detail else '',
                seconds=float(case.get('time', 0))))
    return checks


def load_benchmark():
    path = osp.join(ROOT, 'tools', 'analysis_tools', 'benchmark_norm.py')
    spec = importlib.util.spec_from_file_location('benchmark_norm', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def environment(report, args):
    """Wheels installed, sn_mm importable from the tree; what runs where."""
    env = dict(os.environ)
    paths = [ROOT]
    if osp.isdir(args.wheels):
        target, report['wheels'] = install_wheels(args.wheels)
        paths = ([target] if target else []) + paths
    else:
        report['wheels'] = []
        print(f'(no {args.wheels}: using the packages installed here; '
              '`make gpu-wheels` prepares them for a GPU machine)')
    sys.path[:0] = paths
    env['PYTHONPATH'] = os.pathsep.join(
        paths + [p for p in [env.get('PYTHONPATH')] if p])
    try:
        import mmengine
    except ImportError as err:
        sys.exit(f'gpu_check: {err}: sn_mm needs mmengine. Run `make '
                 'gpu-wheels` where pip reaches the registry and carry '
                 'gpu_wheels/ along (--wheels DIR names another folder).')
    import torch

    import sn_mm
    cuda = torch.cuda.is_available()
    report.update(
        mmengine=f'{mmengine.__version__} from {mmengine.__file__}',
        torch=torch.__version__,
        sn_mm=sn_mm.__version__,
        device=(torch.cuda.get_device_name()
                if cuda else f'CPU ({os.cpu_count()} cores)'))
    try:
        import triton
        report['triton'] = triton.__version__
    except ImportError:
        report['triton'] = None
    if not cuda:
        env['SN_MM_TEST_DEVICE'] = 'cpu'
    return env, cuda


def varying_sizes(report, cuda):
    """SN training steps over sizes that change every batch; a check that
    compilations, caches and allocated memory settle."""
    from sn_mm.testing import varying_sizes as vs
    steps = 200 if cuda else 12
    print(
        f'\nVarying sizes ({steps} training steps, a new image size and '
        'RoI count each)',
        flush=True)
    begin = time.perf_counter()
    try:
        rows = vs.run('cuda' if cuda else 'cpu', steps=steps, toy=not cuda)
    except Exception as err:  # a result to report; the other phases run
        return dict(
            check='varying sizes settle',
            ok=False,
            detail=repr(err)[:300],
            seconds=round(time.perf_counter() - begin, 1))
    result = vs.summary(rows)
    report['varying_sizes'] = dict(summary=result, rows=rows)
    print(f'  {result}')
    return dict(
        check='varying sizes settle',
        ok=result['stopped'],
        detail=str(result)[:300],
        seconds=round(time.perf_counter() - begin, 1))


def triton_paths(report, env, cuda):
    """The Triton plans' A/B (benchmark_paths.py --triton) in a process of
    its own; in Triton's interpreter at toy sizes without a GPU; skipped
    where this Triton cannot run SN's kernels."""
    from sn_mm.ops import triton_problem
    if triton_problem() is not None:
        return dict(
            check='Triton plans timed on and off',
            ok=True,
            detail=f'skipped: {triton_problem()}',
            seconds=0.0)
    table = osp.join(tempfile.mkdtemp(prefix='sn_mm_paths_'), 'paths.json')
    flags = ['--triton', '--rounds', '3' if cuda else '1', '--json', table]
    if not cuda:
        flags.append('--toy')
    print(
        f'\nTriton plans (benchmark_paths.py {" ".join(flags[:-2])})',
        flush=True)
    begin = time.perf_counter()
    result = subprocess.run(
        [
            sys.executable,
            osp.join(ROOT, 'tools', 'analysis_tools', 'benchmark_paths.py'),
            *flags
        ],
        cwd=ROOT,
        env=env if cuda else dict(env, TRITON_INTERPRET='1'))
    ok = result.returncode == 0 and osp.exists(table)
    if ok:
        with open(table) as f:
            report['triton_paths'] = json.load(f)
    return dict(
        check='Triton plans timed on and off',
        ok=ok,
        detail='' if ok else f'exit {result.returncode}',
        seconds=round(time.perf_counter() - begin, 1))


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    report = dict(
        date=time.strftime('%Y-%m-%d %H:%M:%S %Z'),
        python=platform.python_version())
    env, cuda = environment(report, args)
    print(f'sn_mm {report["sn_mm"]}, torch {report["torch"]}, triton '
          f'{report["triton"]}, Python {report["python"]}, on '
          f'{report["device"]}; carried wheels: {len(report["wheels"])}')
    if not cuda:
        print('No GPU here: the tests and timings run on the CPU at toy '
              'sizes so that the script is tested; the GPU figures need a '
              'GPU machine.')
    out = args.out or osp.join(
        os.environ.get('OUT') or osp.join(ROOT, 'work_dirs'), 'gpu_check.json')
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)

    def save():
        report['seconds'] = round(time.perf_counter() - start, 1)
        with open(out, 'w') as f:
            json.dump(report, f, indent=1)

    print(f'\nTests ({", ".join(TEST_FILES)})', flush=True)
    report['checks'] = run_tests(env, args.select)
    save()
    report['checks'].append(varying_sizes(report, cuda))
    save()
    if not args.skip_bench:
        repeats = args.repeats or (6 if cuda else 1)
        flags = [
            '--repeats',
            str(repeats), '--allocator', 'system', '--skip-detector',
            '--skip-resnet'
        ]
        flags += ['--device', 'cuda'] if cuda else ['--toy', '--gpu-sections']
        print(
            '\nTimings (tools/analysis_tools/benchmark_norm.py '
            f'{" ".join(flags)})',
            flush=True)
        group_flags = [
            '--group-sn', '--repeats',
            str(max(repeats // 2, 1)), '--allocator', 'system'
        ] + (['--device', 'cuda'] if cuda else ['--toy'])
        try:
            report['bench'] = load_benchmark().main(flags)
            save()
            print('\nGroup SN (benchmark_norm.py '
                  f'{" ".join(group_flags)})',
                  flush=True)
            report['group_sn'] = load_benchmark().main(group_flags)
        except Exception as err:  # a result to report; the tests stand
            report['checks'].append(
                dict(
                    check='timings ran',
                    ok=False,
                    detail=repr(err)[:300],
                    seconds=0))
        save()
        report['checks'].append(triton_paths(report, env, cuda))
    save()
    failed = [c['check'] for c in report['checks'] if not c['ok']]
    print(f'\n{len(report["checks"]) - len(failed)} of '
          f'{len(report["checks"])} checks passed' +
          (f'; FAILED: {", ".join(failed)}' if failed else '') +
          f'; {report["seconds"]} s; figures in {out}')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
