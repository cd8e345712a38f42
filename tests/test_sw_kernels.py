"""Switchable Whitening's C++ passes (sn_mm::sw_moments, sw_apply,
sw_products) compute what its PyTorch ops compute, under every instruction
set the kernels are built for: outputs, running statistics and every
gradient, at group sizes that fill the kernels' tiles and at ones that
leave remainders, and at rows with and without a remainder after the
vector lanes."""
import pytest
import torch
from test_switchable_whitening import data, make_sw

from sn_mm import ops
from sn_mm.models.switchable_whitening import SwitchableWhitening
from sn_mm.ops import operator

pytestmark = pytest.mark.skipif(
    not ops.native_available(), reason='the C++ extension is not built')

# (channels, num_pergroup, input shape): groups of 16 (the default: full
# tiles), 4, 6 and 3 (remainders of the 4 x 4 product tiles and the row
# tiles); rows of 49 (RoI features), 64, 1 and 136 values.
CASES = [
    (32, 16, (2, 32, 7, 7)),
    (32, 16, (3, 32, 8, 8)),
    (8, 4, (3, 8, 5, 4)),
    (12, 6, (2, 12, 17, 8)),
    (6, 3, (4, 6, 7)),
    (12, 6, (5, 12)),
]


@pytest.fixture(params=ops.cpu_isas() or [None])
def isa(request):
    """Each instruction set the kernels are built for and this CPU runs."""
    before = ops.cpu_isa()
    if request.param is not None:
        ops.set_cpu_isa(request.param)
    try:
        yield request.param
    finally:
        if request.param is not None:
            ops.set_cpu_isa(before)


def run(layer, x, kernels, steps=2):
    """Outputs, running statistics and gradients of a few training steps
    and an eval forward of a copy of ``layer`` with ``kernels`` ('native'
    raises where the C++ passes cannot run)."""
    layer = make_copy(layer, kernels)
    outs = []
    for step in range(steps):
        xi = (x + step).requires_grad_()
        y = layer(xi)
        g = torch.cos(torch.arange(y.numel(), dtype=y.dtype)).view_as(y)
        (y * g).sum().backward()
        outs += [y.detach(), xi.grad]
    layer.eval()
    outs.append(layer(x))
    outs += [p.grad for p in layer.parameters()]
    outs += list(layer.buffers())
    return outs


def make_copy(layer, kernels=None):
    copy = SwitchableWhitening(layer.num_features, layer.num_pergroup,
                               layer.sw_type, layer.T, layer.tie_weight,
                               layer.eps, layer.momentum, layer.affine,
                               kernels)
    copy.load_state_dict(layer.state_dict())
    return copy.to(next(layer.buffers()).dtype)


@pytest.mark.parametrize('sw_type,tie_weight,affine', [(2, False, True),
                                                       (3, True, True),
                                                       (5, False, False)])
@pytest.mark.parametrize('case', CASES)
def test_native_equals_pytorch_ops_float64(isa, case, sw_type, tie_weight,
                                           affine):
    channels, per_group, shape = case
    layer = make_sw(
        channels,
        num_pergroup=per_group,
        sw_type=sw_type,
        tie_weight=tie_weight,
        affine=affine,
        T=4)
    x = data(shape, offset=3.)
    for native, plain in zip(run(layer, x, 'native'), run(layer, x, 'torch')):
        torch.testing.assert_close(native, plain, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize('case', CASES[:3])
def test_native_float32_as_close_to_float64_as_pytorch_ops(isa, case):
    """At an offset of 1e3 the weight's gradient, a sum of products that
    cancel, is off by up to 1e-3 of its largest value on either path; the
    rest by at most 2e-5."""
    channels, per_group, shape = case
    layer = make_sw(
        channels, num_pergroup=per_group, sw_type=5, dtype=torch.float32)
    x = data(shape, dtype=torch.float32, offset=1e3)
    truth = run(make_copy(layer).double(), x.double(), 'native')  # exact
    for native, plain, exact in zip(
            run(layer, x, 'native'), run(layer, x, 'torch'), truth):
        if exact.is_floating_point():
            scale = exact.abs().max()
            native_error = (native.double() - exact).abs().max() / scale
            plain_error = (plain.double() - exact).abs().max() / scale
            assert native_error <= max(2 * plain_error, 2e-3)


def test_native_keeps_only_the_input_for_backward():
    x = data((2, 32, 6, 5), dtype=torch.float32).contiguous().requires_grad_()
    layer = make_sw(32, num_pergroup=16, sw_type=5, dtype=torch.float32)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(t) or t, lambda t: t):
        layer(x).sum().backward()
    large = {
        t.untyped_storage().data_ptr()
        for t in saved if t.numel() >= x.numel()
    }
    assert large == {x.untyped_storage().data_ptr()}


def test_native_backward_twice_and_into_a_frozen_layer():
    layer = make_sw(16, num_pergroup=8, sw_type=3)
    x = data((3, 16, 4, 4)).requires_grad_()
    y = layer(x)
    first = torch.autograd.grad(y.sum(), x, retain_graph=True)[0]
    torch.testing.assert_close(torch.autograd.grad(y.sum(), x)[0], first)
    for p in layer.parameters():
        p.requires_grad_(False)
    ops.set_default_kernels('torch')
    try:
        expected = torch.autograd.grad(layer(x).sum(), x)[0]
    finally:
        ops.set_default_kernels(None)
    torch.testing.assert_close(
        torch.autograd.grad(layer(x).sum(), x)[0], expected)


def test_operators_refuse_what_they_cannot_run():
    rows = torch.randn(4, 3, 5)
    with pytest.raises(RuntimeError, match='contiguous float32 or float64'):
        torch.ops.sn_mm.sw_moments(rows.transpose(1, 2))
    with pytest.raises(RuntimeError, match='contiguous float32 or float64'):
        torch.ops.sn_mm.sw_moments(rows.half())
    with pytest.raises(RuntimeError, match='rows of no values'):
        torch.ops.sn_mm.sw_moments(rows[..., :0])
    with pytest.raises(RuntimeError, match=r'm1 must be contiguous'):
        torch.ops.sn_mm.sw_apply(
            torch.randn(4, 3, 4), rows, None, None, None, None, None)
    with pytest.raises(RuntimeError, match='go together'):
        torch.ops.sn_mm.sw_apply(
            torch.randn(4, 3, 3), rows, None, torch.randn(4, 3, 3), None, None,
            None)
    with pytest.raises(RuntimeError, match='one shape and dtype'):
        torch.ops.sn_mm.sw_products(rows, rows[:2], torch.randn(4, 3))


def test_the_layer_setting_picks_the_kernels(monkeypatch):
    x = data((2, 8, 3, 3))
    native = make_sw(8, kernels='native')
    plain = make_sw(8, kernels='torch')
    assert 'kernels=\'torch\'' in repr(plain)
    ops.set_default_kernels('torch')  # the layer's own setting wins
    try:
        torch.testing.assert_close(native(x), plain(x))
        with torch.autograd.graph.saved_tensors_hooks(
                lambda t: pytest.fail('the C++ path saves nothing here'),
                lambda t: t):
            with torch.no_grad():
                native(x)
    finally:
        ops.set_default_kernels(None)
    monkeypatch.setattr(operator, 'NATIVE', False)  # as if not built
    with pytest.raises(ValueError, match='built: False'):
        native(x)
    torch.testing.assert_close(make_sw(8)(x), plain(x))
    with pytest.raises(ValueError, match=r"kernels='triton'"):
        make_sw(8, kernels='triton')
