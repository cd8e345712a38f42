"""The C++ kernels build on every CPU: with an aarch64 cross-compiler (CI
installs Debian's g++-aarch64-linux-gnu) the operator's host side is
checked against torch's headers and the row kernels are compiled for Arm,
where only the baseline set exists; each set's kernels are self-contained
(no symbol but its table's getter, no call but to the coefficients compiled
once), so that no code compiled for one instruction set is shared with
callers on another."""
import os.path as osp
import shutil
import subprocess
import sysconfig

import pytest
import torch
from tool_runner import ROOT

CSRC = osp.join(ROOT, 'sn_mm', 'ops', 'csrc')
CROSS = shutil.which('aarch64-linux-gnu-g++')
needs_cross = pytest.mark.skipif(
    CROSS is None,
    reason='no aarch64 cross-compiler (apt-get install '
    'g++-aarch64-linux-gnu)')


def torch_includes():
    base = osp.join(osp.dirname(torch.__file__), 'include')
    return [
        '-I', base, '-I',
        osp.join(base, 'torch', 'csrc', 'api', 'include'), '-I',
        sysconfig.get_paths()['include']
    ]


HOST_FILES = ('sn_operator', 'sn_host', 'sn_forward', 'sn_backward',
              'row_coefficients')
# What a set's kernels may call: the coefficients compiled once, for every
# set (row_kernels.h), and the C library's memcpy.
COMPILED_ONCE = sorted([
    f'void sn_mm_rows::input_grad_coefficients<{t}>(sn_mm_rows::'
    f'RowArgs<{t}> const&, long, long, {t}*, {t}*, {t}*)'
    for t in ('double', 'float')
] + ['memcpy'])


@pytest.fixture(scope='module')
def arm_host_checks():
    """The host files' Arm syntax checks, started together (the suite's
    time: each takes several seconds); each test waits for its own."""
    checks = {
        name:
        subprocess.Popen([
            CROSS, '-fsyntax-only', '-std=c++20', '-fopenmp', '-Wno-psabi',
            *torch_includes(),
            osp.join(CSRC, f'{name}.cpp')
        ],
                         stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE,
                         text=True)
        for name in HOST_FILES
    }
    yield checks
    for process in checks.values():  # those no selected test waited for
        process.kill()
        process.communicate()


@needs_cross
@pytest.mark.parametrize('name', HOST_FILES)
def test_the_host_side_compiles_for_arm(name, arm_host_checks):
    _, stderr = arm_host_checks[name].communicate(timeout=600)
    assert arm_host_checks[name].returncode == 0, stderr[-3000:]


@needs_cross
@pytest.mark.parametrize('isa', ['baseline', 'avx2'])
def test_row_kernels_compile_for_arm_self_contained(isa, tmp_path):
    obj = tmp_path / f'{isa}.o'
    result = subprocess.run([
        CROSS, '-c', '-O2', '-std=c++20', '-fno-math-errno', '-Wno-psabi',
        osp.join(CSRC, f'row_kernels_{isa}.cpp'), '-o',
        str(obj)
    ],
                            capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    symbols = subprocess.run(
        ['aarch64-linux-gnu-nm', '-C', '--defined-only', '-g',
         str(obj)],
        capture_output=True,
        text=True,
        check=True).stdout.split('\n')
    undefined = subprocess.run(['aarch64-linux-gnu-nm', '-C', '-u',
                                str(obj)],
                               capture_output=True,
                               text=True,
                               check=True).stdout.split('\n')
    # Arm builds have the baseline set only: the AVX2 file defines nothing.
    defined = [s.split()[-1] for s in symbols if s.strip()]
    assert defined == {
        'baseline': ['sn_mm_rows::row_kernels_baseline()'],
        'avx2': []
    }[isa]
    calls = [u.strip()[2:] for u in undefined if u.strip()]
    assert set(calls) <= set(COMPILED_ONCE), calls
