"""tools/model_converters/sw2mm.py on a checkpoint in the authors' SW
ResNet-50 key layout: strict loads into mmdet's, mmseg's and mmpretrain's
models, the source network's outputs reproduced, bad layouts refused; and
SWResNet's layout itself."""
import os.path as osp
import subprocess
import sys
from importlib import import_module

import pytest
import torch
from mmengine.registry import DefaultScope
from released_sw_resnet import ReleasedSWResNet50
from tool_runner import ROOT

import sn_mm  # noqa: F401
from sn_mm.models.switchable_whitening import SwitchableWhitening

TOOL = osp.join(ROOT, 'tools', 'model_converters', 'sw2mm.py')


def run_tool(*args):
    return subprocess.run([sys.executable, TOOL, *map(str, args)],
                          capture_output=True,
                          text=True,
                          timeout=600)


@pytest.fixture(scope='module')
def released(tmp_path_factory):
    """The authors' network with trained-looking SW layers (logits away
    from uniform, running statistics from a few training batches), saved
    as their training saves it (``module.`` keys, epoch, ...)."""
    torch.manual_seed(0)
    model = ReleasedSWResNet50(sw_cfg=dict(num_pergroup=16, sw_type=2, T=5))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'sw_' in name:
                p.normal_(0, 1)
    model.train()
    for _ in range(3):
        model(torch.randn(4, 3, 64, 64))
    model.eval()
    path = tmp_path_factory.mktemp('sw') / 'resnet50_sw.pth'
    torch.save(
        dict(
            epoch=100,
            state_dict={
                f'module.{k}': v
                for k, v in model.state_dict().items()
            }), path)
    return model, path


def build(scope, cfg):
    import_module(f'{scope}.models')
    with DefaultScope.overwrite_default_scope(scope):
        return import_module(f'{scope}.registry').MODELS.build(cfg)


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_backbone_reproduces_the_released_network(released, tmp_path, scope):
    model, src = released
    dst = tmp_path / 'resnet50_sw_mm.pth'
    result = run_tool(src, dst, '--to', scope)
    assert result.returncode == 0, result.stderr
    assert 'Found a ResNet-50 with 7 SW layers' in result.stdout
    assert "type='SWResNet'" in result.stdout
    state = torch.load(dst, weights_only=False)['state_dict']
    backbone = build(
        scope,
        dict(
            type='SWResNet',
            depth=50,
            style='pytorch',
            sw_cfg=dict(type='SW', num_pergroup=16, sw_type=2, T=5)))
    backbone.load_state_dict(state, strict=True)
    backbone.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        for ours, theirs in zip(backbone(x), model.features(x)):
            torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_classifier_reproduces_the_released_logits(released, tmp_path):
    model, src = released
    dst = tmp_path / 'resnet50_sw_cls.pth'
    result = run_tool(src, dst, '--to', 'mmpretrain')
    assert result.returncode == 0, result.stderr
    classifier = build(
        'mmpretrain',
        dict(
            type='ImageClassifier',
            backbone=dict(
                type='SWResNet',
                depth=50,
                sw_cfg=dict(type='SW', num_pergroup=16, sw_type=2)),
            neck=dict(type='GlobalAveragePooling'),
            head=dict(
                type='LinearClsHead', num_classes=1000, in_channels=2048)))
    classifier.load_state_dict(
        torch.load(dst, weights_only=False)['state_dict'], strict=True)
    classifier.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ours = classifier(x, mode='tensor')
        torch.testing.assert_close(ours, model(x), rtol=1e-4, atol=1e-4)


def test_other_layouts_are_refused(released, tmp_path):
    model, _ = released
    state = {k: v for k, v in model.state_dict().items()}
    # SW moved to a block the authors leave with BN.
    for leaf in ('sw_mean_weight', 'sw_var_weight', 'weight', 'bias',
                 'running_mean', 'running_cov', 'nonfinite_batches'):
        state[f'layer1.2.sw2.{leaf}'] = state.pop(f'layer1.1.sw2.{leaf}')
    src = tmp_path / 'moved.pth'
    torch.save(dict(state_dict=state), src)
    result = run_tool(src, tmp_path / 'out.pth')
    assert result.returncode == 1
    assert 'not where the authors' in result.stderr
    assert 'layer1.1.sw2' in result.stderr and 'layer1.2.sw2' in result.stderr
    bn = tmp_path / 'bn.pth'
    torch.save(dict(state_dict=torch.nn.BatchNorm2d(3).state_dict()), bn)
    result = run_tool(bn, tmp_path / 'out.pth')
    assert result.returncode == 1 and 'no SW layers' in result.stderr


def test_sw_type_5_is_refused_with_the_reason(tmp_path):
    """The release's sw_type=5 weighs BN's and IN's variances with other
    components' weights; SW here does not compute that, so no file."""
    model = ReleasedSWResNet50(sw_cfg=dict(num_pergroup=16, sw_type=5, T=5))
    src = tmp_path / 'type5.pth'
    torch.save(dict(state_dict=model.state_dict()), src)
    result = run_tool(src, tmp_path / 'out.pth')
    assert result.returncode == 1
    assert 'sw_type=5' in result.stderr and 'var_weight[0]' in result.stderr
    assert not (tmp_path / 'out.pth').exists()


def test_sw_resnet_layout_and_norm_eval():
    backbone = build(
        'mmdet',
        dict(
            type='SWResNet',
            depth=101,
            norm_eval=True,
            sw_cfg=dict(type='SW', num_pergroup=16),
            stage_with_sw=(True, False, True, False)))
    names = sorted(n for n, m in backbone.named_modules()
                   if isinstance(m, SwitchableWhitening))
    assert names == sorted(['sw1', 'layer1.1.sw2'] +
                           [f'layer3.{b}.sw2' for b in range(1, 23, 2)])
    backbone.train()
    assert not any(
        m.training for m in backbone.modules()
        if isinstance(m, (SwitchableWhitening, torch.nn.BatchNorm2d)))
    with pytest.raises(ValueError, match='deep_stem'):
        build(
            'mmdet',
            dict(
                type='SWResNet',
                depth=50,
                deep_stem=True,
                sw_cfg=dict(type='SW')))


@pytest.mark.parametrize('ratios', ['uniform', 'source'])
def test_sw_starts_from_a_bn_checkpoint(tmp_path, ratios):
    """SNPretrained starts SWResNet from a BN ResNet: BN layers as they
    are, each SW layer from the BN layer at its place (affine parameters,
    running mean per group, running variance as a diagonal covariance)."""
    bn = build('mmdet', dict(type='ResNet', depth=50))
    with torch.no_grad():
        for name, buf in bn.named_buffers():
            if name.endswith(('running_mean', 'running_var')):
                buf.uniform_(0.5, 2)
        for p in bn.parameters():
            p.normal_()
    ckpt = tmp_path / 'bn.pth'
    torch.save(dict(state_dict=bn.state_dict()), ckpt)
    sw = build(
        'mmdet',
        dict(
            type='SWResNet',
            depth=50,
            sw_cfg=dict(type='SW', num_pergroup=16),
            init_cfg=dict(
                type='SNPretrained', checkpoint=str(ckpt), ratios=ratios)))
    sw.init_weights()
    source = bn.state_dict()
    state = sw.state_dict()
    layers = [
        n for n, m in sw.named_modules() if isinstance(m, SwitchableWhitening)
    ]
    assert len(layers) == 7  # the stem and blocks 1, 3, ... of stages 1-3
    expected = [0.5, 0.5] if ratios == 'uniform' else [1 - 1e-4, 1e-4]
    for layer in layers:
        parent, _, name = layer.rpartition('.')
        src = f'{parent}.bn{name[2:]}' if parent else f'bn{name[2:]}'
        for leaf in ('weight', 'bias'):
            torch.testing.assert_close(state[f'{layer}.{leaf}'],
                                       source[f'{src}.{leaf}'])
        torch.testing.assert_close(state[f'{layer}.running_mean'].flatten(),
                                   source[f'{src}.running_mean'])
        cov = state[f'{layer}.running_cov']
        diagonal = torch.diagonal(cov, dim1=1, dim2=2)
        torch.testing.assert_close(diagonal.flatten(),
                                   source[f'{src}.running_var'])
        assert (cov - torch.diag_embed(diagonal)).abs().max() == 0
        torch.testing.assert_close(
            torch.softmax(state[f'{layer}.sw_mean_weight'], 0),
            torch.tensor(expected),
            rtol=0,
            atol=1e-6)
    for key, value in state.items():
        if key.rpartition('.')[0] not in layers and key in source:
            torch.testing.assert_close(value, source[key])
