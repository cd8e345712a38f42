"""tools/model_converters/sn2mm.py on released-layout checkpoints."""
import copy
import os.path as osp
import subprocess
import sys

import pytest
import torch
from mmengine.registry import DefaultScope
from released_sn_resnet import ReleasedResNetSN, assert_reproduces, randomise

import sn_mm  # noqa: F401

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TOOL = osp.join(ROOT, 'tools', 'model_converters', 'sn2mm.py')


def run_tool(*args):
    return subprocess.run([sys.executable, TOOL, *map(str, args)],
                          capture_output=True,
                          text=True,
                          cwd=ROOT)


def save_released(model, path, prefix='module.', extra=True):
    state = {prefix + k: v for k, v in model.state_dict().items()}
    ckpt = dict(state_dict=state)
    if extra:
        ckpt.update(epoch=100, model='resnet50v1_sn', best_prec1=76.9)
    torch.save(ckpt, path)


@pytest.fixture(scope='module')
def released(tmp_path_factory):
    """A randomised ResNet50v1+SN with BN branch, and one without."""
    return {
        using_bn:
        randomise(ReleasedResNetSN(using_bn=using_bn), seed=int(using_bn))
        for using_bn in (True, False)
    }


def build_backbone(scope, using_bn):
    if scope == 'mmdet':
        from mmdet.models.backbones import ResNet
    else:
        from mmseg.models.backbones import ResNet
    with DefaultScope.overwrite_default_scope(scope):
        return ResNet(
            depth=50,
            style='pytorch',
            norm_eval=False,
            norm_cfg=dict(type='SN', using_bn=using_bn))


@pytest.mark.parametrize('using_bn,prefix', [(True, 'module.'), (True, ''),
                                             (False, 'module.')])
def test_convert_loads_strictly_and_reproduces_outputs(tmp_path, released,
                                                       using_bn, prefix):
    model = released[using_bn]
    src, dst = tmp_path / 'released.pth.tar', tmp_path / 'out' / 'sn.pth'
    save_released(model, src, prefix)
    result = run_tool(src, dst)
    assert result.returncode == 0, result.stderr
    expected_cfg = ("dict(type='SN')"
                    if using_bn else "dict(type='SN', using_bn=False)")
    assert f'norm_cfg={expected_cfg}' in result.stdout
    assert 'fc.weight' in result.stdout  # says what it dropped

    ckpt = torch.load(dst, weights_only=True)  # safe to load
    assert not any(k.startswith('fc.') for k in ckpt['state_dict'])
    # float64: differences are then the converter's, not rounding's.
    x = torch.randn(
        2,
        3,
        64,
        64,
        generator=torch.Generator().manual_seed(3),
        dtype=torch.float64)
    for scope in ('mmdet', 'mmseg'):
        # Fresh copies: a training-mode pass moves running statistics.
        reference = copy.deepcopy(released[using_bn]).double()
        backbone = build_backbone(scope, using_bn)
        backbone.load_state_dict(ckpt['state_dict'], strict=True)
        backbone.double()
        assert_reproduces(reference, backbone, x, 1e-9)
        if using_bn:
            # The released momentum 0.9 on the old value is our 0.1.
            torch.testing.assert_close(
                backbone.layer3[2].sn2.running_var,
                reference.layer3[2].sn2.running_var.flatten())


def refuse(tmp_path, src, *extra, match):
    dst = tmp_path / 'converted.pth'
    result = run_tool(src, dst, *extra)
    assert result.returncode != 0
    assert match in result.stderr, result.stderr
    assert not dst.exists()
    assert not list(tmp_path.glob('*.part'))


def test_refuses_non_checkpoint(tmp_path):
    src = tmp_path / 'notes.pth'
    src.write_text('not a checkpoint')
    refuse(tmp_path, src, match='not a loadable checkpoint')


def test_refuses_checkpoint_without_sn(tmp_path):
    src = tmp_path / 'bn.pth'
    torch.save(dict(state_dict=torch.nn.BatchNorm2d(4).state_dict()), src)
    refuse(tmp_path, src, match='no SN layers')


def test_refuses_unexpected_shapes(tmp_path, released):
    state = released[True].state_dict()
    state['layer2.1.sn2.mean_weight'] = torch.ones(4)
    src = tmp_path / 'bad.pth'
    torch.save(dict(state_dict=state), src)
    refuse(tmp_path, src, match='ratio logits')
    state = released[True].state_dict()
    state['layer2.1.sn2.running_mean'] = torch.zeros(1, 7, 1)
    torch.save(dict(state_dict=state), src)
    refuse(tmp_path, src, match='layer2.1.sn2.running_mean has shape')


def test_refuses_a_layout_that_is_neither_v1_nor_v2(tmp_path, released):
    # In the first block of layer1, sn3 with conv3's 64 input channels but
    # sn1 and sn2 normalising conv outputs, as in v1: no such network.
    state = released[True].state_dict()
    for key in ('weight', 'bias', 'running_mean', 'running_var'):
        t = state[f'layer1.0.sn3.{key}']
        state[f'layer1.0.sn3.{key}'] = t[:, :64].clone()
    src = tmp_path / 'mixed.pth'
    torch.save(dict(state_dict=state), src)
    refuse(tmp_path, src, match='neither a v1 nor a v2')


def test_refuses_existing_destination_unless_forced(tmp_path, released):
    src = tmp_path / 'released.pth'
    save_released(released[True], src)
    dst = tmp_path / 'exists.pth'
    dst.write_text('keep me')
    result = run_tool(src, dst)
    assert result.returncode != 0 and 'exists' in result.stderr
    assert dst.read_text() == 'keep me'
    assert run_tool(src, dst, '--force').returncode == 0
    assert 'state_dict' in torch.load(dst, weights_only=True)
