"""The released v1 ResNet-101 and v2 (pre-activation) ResNet-50/101 SN
models: converted by sn2mm.py, loaded strictly into the mmdet and mmseg
backbones, and reproduced; and the PreActResNet backbone itself."""
import copy

import pytest
import torch
import torch.nn as nn
from mmengine.registry import DefaultScope
from released_sn_resnet import (ReleasedPreActResNetSN, ReleasedResNetSN,
                                assert_reproduces, randomise)
from test_sn2mm import run_tool, save_released

import sn_mm  # noqa: F401
from sn_mm import PreActResNet, SwitchableNorm, SyncSwitchableNorm

RELEASED = {
    'v1-101': lambda: ReleasedResNetSN(layers=(3, 4, 23, 3)),
    'v2-50': lambda: ReleasedPreActResNetSN(layers=(3, 4, 6, 3)),
    'v2-101': lambda: ReleasedPreActResNetSN(layers=(3, 4, 23, 3)),
}


def build(scope, cfg):
    if scope == 'mmdet':
        from mmdet.registry import MODELS
    else:
        from mmseg.registry import MODELS
    with DefaultScope.overwrite_default_scope(scope):
        return MODELS.build(cfg)


@pytest.mark.parametrize('name', RELEASED)
def test_released_model_converts_loads_and_reproduces(tmp_path, name):
    released = randomise(RELEASED[name](), seed=3)
    src, dst = tmp_path / 'released.pth.tar', tmp_path / 'converted.pth'
    save_released(released, src)
    result = run_tool(src, dst)
    assert result.returncode == 0, result.stderr
    depth = int(name.split('-')[1])
    v2 = name.startswith('v2')
    kind = 'v2 (pre-activation)' if v2 else 'v1'
    assert f'Found a {kind} ResNet-{depth} with' in result.stdout
    backbone_type = 'PreActResNet' if v2 else 'ResNet'
    assert (f"backbone=dict(type='{backbone_type}', depth={depth}"
            in result.stdout)
    state = torch.load(dst, weights_only=True)['state_dict']
    assert not any(k.startswith('fc.') for k in state)

    cfg = (
        dict(type='PreActResNet', depth=depth, norm_cfg=dict(
            type='SN')) if v2 else dict(
                type='ResNet',
                depth=depth,
                style='pytorch',
                norm_eval=False,
                norm_cfg=dict(type='SN')))
    x = torch.randn(
        2,
        3,
        64,
        64,
        generator=torch.Generator().manual_seed(4),
        dtype=torch.float64)
    for scope in ('mmdet', 'mmseg'):
        reference = copy.deepcopy(released).double()
        backbone = build(scope, cfg)
        backbone.load_state_dict(state, strict=True)
        backbone.double()
        assert_reproduces(reference, backbone, x, 1e-10)
        # Training moved the running statistics the same way.
        torch.testing.assert_close(
            backbone.layer3[5].sn2.running_var,
            reference.layer3[5].sn2.running_var.flatten(),
            rtol=1e-10,
            atol=1e-12)


NORMS = {
    'SN': (dict(type='SN'), SwitchableNorm),
    'SyncSN': (dict(type='SyncSN'), SyncSwitchableNorm),
    'BN': (dict(type='BN'), nn.BatchNorm2d),
    'GN': (dict(type='GN', num_groups=32), nn.GroupNorm)
}


@pytest.mark.parametrize('norm', NORMS)
@pytest.mark.parametrize('depth', [18, 50])
def test_backbone_with_each_norm_trains(norm, depth):
    cfg, cls = NORMS[norm]
    model = PreActResNet(depth, norm_cfg=cfg).train()
    prefix = {'SN': 'sn', 'SyncSN': 'sn', 'BN': 'bn', 'GN': 'gn'}[norm]
    names = dict(model.named_modules())
    assert isinstance(names[f'{prefix}1'], cls)
    assert isinstance(names[f'{prefix}_out'], cls)
    assert isinstance(names[f'layer1.0.{prefix}1'], cls)
    x = torch.randn(2, 3, 64, 64)
    outs = model(x)
    expansion = 4 if depth == 50 else 1
    assert [tuple(o.shape) for o in outs] == [
        (2, 64 * expansion * 2**i, 16 // 2**i, 16 // 2**i) for i in range(4)
    ]
    # The last stage's output went through sn_out and ReLU.
    assert (outs[-1] >= 0).all()
    sum(o.mean() for o in outs).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_output_stride_8_and_out_indices():
    model = PreActResNet(
        50, strides=(1, 2, 1, 1), dilations=(1, 1, 2, 4),
        out_indices=(2, 3)).eval()
    outs = model(torch.randn(1, 3, 64, 64))
    assert [tuple(o.shape) for o in outs] == [(1, 1024, 8, 8), (1, 2048, 8, 8)]
    assert model.layer4[0].conv2.dilation == (4, 4)
    assert model.layer4[1].conv2.padding == (4, 4)


def test_frozen_stages_freeze_what_they_say():
    model = PreActResNet(18, frozen_stages=1).train()
    frozen = ['conv1', 'sn1', 'layer1']
    for name, p in model.named_parameters():
        assert p.requires_grad == (not name.startswith(tuple(frozen))), name
    assert not model.sn1.training and not model.layer1[0].sn1.training
    assert model.layer2[0].sn1.training
    # The frozen stages' running statistics do not move in training.
    before = model.layer1[0].sn2.running_mean.clone()
    model(torch.randn(2, 3, 32, 32))
    assert torch.equal(model.layer1[0].sn2.running_mean, before)
    assert not torch.equal(model.layer2[0].sn2.running_mean,
                           torch.zeros_like(before[:128]))


def test_norm_eval_keeps_norm_layers_in_eval():
    model = PreActResNet(18, norm_eval=True).train()
    assert model.training
    assert not any(m.training
                   for m in model.modules() if isinstance(m, SwitchableNorm))
    before = model.layer2[0].sn2.running_var.clone()
    model(torch.randn(2, 3, 32, 32))
    assert torch.equal(model.layer2[0].sn2.running_var, before)


def test_with_cp_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = PreActResNet(18).train()
    checkpointed = copy.deepcopy(plain)
    for block in checkpointed.modules():
        if hasattr(block, 'with_cp'):
            block.with_cp = True
    x = torch.randn(2, 3, 32, 32, requires_grad=True)
    for model in (plain, checkpointed):
        sum(o.sum() for o in model(x)).backward()
    for (name, p), q in zip(plain.named_parameters(),
                            checkpointed.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_bad_arguments_are_refused():
    with pytest.raises(KeyError, match='invalid depth 42'):
        PreActResNet(42)
    with pytest.raises(ValueError, match='out_indices'):
        PreActResNet(18, out_indices=(4, ))
