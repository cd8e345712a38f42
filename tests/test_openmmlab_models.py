"""SN and SyncSN inside mmcv's, mmdet's and mmseg's own model builders."""
import pytest
import torch
from mmcv.cnn import build_norm_layer
from mmengine.registry import DefaultScope

import sn_mm  # noqa: F401  (registers SN and SyncSN)
from sn_mm import SwitchableNorm, SyncSwitchableNorm

NORMS = {'SN': SwitchableNorm, 'SyncSN': SyncSwitchableNorm}


@pytest.mark.parametrize('norm_type', NORMS)
@pytest.mark.parametrize('scope', [None, 'mmdet', 'mmseg'])
def test_build_norm_layer_in_any_scope(norm_type, scope):
    if scope is None:
        name, layer = build_norm_layer(dict(type=norm_type, using_bn=False), 8)
    else:
        with DefaultScope.overwrite_default_scope(scope):
            name, layer = build_norm_layer(dict(type=norm_type), 8, postfix=2)
        assert name == 'sn2'
    assert type(layer) is NORMS[norm_type]
    assert layer.num_features == 8


def build_resnet50(scope, norm_type):
    if scope == 'mmdet':
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules
    else:
        from mmseg.registry import MODELS
        from mmseg.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope(scope):
        # mmseg's 'ResNet' is the plain-stem v1 ResNet, as the released SN
        # backbones are; the deep-stem one is 'ResNetV1c'.
        return MODELS.build(
            dict(
                type='ResNet',
                depth=50,
                style='pytorch',
                norm_eval=False,
                norm_cfg=dict(type=norm_type, requires_grad=True),
                # Zero-initialised residual norms would make every branch's
                # gradient exactly 0 on the first steps.
                zero_init_residual=False))


@pytest.mark.parametrize('norm_type', NORMS)
@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_resnet50_train_step(scope, norm_type):
    torch.manual_seed(0)
    model = build_resnet50(scope, norm_type)
    model.init_weights()
    model.train()
    modules = dict(model.named_modules())
    # The names of the released SN ImageNet checkpoints.
    for name in ('sn1', 'layer1.0.sn1', 'layer1.0.sn2', 'layer1.0.sn3',
                 'layer1.0.downsample.1', 'layer4.2.sn3'):
        assert type(modules[name]) is NORMS[norm_type], name
    state = model.state_dict()
    for key in ('sn1.mean_weight', 'layer3.5.sn2.var_weight',
                'layer2.0.downsample.1.running_var'):
        assert key in state
    assert not any('.bn' in k or k.startswith('bn') for k in state)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ratio_before = model.layer1[0].sn1.mean_weight.detach().clone()
    x = torch.randn(2, 3, 64, 64)
    for _ in range(2):
        outs = model(x)
        loss = sum(o.square().mean() for o in outs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert torch.isfinite(loss)
    # The ratio logits are learned like any other parameter.
    assert not torch.equal(model.layer1[0].sn1.mean_weight, ratio_before)
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize(
    'arch', [
        dict(type='ResNet', depth=50),
        dict(type='ResNetV1d', depth=50),
        dict(type='ResNeXt', depth=50, groups=32, width_per_group=4)
    ],
    ids=lambda a: a['type'])
@pytest.mark.parametrize('norm_type', NORMS)
def test_mmpretrain_backbones(arch, norm_type):
    """mmpretrain's models find SN and SyncSN too: a classifier whose
    backbone has norm_cfg=dict(type='SN') builds in mmpretrain's scope with
    no BN left, and takes a training step."""
    from mmpretrain.registry import MODELS
    from mmpretrain.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(
            dict(
                type='ImageClassifier',
                backbone=dict(arch, norm_cfg=dict(type=norm_type)),
                neck=dict(type='GlobalAveragePooling'),
                head=dict(
                    type='LinearClsHead', num_classes=10, in_channels=2048)))
    norms = [m for m in model.modules() if isinstance(m, NORMS[norm_type])]
    assert len(norms) >= 53
    assert not any(
        isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    model.train()
    loss = model(torch.randn(2, 3, 32, 32), mode='tensor').square().mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert norms[0].mean_weight.grad is not None
