"""The tree is clean under OpenMMLab's lint and format set, as configured in
setup.cfg (flake8, isort, yapf), and the C++ under clang-format
(.clang-format); each check fails naming what it would change."""
import glob
import os.path as osp
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


def test_flake8():
    result = run('flake8', *PYTHON_DIRS)
    assert result.returncode == 0, result.stdout[-3000:]


def test_isort():
    result = run('isort', '--check-only', '--diff', *PYTHON_DIRS)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]


def test_yapf():
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
