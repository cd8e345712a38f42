"""The operator sn_mm::switchable_norm on the CPU (the C++ kernels, one call
per pass) against the reference, and its torch.library registration."""
import copy
import gc
import weakref

import pytest
import torch
from helpers import make_sn, random_input, require_kernels

from sn_mm import SwitchableNorm
from sn_mm.ops import native_available
from sn_mm.ops._compat import TORCH_VERSION

switchable_norm_op = torch.ops.sn_mm.switchable_norm
pytestmark = pytest.mark.skipif(
    not native_available(), reason='native extension not built')

SHAPES = [(3, 6, 4, 5), (4, 6), (3, 6, 1, 1), (0, 6, 3, 3), (2, 6, 7),
          (2, 6, 2, 3, 2), (1, 6, 5, 5)]


def pair(**kwargs):
    fused = make_sn(6, **kwargs)
    fused.kernels = 'native'
    reference = copy.deepcopy(fused)
    reference.kernels = 'torch'
    return fused, reference


def step(layer, x, grad):
    x = x.detach().requires_grad_()
    y = layer(x)
    (y * grad).sum().backward()
    return y.detach(), x.grad


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize(
    'settings', [dict(), dict(using_bn=False),
                 dict(unbiased=False)])
@pytest.mark.parametrize('training', [True, False])
def test_matches_the_reference(shape, settings, training):
    fused, reference = pair(**settings)
    fused.train(training)
    reference.train(training)
    x = random_input(shape)
    grad = random_input(shape, seed=2)
    for _ in range(2):  # twice: the running statistics move alike
        y, gx = step(fused, x, grad)
        y_ref, gx_ref = step(reference, x, grad)
        torch.testing.assert_close(y, y_ref)
        torch.testing.assert_close(gx, gx_ref)
    for name, p in fused.named_parameters():
        torch.testing.assert_close(
            p.grad, dict(reference.named_parameters())[name].grad, msg=name)
    for name, b in fused.named_buffers():
        torch.testing.assert_close(
            b, dict(reference.named_buffers())[name], msg=name)


@pytest.mark.parametrize('momentum', [None, 0.3])
def test_running_statistics_and_fixed_ratios(momentum):
    fused, reference = pair()
    for layer in (fused, reference):
        layer.momentum = momentum
        layer.fix_ratios(mean=[0, 0, 1], var=[0.5, 0.5, 0])
    x = random_input((3, 6, 4, 4))
    for _ in range(3):
        step(fused, x, x)
        step(reference, x, x)
    torch.testing.assert_close(fused.running_var, reference.running_var)
    assert int(fused.num_batches_tracked) == 3
    assert not fused.mean_weight.grad.any()
    assert not fused.var_weight.grad.any()


def test_empty_batch_leaves_running_statistics():
    fused, _ = pair()
    before = fused.running_mean.clone()
    y, gx = step(fused, random_input((0, 6, 3, 3)), random_input((0, 6, 3, 3)))
    assert y.shape == (0, 6, 3, 3) and gx.shape == (0, 6, 3, 3)
    assert torch.equal(fused.running_mean, before)
    assert int(fused.num_batches_tracked) == 0


@pytest.mark.parametrize('training', [True, False])
@pytest.mark.parametrize('shape', [(2, 3, 2, 3), (3, 3)])
def test_first_and_second_derivatives(training, shape):
    require_kernels('native')
    layer = SwitchableNorm(3, kernels='native').double()
    layer.load_state_dict(make_sn(3).state_dict())
    layer.train(training)
    names = ('weight', 'bias', 'mean_weight', 'var_weight')

    def f(x, *params):
        return torch.func.functional_call(layer, dict(zip(names, params)),
                                          (x, ))

    args = (random_input(shape).requires_grad_(),
            *(getattr(layer, n).detach().clone().requires_grad_()
              for n in names))
    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args)


def test_backward_node_keeps_autograd_contract():
    """The backward node: named; its saved tensors freed after a backward
    (a second one then raises) unless the graph is retained, when the same
    gradients come again; an input changed in place after the forward is
    refused; with a parameter frozen, the others' gradients land in their
    places."""
    layer, reference = pair()
    x = random_input((2, 6, 3, 3)).requires_grad_()
    grad = random_input(x.shape, seed=3)
    y = layer(x)
    assert y.grad_fn.name().endswith('<SwitchableNormBackward>')
    # edges to the five differentiable inputs; the buffers have none
    edges = [fn for fn, _ in y.grad_fn.next_functions]
    assert None not in edges[:5] and edges[5:] == [None] * (len(edges) - 5)
    first = torch.autograd.grad(y.sum(), x, retain_graph=True)[0]
    again = torch.autograd.grad(y.sum(), x)[0]
    assert torch.equal(first, again)
    with pytest.raises(
            RuntimeError, match='backward through the graph a '
            'second time'):
        y.sum().backward()

    packed = []

    class Saved:

        def __init__(self, t):
            self.t = t

    def pack(t):
        saved = Saved(t)
        packed.append(weakref.ref(saved))
        return saved

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda s: s.t):
        y = layer(x)
    assert packed
    y.sum().backward()
    gc.collect()
    assert not [r for r in packed if r() is not None]

    h = x * 1
    y = layer(h)
    h.add_(1)
    with pytest.raises(RuntimeError, match='modified by an inplace'):
        y.sum().backward()

    # weight frozen: the other gradients, each in its place, as the
    # reference's
    for sn in (layer, reference):
        x.grad = None
        sn.zero_grad(set_to_none=True)
        sn.weight.requires_grad_(False)
        (sn(x) * grad).sum().backward()
        got = [x.grad] + [p.grad for p in sn.parameters()]
        if sn is layer:
            native = got
    for a, b in zip(native, got):
        torch.testing.assert_close(a, b)


def test_transforms_without_a_cpu_rule_are_refused_by_name():
    """Forward-mode AD and functorch transforms have no rule in the C++
    kernels: a clear error that names the way out (kernels='torch'), which
    computes them."""
    layer, reference = pair()
    x = random_input((2, 6, 3, 3))
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(x, torch.ones_like(x))
        with pytest.raises(
                RuntimeError, match="forward-mode.*kernels='torch'"):
            layer(dual)
        tangent = torch.autograd.forward_ad.unpack_dual(
            reference(dual)).tangent
        assert tangent is not None and tangent.shape == x.shape
    # (eval: a transformed function may not update the running statistics)
    layer.eval()
    reference.eval()
    with pytest.raises(RuntimeError, match="functorch.*kernels='torch'"):
        torch.func.grad(lambda t: layer(t).sum())(x)
    assert torch.func.grad(lambda t: reference(t).sum())(x).shape == x.shape


@pytest.mark.parametrize('setting', ['default', 'no_bn', 'fixed_mean'])
def test_compiled_autograd_matches_eager_across_steps(setting):
    """Compiled autograd (the backward as an eager-backend graph, SN's node
    a call in it) gives the eager backward's gradients, step after step
    while an optimiser changes the logits: the ratios are recomputed from
    them, not constants of the graph."""
    from torch._dynamo import compiled_autograd
    if TORCH_VERSION < (2, 3):
        pytest.skip('compiled autograd runs C++ autograd Functions (SN\'s '
                    'CPU node) from torch 2.3 on (pytorch/pytorch#120681)')

    # (its name before torch 2.4: enable)
    enable = getattr(compiled_autograd, '_enable', None) or \
        compiled_autograd.enable
    layer, _ = pair(using_bn=setting != 'no_bn')
    if setting == 'fixed_mean':
        layer.ratio_fixed[0] = True
        layer.fixed_ratios[0] = torch.tensor([0.2, 0.3, 0.5])
    eager = copy.deepcopy(layer)
    x = random_input((2, 6, 3, 3)).requires_grad_()
    weights = random_input(x.shape, seed=3)

    def compiler(graph):
        return torch.compile(graph, backend='eager')

    def step(sn, compiled):
        x.grad = None
        sn.zero_grad(set_to_none=True)
        if compiled:
            with enable(compiler):
                (sn(x) * weights).sum().backward()
        else:
            (sn(x) * weights).sum().backward()
        grads = [x.grad] + [p.grad for p in sn.parameters()]
        with torch.no_grad():
            for p in sn.parameters():
                p -= 0.3 * p.grad
        return grads

    for _ in range(3):
        for got, expected in zip(step(layer, True), step(eager, False)):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)


def op_args(training=True):
    layer = make_sn(6)
    return (random_input(
        (2, 6, 3,
         3)).requires_grad_(), layer.weight.detach().clone().requires_grad_(),
            layer.bias.detach().clone().requires_grad_(),
            layer.mean_weight.detach().clone().requires_grad_(),
            layer.var_weight.detach().clone().requires_grad_(),
            layer.running_mean.clone(), layer.running_var.clone(),
            layer.num_batches_tracked.clone(), layer.nonfinite_batches.clone(),
            layer.ratio_fixed.clone(), layer.fixed_ratios.clone(), training,
            0.1, 1e-5, True, False)


@pytest.mark.parametrize('training', [True, False])
def test_library_registration(training):
    """torch.library's own checks: schema (the mutated running statistics
    declared), fake implementation, autograd registration."""
    if not hasattr(torch.library, 'opcheck'):
        pytest.skip('torch.library.opcheck needs torch >= 2.4 (the fake '
                    'implementation runs in test_switchable_norm\'s meta '
                    'tests)')
    torch.library.opcheck(
        switchable_norm_op,
        op_args(training),
        test_utils=('test_schema', 'test_autograd_registration',
                    'test_faketensor'))


def test_one_call_per_pass():
    """Forward and backward each dispatch one sn_mm operator and no
    (N, C)-sized ATen arithmetic."""
    layer = make_sn(6).float()
    x = torch.randn(2, 6, 8, 8, requires_grad=True)
    grad = torch.randn(2, 6, 8, 8)
    with torch.profiler.profile() as prof:
        layer(x).backward(grad)
    names = [e.name for e in prof.events()]
    assert names.count('sn_mm::switchable_norm') == 1
    arithmetic = {
        'aten::mul', 'aten::add', 'aten::sub', 'aten::div', 'aten::softmax',
        'aten::_softmax', 'aten::var_mean', 'aten::sum', 'aten::addcmul'
    }
    assert not arithmetic & set(names), sorted(arithmetic & set(names))


def test_bad_input_is_refused_by_name():
    fused, _ = pair()
    with pytest.raises(ValueError, match='built for 6 channels'):
        fused(random_input((2, 5, 3, 3)))
    args = list(op_args())
    args[1] = args[1][:4]
    with pytest.raises(RuntimeError, match='weight and bias must be 6'):
        switchable_norm_op(*args)
