"""Stock OpenMMLab configs with SN swapped in keep their meaning:
``norm_eval``, ``frozen_stages`` and ``norm_cfg.requires_grad`` freeze SN
and SyncSN layers as they freeze BN, in mmdet's, mmseg's, mmpretrain's and
mmaction2's backbones, built as a user builds them."""
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope

import sn_mm  # noqa: F401  (registers SN and SyncSN)
import sn_mm.video  # noqa: F401  (mmaction2 imports)
from sn_mm import SwitchableNorm, SyncSwitchableNorm

IMAGE = (2, 3, 64, 64)
CLIP = (2, 3, 8, 32, 32)
# (id, stock config, what the user changes besides the norm layer, input,
# the stages frozen_stages leaves frozen as (module name prefixes)).
CASES = [
    ('mmdet-resnet', 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py', {},
     IMAGE, ('sn1', 'layer1.')),
    ('mmdet-resnext', 'mmdet::mask_rcnn/mask-rcnn_x101-32x4d_fpn_1x_coco.py',
     {}, IMAGE, ('sn1', 'layer1.')),
    ('mmdet-resnetv1d', 'mmdet::resnet_strikes_back/'
     'mask-rcnn_r50-rsb-pre_fpn_1x_coco.py',
     dict(type='ResNetV1d', norm_eval=True, frozen_stages=1,
          init_cfg=None), IMAGE, ('stem.', 'layer1.')),
    ('mmdet-regnet', 'mmdet::regnet/mask-rcnn_regnetx-3.2GF_fpn_1x_coco.py',
     {}, IMAGE, ('sn1', 'layer1.')),
    ('mmdet-hrnet', 'mmdet::hrnet/faster-rcnn_hrnetv2p-w18-1x_coco.py', {},
     IMAGE, ()),
    ('mmseg-resnetv1c',
     'mmseg::deeplabv3/deeplabv3_r50-d8_4xb2-40k_cityscapes-512x1024.py',
     dict(norm_eval=True, frozen_stages=1), IMAGE, ('stem.', 'layer1.')),
    ('mmseg-hrnet', 'mmseg::hrnet/fcn_hr18_4xb2-40k_cityscapes-512x1024.py',
     dict(norm_eval=True), IMAGE, ()),
    ('mmpretrain-resnet', 'mmpretrain::resnet/resnet50_8xb32_in1k.py',
     dict(norm_eval=True, frozen_stages=1), IMAGE, ('sn1', 'layer1.')),
    ('mmaction-resnet3d', 'mmaction::recognition/i3d/'
     'i3d_imagenet-pretrained-r50_8xb8-32x2x1-100e_kinetics400-rgb.py',
     dict(norm_eval=True, frozen_stages=1), CLIP, ('conv1.', 'layer1.')),
]


def build_backbone(tmp_path, config, changes, norm_cfg):
    """The backbone of a stock config with ``norm_cfg`` and ``changes``,
    as a user gets it: a config of their own on the stock one, the whole
    model built in its scope."""
    backbone = dict(norm_cfg=norm_cfg, **changes)
    path = tmp_path / 'user_config.py'
    path.write_text(f"_base_ = '{config}'\n"
                    f"model = dict(backbone={backbone!r})\n")
    cfg = Config.fromfile(str(path))
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        return MODELS.build(cfg.model).backbone


def sn_layers(module):
    return {
        n: m
        for n, m in module.named_modules() if isinstance(m, SwitchableNorm)
    }


def frozen(name, prefixes):
    return any(name.startswith(p) for p in prefixes)


@pytest.mark.parametrize('norm_type', ['SN', 'SyncSN'])
@pytest.mark.parametrize(
    'config,changes,shape,frozen_stages', [c[1:] for c in CASES],
    ids=[c[0] for c in CASES])
def test_norm_eval_freezes_sn_as_it_freezes_bn(tmp_path, config, changes,
                                               shape, frozen_stages,
                                               norm_type):
    torch.manual_seed(0)
    backbone = build_backbone(tmp_path, config, changes, dict(type=norm_type))
    assert backbone.norm_eval
    layers = sn_layers(backbone)
    assert len(layers) > 10
    expected_type = SwitchableNorm if norm_type == 'SN' else \
        SyncSwitchableNorm
    assert {type(m) for m in layers.values()} == {expected_type}
    with torch.no_grad():  # statistics that a step would visibly move
        for m in layers.values():
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2)
    before = {n: m.state_dict() for n, m in layers.items()}
    before = {
        n: {
            k: v.clone()
            for k, v in s.items()
        }
        for n, s in before.items()
    }

    backbone.train()
    training = [n for n, m in layers.items() if m.training]
    assert not training, f'{len(training)} SN layers train: {training[:3]}'
    outs = backbone(torch.randn(shape))
    sum(o.float().square().mean() for o in outs).backward()

    for name, layer in layers.items():
        for key in ('running_mean', 'running_var', 'num_batches_tracked'):
            assert torch.equal(getattr(layer, key), before[name][key]), \
                (name, key)
        # The ratio logits and affine parameters follow requires_grad:
        # frozen_stages freezes its stages, norm_cfg's requires_grad (True
        # in these configs) the rest.
        learns = not frozen(name, frozen_stages)
        for param in ('weight', 'bias', 'mean_weight', 'var_weight'):
            p = getattr(layer, param)
            assert p.requires_grad == learns, (name, param)
            if not learns:
                assert p.grad is None, (name, param)
    # The other stages' logits take gradients: eval mode mixes IN and LN
    # with the running BN statistics, all three learnable.
    assert any(
        m.mean_weight.grad is not None and m.mean_weight.grad.abs().sum() > 0
        for n, m in layers.items() if not frozen(n, frozen_stages))

    # norm_eval=False: the same backbone trains its SN layers.
    backbone.norm_eval = False
    backbone.train()
    assert any(m.training for m in layers.values())


def test_requires_grad_false_freezes_logits_and_affine(tmp_path):
    """``norm_cfg.requires_grad=False`` (mmdet's frozen-BN setting) leaves
    no SN parameter to learn, the logits included."""
    backbone = build_backbone(tmp_path,
                              'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
                              {}, dict(type='SN', requires_grad=False))
    backbone.train()
    for name, layer in sn_layers(backbone).items():
        assert not layer.training, name
        assert not any(p.requires_grad for p in layer.parameters()), name


def test_norm_eval_false_in_stock_config_trains_sn(tmp_path):
    backbone = build_backbone(
        tmp_path,
        'mmseg::deeplabv3/deeplabv3_r50-d8_4xb2-40k_cityscapes-512x1024.py',
        {}, dict(type='SN'))
    assert not backbone.norm_eval
    backbone.train()
    layers = sn_layers(backbone)
    assert all(m.training for m in layers.values())
    before = layers['stem.1'].running_mean.clone()
    backbone(torch.randn(IMAGE))
    assert not torch.equal(layers['stem.1'].running_mean, before)
