"""SyncSN in real gloo processes against SN on the whole batch, on the C++
kernels split at their collectives and on the reference."""

import pytest
import torch
import torch.distributed as dist

from sn_mm import (SwitchableNorm, SyncSwitchableNorm, convert_sync_sn, ops,
                   revert_sync_sn)
from sn_mm.testing.processes import run_on_ranks

WORLD = 2
# (name, input shape of the whole batch, samples on rank 0, on rank 1,
# the layer's other arguments)
CASES = [
    ('4d_3+1', (4, 5, 3, 4), [3, 1], {}),
    ('4d_4+0', (4, 5, 3, 4), [4, 0], {}),
    ('2d_1+3', (4, 5), [1, 3], {}),
    ('one_position_2+2', (4, 5, 1, 1), [2, 2], {}),
    ('group_sn_3+1', (4, 6, 3, 4), [3, 1], dict(ratio_groups=3)),
    ('video_3+1', (4, 5, 3, 4, 2), [3, 1], {}),
    ('video_group_sn_2+2', (4, 6, 2, 3, 4), [2, 2], dict(ratio_groups=2)),
    ('sparse_sn_1+3', (4, 5, 3, 4), [1, 3], dict(ratio_fn='sparsestmax')),
    ('fixed_mean_2+2', (4, 5, 3, 4), [2, 2], dict(fix_mean=[.2, .3, .5])),
    ('cumulative_biased_3+1', (4, 5, 3, 4), [3, 1],
     dict(momentum=None, unbiased=False)),
]
PARAMS = ('weight', 'bias', 'mean_weight', 'var_weight')
# The SyncSN route the default setting takes across processes on the CPU:
# the reference, with the collectives (the Triton kernels' split route is
# tested on the GPU, tests/test_sync_sn_triton.py).
KERNELS = {'auto': '_call_reference'}


def case_data(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 2 + 1
    grad_out = torch.randn(shape, generator=gen, dtype=torch.float64)
    return x, grad_out


def make_layer(cls, channels, options, seed, dtype=torch.float64, **kwargs):
    options = dict(options)
    fix_mean = options.pop('fix_mean', None)
    layer = init_layer(cls(channels, **options, **kwargs).to(dtype), seed)
    if fix_mean is not None:
        layer.fix_ratios(mean=fix_mean)
    return layer


def init_layer(layer, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in PARAMS:
            p = getattr(layer, name)
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
        layer.running_var.fill_(2.0)
    return layer


def run_layer(layer, x, grad_out, steps=2):
    """Two training steps (running statistics move twice), then the output,
    input gradient and parameter gradients of the last one."""
    for _ in range(steps):
        layer.zero_grad()
        x = x.detach().requires_grad_()
        # (In place on the output, as an inplace ReLU after it is.)
        out = layer(x).add_(1)
        (out * grad_out).sum().backward()
    return dict(
        out=out.detach(),
        x_grad=x.grad,
        running_mean=layer.running_mean.clone(),
        running_var=layer.running_var.clone(),
        **{n: getattr(layer, n).grad.clone()
           for n in PARAMS})


def rank_cases(rank, dtype=torch.float64, **kwargs):
    """Each case's name, this rank's share of its input and output
    gradient, and its SyncSN layer (``kwargs``: the layer's further
    arguments)."""
    for i, (name, shape, split, options) in enumerate(CASES):
        x, grad_out = case_data(shape, seed=i)
        start = sum(split[:rank])
        share = slice(start, start + split[rank])
        layer = make_layer(
            SyncSwitchableNorm,
            shape[1],
            options,
            100 + i,
            dtype=dtype,
            **kwargs)
        yield name, x[share].to(dtype), grad_out[share].to(dtype), layer


def worker(rank):
    results = {}
    for kernels in KERNELS:
        for name, x, grad_out, layer in rank_cases(rank, kernels=kernels):
            result = run_layer(layer, x, grad_out)
            result['route'] = ops.route(kernels, x, layer.weight,
                                        layer.running_mean,
                                        dist.group.WORLD).call.__name__
            results[kernels, name] = result
    return results


@pytest.fixture(scope='module')
def sync_results():
    return run_on_ranks(worker, WORLD)


@pytest.mark.parametrize('kernels', list(KERNELS))
@pytest.mark.parametrize('case', range(len(CASES)), ids=[c[0] for c in CASES])
def test_sync_matches_sn_on_whole_batch(sync_results, case, kernels):
    name, shape, split, options = CASES[case]
    x, grad_out = case_data(shape, seed=case)
    expected = run_layer(
        make_layer(SwitchableNorm, shape[1], options, 100 + case), x, grad_out)
    per_rank = [r[kernels, name] for r in sync_results]
    assert [r.pop('route') for r in per_rank] == [KERNELS[kernels]] * WORLD
    # Outputs and input gradients: each rank holds its own slice.
    for key in ('out', 'x_grad'):
        torch.testing.assert_close(
            torch.cat([r[key] for r in per_rank]), expected[key])
    # Parameter gradients: the ranks' sum is the whole batch's gradient.
    for key in PARAMS:
        torch.testing.assert_close(
            sum(r[key] for r in per_rank), expected[key])
    # Running statistics: identical on every rank and equal to SN's.
    for r in per_rank:
        torch.testing.assert_close(r['running_mean'], expected['running_mean'])
        torch.testing.assert_close(r['running_var'], expected['running_var'])


def test_without_process_group_equals_sn():
    assert not dist.is_initialized()
    x, grad_out = case_data((4, 5, 3, 3), seed=7)
    sync = run_layer(
        init_layer(SyncSwitchableNorm(5).double(), 3), x, grad_out)
    plain = run_layer(init_layer(SwitchableNorm(5).double(), 3), x, grad_out)
    for key in plain:
        assert torch.equal(sync[key], plain[key]), key


def test_convert_and_revert_round_trip():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), SwitchableNorm(4),
        torch.nn.Sequential(
            torch.nn.Conv2d(4, 6, 1),
            SwitchableNorm(6, using_bn=False, unbiased=False)))
    init_layer(model[1], 0)
    model.eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    params = list(model.parameters())

    converted = convert_sync_sn(model)
    assert converted is model
    assert type(model[1]) is SyncSwitchableNorm
    assert type(model[2][1]) is SyncSwitchableNorm
    assert model[2][1].using_bn is False and model[2][1].unbiased is False
    assert not model[1].training
    # The very same Parameter objects: an existing optimizer keeps working.
    assert all(a is b for a, b in zip(params, model.parameters()))
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())

    reverted = revert_sync_sn(model)
    assert type(model[1]) is SwitchableNorm
    assert type(model[2][1]) is SwitchableNorm
    assert all(a is b for a, b in zip(params, reverted.parameters()))
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())

    # A bare layer is replaced and returned.
    single = convert_sync_sn(SwitchableNorm(3))
    assert type(single) is SyncSwitchableNorm


@pytest.mark.parametrize('group', ['nodes', 0, -2, True, 1.5])
def test_unknown_group_is_refused(group):
    with pytest.raises(ValueError, match="'node'"):
        SyncSwitchableNorm(4, group=group)


def test_group_names_and_sizes_are_kept_through_conversion():
    assert SyncSwitchableNorm(4, group='node').group == 'node'
    assert convert_sync_sn(SwitchableNorm(4), group=2).group == 2
    # No process group: each setting computes what SN computes.
    x = torch.randn(3, 4, 2, 2)
    for group in ('world', 'node', 4):
        torch.testing.assert_close(
            SyncSwitchableNorm(4, group=group)(x),
            SwitchableNorm(4)(x))


def unequal_calls_worker(rank, skip):
    """Two SyncSN layers of one size (so that their all-gathers would pair
    silently): one step on which both ranks call both, then one on which
    ``skip`` decides which calls rank 1 leaves out or repeats. Returns what
    each rank raised and whether the running statistics moved."""
    torch.manual_seed(rank)
    model = convert_sync_sn(
        torch.nn.ModuleDict(dict(a=SwitchableNorm(4), b=SwitchableNorm(4))))
    x = torch.randn(2, 4, 3, 3) + rank
    model['b'](model['a'](x))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    calls = {'skip a': 'b', 'repeat a': 'aab'}[skip] if rank else 'ab'
    try:
        for name in calls:
            model[name](x)
    except RuntimeError as error:
        moved = [
            k for k, v in model.state_dict().items()
            if 'running' in k and not torch.equal(v, before[k])
        ]
        return str(error), moved
    return None, None


# What each rank raises, and the statistics that moved before: where
# rank 1 skips a, rank 0's a pairs with its b; where it repeats a, the
# first repeat pairs with rank 0's a (a true pair), the second with b.
UNEQUAL = {
    'skip a': ("rank 0: 'a' call 2; rank 1: 'b' call 2", []),
    'repeat a': ("rank 0: 'b' call 2; rank 1: 'a' call 3",
                 ['a.running_mean', 'a.running_var']),
}


@pytest.mark.parametrize('skip', list(UNEQUAL))
def test_unequal_calls_raise_naming_layers_and_ranks(skip):
    results = run_on_ranks(unequal_calls_worker, WORLD, (skip, ), timeout=60)
    pairs, moved_before = UNEQUAL[skip]
    for error, moved in results:
        assert error is not None, 'a rank went on past the unequal calls'
        assert 'called SyncSN layers unequally' in error
        assert f'({pairs})' in error, error
        assert 'statistics were not combined' in error
        assert moved == moved_before, moved
