"""The tree is clean under OpenMMLab's lint and format set, as configured in
setup.cfg (flake8, isort, yapf), and the C++ under clang-format
(.clang-format); each check fails naming what it would change. vermin finds
nothing that needs a newer Python than setup.py's ``python_requires``."""
import glob
import importlib.util
import os.path as osp
import re
import shutil
import subprocess
import sys

import pytest
from tool_runner import ROOT

PYTHON_DIRS = ['sn_mm', 'tools', 'tests', 'configs', 'setup.py']
CPP = sorted(glob.glob(osp.join(ROOT, 'sn_mm', 'ops', 'csrc', '*.[ch]*')))


def run(*args):
    return subprocess.run([sys.executable, '-m', *args],
                          cwd=ROOT,
                          capture_output=True,
                          text=True)


def require(module):
    """Skip where ``module`` (a tool of requirements/tests.txt) is not
    installed: the oldest leg (make test-oldest) installs none of them; the
    source they check is the same on every leg."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f'{module} is not installed (requirements/tests.txt, '
                    'the main leg)')


def test_flake8():
    require('flake8')
    result = run('flake8', *PYTHON_DIRS)
    assert result.returncode == 0, result.stdout[-3000:]


def test_isort():
    require('isort')
    result = run('isort', '--check-only', '--diff', *PYTHON_DIRS)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]


def test_yapf():
    require('yapf')
    result = run('yapf', '--diff', '--recursive', '--parallel', *PYTHON_DIRS)
    assert result.returncode == 0 and not result.stdout, \
        result.stdout[-3000:]


def test_clang_format():
    binary = shutil.which('clang-format') or osp.join(
        osp.dirname(sys.executable), 'clang-format')
    if not osp.exists(binary):
        pytest.skip('clang-format is not installed (requirements/tests.txt)')
    result = subprocess.run([binary, '--dry-run', '--Werror', *CPP],
                            cwd=ROOT,
                            capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr[-3000:]


def test_vermin_finds_nothing_newer_than_python_requires():
    require('vermin')
    with open(osp.join(ROOT, 'setup.py')) as f:
        oldest = re.search(r"python_requires='>=([0-9.]+)'", f.read())[1]
    # --exclude long: a tensor's .long() reads to vermin as Python 2's long.
    result = subprocess.run([
        osp.join(osp.dirname(sys.executable),
                 'vermin'), f'-t={oldest}-', '--violations',
        '--eval-annotations', '--no-tips', '--exclude', 'long', *PYTHON_DIRS
    ],
                            cwd=ROOT,
                            capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout[-3000:]
