"""What several test modules share: SN layers with non-trivial state, inputs,
the float64 reference of a layer, running a layer forward and backward,
checking a kernel set against the PyTorch kernels, free ports."""
import importlib.util
import os.path as osp
import socket

import torch

from sn_mm import SwitchableNorm
from sn_mm.ops import kernels as kernel_sets
from sn_reference import reference_sn


def free_port():
    """A free TCP port on 127.0.0.1 for a process group's rendezvous."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def make_sn(c, using_bn=True, unbiased=True, dtype=torch.float64, seed=0,
            **kwargs):
    """An SN layer with non-trivial parameters and running statistics."""
    gen = torch.Generator().manual_seed(seed)
    sn = SwitchableNorm(c, using_bn=using_bn, unbiased=unbiased,
                        **kwargs).to(dtype)
    with torch.no_grad():
        sn.weight.copy_(torch.rand(c, generator=gen) + 0.5)
        sn.bias.copy_(torch.randn(c, generator=gen))
        sn.mean_weight.copy_(torch.randn(sn.mean_weight.shape, generator=gen))
        sn.var_weight.copy_(torch.randn(sn.var_weight.shape, generator=gen))
        if using_bn:
            sn.running_mean.copy_(torch.randn(c, generator=gen))
            sn.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
    return sn


def random_input(shape, seed=1, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    # A per-channel offset and scale, so that the normalisers differ.
    x = torch.randn(shape, generator=gen, dtype=dtype)
    offset = torch.randn(shape[:2], generator=gen, dtype=dtype) * 3
    return x * 2 + offset.reshape(*shape[:2], *([1] * (len(shape) - 2)))


def reference_of(sn, x, training):
    """(output, new running mean, new running var) of the float64
    reference for layer ``sn``'s current state."""
    return reference_sn(x, sn.weight.detach(), sn.bias.detach(),
                        sn.mean_weight.detach(), sn.var_weight.detach(),
                        sn.running_mean, sn.running_var, training,
                        momentum=sn.momentum, eps=sn.eps, using_bn=sn.using_bn,
                        unbiased=sn.unbiased)


def run_layer(sn, x, kernels):
    """Forward and backward (a fixed random output gradient) with
    ``sn.kernels = kernels``; returns the output, every gradient and the
    running statistics."""
    sn.kernels = kernels
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


def kernel_set(name):
    return {'native': lambda: kernel_sets.NATIVE,
            'triton': kernel_sets._triton,
            'torch': lambda: kernel_sets.TORCH}[name]()


def assert_kernels_agree(how, length, dtype, tol, names=KERNELS, shape=(5, 6),
                         device='cpu'):
    """Each kernel in ``names`` of the ``how`` kernel set ('native' or
    'triton') returns what its PyTorch version returns, on random inputs
    with rows of ``length``."""
    a = kernel_inputs(*shape, length, dtype)
    a = {k: ([t.to(device) for t in v] if isinstance(v, list) else
             v.to(device)) for k, v in a.items()}
    x, g, (m, s1, s2, mu), v = a['x'], a['g'], a['nc'], a['var_nc']
    n_vecs, c_vecs, (w0, w1) = a['n1'], a['c1'], a['w']
    correction = 1 if length > 1 else 0  # as SwitchableNorm chooses
    calls = {
        'row_moments': lambda k: k.row_moments(x, correction),
        'moment_reductions': lambda k: k.moment_reductions(m, v),
        'normalize': lambda k: k.normalize(
            x, m, v, w0, w1, n_vecs[0], n_vecs[1].abs(), c_vecs[0],
            c_vecs[1].abs(), c_vecs[2], c_vecs[3], 1e-5),
        'row_grad_sums': lambda k: k.row_grad_sums(g, x, m),
        'grad_reductions': lambda k: k.grad_reductions(
            s1, s2, mu, v.rsqrt(), c_vecs[0], m, v, n_vecs[2], c_vecs[2]),
        'input_grad': lambda k: k.input_grad(
            g, x, s1, s2, mu, v.rsqrt(), c_vecs[0], m, w0, w1, *n_vecs[:3],
            *c_vecs[:3], correction),
    }
    tested = kernel_set(how)
    with torch.no_grad():
        for name in names:
            # The kernel under test must not be the PyTorch one itself.
            assert getattr(tested, name) is not getattr(kernel_sets.TORCH,
                                                        name), name
            result = calls[name](tested)
            fallback = calls[name](kernel_sets.TORCH)
            if isinstance(result, torch.Tensor):
                result, fallback = (result, ), (fallback, )
            assert len(result) == len(fallback), name
            for i, (p, q) in enumerate(zip(result, fallback)):
                assert p.shape == q.shape, (name, i)
                torch.testing.assert_close(p, q, **tol, msg=f'{name}[{i}]')


def load_tool(*parts):
    """A tool script under tools/ as a module, to call its functions."""
    path = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools',
                    *parts)
    spec = importlib.util.spec_from_file_location(
        osp.splitext(parts[-1])[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def require_kernels(name):
    """Skip the calling test where kernel set ``name`` cannot run here."""
    import pytest
    if name == 'native' and not kernel_sets.native_available():
        pytest.skip('native extension not built (SN_MM_NO_EXT=1)')
    if name == 'triton':
        pytest.importorskip('triton')
