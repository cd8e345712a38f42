"""Every detection config builds; each distinct model takes a train step."""
import glob
import os.path as osp
import re

import pytest
import torch
from helpers import toy_det_batch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope

import sn_mm  # noqa: F401
from sn_mm import SwitchableNorm

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET_CONFIGS = sorted(
    glob.glob(osp.join(ROOT, 'configs', 'faster_rcnn', '*.py')) +
    glob.glob(osp.join(ROOT, 'configs', 'mask_rcnn', '*.py')))
TOY_CONFIGS = sorted(glob.glob(osp.join(ROOT, 'configs', 'toy', '*coco.py')))


def config_id(path):
    return osp.splitext(osp.basename(path))[0]


def distinct_models(paths):
    """Scratch rows, and rows started from another checkpoint, build the
    same network as their finetuned twins."""
    return [
        p for p in paths if not any(
            tag in p for tag in ('-scratch', '-from-bn', '-pretrained'))
    ]


def test_the_paper_rows_are_all_there():
    names = {config_id(p) for p in DET_CONFIGS}
    # The SN / SN rows once more, from torchvision's BN ResNet-50.
    from_bn = {n for n in names if '-from-bn' in n}
    assert from_bn == {
        'faster-rcnn_r50-sn-from-bn_fpn_sn-head_1x_coco',
        'mask-rcnn_r50-sn-from-bn_fpn_sn-head_2x_coco'
    }
    names -= from_bn
    # Table 6's SN / SN row with group SN, two groups.
    group_sn = {n for n in names if '-gsn' in n}
    assert group_sn == {'mask-rcnn_r50-gsn2_fpn_gsn2-head_2x_coco'}
    names -= group_sn
    assert len([n for n in names if '-c4_' in n]) == 7  # Table 4
    assert len([
        n for n in names if n.startswith('faster-rcnn') and '_fpn_' in n
    ]) == 5  # Table 5
    # Table 6's six rows, and the Sparse SN (8,2) one
    assert len([n for n in names if n.startswith('mask-rcnn_r50-')]) == 7
    assert 'mask-rcnn_r50-ssn-8x2_fpn_ssn-head_2x_coco' in names
    # and the stronger released backbones in setting 3
    assert {
        n
        for n in names
        if n.startswith('mask-rcnn') and not n.startswith('mask-rcnn_r50-')
    } == {
        f'mask-rcnn_{b}-sn-8x32_fpn_sn-head_2x_coco'
        for b in ('r101', 'preact-r50', 'preact-r101')
    }


@pytest.mark.parametrize('path', DET_CONFIGS + TOY_CONFIGS, ids=config_id)
def test_config_builds(path):
    cfg = Config.fromfile(path)
    assert 'sn_mm' in cfg.custom_imports.imports
    assert cfg.optim_wrapper.constructor == 'SNOptimWrapperConstructor'
    assert cfg.optim_wrapper.paramwise_cfg.norm_decay_mult == 0
    from mmdet.registry import MODELS

    # On the meta device: every constructor runs, no weight is filled in
    # (the train steps below build real ones).
    with DefaultScope.overwrite_default_scope('mmdet'), torch.device('meta'):
        model = MODELS.build(cfg.model)
    name = config_id(path)
    norms = [m for m in model.modules() if isinstance(m, SwitchableNorm)]
    backbone_sn = any(
        isinstance(m, SwitchableNorm) for m in model.backbone.modules())
    assert bool(norms) == ('sn' in name.replace('scratch', ''))
    backbone = re.search(r'_((?:preact-)?r\d+)-', name).group(1)
    sparse = f'{backbone}-ssn' in name
    groups = 2 if f'{backbone}-gsn2' in name else 1
    assert backbone_sn == (f'{backbone}-sn' in name or sparse or groups > 1)
    # Group SN everywhere in its row, SN's single ratio vector elsewhere.
    assert all(m.ratio_groups == groups for m in norms)
    if backbone_sn and 'scratch' not in name and 'toy' not in name:
        init = cfg.model.backbone.init_cfg
        released = {
            'r50': 'resnet50_sn_8x2',
            'r101': 'resnet101_sn_8x32',
            'preact-r50': 'resnet50v2_sn_8x32',
            'preact-r101': 'resnet101v2_sn_8x32'
        }[backbone]
        if sparse:
            released = 'resnet50_ssn_8x2'
        if '-from-bn' in name:
            assert init.type == 'SNPretrained' and init.ratios == 'uniform'
            assert init.checkpoint == 'torchvision://resnet50'
        else:
            assert init.checkpoint == f'checkpoints/{released}_mm.pth'
        assert cfg.model.backbone.norm_eval is False
    # Sparse SN everywhere (backbone, FPN, heads), its radius scheduled.
    assert all((m.ratio_fn == 'sparsestmax') == sparse for m in norms)
    hooks = [h['type'] for h in cfg.get('custom_hooks', [])]
    assert ('SSNRadiusHook' in hooks) == sparse
    if 'preact' in name:
        assert type(model.backbone).__name__ == 'PreActResNet'
        assert model.backbone.depth == int(backbone.split('-r')[1])


@pytest.mark.parametrize(
    'path', distinct_models(DET_CONFIGS) + TOY_CONFIGS, ids=config_id)
def test_train_step(path):
    cfg = Config.fromfile(path)
    if 'rpn_proposal' in cfg.model.train_cfg:
        # Few RoIs: the C4 models run all of conv5 on every sampled RoI.
        cfg.model.train_cfg.rpn_proposal.max_per_img = 64
        cfg.model.train_cfg.rcnn.sampler.num = 16
    from mmdet.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
        optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    model.train()
    data = toy_det_batch(model, with_mask='mask' in config_id(path))
    before = {
        n: p.detach().clone()
        for n, p in model.named_parameters() if p.requires_grad
    }
    losses = model(**data, mode='loss')
    loss, _ = model.parse_losses(losses)
    assert torch.isfinite(loss)
    optim_wrapper.update_params(loss)
    changed = [
        n for n, p in model.named_parameters()
        if n in before and not torch.equal(before[n], p)
    ]
    assert changed, 'the optimizer step changed nothing'
    if any(isinstance(m, SwitchableNorm) for m in model.modules()):
        assert any(n.endswith('mean_weight') for n in changed)
