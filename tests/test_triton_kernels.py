"""SN's Triton kernels compute what the PyTorch path computes.

On a GPU machine they compile and run on CUDA tensors; elsewhere they run in
Triton's interpreter on CPU tensors (tests/conftest.py), which checks their
arithmetic and masking, and are compiled for sm_80/sm_90 without running,
which checks that they lower to GPU code.
"""
import os
import os.path as osp

import pytest
import torch

from helpers import assert_kernels_agree, make_sn, random_input, run_layer
from sn_mm import ops
from sn_mm.ops import kernels as kernel_sets
from tool_runner import ROOT, run_python

triton = pytest.importorskip('triton')

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('length', [1, 7, 49, 200, 1500])
def test_each_triton_kernel_equals_pytorch(length):
    assert_kernels_agree('triton', length, torch.float32, TOL,
                         names=('row_moments', 'normalize', 'row_grad_sums',
                                'input_grad'), shape=(3, 4), device=DEVICE)


SHAPES = {'2d': (6, 5), '4d': (4, 5, 6, 7), 'roi_7x7': (6, 5, 7, 7),
          'one_position': (4, 5, 1, 1), 'empty': (0, 5, 3, 3)}


@pytest.mark.parametrize('shape', SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize('using_bn', [True, False])
@pytest.mark.parametrize('training', [True, False])
def test_sn_on_triton_equals_pytorch(shape, using_bn, training):
    x = random_input(shape, dtype=torch.float32).to(DEVICE)
    results = [
        run_layer(make_sn(shape[1], using_bn, dtype=torch.float32).to(
            DEVICE).train(training), x, how) for how in ('triton', 'torch')
    ]
    for key in results[0]:
        torch.testing.assert_close(results[0][key], results[1][key], **TOL,
                                   msg=key)


def test_float64_falls_back_to_pytorch():
    x = random_input((2, 3, 4, 4)).to(DEVICE)
    triton_run, torch_run = (run_layer(make_sn(3).to(DEVICE), x, how)
                             for how in ('triton', 'torch'))
    for key in triton_run:
        torch.testing.assert_close(triton_run[key], torch_run[key], rtol=0,
                                   atol=0, msg=key)


def test_the_setting_selects_triton(monkeypatch):
    x = torch.randn(2, 3, 5, device=DEVICE)
    assert ops.select_kernels('triton', x) is kernel_sets._triton()
    monkeypatch.setenv(ops.KERNELS_ENV, 'triton')
    assert ops.select_kernels(None, x) is kernel_sets._triton()
    monkeypatch.delenv(ops.KERNELS_ENV)
    # Not by default (yet): PyTorch's ops on GPUs, native on this CPU.
    assert ops.select_kernels(None, x) is not kernel_sets._triton()


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a GPU')
def test_triton_layer_on_gpu_equals_float64_reference():
    from helpers import reference_of
    sn = make_sn(3, dtype=torch.float32, kernels='triton').cuda()
    x = random_input((2, 3, 5, 4), dtype=torch.float32)
    expected, exp_rm, exp_rv = reference_of(sn.cpu(), x, training=True)
    sn.cuda()
    out = sn(x.cuda())
    torch.testing.assert_close(out.double().cpu(), expected, **TOL)
    torch.testing.assert_close(sn.running_var.double().cpu(), exp_rv, **TOL)


def test_triton_kernels_compile_for_nvidia_gpus():
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    result = run_python([osp.join(ROOT, 'tests', 'triton_compile_check.py')],
                        cwd=ROOT, ok=False, timeout=600, base_env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if 'cubin=' in line]
    assert len(lines) == 16, result.stdout
    assert all(int(line.rsplit('=', 1)[1]) > 0 for line in lines)
