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

from sn_mm import SwitchableNorm, ops
from test_native_kernels import assert_kernels_agree, run
from tool_runner import ROOT, run_python
from test_switchable_norm import make_sn, random_input

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
        run(make_sn(shape[1], using_bn, dtype=torch.float32).to(
            DEVICE).train(training), x, how) for how in ('triton', False)
    ]
    for key in results[0]:
        torch.testing.assert_close(results[0][key], results[1][key], **TOL,
                                   msg=key)


def test_float64_falls_back_to_pytorch():
    x = random_input((2, 3, 4, 4)).to(DEVICE)
    triton_run, torch_run = (run(make_sn(3).to(DEVICE), x, how)
                             for how in ('triton', False))
    for key in triton_run:
        torch.testing.assert_close(triton_run[key], torch_run[key], rtol=0,
                                   atol=0, msg=key)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a GPU')
def test_env_selects_triton_on_gpu(monkeypatch):
    x = torch.randn(2, 3, 5, device='cuda')
    monkeypatch.setenv(ops.GPU_KERNELS_ENV, 'triton')
    assert ops._backend(x, True) == 'triton'
    monkeypatch.delenv(ops.GPU_KERNELS_ENV)
    assert ops._backend(x, True) == 'torch'
    assert isinstance(SwitchableNorm(3).cuda()(x.unsqueeze(-1)),
                      torch.Tensor)


def test_triton_kernels_compile_for_nvidia_gpus():
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    result = run_python([osp.join(ROOT, 'tests', 'triton_compile_check.py')],
                        cwd=ROOT, ok=False, timeout=600, base_env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if 'cubin=' in line]
    assert len(lines) == 16, result.stdout
    assert all(int(line.rsplit('=', 1)[1]) > 0 for line in lines)
