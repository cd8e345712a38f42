"""Fixed ratios in SN and SyncSN, hard ratios (harden_sn, its tool, the
hard-ratio view of plot_ratios)."""
import copy
import math
import os.path as osp

import pytest
import torch
from helpers import (load_tool, make_sn, random_input, require_kernels,
                     run_layer, toy_det_batch)
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope
from tool_runner import ROOT, run_python, tool

from sn_mm import (SwitchableNorm, SyncSwitchableNorm, convert_sync_sn,
                   harden_sn, revert_sync_sn)
from sn_mm.testing import reference_sn
from sn_mm.testing.processes import run_on_ranks

HARD_BN_IN = ([0., 0., 1.], [1., 0., 0.])  # mean from BN, variance from IN


def logits_of(ratio):
    """Logits whose softmax is ``ratio`` exactly (-inf for the zeros)."""
    return torch.tensor([math.log(r) if r > 0 else -math.inf for r in ratio],
                        dtype=torch.float64)


def reference_fixed(sn, x, training, mean, var):
    """The reference with the given ratios (None: the layer's logits)."""
    if x[0, 0].numel() == 1:  # no IN: a ratio of IN alone means LN
        mean, var = [[0., 1., 0.] if r is not None and sum(r[1:]) == 0 else r
                     for r in (mean, var)]
    logits = [
        sn_logits.detach() if r is None else logits_of(r)
        for r, sn_logits in ((mean, sn.mean_weight), (var, sn.var_weight))
    ]
    return reference_sn(
        x,
        sn.weight.detach(),
        sn.bias.detach(),
        *logits,
        sn.running_mean,
        sn.running_var,
        training,
        eps=sn.eps,
        unbiased=sn.unbiased)


@pytest.mark.parametrize('shape', [(4, 5, 3, 4), (6, 5)], ids=['4d', '2d'])
@pytest.mark.parametrize(
    'ratios', [HARD_BN_IN, ([0.2, 0.3, .5], None), (None, [0., 1., 0.])],
    ids=['hard', 'soft_mean', 'var_only'])
@pytest.mark.parametrize('kernels', ['native', 'torch'])
def test_fixed_ratios_match_reference(shape, ratios, kernels):
    require_kernels(kernels)
    sn = make_sn(5, kernels=kernels)
    sn.fix_ratios(*ratios)
    mean, var = ratios
    for stat, ratio in zip(('mean', 'var'), ratios):
        if ratio is not None:  # reported as given
            assert list(sn.ratios()[stat].values()) == pytest.approx(ratio)
    x = random_input(shape)
    for training in (True, False):
        expected, exp_rm, exp_rv = reference_fixed(sn, x, training, mean, var)
        torch.testing.assert_close(
            sn.train(training)(x), expected, rtol=1e-10, atol=1e-10)
        if training:
            torch.testing.assert_close(sn.running_var, exp_rv)


def test_in_only_ratio_falls_back_to_ln_at_one_position():
    sn = make_sn(5)
    sn.fix_ratios(mean=[1., 0., 0.], var=[1., 0., 0.])
    x = random_input((4, 5, 1, 1))
    expected, _, _ = reference_fixed(sn, x, True, [0., 1., 0.], [0., 1., 0.])
    torch.testing.assert_close(sn(x), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('kernels', ['native', 'triton', 'torch'])
@pytest.mark.parametrize(
    'mean', [HARD_BN_IN[0], [0.25, 0.25, 0.5]], ids=['one_hot', 'soft'])
def test_fixed_ratios_take_no_gradient_and_never_move(kernels, mean):
    require_kernels(kernels)
    sn = make_sn(4, dtype=torch.float32, kernels=kernels)
    sn.fix_ratios(mean=mean)  # the variance stays learned
    optim = torch.optim.SGD(
        sn.parameters(), lr=0.5, momentum=0.9, weight_decay=0.1)
    before = sn.ratios()
    for step in range(3):
        x = random_input((3, 4, 5, 5), seed=step, dtype=torch.float32)
        optim.zero_grad()
        out = sn(x)
        (out * torch.randn_like(out)).sum().backward()
        assert torch.equal(sn.mean_weight.grad, torch.zeros(3))
        assert sn.var_weight.grad.abs().sum() > 0
        optim.step()
    after = sn.ratios()
    assert after['mean'] == before['mean']  # exactly
    assert list(after['mean'].values()) == mean
    assert after['var'] != before['var']


@pytest.mark.parametrize('kernels', ['native', 'triton'])
def test_kernel_paths_agree_with_fixed_ratios(kernels):
    require_kernels(kernels)
    dtype = torch.float32 if kernels == 'triton' else torch.float64
    x = random_input((4, 5, 6, 7), dtype=dtype)
    results = []
    for how in (kernels, 'torch'):
        sn = make_sn(5, dtype=dtype)
        sn.fix_ratios(*HARD_BN_IN)
        results.append(run_layer(sn, x, how))
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else {}
    for key in results[0]:
        torch.testing.assert_close(
            results[0][key], results[1][key], **tol, msg=key)


def test_fixed_ratios_survive_state_dict_and_sync_conversion(tmp_path):
    sn = make_sn(5)
    sn.fix_ratios(*HARD_BN_IN)
    torch.save(sn.state_dict(), tmp_path / 'sn.pth')
    fresh = SwitchableNorm(5).double()
    fresh.load_state_dict(torch.load(tmp_path / 'sn.pth'), strict=True)
    assert fresh.fixed() == dict(mean=True, var=True)
    assert fresh.ratios() == sn.ratios()
    x = random_input((3, 5, 4, 4))
    torch.testing.assert_close(fresh.eval()(x), sn.eval()(x))
    model = torch.nn.Sequential(sn)
    synced = convert_sync_sn(model)
    assert isinstance(synced[0], SyncSwitchableNorm)
    assert synced[0].ratios() == sn.ratios()
    assert isinstance(revert_sync_sn(synced)[0], SwitchableNorm)
    assert synced[0].fixed() == dict(mean=True, var=True)
    # Checkpoints from before fixed ratios load strictly, nothing fixed.
    state = sn.state_dict()
    del state['ratio_fixed'], state['fixed_ratios']
    older = SwitchableNorm(5).double()
    older.load_state_dict(state, strict=True)
    assert older.fixed() == dict(mean=False, var=False)


def test_bad_ratios_are_refused():
    sn = SwitchableNorm(4)
    with pytest.raises(ValueError, match='expected 3 values'):
        sn.fix_ratios(mean=[0.5, 0.5])
    with pytest.raises(ValueError, match='sum to 1'):
        sn.fix_ratios(var=[0.5, 0.6, -0.1])
    with pytest.raises(ValueError, match='sum to 1'):
        sn.fix_ratios(var=[0.5, 0.6, 0.1])
    assert sn.fixed() == dict(mean=False, var=False)


def sync_worker(rank):
    layer = SyncSwitchableNorm(5).double()
    layer.load_state_dict(make_sn(5).state_dict())
    layer.fix_ratios(*HARD_BN_IN)
    x = random_input((4, 5, 3, 3))[rank * 2:(rank + 1) * 2]
    x.requires_grad_()
    y = layer(x)
    y.square().sum().backward()
    return dict(
        y=y.detach(),
        x_grad=x.grad,
        mean_weight_grad=layer.mean_weight.grad,
        running_var=layer.running_var)


def test_syncsn_with_fixed_ratios_in_two_processes():
    results = run_on_ranks(sync_worker, 2)
    sn = make_sn(5)
    sn.fix_ratios(*HARD_BN_IN)
    x = random_input((4, 5, 3, 3)).requires_grad_()
    y = sn(x)
    y.square().sum().backward()
    for rank, r in enumerate(results):
        part = slice(rank * 2, rank * 2 + 2)
        torch.testing.assert_close(r['y'], y[part].detach())
        torch.testing.assert_close(r['x_grad'], x.grad[part])
        torch.testing.assert_close(r['running_var'], sn.running_var)
        assert torch.equal(r['mean_weight_grad'],
                           torch.zeros(3, dtype=torch.float64))


def test_harden_sn_fixes_the_argmax():
    model = torch.nn.Sequential(
        make_sn(4, seed=1), make_sn(6, seed=2),
        make_sn(3, using_bn=False, seed=3))
    soft = [m.ratios() for m in model]
    assert harden_sn(model) == 3
    for m, before in zip(model, soft):
        for stat in ('mean', 'var'):
            best = max(before[stat], key=before[stat].get)
            assert m.ratios()[stat] == {
                t: float(t == best)
                for t in before[stat]
            }
    assert harden_sn(model) == 0  # already hard


TOY_DET = osp.join(ROOT, 'configs', 'toy',
                   'mask-rcnn_r18-sn_fpn_sn-head_toy-coco.py')


def test_harden_then_train_the_toy_mask_rcnn():
    from mmdet.registry import MODELS
    cfg = Config.fromfile(TOY_DET)
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
        optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    layers = [m for m in model.modules() if isinstance(m, SwitchableNorm)]
    with torch.no_grad():
        for m in layers:
            m.mean_weight.normal_()
            m.var_weight.normal_()
    assert harden_sn(model) == len(layers)
    hard = [m.ratios() for m in layers]
    model.train()
    data = toy_det_batch(model)
    before = copy.deepcopy(model.state_dict())
    for _ in range(2):
        loss, _ = model.parse_losses(model(**data, mode='loss'))
        assert torch.isfinite(loss)
        optim_wrapper.update_params(loss)
    assert [m.ratios() for m in layers] == hard
    assert not torch.equal(
        before['backbone.layer1.0.conv1.weight'],
        model.state_dict()['backbone.layer1.0.conv1.weight'])


def test_harden_tool_and_the_hard_view(tmp_path):
    from released_sn_resnet import ReleasedResNetSN, randomise
    soft_path, hard_path = tmp_path / 'soft.pth', tmp_path / 'hard.pth'
    model = randomise(ReleasedResNetSN(), seed=5)
    torch.save(dict(state_dict=model.state_dict(), epoch=3), soft_path)
    result = run_python(
        [tool('model_converters', 'harden_sn.py'), soft_path, hard_path],
        cwd=tmp_path)
    assert 'Fixed 53 SN layers to hard ratios (53 changed)' in result.stdout
    ckpt = torch.load(hard_path, weights_only=False)
    assert ckpt['epoch'] == 3  # the rest of the checkpoint is kept
    state = ckpt['state_dict']
    soft = model.state_dict()
    for layer in ('sn1', 'layer3.4.sn2', 'layer2.0.downsample.1'):
        for row, stat in enumerate(('mean', 'var')):
            expected = torch.zeros(3, dtype=torch.float32)
            expected[soft[f'{layer}.{stat}_weight'].argmax()] = 1
            assert torch.equal(state[f'{layer}.fixed_ratios'][row], expected)
        assert state[f'{layer}.ratio_fixed'].all()

    # The hard view: printed choices, figure cells, the two counts.
    out = tmp_path / 'hard.png'
    result = run_python([
        tool('analysis_tools', 'plot_ratios.py'), hard_path, '--hard',
        '--compare', soft_path, '--out', out
    ],
                        cwd=tmp_path)
    rows = {
        line.split()[0]: line.split()[1:]
        for line in result.stdout.splitlines()[1:54]
    }
    terms = ('in', 'ln', 'bn')
    choice = {
        layer: [
            terms[int(soft[f'{layer}.{s}_weight'].argmax())]
            for s in ('mean', 'var')
        ]
        for layer in rows
    }
    assert rows['layer3.4.sn2'] == ['3x3'] + choice['layer3.4.sn2']
    assert rows['layer3.4.sn1'] == ['1x1'] + choice['layer3.4.sn1']
    assert rows['layer2.0.downsample.1'][0] == 'shortcut'
    differ = sum(c[0] != c[1] for c in choice.values())
    assert f'{differ} of 53 layers choose a different normaliser' in \
        result.stdout
    assert '0 of 53 layers changed their choice' in result.stdout
    assert out.read_bytes()[:4] == b'\x89PNG'
    plot = load_tool('analysis_tools', 'plot_ratios.py')
    from sn_mm.analysis import sn_ratios
    from sn_mm.models import hard_choices
    choices = hard_choices(sn_ratios(state))
    fig = plot.make_hard_figure(choices, {n: 'other' for n in choices}, 't')
    grid = fig.axes[0].images[0].get_array()
    assert [[terms[int(v)] for v in row]
            for row in grid] == [[choice[n][0] for n in choices],
                                 [choice[n][1] for n in choices]]
    # Against a checkpoint with other choices: the count of changed layers.
    flipped = {
        k: (-v if k.endswith('mean_weight') else v)
        for k, v in soft.items()
    }
    torch.save(dict(state_dict=flipped), tmp_path / 'flipped.pth')
    result = run_python([
        tool('analysis_tools', 'plot_ratios.py'), hard_path, '--hard',
        '--compare', tmp_path / 'flipped.pth', '--out', out
    ],
                        cwd=tmp_path)
    moved = sum(
        int(soft[f'{n}.mean_weight'].argmax()) != int((
            -soft[f'{n}.mean_weight']).argmax()) for n in choice)
    assert f'{moved} of 53 layers changed their choice' in result.stdout


@pytest.mark.parametrize('training', [True, False])
def test_gradcheck_and_gradgradcheck_with_fixed_ratios(training):
    from torch.func import functional_call
    sn = make_sn(3).train(training)
    sn.fix_ratios(mean=[0.25, 0.25, 0.5])
    names = ['weight', 'bias', 'mean_weight', 'var_weight']
    params = [getattr(sn, n).detach().clone().requires_grad_() for n in names]
    x = random_input((3, 3, 2, 3)).requires_grad_()

    def fn(x, *params):
        return functional_call(sn, dict(zip(names, params)), (x, ))

    assert torch.autograd.gradcheck(fn, (x, *params))
    assert torch.autograd.gradgradcheck(fn, (x, *params))
