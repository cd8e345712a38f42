"""Install sn_mm as a user with an OpenMMLab environment does, and check it.

1. Builds a wheel of this checkout with pip's default build isolation
   (``pip wheel``), using the pip that a fresh venv ships.
2. Installs it into a fresh venv that sees the given environment's packages
   (torch, OpenMMLab, ...) but not its sn_mm, with ``--no-index``: nothing
   is downloaded, and nothing the environment has is replaced.
3. Times, from ``pip install <wheel>``, the first SN output on a CPU with
   the C++ kernels built into an empty cache, then again from the cache.
4. Runs the native-kernel agreement tests (tests/test_native_kernels.py)
   on that install, with each compiler given (``--compilers``), each
   building into its own empty cache.

Prints a table of seconds and results; exits non-zero if anything fails.

Example::

    python tools/misc/wheel_check.py --env .venv/bin/python \\
        --compilers g++-11 clang++-16
"""
import argparse
import os
import os.path as osp
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
# What a user's checkout holds that a wheel is built from (not the venvs,
# data or build outputs beside it).
SKIP = ('.git', '.venv*', 'data', 'work_dirs', 'checkpoints', 'build', 'dist',
        'gpu_wheels', '__pycache__', '*.pyc', '*.so', '.mim', '*.egg-info',
        '.pytest_cache')
FIRST_OUTPUT = ('import time; start = time.perf_counter()\n'
                'import torch, sn_mm\n'
                'from sn_mm.ops import native_status\n'
                'y = sn_mm.SwitchableNorm(8)(torch.randn(2, 8, 5, 5))\n'
                'status = native_status()\n'
                'assert status.available, status.reason\n'
                'print(f"{status.origin} {time.perf_counter() - start:.1f} "\n'
                '      f"{sn_mm.__file__}")\n')


def run(args, **kwargs):
    print('+', ' '.join(args), flush=True)
    return subprocess.run(args, check=True, **kwargs)


def output(args, **kwargs):
    return subprocess.run(
        args, check=True, capture_output=True, text=True,
        **kwargs).stdout.strip()


def purelib(python):
    return output([
        python, '-c', 'import sysconfig; print(sysconfig.get_paths()'
        '["purelib"])'
    ])


def fresh_venv(env_python, where):
    """A venv of the environment's base Python with the pip it ships, and
    the environment's site-packages entries linked in but sn_mm's (the
    environment's setuptools, which its torch may require, replaces the
    venv's own)."""
    run([env_python, '-m', 'venv', where])
    python = osp.join(where, 'bin', 'python')
    run([python, '-m', 'pip', 'uninstall', '-q', '-y', 'setuptools'])
    theirs, ours = purelib(env_python), purelib(python)
    mine = os.listdir(ours)
    # A project's package and dist-info folders start with its name.
    own = {name.split('-')[0].split('.')[0].lower() for name in mine}
    for name in sorted(os.listdir(theirs)):
        project = name.split('-')[0].split('.')[0].lower()
        if project in own or 'sn_mm' in name.lower().replace('-', '_'):
            continue
        if name.endswith('.pth'):
            copy_pth(osp.join(theirs, name), osp.join(ours, name))
        else:
            os.symlink(osp.join(theirs, name), osp.join(ours, name))
    return python


def copy_pth(source, target):
    """A .pth file without the lines that put a checkout of sn_mm on the
    path (a legacy editable install's easy-install.pth)."""
    with open(source) as f:
        lines = f.readlines()
    with open(target, 'w') as f:
        f.writelines(
            line for line in lines
            if not osp.isfile(osp.join(line.strip(), 'sn_mm', '__init__.py')))


def time_first_output(python, env, cwd):
    start = time.perf_counter()
    line = output([python, '-c', FIRST_OUTPUT], env=env, cwd=cwd)
    origin, _, where = line.splitlines()[-1].split(' ', 2)
    return origin, time.perf_counter() - start, where


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog='\n\n'.join(__doc__.split('\n\n')[1:]))
    parser.add_argument(
        '--env',
        default=sys.executable,
        help='the Python of the environment to install into a copy of '
        '(default: this one)')
    parser.add_argument(
        '--compilers',
        nargs='*',
        default=[],
        help='more C++ compilers to build the kernels with and run the '
        'agreement tests on (the default compiler always runs)')
    parser.add_argument(
        '--tests',
        default='tests/test_native_kernels.py',
        help='the agreement tests (pytest arguments, relative to the '
        'checkout)')
    return parser.parse_args(argv)


def build_and_install(python, work, env, rows):
    """Build the wheel (build isolation), install it (no index), and time
    the first SN output twice: with the kernels' build, then cached."""
    src = osp.join(work, 'src')
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*SKIP))
    start = time.perf_counter()
    run([
        python, '-m', 'pip', 'wheel', '-q', '--no-deps', '-w',
        osp.join(work, 'dist'), src
    ],
        cwd=work)
    wheels = os.listdir(osp.join(work, 'dist'))
    rows.append(('pip wheel (build isolation)',
                 f'{time.perf_counter() - start:.1f}', wheels[0]))
    assert wheels[0].endswith('-py3-none-any.whl'), wheels
    start = time.perf_counter()
    run([
        python, '-m', 'pip', 'install', '-q', '--no-index', '--find-links',
        osp.join(work, 'dist'), 'sn_mm'
    ],
        cwd=work)
    installed = time.perf_counter() - start
    rows.append(('pip install <wheel> --no-index', f'{installed:.1f}',
                 'no download, nothing replaced'))
    for label in ('first SN output, kernels built',
                  'first SN output, kernels cached'):
        origin, seconds, where = time_first_output(python, env, work)
        assert where.startswith(work), where  # the wheel's sn_mm
        rows.append((label, f'{installed + seconds:.1f}',
                     f'{origin} (from pip install on)'))


def agreement_tests(python, work, env, cxx, tests, rows):
    """Build the kernels with ``cxx`` (None: the default compiler, cached
    already) and run the agreement tests on them; whether they passed."""
    name = cxx or os.environ.get('CXX') or 'c++ (default)'
    env = dict(env)
    if cxx:
        env['CXX'] = cxx
        env['TORCH_EXTENSIONS_DIR'] = osp.join(work, f'ext-{cxx}')
    start = time.perf_counter()
    try:
        origin, _, _ = time_first_output(python, env, work)
    except subprocess.CalledProcessError as err:
        print(err.stdout, err.stderr)
        rows.append((f'kernels with {name}', '-', 'FAILED to build'))
        return False
    # Two workers, as make test runs (pytest-xdist): half the time here.
    result = subprocess.run([
        python, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-n', '2',
        *[osp.join(ROOT, t) for t in tests.split()]
    ],
                            cwd=work,
                            env=env,
                            capture_output=True,
                            text=True)
    last = (result.stdout.strip().splitlines() or ['?'])[-1]
    if result.returncode != 0:
        print(result.stdout[-5000:], result.stderr[-3000:])
    rows.append((f'kernels with {name}', f'{time.perf_counter() - start:.1f}',
                 f'{origin}; {last}'))
    return result.returncode == 0


def main(argv=None):
    args = parse_args(argv)
    work = tempfile.mkdtemp(prefix='sn_mm_wheel_')
    rows, failed = [], []
    try:
        python = fresh_venv(args.env, osp.join(work, 'venv'))
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=osp.join(work, 'ext'))
        env.pop('SN_MM_NO_EXT', None)
        build_and_install(python, work, env, rows)
        for cxx in [None] + args.compilers:
            if not agreement_tests(python, work, env, cxx, args.tests, rows):
                failed.append(cxx or 'the default compiler')
    finally:
        shutil.rmtree(work, ignore_errors=True)

    width = max(len(r[0]) for r in rows)
    print(f'\n{"step":<{width}}  seconds  result')
    for step, seconds, result in rows:
        print(f'{step:<{width}}  {seconds:>7}  {result}')
    if failed:
        sys.exit(f'failed: {", ".join(failed)}')


if __name__ == '__main__':
    main()
