"""Activation checkpointing (``with_cp=True``, ``torch.utils.checkpoint``)
updates SN's running statistics once per step, as the same step without
checkpointing does, with the same gradients: SN, group SN and SyncSN (real
gloo processes), both checkpoint variants, on the CPU and on CUDA."""
import pytest
import torch
import torch.utils.checkpoint as cp
from mmdet.models import ResNet

from sn_mm import SwitchableNorm, SyncSwitchableNorm
from sn_mm.testing.processes import run_on_ranks

DEVICES = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])
NORMS = {
    'sn': dict(type='SN'),
    'group_sn': dict(type='SN', ratio_groups=2),
    'cumulative': dict(type='SN', momentum=None),
}


def sn_state(model):
    return {
        k: v.clone()
        for k, v in model.state_dict().items() if any(
            k.endswith(b)
            for b in ('running_mean', 'running_var', 'num_batches_tracked',
                      'nonfinite_batches'))
    }


def step(model, x):
    """One training forward and backward; the gradients of every
    parameter, and the SN layers' statistics after it."""
    model.zero_grad()
    outs = model(x)
    sum((o * torch.linspace(-1, 1, o.numel(), device=o.device,
                            dtype=o.dtype).view_as(o)).sum()
        for o in outs).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return grads, sn_state(model)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('norm', NORMS)
def test_with_cp_updates_statistics_once(norm, device):
    torch.manual_seed(0)
    plain, checkpointed = (
        ResNet(
            depth=18,
            norm_cfg=NORMS[norm],
            norm_eval=False,
            with_cp=with_cp,
            zero_init_residual=False).to(device, torch.float64)
        for with_cp in (False, True))
    checkpointed.load_state_dict(plain.state_dict())
    plain.train()
    checkpointed.train()
    x = torch.randn(2, 3, 64, 64, device=device, dtype=torch.float64)
    for _ in range(2):
        grads, state = step(plain, x)
        cp_grads, cp_state = step(checkpointed, x)
        for key, value in state.items():
            torch.testing.assert_close(cp_state[key], value, msg=key)
        for key, value in grads.items():
            torch.testing.assert_close(cp_grads[key], value, msg=key)
    # The step moved them: the comparison is not between untouched copies.
    assert int(checkpointed.layer1[0].sn1.num_batches_tracked) == 2


@pytest.mark.parametrize('use_reentrant', [False, True])
def test_torch_checkpoint_either_variant(use_reentrant):
    torch.manual_seed(0)
    layer = SwitchableNorm(4).double()
    x = torch.randn(3, 4, 5, 5, dtype=torch.float64, requires_grad=True)
    out = cp.checkpoint(layer, x, use_reentrant=use_reentrant)
    out.square().sum().backward()
    expected = SwitchableNorm(4).double()
    expected(x.detach())
    assert int(layer.num_batches_tracked) == 1
    torch.testing.assert_close(layer.running_mean, expected.running_mean)
    torch.testing.assert_close(layer.running_var, expected.running_var)


def sync_worker(rank):
    torch.manual_seed(0)
    layers = [SyncSwitchableNorm(6).double() for _ in range(2)]
    x = torch.randn(4, 6, 5, 5, dtype=torch.float64)[2 * rank:2 * rank + 2]
    results = []
    for layer, with_cp in zip(layers, (False, True)):
        inp = x.clone().requires_grad_()
        out = cp.checkpoint(layer, inp, use_reentrant=False) if with_cp \
            else layer(inp)
        out.square().sum().backward()
        results.append(
            dict(
                x_grad=inp.grad,
                mean_weight=layer.mean_weight.grad,
                **sn_state(layer)))
    return results


def test_syncsn_under_checkpoint():
    for plain, checkpointed in run_on_ranks(sync_worker, 2):
        assert int(checkpointed['num_batches_tracked']) == 1
        for key, value in plain.items():
            torch.testing.assert_close(checkpointed[key], value, msg=key)
