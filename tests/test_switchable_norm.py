import pytest
import torch
import torch.nn as nn
from helpers import make_sn, random_input, reference_of
from torch.func import functional_call

from sn_mm import SwitchableNorm, SyncSwitchableNorm
from sn_mm.models.switchable_norm import TERMS
from sn_mm.testing import reference_sn

SHAPES = {
    '2d': (6, 5),
    '4d': (4, 5, 6, 7),
    '5d': (3, 5, 2, 4, 3),
    'one_position': (4, 5, 1, 1),
}


def test_initial_state():
    sn = SwitchableNorm(8)
    assert sn.weight.shape == sn.bias.shape == (8, )
    assert torch.equal(sn.mean_weight, torch.ones(3))
    assert torch.equal(sn.var_weight, torch.ones(3))
    assert torch.equal(sn.running_mean, torch.zeros(8))
    assert torch.equal(sn.running_var, torch.ones(8))
    no_bn = SwitchableNorm(8, using_bn=False)
    assert no_bn.mean_weight.shape == no_bn.var_weight.shape == (2, )
    assert no_bn.running_mean is None and no_bn.running_var is None
    assert 'running_mean' not in no_bn.state_dict()


@pytest.mark.parametrize('shape', SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize('using_bn', [True, False])
@pytest.mark.parametrize('unbiased', [True, False])
def test_matches_reference_train_and_eval(shape, using_bn, unbiased):
    sn = make_sn(shape[1], using_bn, unbiased)
    x = random_input(shape)
    # Two training steps: the second starts from updated running stats.
    for _ in range(2):
        expected, exp_rm, exp_rv = reference_of(sn, x, training=True)
        out = sn.train()(x)
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
        if using_bn:
            torch.testing.assert_close(sn.running_mean, exp_rm)
            torch.testing.assert_close(sn.running_var, exp_rv)
    expected, _, _ = reference_of(sn, x, training=False)
    torch.testing.assert_close(sn.eval()(x), expected, rtol=1e-10, atol=1e-10)


def test_eval_does_not_touch_running_stats():
    sn = make_sn(5).eval()
    before = (sn.running_mean.clone(), sn.running_var.clone())
    sn(random_input((4, 5, 3, 3)))
    assert torch.equal(sn.running_mean, before[0])
    assert torch.equal(sn.running_var, before[1])


def test_eval_is_per_sample():
    # In eval mode a sample's output must not depend on its batch-mates.
    sn = make_sn(5).eval()
    x = random_input((4, 5, 3, 3))
    torch.testing.assert_close(sn(x)[:1], sn(x[:1]))


@pytest.mark.parametrize('shape', [(3, 4, 3, 2), (5, 4), (3, 4, 1, 1),
                                   (2, 4, 2, 3, 2)])
@pytest.mark.parametrize('using_bn', [True, False])
@pytest.mark.parametrize('training', [True, False])
def test_gradcheck(shape, using_bn, training):
    sn = make_sn(shape[1], using_bn).train(training)
    names = ['weight', 'bias', 'mean_weight', 'var_weight']
    params = [getattr(sn, n).detach().clone().requires_grad_() for n in names]
    x = random_input(shape).requires_grad_()

    def fn(x, *params):
        return functional_call(sn, dict(zip(names, params)), (x, ))

    assert torch.autograd.gradcheck(fn, (x, *params))


@pytest.mark.parametrize('shape', [(0, 4, 5, 5), (0, 4)])
@pytest.mark.parametrize('training', [True, False])
def test_empty_batch(shape, training):
    sn = make_sn(4, dtype=torch.float32).train(training)
    before = (sn.running_mean.clone(), sn.running_var.clone())
    x = torch.zeros(shape, requires_grad=True)
    out = sn(x)
    assert out.shape == shape and out.requires_grad
    out.sum().backward()
    assert x.grad.shape == shape
    for p in sn.parameters():
        assert p.grad is not None and torch.all(p.grad == 0)
    assert torch.equal(sn.running_mean, before[0])
    assert torch.equal(sn.running_var, before[1])


@pytest.mark.parametrize('unbiased', [True, False])
def test_one_position_has_no_nan_and_skips_in(unbiased):
    sn = make_sn(5, unbiased=unbiased, dtype=torch.float32)
    x = random_input((4, 5, 1, 1), dtype=torch.float32).requires_grad_()
    out = sn(x)
    out.square().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    # The IN logit plays no part: its gradient is exactly zero.
    assert sn.mean_weight.grad[0] == 0 and sn.var_weight.grad[0] == 0
    assert sn.mean_weight.grad[1:].abs().sum() > 0


def test_single_sample_train_equals_reference():
    # One sample at one position: BN's variance is 0 and IN is undefined.
    sn = make_sn(5, dtype=torch.float32)
    x = random_input((1, 5, 1, 1), dtype=torch.float32)
    expected, exp_rm, exp_rv = reference_of(sn, x, training=True)
    out = sn(x)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sn.running_mean.double(), exp_rm)
    torch.testing.assert_close(sn.running_var.double(), exp_rv)


def test_bf16_autocast_computes_statistics_in_fp32():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, padding=1)
    sn = SwitchableNorm(8)
    x = torch.randn(2, 3, 8, 8)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        feat = conv(x) + 100.0  # a large offset: bf16 sums would drift
        assert feat.dtype == torch.bfloat16
        out = sn(feat)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert sn.weight.grad.dtype == torch.float32
    # The float64 reference on the same (bf16-rounded) input: the statistics
    # are float32-exact, so the running mean agrees to float32 precision and
    # the output to the rounding of a bf16 result.
    fresh = SwitchableNorm(8).double()
    expected, exp_rm, exp_rv = reference_of(
        fresh, feat.detach().double(), training=True)
    torch.testing.assert_close(
        sn.running_mean.double(), exp_rm, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(
        sn.running_var.double(), exp_rv, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.double(), expected, rtol=1e-2, atol=1e-2)


def test_wrong_input_raises():
    sn = SwitchableNorm(4)
    with pytest.raises(ValueError, match=r'shape \(N, C, \*\).*1D'):
        sn(torch.randn(4))
    with pytest.raises(ValueError, match='built for 4 channels, got .* 3'):
        sn(torch.randn(2, 3, 5, 5))
    for dtype in (torch.int64, torch.bool):
        with pytest.raises(
                TypeError, match=f'floating-point inputs, got '
                f'{dtype}'):
            sn(torch.ones(2, 4, 3, 3, dtype=dtype))
    # A rejected input must not have touched the running statistics.
    assert torch.equal(sn.running_mean, torch.zeros(4))
    assert int(sn.num_batches_tracked) == 0


@pytest.mark.parametrize('kwargs, message', [
    (dict(momentum=2.0), 'momentum must be in'),
    (dict(momentum=-0.1), 'momentum must be in'),
    (dict(eps=-1.), 'eps must be > 0'),
    (dict(eps=0.), 'eps must be > 0'),
    (dict(eps=float('nan')), 'eps must be > 0'),
    (dict(num_features=0), 'num_features must be a positive integer'),
    (dict(num_features=2.5), 'num_features must be a positive integer'),
    (dict(num_features=True), 'num_features must be a positive integer'),
])
@pytest.mark.parametrize('cls', [SwitchableNorm, SyncSwitchableNorm])
def test_bad_arguments_are_refused_by_name(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**dict(dict(num_features=4), **kwargs))
    cls(4, momentum=None), cls(4, momentum=0.), cls(4, momentum=1.)


@pytest.mark.parametrize('training', [True, False])
def test_meta_inputs_give_meta_outputs(training):
    """Shape inference and deferred initialisation: a layer and an input on
    the meta device give a meta output of the input's shape, gradients
    included."""
    with torch.device('meta'):
        sn = SwitchableNorm(8).train(training)
    x = torch.empty(2, 8, 5, 5, device='meta', requires_grad=True)
    y = sn(x)
    y.sum().backward()
    assert y.is_meta and y.shape == x.shape and x.grad.shape == x.shape


def test_ratios_and_repr():
    sn = SwitchableNorm(4)
    ratios = sn.ratios()
    assert set(ratios) == {'mean', 'var'}
    assert list(ratios['mean']) == list(TERMS)
    assert all(abs(v - 1 / 3) < 1e-6 for v in ratios['var'].values())
    with torch.no_grad():
        sn.mean_weight.copy_(torch.tensor([0.0, 0.0, 10.0]))
    assert sn.ratios()['mean']['bn'] > 0.99
    assert 'mean_ratios=(in=0.000, ln=0.000, bn=1.000)' in repr(sn)
    assert list(SwitchableNorm(
        4, using_bn=False).ratios()['var']) == ['in', 'ln']


def test_cumulative_average_with_momentum_none():
    # As nn.BatchNorm2d(momentum=None): the plain average of the batches'
    # statistics, an empty batch not counted.
    sn = make_sn(5, momentum=None)
    batches = [random_input((3, 5, 4, 4), seed=s) for s in range(3)]
    sn(batches[0])
    sn(batches[0][:0])
    for x in batches[1:]:
        sn(x)
    assert sn.num_batches_tracked == 3
    # With momentum 1 the reference's new running stats are the batch's.
    batch_stats = [
        reference_sn(
            x,
            sn.weight,
            sn.bias,
            sn.mean_weight,
            sn.var_weight,
            sn.running_mean,
            sn.running_var,
            True,
            momentum=1.)[1:] for x in batches
    ]
    torch.testing.assert_close(sn.running_mean,
                               sum(s[0] for s in batch_stats) / 3)
    torch.testing.assert_close(sn.running_var,
                               sum(s[1] for s in batch_stats) / 3)


def test_batch_counter_is_in_the_state_and_optional_when_loading():
    sn = make_sn(4)
    sn(random_input((2, 4, 3, 3)))
    state = sn.state_dict()
    assert state['num_batches_tracked'] == 1
    # Released checkpoints and earlier versions have no counter: strict
    # loading still works and starts it at 0.
    del state['num_batches_tracked']
    fresh = SwitchableNorm(4).double()
    fresh.load_state_dict(state, strict=True)
    assert fresh.num_batches_tracked == 0
    torch.testing.assert_close(fresh.running_var, sn.running_var)
    assert 'num_batches_tracked' not in SwitchableNorm(
        4, using_bn=False).state_dict()
