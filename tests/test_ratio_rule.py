"""The ratio rule has one definition, sn_mm/ops/ratios.py, which the
reference path (kernels='torch') uses; the C++ and Triton kernels apply
their own copy of it on their devices, behind compiled-in flags (SparsestMax
ratios given, fixed ratios, IN defined, the BN term, ratio groups). Every
combination of those flags is run here on each kernel path against the
reference: outputs, the input gradient, the logits' gradients, the affine
gradients and the running statistics after two training steps."""
import itertools
import os

import pytest
import torch
from helpers import require_kernels

from sn_mm import SwitchableNorm
from sn_mm.ops import native_available

FIXED = ('none', 'mean', 'both')
CASES = list(
    itertools.product(
        (True, False),  # using_bn
        (True, False),  # IN defined (H x W > 1)
        FIXED,  # which ratio vectors are fixed
        ('softmax', 'sparsestmax'),
        (1, 2),  # ratio groups
    ))
PATHS = (['native'] if native_available() else []) + (
    ['triton'] if os.environ.get('TRITON_INTERPRET') == '1' else [])


def make(using_bn, fixed, ratio_fn, groups, kernels, dtype):
    gen = torch.Generator().manual_seed(3)
    layer = SwitchableNorm(
        4,
        using_bn=using_bn,
        ratio_fn=ratio_fn,
        ratio_groups=groups,
        kernels=kernels)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
        layer.weight.add_(2)
        if ratio_fn == 'sparsestmax':
            layer.radius.fill_(0.5)
        k = layer.fixed_ratios.shape[-1]
        if fixed != 'none':
            # In the last group only, where there are two: a group whose
            # ratios are fixed beside one whose are not. The mean's vector
            # selects IN alone (LN alone where IN is undefined), the
            # variance's mixes with an exact zero.
            at = (0, -1) if groups > 1 else (0, )
            layer.ratio_fixed[at] = True
            layer.fixed_ratios[at] = torch.tensor([1., 0., 0.][:k])
            if fixed == 'both':
                at = (1, -1) if groups > 1 else (1, )
                layer.ratio_fixed[at] = True
                layer.fixed_ratios[at] = torch.tensor([0.25, 0.75, 0.][:k])
    return layer.to(dtype)


def run(layer, x, grad):
    x = x.clone().requires_grad_()
    for _ in range(2):  # the second step starts from updated statistics
        layer.zero_grad()
        y = layer(x)
        y.backward(grad)
    result = dict(output=y, input_grad=x.grad)
    result.update((f'{n} grad', p.grad) for n, p in layer.named_parameters())
    result.update((n, b) for n, b in layer.named_buffers() if b is not None)
    layer.eval()
    result['eval output'] = layer(x)
    return {k: v.detach().double() for k, v in result.items()}


@pytest.mark.parametrize('path', PATHS)
@pytest.mark.parametrize(
    'using_bn,has_in,fixed,ratio_fn,groups',
    CASES,
    ids=[
        f'bn{int(c[0])}-in{int(c[1])}-fixed_{c[2]}-{c[3]}-g{c[4]}'
        for c in CASES
    ])
def test_kernels_apply_the_ratio_rule(path, using_bn, has_in, fixed, ratio_fn,
                                      groups):
    if path == 'triton':
        require_kernels('triton')
    dtype = torch.float64 if path == 'native' else torch.float32
    shape = (3, 4, 3, 2) if has_in else (3, 4, 1, 1)
    gen = torch.Generator().manual_seed(4)
    x = (torch.randn(shape, generator=gen) * 2 + 1).to(dtype)
    grad = torch.randn(shape, generator=gen).to(dtype)
    want = run(
        make(using_bn, fixed, ratio_fn, groups, 'torch', dtype), x, grad)
    got = run(make(using_bn, fixed, ratio_fn, groups, path, dtype), x, grad)
    tol = 1e-9 if dtype == torch.float64 else 2e-4
    assert got.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(
            got[key],
            value,
            rtol=tol,
            atol=tol * max(1., float(value.abs().max())),
            msg=key)


@pytest.mark.skipif(not PATHS, reason='no kernel path besides the reference')
def test_the_comparison_can_fail(monkeypatch):
    """A reference whose rule for inputs without IN differs from the
    kernels' (LN's ratio taken as it is, not renormalised) is caught."""
    from sn_mm.ops import ratios
    monkeypatch.setattr(ratios, 'ratio_without_in',
                        lambda ratio: ratio[..., 1:])
    with pytest.raises(AssertionError, match='output'):
        test_kernels_apply_the_ratio_rule(PATHS[0], True, False, 'both',
                                          'softmax', 1)
