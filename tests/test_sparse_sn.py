"""Sparse SN: sparsemax and SparsestMax, the ``ratio_fn='sparsestmax'``
layer, SSNRadiusHook in a real training run, and sn2mm on released-layout
SSN checkpoints."""
import copy
import math
import os.path as osp

import pytest
import torch
from helpers import make_sn, random_input, require_kernels
from mmengine.registry import DefaultScope
from released_sn_resnet import ReleasedResNetSN, assert_reproduces, randomise
from ssn_reference import (ReleasedSSN2d, make_fixed, sparsemax_by_bisection,
                           sparsestmax_by_candidates)
from tool_runner import ROOT, run_python, run_python_together, tool
from torch.autograd import gradcheck

import sn_mm  # noqa: F401
from sn_mm import SwitchableNorm, convert_sync_sn, revert_sync_sn
from sn_mm.engine import SSNRadiusHook
from sn_mm.ops.sparsestmax import sparsemax, sparsestmax

VERTEX_DISTANCE = math.sqrt(2 / 3)  # from u = 1/3 to a one-hot vector
EDGE_DISTANCE = math.sqrt(1 / 6)  # from u to an edge's midpoint


def logit_cases(seed=0, n=300):
    """Random logit vectors of 2 and 3 entries at several scales, with
    ties (two or all entries equal, top or bottom) mixed in."""
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for i in range(n):
        k = 3 if i % 4 else 2
        z = torch.randn(
            k, generator=gen, dtype=torch.float64) * (
                0.05 + 3 * torch.rand(1, generator=gen).item())
        if i % 7 == 0:
            z[1] = z[0]  # tie among the top two (or all, for K=2)
        if i % 11 == 0 and k == 3:
            z[2] = z[1]
        cases.append(z)
    return cases


@pytest.mark.parametrize('k', [2, 3, 5])
def test_sparsemax_is_the_simplex_projection(k):
    gen = torch.Generator().manual_seed(k)
    for i in range(100):
        z = torch.randn(k, generator=gen, dtype=torch.float64) * 2
        if i % 5 == 0:
            z[1] = z[0]
        torch.testing.assert_close(
            sparsemax(z), sparsemax_by_bisection(z), rtol=0, atol=1e-12)
    # all equal: uniform; far apart: one-hot
    torch.testing.assert_close(
        sparsemax(torch.zeros(k, dtype=torch.float64)),
        torch.full((k, ), 1 / k, dtype=torch.float64))
    far = torch.zeros(k, dtype=torch.float64)
    far[1] = 5
    assert sparsemax(far).tolist() == torch.eye(k)[1].tolist()


def test_sparsestmax_matches_its_definition():
    """The nearest point of the simplex outside the ball of radius r, over
    radii inside the simplex (r < 0.408), crossing its edges (the recursive
    case) and beyond its vertices; ties included (where the nearest point
    is not unique, the distance to z must be the least one)."""
    gen = torch.Generator().manual_seed(1)
    recursive = 0
    for z in logit_cases():
        k = z.numel()
        for r in (0., 0.2, 0.3, 0.45, 0.6, 0.75, 0.9, 1.0,
                  float(torch.rand(1, generator=gen))):
            p = sparsestmax(z, r)
            expected = sparsestmax_by_candidates(z, r)
            uniform = float((sparsemax(z) - 1 / k).norm()) < 1e-14
            if uniform and r > 0:
                # No direction leads out: stays uniform, as in SSN.
                torch.testing.assert_close(p, sparsemax(z))
                continue
            assert abs(float(p.sum()) - 1) < 1e-12 and float(p.min()) >= 0
            gap = float((p - z).square().sum() - (expected - z).square().sum())
            assert abs(gap) < 1e-10, (z, r, p, expected)
            if k == 3 and int((p == 0).sum()) == 1 and r > EDGE_DISTANCE:
                recursive += 1
            if k == 3 and r >= VERTEX_DISTANCE:
                assert sorted(p.tolist()) == [0., 0., 1.]
    assert recursive > 50  # the edge case was exercised


def test_sparsestmax_gradient():
    """Within each piece (inside, on the circle, on an edge) autograd's
    Jacobian matches finite differences."""
    cases = [
        (torch.tensor([0.3, 0.2, -0.1]), 0.0),  # sparsemax interior
        (torch.tensor([0.3, 0.2, -0.1]), 0.3),  # on the circle
        (torch.tensor([0.9, 0.1, -0.5]), 0.3),  # sparsemax on an edge
        (torch.tensor([0.3, 0.25, 0.1]), 0.6),  # circle meets an edge
        (torch.tensor([0.4, -0.2]), 0.2)
    ]  # K = 2, on the circle
    for z, r in cases:
        z = z.double().requires_grad_()
        assert gradcheck(lambda v: sparsestmax(v, r), (z, ))
    # an unknown shape is refused by name
    with pytest.raises(ValueError, match='2 or 3 logits'):
        sparsestmax(torch.zeros(4), 0.1)


def ssn_pair(c=6, radius=0.35, seed=0):
    """Our ratio_fn='sparsestmax' layer and the released SSN layer with the
    same random state."""
    ours = SwitchableNorm(c, ratio_fn='sparsestmax').double()
    ours.load_state_dict(make_sn(c, seed=seed).state_dict(), strict=True)
    with torch.no_grad():  # soft at radius 0.35, one-hot at 0.95
        ours.mean_weight.copy_(torch.tensor([0.5, 0.2, -0.1]))
        ours.var_weight.copy_(torch.tensor([0.1, 0.3, 0.35]))
    ours.set_radius(radius)
    ref = ReleasedSSN2d(c).double()
    state = {
        k: v.reshape(ref.state_dict()[k].shape)
        for k, v in ours.state_dict().items() if k in ref.state_dict()
    }
    state['radius'] = torch.tensor([radius], dtype=torch.float64)
    ref.load_state_dict(state, strict=False)
    ref.momentum = 1 - ours.momentum
    return ours, ref


@pytest.mark.parametrize('kernels', ['torch', 'native'])
@pytest.mark.parametrize('training', [True, False])
def test_layer_matches_the_released_ssn_layer(kernels, training):
    require_kernels(kernels)
    ours, ref = ssn_pair()
    ours.kernels = kernels
    ours.train(training)
    ref.train(training)
    x = random_input((3, 6, 5, 4))
    torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-10)
    assert ours.fixed() == dict(mean=False, var=False)
    ratios = ours.ratios()
    torch.testing.assert_close(
        torch.tensor(list(ratios['mean'].values()), dtype=torch.float64),
        ref.ratios()[0],
        rtol=0,
        atol=1e-12)


@pytest.mark.parametrize('kernels', ['torch', 'native'])
def test_layer_gradients(kernels):
    """First and second derivatives, through the analytic backward."""
    require_kernels(kernels)
    layer, _ = ssn_pair(c=3, radius=0.3)
    layer.kernels = kernels
    x = random_input((2, 3, 2, 3)).requires_grad_()
    params = (layer.weight, layer.bias, layer.mean_weight, layer.var_weight)

    def f(x, *p):
        return torch.func.functional_call(
            layer,
            dict(zip(('weight', 'bias', 'mean_weight', 'var_weight'),
                     p)), (x, ))

    layer.eval()
    assert torch.autograd.gradcheck(f, (x, *params))
    assert torch.autograd.gradgradcheck(f, (x, *params))


def test_one_hot_ratios_are_fixed_in_training_only():
    layer, _ = ssn_pair(radius=0.95)  # beyond the vertices: one-hot
    x = random_input((3, 6, 4, 4))
    layer.eval()
    layer(x)
    assert layer.fixed() == dict(mean=False, var=False)  # eval: no change
    layer.train()
    layer(x).square().sum().backward()
    assert layer.fixed() == dict(mean=True, var=True)
    hot = layer.fixed_ratios.clone()
    assert sorted(hot[0].tolist()) == [0., 0., 1.]
    # SSN fixes the argmax of the logits
    assert int(hot[0].argmax()) == int(layer.mean_weight.argmax())
    assert not layer.mean_weight.grad.any()
    assert not layer.var_weight.grad.any()
    opt = torch.optim.SGD(layer.parameters(), lr=1., weight_decay=0.1)
    opt.step()
    layer.set_radius(0.)  # a smaller radius no longer matters
    layer(x)
    assert torch.equal(layer.fixed_ratios, hot)
    assert [list(r.values()) for r in layer.ratios().values()] == hot.tolist()


def test_state_dict_radius_and_sync_conversion(tmp_path):
    layer, _ = ssn_pair(radius=0.4)
    state = layer.state_dict()
    assert float(state['radius']) == pytest.approx(0.4)
    fresh = SwitchableNorm(6, ratio_fn='sparsestmax').double()
    fresh.load_state_dict(state, strict=True)
    assert float(fresh.radius) == pytest.approx(0.4)
    # an SN checkpoint loads into a Sparse SN layer (radius as it was)
    plain = make_sn(6).state_dict()
    fresh.load_state_dict(plain, strict=True)
    # SyncSN shares the radius buffer both ways
    synced = convert_sync_sn(torch.nn.Sequential(fresh))
    assert synced[0].ratio_fn == 'sparsestmax'
    assert synced[0].radius is fresh.radius
    back = revert_sync_sn(synced)
    assert back[0].radius is fresh.radius
    assert 'ratio_fn' not in repr(make_sn(3)) and 'radius=' in repr(fresh)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="unknown ratio_fn 'sparsemax'"):
        SwitchableNorm(4, ratio_fn='sparsemax')
    with pytest.raises(ValueError, match=r'radius must be in \[0, 1\]'):
        SwitchableNorm(4, ratio_fn='sparsestmax').set_radius(1.5)
    with pytest.raises(RuntimeError, match='has no radius'):
        SwitchableNorm(4).set_radius(0.5)
    with pytest.raises(ValueError, match='start <= end'):
        SSNRadiusHook(start=0.5, end=0.2)


def test_radius_hook_schedule():
    hook = SSNRadiusHook()
    assert hook.radius_at(0, 100) == 0
    assert hook.radius_at(25, 100) == 0.25
    assert hook.radius_at(100, 100) == 1
    assert SSNRadiusHook(0.2, 0.6).radius_at(50, 100) == pytest.approx(0.4)


SSN_TOY = osp.join(ROOT, 'configs', 'toy', 'deeplabv3_r18-ssn-d8_toy-seg.py')


def test_toy_training_ends_with_every_layer_fixed(toy_seg_workspace):
    """tools/train.py on the toy Sparse SN config: 8 iterations with a
    checkpoint at 4, then resumed to the end. The radius follows the
    iteration count across the resume, and every layer ends fixed. (Without
    mmseg's zero-initialised residual branches, whose layers would take no
    gradient in so few iterations and keep uniform ratios.)"""
    cwd = toy_seg_workspace
    common = [
        '--work-dir', 'ssn_wd', '--cfg-options', 'train_cfg.max_iters=8',
        'train_cfg.val_interval=100', 'train_dataloader.batch_size=2',
        'model.backbone.zero_init_residual=False',
        'default_hooks.checkpoint.interval=4',
        'default_hooks.checkpoint.max_keep_ckpts=3'
    ]
    run_python([tool('train.py'), SSN_TOY, *common], cwd)
    first = torch.load(cwd / 'ssn_wd' / 'iter_4.pth', weights_only=False)
    radii = {
        float(v)
        for k, v in first['state_dict'].items() if k.endswith('.radius')
    }
    assert radii == {3 / 8}  # set before the 4th iteration (index 3)
    # resume from iteration 4 in a fresh work dir
    (cwd / 'ssn_resumed').mkdir()
    run_python([
        tool('train.py'), SSN_TOY, '--resume',
        str(cwd / 'ssn_wd' / 'iter_4.pth'), '--work-dir', 'ssn_resumed',
        *common[2:]
    ], cwd)
    last = torch.load(
        cwd / 'ssn_resumed' / 'iter_8.pth', weights_only=False)['state_dict']
    assert {float(v)
            for k, v in last.items() if k.endswith('.radius')} == {7 / 8}
    fixed = {k: v for k, v in last.items() if k.endswith('.ratio_fixed')}
    assert len(fixed) > 20 and all(bool(v.all()) for v in fixed.values())
    for k in fixed:
        hot = last[k.replace('ratio_fixed', 'fixed_ratios')]
        assert all(sorted(row.tolist()) == [0., 0., 1.] for row in hot)


# -- sn2mm on released-layout SSN checkpoints --------------------------------


def save_released(model, path):
    state = {'module.' + k: v for k, v in model.state_dict().items()}
    torch.save(
        dict(state_dict=state, epoch=100, model='resnet_v1_ssn50'), path)


def mmdet_resnet50(**norm):
    from mmdet.models.backbones import ResNet
    with DefaultScope.overwrite_default_scope('mmdet'):
        return ResNet(
            depth=50,
            style='pytorch',
            norm_eval=False,
            norm_cfg=dict(type='SN', **norm))


@pytest.fixture(scope='module')
def released_ssn():
    return make_fixed(randomise(ReleasedResNetSN(norm=ReleasedSSN2d), seed=5))


def test_convert_fixed_ssn_checkpoint(tmp_path, released_ssn):
    src, dst = tmp_path / 'ssn.pth.tar', tmp_path / 'ssn_mm.pth'
    save_released(released_ssn, src)
    result = run_python([tool('model_converters', 'sn2mm.py'), src, dst], ROOT)
    assert 'Sparse SN layers' in result.stdout
    assert 'all were one-hot' in result.stdout
    state = torch.load(dst, weights_only=True)['state_dict']
    assert not any(
        k.endswith(('mean_fixed', 'var_fixed', '.radius')) for k in state)
    x = torch.randn(
        2,
        3,
        64,
        64,
        generator=torch.Generator().manual_seed(3),
        dtype=torch.float64)
    for norm in (dict(), dict(ratio_fn='sparsestmax')):
        backbone = mmdet_resnet50(**norm)
        backbone.load_state_dict(state, strict=True)
        backbone.double()
        layers = [
            m for m in backbone.modules() if isinstance(m, SwitchableNorm)
        ]
        assert all(m.fixed() == dict(mean=True, var=True) for m in layers)
        assert_reproduces(
            copy.deepcopy(released_ssn).double(), backbone, x, 1e-10)


def test_unfixed_ssn_layers_are_refused_unless_allowed(tmp_path, released_ssn):
    model = copy.deepcopy(released_ssn)
    make_fixed(model, seed=5, unfixed=('layer2.1.sn2', 'layer4.0.sn1'))
    src = tmp_path / 'ssn.pth.tar'
    refused, dst = tmp_path / 'refused.pth', tmp_path / 'ssn_mm.pth'
    save_released(model, src)
    sn2mm = tool('model_converters', 'sn2mm.py')
    refusal, allowed = run_python_together(
        [[sn2mm, src, refused], [sn2mm, src, dst, '--allow-unfixed']],
        ROOT,
        ok=False)
    assert refusal.returncode == 1 and not refused.exists()
    assert 'are not fixed yet' in refusal.stderr
    assert 'layer2.1.sn2 (mean)' in refusal.stderr
    assert '--allow-unfixed' in refusal.stderr
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert '4 ratio vectors were not fixed' in allowed.stdout
    state = torch.load(dst, weights_only=True)['state_dict']
    backbone = mmdet_resnet50()
    backbone.load_state_dict(state, strict=True)
    backbone.double()
    x = torch.randn(
        2,
        3,
        64,
        64,
        generator=torch.Generator().manual_seed(3),
        dtype=torch.float64)
    # float32 ratios in the checkpoint: float32's tolerance
    assert_reproduces(copy.deepcopy(model).double(), backbone, x, 1e-5)
