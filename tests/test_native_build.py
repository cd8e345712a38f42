"""How SN finds its C++ CPU kernels (sn_mm/ops/native.py), each cause that
stops them forced in a fresh process: one warning that names the cause and
the fix, then SN on PyTorch ops, computing the same; never silence.

The kernels' own build (into an empty cache, with GCC 11 and 12 and clang)
is tools/misc/wheel_check.py's, which CI runs on both legs: a build takes a
minute, too long for the suite.
"""
import glob
import importlib.machinery
import os
import os.path as osp
import shutil
import stat

import pytest
from tool_runner import ROOT, run_python_together

from sn_mm.ops import native_status
from sn_mm.ops.native import build_key

# Runs SN in a fresh process; prints the status, the warnings and whether
# the output matches the reference.
PROBE = '''
import warnings
warnings.simplefilter('always')
with warnings.catch_warnings(record=True) as caught:
    import torch
    from sn_mm import SwitchableNorm
    from sn_mm.ops import implementation, native_available, native_status
    x = torch.randn(2, 4, 5, 5)
    layer = SwitchableNorm(4)
    y = layer(x)
    y = layer(x)  # a second call: no second warning
    native_available()
    same = torch.allclose(y, SwitchableNorm(4, kernels='torch')(x),
                          atol=1e-5)
    kind = implementation(None, x, layer.weight, None)
status = native_status()
ours = [str(w.message) for w in caught if 'sn_mm' in str(w.message)]
print('STATUS', status.available, status.origin, kind, same)
print('WARNINGS', len(ours))
for message in ours:
    print(message)
'''

NOT_BUILT_HERE = native_status().origin == 'prebuilt'


def probe(tmp_path, env, cwd=ROOT):
    env = dict({'TORCH_EXTENSIONS_DIR': str(tmp_path / 'cache')}, **env)
    # This process's SN_MM_NO_EXT=1 would hide the cause each test forces.
    base = {k: v for k, v in os.environ.items() if k != 'SN_MM_NO_EXT'}
    run, = run_python_together([['-c', PROBE]],
                               cwd,
                               env=env,
                               timeout=600,
                               base_env=base)
    lines = run.stdout.splitlines()
    status = next(line for line in lines if line.startswith('STATUS'))
    count = next(line for line in lines if line.startswith('WARNINGS'))
    return status.split()[1:], int(count.split()[1]), run.stdout


def fake_compiler(tmp_path, version='fakecc 1.0'):
    path = tmp_path / 'fakecc'
    # Answers the version queries (torch 2.1 asks with -v too), fails to
    # compile.
    path.write_text('#!/bin/sh\n'
                    'if [ "$1" = "--version" ] || [ "$1" = "-v" ]; then '
                    f'echo "{version}"; exit 0; fi\n'
                    'echo "fake.cpp:1:1: error: this compiler builds '
                    'nothing" >&2\n'
                    'exit 1\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_this_process_runs_the_kernels():
    # Built by make venv's first use, or by the first test that needed
    # them; SN_MM_NO_EXT=1 is the only way to go without.
    status = native_status()
    if os.environ.get('SN_MM_NO_EXT') == '1':
        assert status.origin == 'disabled' and not status.available
        return
    assert status.available, status.reason
    assert status.origin in ('prebuilt', 'built', 'cached')
    assert osp.isfile(status.path)


def no_ninja_path(tmp_path):
    """A PATH with the compiler alone (the interpreter runs by its path)."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    (bin_dir / 'c++').symlink_to(shutil.which('c++'))
    return str(bin_dir)


# Each cause that stops the build: the environment that forces it, and what
# the one warning says.
CAUSES = {
    'no_compiler': (lambda tmp: {
        'CXX': '/nowhere/g++'
    }, ["'/nowhere/g++' (CXX) is not found", 'apt install g++']),
    'failed_build': (lambda tmp: {
        'CXX': fake_compiler(tmp)
    }, [
        'did not build with fakecc 1.0', 'error: this compiler builds nothing',
        'SN_MM_VERBOSE_BUILD=1'
    ]),
    'no_ninja': (lambda tmp: {
        'PATH': no_ninja_path(tmp)
    }, ['ninja, which torch builds extensions with', 'pip install ninja']),
}
needs_a_build = pytest.mark.skipif(
    NOT_BUILT_HERE,
    reason='a prebuilt sn_mm._ext loads before any build is tried '
    '(SN_MM_BUILD_EXT=1)')


@needs_a_build
@pytest.mark.parametrize('cause', CAUSES)
def test_a_cause_is_named_once_then_pytorch_ops(tmp_path, cause):
    make_env, said = CAUSES[cause]
    (ok, origin, kind, same), warnings, out = probe(tmp_path,
                                                    make_env(tmp_path))
    assert (ok, origin, kind, same) == ('False', 'failed', 'torch', 'True')
    assert warnings == 1, out
    assert 'SN runs on PyTorch ops on CPUs' in out
    for words in said:
        assert words in out, out


def test_switched_off_says_so_without_a_warning(tmp_path):
    (ok, origin, kind, same), warnings, out = probe(tmp_path,
                                                    {'SN_MM_NO_EXT': '1'})
    assert (ok, origin, kind, same) == ('False', 'disabled', 'torch', 'True')
    assert warnings == 0, out


@pytest.fixture
def package_with_a_stale_prebuilt(tmp_path):
    """A copy of the sn_mm package whose prebuilt sn_mm._ext does not load
    (as after a torch upgrade), first on PYTHONPATH."""
    site = tmp_path / 'site'
    shutil.copytree(
        osp.join(ROOT, 'sn_mm'),
        site / 'sn_mm',
        ignore=shutil.ignore_patterns('__pycache__', '*.so', '.mim'))
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (site / 'sn_mm' / f'_ext{suffix}').write_bytes(b'not a shared library')
    return site


def test_a_prebuilt_that_does_not_load_is_named(tmp_path,
                                                package_with_a_stale_prebuilt):
    (ok, origin, kind, same), warnings, out = probe(
        tmp_path, {
            'CXX': '/nowhere/g++',
            'PYTHONPATH': str(package_with_a_stale_prebuilt)
        },
        cwd=tmp_path)
    assert (ok, origin, kind, same) == ('False', 'failed', 'torch', 'True')
    assert warnings == 1, out
    assert 'the prebuilt sn_mm._ext does not load' in out
    assert "'/nowhere/g++' (CXX) is not found" in out


@needs_a_build
@pytest.mark.skipif(
    not native_status().available,
    reason='this process has no cached build to give way to')
def test_a_stale_prebuilt_gives_way_to_the_cached_build(
        tmp_path, package_with_a_stale_prebuilt):
    # The cache this process loaded from: the copy's sources are the same,
    # so its key is too. The copy, at another path, loads that build as it
    # is: two installs sharing a cache do not rebuild it after each other.
    folder = osp.dirname(native_status().path)
    objects = {
        path: os.stat(path).st_mtime_ns
        for path in glob.glob(osp.join(folder, '*.o'))
    }
    assert objects
    (ok, origin, kind, same), warnings, out = probe(
        tmp_path, {
            'TORCH_EXTENSIONS_DIR': osp.dirname(folder),
            'PYTHONPATH': str(package_with_a_stale_prebuilt)
        },
        cwd=tmp_path)
    assert (ok, origin, kind, same) == ('True', 'cached', 'native', 'True')
    assert warnings == 0, out
    assert {path: os.stat(path).st_mtime_ns for path in objects} == objects


def test_the_key_changes_with_the_compiler_and_the_sources(
        tmp_path, monkeypatch):
    from sn_mm.ops import native
    key = build_key('g++ 12.2.0')
    assert build_key('g++ 12.2.0') == key
    assert build_key('g++ 11.3.0') != key
    csrc = tmp_path / 'csrc'
    shutil.copytree(native.CSRC, csrc)
    monkeypatch.setattr(native, 'CSRC', str(csrc))
    assert build_key('g++ 12.2.0') == key
    with open(csrc / 'sn_host.h', 'a') as f:
        f.write('// edited\n')
    assert build_key('g++ 12.2.0') != key
