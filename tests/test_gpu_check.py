"""tools/misc/gpu_check.py (make gpu-check) on this machine: without a GPU
it installs the carried wheels, runs its checks and timings at toy sizes on
the CPU, writes its JSON and exits 0, so that a GPU machine's minutes go to
measuring."""
import base64
import hashlib
import json
import zipfile

import pytest
import torch
from tool_runner import ROOT, run_python, tool

from sn_mm.ops import triton_problem


def probe_wheel(folder):
    """A minimal pure-Python wheel, built here: what the script installs
    for the GPU machine is the same kind of file."""
    name = 'sn_mm_gpu_probe'
    files = {
        f'{name}.py':
        b'VALUE = 42\n',
        f'{name}-0.1.dist-info/METADATA':
        f'Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n'.encode(),
        f'{name}-0.1.dist-info/WHEEL':
        b'Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n'
        b'Tag: py3-none-any\n'
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(
            hashlib.sha256(data).digest()).rstrip(b'=').decode()
        record.append(f'{path},sha256={digest},{len(data)}')
    record.append(f'{name}-0.1.dist-info/RECORD,,')
    files[f'{name}-0.1.dist-info/RECORD'] = ('\n'.join(record) + '\n').encode()
    path = folder / f'{name}-0.1-py3-none-any.whl'
    with zipfile.ZipFile(path, 'w') as zf:
        for arcname, data in files.items():
            zf.writestr(arcname, data)
    return path


@pytest.mark.skipif(torch.cuda.is_available(), reason='a GPU is there')
def test_gpu_check_runs_its_cpu_parts(tmp_path):
    wheels = tmp_path / 'wheels'
    wheels.mkdir()
    probe_wheel(wheels)
    out = tmp_path / 'gpu_check.json'
    # (test_sync_sn_triton.py's two-process runs left out: the suite runs
    # that file itself.)
    result = run_python([
        tool('misc', 'gpu_check.py'), '--wheels', wheels, '--out', out,
        '--select', 'not fused_sync and not fused_path'
    ],
                        cwd=tmp_path,
                        timeout=900)
    assert 'No GPU here' in result.stdout
    assert 'carried wheels: 1' in result.stdout
    report = json.loads(out.read_text())
    assert report['wheels'] == ['sn_mm_gpu_probe-0.1-py3-none-any.whl']
    checks = report['checks']
    assert all(c['ok'] for c in checks), [c for c in checks if not c['ok']]
    ran = {
        c['check'].split('[')[0]
        for c in checks if not c['detail'].startswith('skipped')
    }
    expected = {
        'test_against_float64_reference', 'test_empty_batch',
        'test_gradcheck_and_gradgradcheck', 'test_autocast',
        'test_channels_last_without_a_full_size_copy',
        'test_syncsn_collective_path_on_one_rank',
        'test_fused_kernels_agree_with_the_reference'
    }
    if triton_problem() is not None:  # (a Triton older than the kernels')
        expected.remove('test_fused_kernels_agree_with_the_reference')
    assert expected <= ran, expected - ran
    settle = next(c for c in checks if c['check'] == 'varying sizes settle')
    assert settle['ok'] and report['varying_sizes']['summary']['steps'] == 12
    bench = report['bench']
    assert {'layer, operator eval fwd', 'layer, direct train fwd+bwd'} <= \
        set(bench['route_host_us'])
    layers = {(r['layer'], r['dtype']) for r in bench['layers']}
    for layer in ('SN', 'SyncSN', 'BN', 'GN(32)', 'IN', 'LN'):
        assert {(layer, 'float32'), (layer, 'bfloat16')} <= layers
    assert all(r['eval_bw_fraction'] > 0 for r in bench['layers']
               if r['layer'] == 'SN')
    assert {r['dtype'] for r in bench['two_read']} == {'float32', 'bfloat16'}
    assert all(r['bw_fraction'] > 0 for r in bench['two_read'])
    assert 'Ceiling of the eval-bandwidth column at 2x32x8x8' in \
        result.stdout
    assert [r['norm']
            for r in bench['resnet50_step']['rows']] == ['BN', 'GN(32)', 'SN']
    assert '| ResNet-50 train step' in result.stdout
    groups = {r['layer'] for r in report['group_sn']['group_sn']}
    assert groups == {'SN', 'SN G=2', 'SN G=32'}
    assert 'checks passed' in result.stdout
    if triton_problem() is not None:
        return
    # The Triton plans' A/B (benchmark_paths.py --triton, in the
    # interpreter): each layout ran with it on, never with it off.
    plans = {(r['path'], r['mode']) for r in report['triton_paths']}
    assert plans == {(p, m)
                     for p in ('split_rows', 'channels_last_tiles')
                     for m in ('eval', 'train')}
    assert all(r['taken_on'] > 0 and r['taken_off'] == 0
               for r in report['triton_paths'])


def test_gpu_check_reports_a_failing_test(tmp_path):
    """A failing GPU test makes the check fail and names it; --select
    runs only the tests it matches."""
    out = tmp_path / 'gpu_check.json'
    result = run_python([
        tool('misc', 'gpu_check.py'), '--skip-bench', '--out', out, '--select',
        'test_autocast'
    ],
                        cwd=tmp_path,
                        ok=False,
                        env={'SN_MM_KERNELS': 'no-such-kernels'},
                        timeout=900)
    assert result.returncode == 1
    report = json.loads(out.read_text())
    tests = [c for c in report['checks'] if c['check'].startswith('test_')]
    assert tests and all(c['check'].startswith('test_autocast[')
                         for c in tests), tests
    assert any(not c['ok'] for c in tests)
    assert 'FAILED: test_autocast[' in result.stdout


def test_gpu_check_help():
    result = run_python([tool('misc', 'gpu_check.py'), '--help'], cwd=ROOT)
    assert '--wheels' in result.stdout and '--skip-bench' in result.stdout
