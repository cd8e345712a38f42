"""The native CPU kernels and the PyTorch fallback compute the same SN."""
import os

import pytest
import torch

from sn_mm import ops
from sn_mm.ops import native_available
from sn_reference import reference_sn
from test_switchable_norm import make_sn, random_input

# 7x7 (RoI features) and 13x11 rows take the kernels' short- and long-row
# paths, both with a remainder after the vector lanes.
SHAPES = {'2d': (6, 5), '4d': (4, 5, 6, 7), '5d': (3, 5, 2, 4, 3),
          'roi_7x7': (6, 5, 7, 7), 'long_rows': (2, 3, 13, 11),
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


def kernel_inputs(n, c, length, dtype):
    gen = torch.Generator().manual_seed(length)

    def rand(*shape, low=-1.0, high=1.0):
        return torch.rand(shape, generator=gen, dtype=dtype) * (high -
                                                                low) + low

    return dict(x=rand(n, c, length, low=-3, high=5), g=rand(n, c, length),
                nc=[rand(n, c) for _ in range(4)],
                var_nc=rand(n, c, low=0.1, high=2), n1=[rand(n, 1)
                                                        for _ in range(4)],
                c1=[rand(c) for _ in range(4)], w=rand(2, low=0, high=1))


KERNELS = ('row_moments', 'moment_reductions', 'normalize', 'row_grad_sums',
           'grad_reductions', 'input_grad')


def assert_kernels_agree(how, length, dtype, tol, names=KERNELS, shape=(5, 6),
                         device='cpu'):
    """Each kernel in ``names``, run with ``use_native=how``, returns what
    its PyTorch version returns, on random inputs with rows of ``length``."""
    a = kernel_inputs(*shape, length, dtype)
    a = {k: ([t.to(device) for t in v] if isinstance(v, list) else
             v.to(device)) for k, v in a.items()}
    x, g, (m, s1, s2, mu), v = a['x'], a['g'], a['nc'], a['var_nc']
    n_vecs, c_vecs, (w0, w1) = a['n1'], a['c1'], a['w']
    correction = 1 if length > 1 else 0  # as SwitchableNorm chooses
    calls = {
        'row_moments': lambda how: ops.row_moments(x, correction, how),
        'moment_reductions': lambda how: ops.moment_reductions(m, v, how),
        'normalize': lambda how: ops.normalize(
            x, m, v, w0, w1, n_vecs[0], n_vecs[1].abs(), c_vecs[0],
            c_vecs[1].abs(), c_vecs[2], c_vecs[3], 1e-5, how),
        'row_grad_sums': lambda how: ops.row_grad_sums(g, x, how),
        'grad_reductions': lambda how: ops.grad_reductions(
            s1, s2, mu, v.rsqrt(), c_vecs[0], m, v, how),
        'input_grad': lambda how: ops.input_grad(
            g, x, s1, s2, mu, v.rsqrt(), c_vecs[0], m, w0, w1, *n_vecs[:2],
            *c_vecs[:2], correction, how),
    }
    with torch.no_grad():
        for name in names:
            result, fallback = calls[name](how), calls[name](False)
            if isinstance(result, torch.Tensor):
                result, fallback = (result, ), (fallback, )
            assert len(result) == len(fallback), name
            for i, (p, q) in enumerate(zip(result, fallback)):
                assert p.shape == q.shape, (name, i)
                torch.testing.assert_close(p, q, **tol, msg=f'{name}[{i}]')


@pytest.mark.skipif(not native_available(), reason='extension not built')
@pytest.mark.parametrize('length', [1, 7, 49, 127, 128, 200, 256])
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
def test_each_kernel_native_equals_pytorch(length, dtype):
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(
        rtol=2e-5, atol=2e-5)
    assert_kernels_agree(True, length, dtype, tol)


@pytest.mark.skipif(not native_available(), reason='extension not built')
def test_kernels_refuse_mismatched_statistics():
    x = torch.randn(2, 3, 4)
    with torch.no_grad(), pytest.raises(RuntimeError, match='mu_c'):
        ops.normalize(x, torch.zeros(2, 3), torch.ones(2, 3),
                      torch.tensor(0.3), torch.tensor(0.3), torch.zeros(2, 1),
                      torch.ones(2, 1), torch.zeros(4), torch.ones(3),
                      torch.ones(3), torch.zeros(3), 1e-5)


def test_unknown_kernel_choices_are_refused(monkeypatch):
    x = random_input((2, 3, 4, 4))
    sn = make_sn(3)
    running = sn.running_mean.clone()
    sn.use_native_kernels = 'Triton'
    with pytest.raises(ValueError, match="use_native_kernels='Triton'"):
        sn(x)
    sn.use_native_kernels = True
    monkeypatch.setenv(ops.GPU_KERNELS_ENV, 'cuda')
    with pytest.raises(ValueError, match="SN_MM_GPU_KERNELS='cuda'"):
        sn(x)
    assert torch.equal(running, sn.running_mean)  # refused before touching
    monkeypatch.setenv(ops.GPU_KERNELS_ENV, 'torch')
    sn(x)
    assert not torch.equal(running, sn.running_mean)
