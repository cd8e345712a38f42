"""tools/analysis_tools/benchmark_norm.py and benchmark_paths.py run and
print their tables (they time nothing that a test checks: the figures
belong in docs/performance.md)."""
import re

import pytest
import torch
from tool_runner import ROOT, run_python, tool


def test_benchmark_prints_every_layer_and_the_ratios():
    result = run_python([
        tool('analysis_tools', 'benchmark_norm.py'), '--shapes', '3',
        '--skip-detector', '--repeats', '1'
    ],
                        cwd=ROOT,
                        timeout=300)
    out = result.stdout
    assert 'malloc: steady' in out  # restarted under the allocator settings
    for layer in ('BN', 'GN(32)', 'IN', 'LN', 'SN', 'SyncSN', 'naive SN'):
        assert re.search(
            rf'\| 8x256x56x56 \| float32 \| '
            rf'{re.escape(layer)} \|', out)
    ratios = re.search(
        r'\| 8x256x56x56 \| float32 \| ([\d.]+) \| '
        r'([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|', out)
    assert ratios, out
    # Bytes saved for backward do not depend on timing: SN's C++ kernels
    # keep the input and (N, C) statistics, as much as BN to within the
    # statistics (the reference, without them, keeps its intermediates).
    from sn_mm.ops import native_available
    if native_available():
        assert float(ratios.group(4)) <= 1.25
    # the batch-1 ResNet-50 eval table, SN against GN(32)
    assert re.search(r'\| SN in every norm layer \| [\d.]+ \| [\d.]+ \|',
                     out), out


@pytest.mark.skipif(torch.cuda.is_available(), reason='a GPU is there')
def test_benchmark_refuses_cuda_without_a_gpu():
    result = run_python([
        tool('analysis_tools', 'benchmark_norm.py'), '--device', 'cuda',
        '--skip-detector'
    ],
                        cwd=ROOT,
                        ok=False)
    assert result.returncode == 2
    assert 'no GPU is visible' in result.stderr


def test_benchmark_compile_prints_its_table():
    # Dynamo alone (the eager backend), small inputs and the detector
    # alone: the tool's plumbing, not inductor's speed (tests/test_export.py
    # compiles both models with AOT autograd).
    result = run_python([
        tool('analysis_tools', 'benchmark_compile.py'), '--backend', 'eager',
        '--repeats', '1', '--size', '32', '--model', 'mask-rcnn'
    ],
                        cwd=ROOT,
                        timeout=600)
    rows = [
        line for line in result.stdout.splitlines()
        if line.startswith('| DeepLabV3') or line.startswith('| Mask')
    ]
    assert len(rows) == 1 and rows[0].startswith('| Mask'), result.stdout
    assert len(rows[0].split('|')) == 11


def test_benchmark_group_sn_table():
    result = run_python([
        tool('analysis_tools', 'benchmark_norm.py'), '--group-sn', '--toy',
        '--repeats', '1'
    ],
                        cwd=ROOT,
                        timeout=300)
    for layer in ('SN', 'SN G=2', 'SN G=32'):
        assert re.search(rf'\| 2x32x8x8 \| float32 \| {layer} \|',
                         result.stdout), result.stdout
    assert re.search(
        r'\| 2x32x8x8 \| float32 \| SN \|( [\d.]+ \|){4} '
        r'1\.00 \| 1\.00 \|', result.stdout)


def test_benchmark_sw_table():
    result = run_python([
        tool('analysis_tools', 'benchmark_norm.py'), '--sw', '--toy',
        '--repeats', '1'
    ],
                        cwd=ROOT,
                        timeout=300)
    for layer in ('SN', 'SW sw_type=2', 'SW sw_type=5'):
        assert re.search(rf'\| 1x64x7x7 \| {layer} \|( [\d.]+ \|){{6}}$',
                         result.stdout, re.M), result.stdout
    assert re.search(
        r'\| 2x32x8x8 \| SN \|( [\d.]+ \|){3} '
        r'1\.00 \| 1\.00 \| 1\.00 \|', result.stdout)


def test_benchmark_names_the_instruction_set():
    from sn_mm.ops import cpu_isas, native_available
    if not native_available():
        pytest.skip('extension not built')
    isa = cpu_isas()[-1]
    result = run_python([
        tool('analysis_tools', 'benchmark_norm.py'), '--toy',
        '--skip-detector', '--skip-resnet', '--repeats', '1', '--cpu-isa', isa
    ],
                        cwd=ROOT,
                        timeout=300)
    assert f"SN's C++ kernels: {isa} (this CPU: " in result.stdout


def check_path_table(args, env, expected):
    """benchmark_paths.py with ``args`` prints a row for each (path, mode)
    of ``expected``, and each path ran with it on, never with it off."""
    result = run_python([tool('analysis_tools', 'benchmark_paths.py'), *args],
                        cwd=ROOT,
                        env=env,
                        timeout=300)
    rows = re.findall(
        r'\| (\w+) \| \w+ \| [\dx]+ \| (\w+) \| [\d.]+ \| '
        r'[\d.]+ \| [\d.]+ \| (\d+), (\d+) \|', result.stdout)
    assert {(path, mode) for path, mode, _, _ in rows} == expected, \
        result.stdout
    assert all(int(on) > 0 and int(off) == 0 for _, _, on, off in rows)


def test_path_benchmark_times_each_path_on_and_off():
    from sn_mm.ops import cpu_isas, native_available
    if not native_available():
        pytest.skip('extension not built')
    expected = {('short_rows', 'eval'), ('short_rows', 'train'),
                ('by_sample', 'eval')}
    check_path_table(
        ['--toy', '--rounds', '1', '--threads', '1', '--isa',
         cpu_isas()[0]], None, expected)
