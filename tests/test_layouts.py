"""channels_last inputs: the same outputs and gradients as contiguous ones
on every kernel path; on the PyTorch kernels (the GPU default) the output
and input gradient stay channels_last, with no full-size copy."""
import math

import pytest
import torch
from helpers import make_sn, random_input, require_kernels


def full_size_copies(prof, numel):
    return [
        e.name for e in prof.events()
        if e.name in ('aten::copy_', 'aten::clone', 'aten::contiguous',
                      'aten::_to_copy') and any(
                          s and math.prod(s) == numel for s in e.input_shapes)
    ]


@pytest.mark.parametrize('kernels', ['torch', 'native'])
@pytest.mark.parametrize('training', [True, False])
def test_channels_last(kernels, training):
    require_kernels(kernels)
    layer, twin = make_sn(6), make_sn(6)
    layer.kernels = twin.kernels = kernels
    layer.train(training)
    twin.train(training)
    x = random_input((3, 6, 5, 4))
    grad = random_input((3, 6, 5, 4), seed=2)
    x_ref = x.clone().requires_grad_()
    y_ref = twin(x_ref)
    y_ref.backward(grad)
    x_cl = x.to(memory_format=torch.channels_last).requires_grad_()
    grad_cl = grad.to(memory_format=torch.channels_last)
    with torch.profiler.profile(record_shapes=True) as prof:
        y = layer(x_cl)
        y.backward(grad_cl)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(x_cl.grad, x_ref.grad)
    for name, p in layer.named_parameters():
        torch.testing.assert_close(p.grad,
                                   dict(twin.named_parameters())[name].grad)
    if kernels == 'torch':
        assert y.is_contiguous(memory_format=torch.channels_last)
        assert x_cl.grad.is_contiguous(memory_format=torch.channels_last)
        assert not full_size_copies(prof, x.numel())
