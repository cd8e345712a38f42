"""A training batch whose BN statistics are not finite leaves the running
statistics and num_batches_tracked untouched and is counted in
``nonfinite_batches``: SN on every kernel set, SyncSN across processes."""
import pytest
import torch
from helpers import make_sn, random_input, require_kernels

from sn_mm import SwitchableNorm, SyncSwitchableNorm
from sn_mm.testing.processes import run_on_ranks

KERNELS = ['native', 'triton', 'torch']


def poisoned(shape, how, seed=1):
    x = random_input(shape, seed=seed, dtype=torch.float32)
    if how == 'nan':
        x[0, 1, 0, 0] = float('nan')
    elif how == 'inf':
        x[1, 0, 1, 1] = float('inf')
    else:  # finite values whose squares overflow float32
        x[0, 2] = 3e38
        x[0, 2, 0, 0] = -3e38
    return x


def state_of(sn):
    return {k: v.clone() for k, v in sn.state_dict().items()}


@pytest.mark.parametrize('how', ['nan', 'inf', 'overflow'])
@pytest.mark.parametrize('momentum', [0.1, None])
@pytest.mark.parametrize('kernels', KERNELS)
def test_nonfinite_batch_leaves_running_statistics(kernels, momentum, how):
    require_kernels(kernels)
    shape = (3, 4, 2, 2)
    sn = make_sn(4, dtype=torch.float32, kernels=kernels, momentum=momentum)
    sn.train()
    sn(random_input(shape, dtype=torch.float32))  # one ordinary step first
    before = state_of(sn)
    assert int(sn.num_batches_tracked) == 1
    x = poisoned(shape, how).requires_grad_()
    y = sn(x)
    y.sum().backward()  # the gradient runs too
    # The output is what the statistics give: not finite where they are not.
    assert not torch.isfinite(y).all()
    after = state_of(sn)
    for name in ('running_mean', 'running_var', 'num_batches_tracked'):
        assert torch.equal(after[name], before[name]), name
    assert int(sn.nonfinite_batches) == 1
    # The next finite batch updates as usual, from the state before.
    x = random_input(shape, seed=3, dtype=torch.float32)
    sn(x)
    fresh = make_sn(4, dtype=torch.float32, kernels=kernels, momentum=momentum)
    fresh.load_state_dict(before)
    fresh.train()(x)
    torch.testing.assert_close(sn.running_mean, fresh.running_mean)
    torch.testing.assert_close(sn.running_var, fresh.running_var)
    assert int(sn.num_batches_tracked) == 2
    assert int(sn.nonfinite_batches) == 1


@pytest.mark.parametrize('kernels', KERNELS)
def test_eval_and_no_bn_layers_count_nothing(kernels):
    require_kernels(kernels)
    sn = make_sn(4, dtype=torch.float32, kernels=kernels).eval()
    sn(poisoned((3, 4, 2, 2), 'nan'))
    assert int(sn.nonfinite_batches) == 0
    assert SwitchableNorm(4, using_bn=False).nonfinite_batches is None


def test_checkpoint_without_the_count_loads():
    state = SwitchableNorm(4).state_dict()
    del state['nonfinite_batches']
    sn = SwitchableNorm(4)
    sn.nonfinite_batches.fill_(5)
    sn.load_state_dict(state)  # strict
    assert int(sn.nonfinite_batches) == 0


def sync_worker(rank):
    torch.manual_seed(0)
    layer = SyncSwitchableNorm(4)
    x = random_input((2, 4, 3, 3), seed=rank, dtype=torch.float32)
    layer(x)
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    # Only rank 1's half holds a NaN: the shared statistics are NaN on both.
    layer(poisoned((2, 4, 3, 3), 'nan') if rank else x)
    after = layer.state_dict()
    return dict(
        same=all(
            torch.equal(after[k], before[k])
            for k in ('running_mean', 'running_var', 'num_batches_tracked')),
        count=int(layer.nonfinite_batches))


def test_syncsn_skips_on_every_rank():
    for rank, result in enumerate(run_on_ranks(sync_worker, 2)):
        assert result == dict(same=True, count=1), rank
