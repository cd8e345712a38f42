"""Batch-average statistics against averages computed in the test."""
import copy

import torch
import torch.nn as nn

from sn_mm import SwitchableNorm
from sn_mm.engine import BatchAverageProgress, sn_batch_average
from sn_mm.testing import reference_sn
from sn_mm.testing.processes import run_on_ranks


def make_model(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), SwitchableNorm(6), nn.ReLU(),
        nn.Conv2d(6, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Dropout(0.5),
        SwitchableNorm(8, unbiased=False), SwitchableNorm(8, using_bn=False))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, SwitchableNorm):
                m.mean_weight.normal_()
                m.var_weight.normal_()
        model[4].running_mean.normal_()
    return model.train()  # as after training


def make_batches(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 3, 5, 5, generator=gen) * 2 + 1 for _ in range(n)]


def direct_averages(model, batches):
    """Each SN layer's BN statistics over each batch, from its input
    captured in a frozen pass (eval everywhere, SN in training mode), with
    the reference formulas; then their plain average."""
    model = copy.deepcopy(model).eval()
    inputs = {}
    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, SwitchableNorm) and m.using_bn:
            m.train()
            hooks.append(
                m.register_forward_pre_hook(
                    lambda mod, args, name=name: inputs[name].append(args[0])))
            inputs[name] = []
    with torch.no_grad():
        for x in batches:
            model(x)
    for h in hooks:
        h.remove()
    layers = dict(model.named_modules())
    result = {}
    for name, xs in inputs.items():
        m = layers[name]
        stats = [
            reference_sn(
                x,
                m.weight,
                m.bias,
                m.mean_weight,
                m.var_weight,
                torch.zeros(m.num_features),
                torch.zeros(m.num_features),
                True,
                momentum=1.,
                unbiased=m.unbiased)[1:] for x in xs
        ]
        result[name] = (sum(s[0] for s in stats) / len(stats),
                        sum(s[1] for s in stats) / len(stats))
    return result


def test_batch_average_equals_direct_average():
    model = make_model()
    batches = make_batches(4, seed=1)
    expected = direct_averages(model, batches)
    params = {k: v.clone() for k, v in model.named_parameters()}
    bn_buffers = {k: v.clone() for k, v in model[4].state_dict().items()}
    modes = [m.training for m in model.modules()]

    seen = sn_batch_average(model, iter(batches), model, num_batches=3)
    assert seen == 3
    expected3 = direct_averages(make_model(), batches[:3])
    layers = dict(model.named_modules())
    for name, (mean, var) in expected3.items():
        torch.testing.assert_close(layers[name].running_mean, mean.float())
        torch.testing.assert_close(layers[name].running_var, var.float())
    # Only K batches were used: the 4-batch average differs.
    assert not torch.allclose(layers['1'].running_mean,
                              expected['1'][0].float())
    for k, v in model.named_parameters():
        assert torch.equal(v, params[k]), k
    for k, v in model[4].state_dict().items():
        assert torch.equal(v, bn_buffers[k]), k
    assert [m.training for m in model.modules()] == modes
    # The cumulative average was switched on for the pass only.
    for m in model.modules():
        if isinstance(m, SwitchableNorm) and m.using_bn:
            assert m.momentum == 0.1
            assert m.num_batches_tracked == 0


def test_batch_average_skips_empty_batches():
    model = make_model()
    batches = make_batches(2, seed=3)
    expected = direct_averages(make_model(), batches)
    with_empty = [batches[0], batches[0][:0], batches[1]]
    assert sn_batch_average(model, iter(with_empty), model, 3) == 3
    layers = dict(model.named_modules())
    for name, (mean, var) in expected.items():
        torch.testing.assert_close(layers[name].running_mean, mean.float())
        torch.testing.assert_close(layers[name].running_var, var.float())


def worker(rank):
    model = make_model()
    sn_batch_average(model, make_batches(2, seed=10 + rank), model, 2)
    return model.state_dict()


def test_ranks_average_together():
    states = run_on_ranks(worker, 2)
    expected = direct_averages(make_model(),
                               make_batches(2, 10) + make_batches(2, 11))
    for name, (mean, var) in expected.items():
        for state in states:
            torch.testing.assert_close(state[f'{name}.running_mean'],
                                       mean.float())
            torch.testing.assert_close(state[f'{name}.running_var'],
                                       var.float())


def test_progress_is_reported_per_rank_as_batches_are_done():
    lines = []
    progress = BatchAverageProgress(5, interval=2, log=lines.append)
    model = make_model()
    assert sn_batch_average(
        model, iter(make_batches(5, seed=4)), model, 5, progress=progress) == 5
    done = [line.split(': ')[1].split(' batches')[0] for line in lines]
    assert done == ['2/5', '4/5', '5/5'], lines
    assert all(line.startswith('SN batch average, rank 0: ') for line in lines)
    assert lines[-1].split('batches (')[1].startswith('100%')
    assert 'batches/s' in lines[0] and 's left' in lines[0]
