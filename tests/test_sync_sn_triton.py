"""SyncSN on the fused Triton kernels (sn_mm/ops/triton_fused.py) in real
gloo processes, against SN on the whole batch: the fused path's all-gather
in forward and all-reduce in backward are the reference's, so a rank on
either path (an empty batch takes the reference) interoperates. Without a
GPU the kernels run in Triton's interpreter."""
import os

import pytest
import torch
from helpers import require_kernels
from test_sync_switchable_norm import (CASES, PARAMS, case_data, make_layer,
                                       rank_cases, run_layer)

from sn_mm import SwitchableNorm
from sn_mm.testing.processes import run_on_ranks

require_kernels('triton', allow_module_level=True)
# Marked cuda as well: on a GPU the two processes share the one device
# (gloo carries CUDA tensors), the multi-rank path on CUDA tensors that
# `make gpu-check` runs.
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available()
        and os.environ.get('TRITON_INTERPRET') != '1',
        reason='needs a GPU or Triton\'s interpreter')
]
WORLD = 2
DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'


def worker(rank):
    from sn_mm.ops import triton_fused
    calls = []
    real = triton_fused._combine_over_group
    triton_fused._combine_over_group = lambda *a: calls.append(1) or real(*a)
    results = {}
    for name, x, grad_out, layer in rank_cases(
            rank, dtype=torch.float32, kernels='triton'):
        results[name] = {
            k: v.cpu()
            for k, v in run_layer(
                layer.to(DEVICE), x.to(DEVICE), grad_out.to(DEVICE)).items()
        }
    results['fused_calls'] = len(calls)
    return results


@pytest.fixture(scope='module')
def sync_results():
    return run_on_ranks(worker, WORLD)


def test_the_fused_path_ran(sync_results):
    # Two training steps per case, on every rank with samples.
    for rank, results in enumerate(sync_results):
        expected = 2 * sum(1 for _, _, split, _ in CASES if split[rank])
        assert results['fused_calls'] == expected


@pytest.mark.parametrize('case', range(len(CASES)), ids=[c[0] for c in CASES])
def test_fused_sync_matches_sn_on_whole_batch(sync_results, case):
    name, shape, split, options = CASES[case]
    x, grad_out = case_data(shape, seed=case)
    expected = run_layer(
        make_layer(
            SwitchableNorm,
            shape[1],
            options,
            100 + case,
            dtype=torch.float32,
            kernels='torch'), x.float(), grad_out.float())
    per_rank = [r[name] for r in sync_results]
    tol = dict(rtol=1e-4, atol=1e-4)
    for key in ('out', 'x_grad'):
        torch.testing.assert_close(
            torch.cat([r[key] for r in per_rank]), expected[key], **tol)
    for key in PARAMS:
        torch.testing.assert_close(
            sum(r[key] for r in per_rank), expected[key], **tol)
    for r in per_rank:
        torch.testing.assert_close(r['running_mean'], expected['running_mean'],
                                   **tol)
        torch.testing.assert_close(r['running_var'], expected['running_var'],
                                   **tol)
