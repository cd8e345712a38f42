"""The native CPU kernels and the PyTorch fallback compute the same SN."""
import os

import pytest
import torch

from sn_mm.ops import native_available
from sn_reference import reference_sn
from test_switchable_norm import make_sn, random_input

SHAPES = {'2d': (6, 5), '4d': (4, 5, 6, 7), '5d': (3, 5, 2, 4, 3),
          'one_position': (4, 5, 1, 1), 'empty': (0, 5, 3, 3)}


def test_extension_is_built():
    # make test builds it; SN_MM_NO_EXT=1 is the only way to go without.
    if os.environ.get('SN_MM_NO_EXT') == '1':
        pytest.skip('built without the extension on purpose')
    assert native_available()


def run(sn, x, native):
    sn.use_native_kernels = native
    x = x.detach().clone().requires_grad_()
    sn.zero_grad()
    out = sn(x)
    gen = torch.Generator().manual_seed(5)
    (out * torch.randn(out.shape, generator=gen, dtype=out.dtype)).sum(
    ).backward()
    result = dict(out=out.detach(), x_grad=x.grad)
    for name, p in sn.named_parameters():
        result[name] = p.grad.clone()
    if sn.using_bn:
        result['running_mean'] = sn.running_mean.clone()
        result['running_var'] = sn.running_var.clone()
    return result


@pytest.mark.skipif(not native_available(), reason='extension not built')
@pytest.mark.parametrize('shape', SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize('using_bn', [True, False])
@pytest.mark.parametrize('unbiased', [True, False])
@pytest.mark.parametrize('training', [True, False])
def test_native_equals_pytorch_float64(shape, using_bn, unbiased, training):
    x = random_input(shape)
    results = [run(make_sn(shape[1], using_bn, unbiased).train(training), x,
                   native) for native in (True, False)]
    for key in results[0]:
        torch.testing.assert_close(results[0][key], results[1][key],
                                   rtol=1e-12, atol=1e-12, msg=key)


@pytest.mark.skipif(not native_available(), reason='extension not built')
def test_native_equals_pytorch_float32():
    x = random_input((4, 16, 9, 9), dtype=torch.float32)
    results = [run(make_sn(16, dtype=torch.float32), x, native)
               for native in (True, False)]
    for key in results[0]:
        torch.testing.assert_close(results[0][key], results[1][key],
                                   rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize('training', [True, False])
def test_pytorch_fallback_matches_reference(training):
    sn = make_sn(5).train(training)
    sn.use_native_kernels = False
    x = random_input((4, 5, 6, 7))
    expected, exp_rm, exp_rv = reference_sn(
        x, sn.weight.detach(), sn.bias.detach(), sn.mean_weight.detach(),
        sn.var_weight.detach(), sn.running_mean, sn.running_var, training)
    torch.testing.assert_close(sn(x), expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(sn.running_var, exp_rv)


def test_pytorch_fallback_gradcheck():
    sn = make_sn(3)
    sn.use_native_kernels = False
    x = random_input((3, 3, 4, 2)).requires_grad_()
    assert torch.autograd.gradcheck(sn, (x, ))
