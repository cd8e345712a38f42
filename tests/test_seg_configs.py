"""Every segmentation config builds; each distinct model takes a train step
and a multi-scale (test-time augmentation) prediction on one of its two
datasets."""
import glob
import os.path as osp
import re

import pytest
import torch
from helpers import toy_seg_batch
from mmengine.config import Config
from mmengine.dataset import Compose, pseudo_collate
from mmengine.model import revert_sync_batchnorm
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope

import sn_mm  # noqa: F401
from sn_mm import SwitchableNorm
from sn_mm.testing import make_toy_seg

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CONFIGS = sorted(
    glob.glob(osp.join(ROOT, 'configs', 'deeplabv3', '*.py')) +
    glob.glob(osp.join(ROOT, 'configs', 'pspnet', '*.py')))
TOY_CONFIGS = sorted(glob.glob(osp.join(ROOT, 'configs', 'toy', '*seg.py')))
NORM_TYPES = {
    'syncbn': 'SyncBN',
    'gn': 'GN',
    'sn': 'SN',
    'syncsn': 'SyncSN',
    'ssn': 'SN',
    'gsn2': 'SN'
}


def config_id(path):
    return osp.splitext(osp.basename(path))[0]


def backbone_and_row(path):
    """('r50', 'sn-8x2'), ('preact-r101', 'syncsn-8x32'), ...: the parts
    around the row in '{model}_{backbone}-{row}-d8_...'."""
    m = re.fullmatch(r'((?:preact-)?r\d+)-(.+)-d8',
                     config_id(path).split('_')[1])
    return m.group(1), m.group(2)


def row(path):
    return backbone_and_row(path)[1]


def distinct_models(paths):
    """One config per model, backbone and normalizer. R50 (8,4), (8,32) and
    from-BN rows differ from (8,2) only in the checkpoint; a row's ADE20K
    and Cityscapes configs differ in the classes and the TTA scales, which
    the rows kept cover on both datasets for every model and backbone: SN,
    Sparse SN and group SN on ADE20K, SyncSN, SyncBN and GN on Cityscapes."""
    on_ade20k = ('sn', 'ssn', 'gsn2')
    return [
        p for p in paths
        if not (backbone_and_row(p)[0] == 'r50' and row(p).endswith(
            ('8x4', '8x32', 'from-bn'))) and ('ade20k' in p) == (
                row(p).split('-')[0] in on_ade20k)
    ]


# The released backbone each (8,32)-and-beyond row starts from.
CHECKPOINTS = {
    'r50': 'resnet50',
    'r101': 'resnet101',
    'preact-r50': 'resnet50v2',
    'preact-r101': 'resnet101v2'
}


def build(cfg):
    from mmseg.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmseg'):
        return MODELS.build(cfg.model)


def test_the_paper_rows_are_all_there():
    # and the Sparse SN (8,2) row, from the released ResNet50v1+SSN, and
    # the SN row from torchvision's BN ResNet-50
    rows = {
        'syncbn', 'gn', 'sn-8x2', 'sn-8x4', 'sn-8x32', 'syncsn-8x2',
        'syncsn-8x4', 'syncsn-8x32', 'ssn-8x2', 'sn-from-bn'
    }
    for model in ('deeplabv3', 'pspnet'):
        for data in ('ade20k-450x450', 'cityscapes-713x713'):
            found = {
                row(p)
                for p in SEG_CONFIGS
                if config_id(p).startswith(model + '_r50-') and data in p
            }
            # and DeepLabV3's ADE20K SN (8,2) row with group SN
            extra = {'gsn2-8x2'} if (model,
                                     data) == ('deeplabv3',
                                               'ade20k-450x450') else set()
            assert found == rows | extra, (model, data)


def test_the_stronger_backbones_are_all_there():
    for data in ('ade20k-450x450', 'cityscapes-713x713'):
        found = {
            backbone_and_row(p)
            for p in SEG_CONFIGS if config_id(p).startswith('deeplabv3_')
            and data in p and backbone_and_row(p)[0] != 'r50'
        }
        assert found == {(b, r)
                         for b in ('r101', 'preact-r50', 'preact-r101')
                         for r in ('sn-8x32', 'syncsn-8x32')}, data


@pytest.mark.parametrize('path', SEG_CONFIGS + TOY_CONFIGS, ids=config_id)
def test_config_builds(path):
    cfg = Config.fromfile(path)
    assert 'sn_mm' in cfg.custom_imports.imports
    # On the meta device: every constructor runs, no weight is filled in
    # (the train steps below build real ones).
    with torch.device('meta'):
        model = build(cfg)
    # The plain-stem ResNet of the released SN checkpoints, not ResNetV1c.
    assert hasattr(model.backbone,
                   'conv1') and not hasattr(model.backbone, 'stem')
    if 'preact' in config_id(path):
        assert type(model.backbone).__name__ == 'PreActResNet'
        assert model.backbone.depth == int(
            backbone_and_row(path)[0].split('-r')[1])
    if 'toy' in path:
        return
    norm = NORM_TYPES[row(path).split('-')[0]]
    for part in ('backbone', 'decode_head', 'auxiliary_head'):
        assert cfg.model[part].norm_cfg.type == norm, part
    assert cfg.model.backbone.dilations == (1, 1, 2, 4)
    assert cfg.model.backbone.strides == (1, 2, 1, 1)
    assert cfg.model.auxiliary_head.loss_decode.loss_weight == 0.4
    assert cfg.param_scheduler[0].type == 'PolyLR'
    assert cfg.param_scheduler[0].power == 0.9
    assert cfg.train_dataloader.batch_size == 2
    if row(path) == 'sn-from-bn':
        init = cfg.model.backbone.init_cfg
        assert init.type == 'SNPretrained' and init.ratios == 'uniform'
        assert init.checkpoint == 'torchvision://resnet50'
    elif norm in ('SN', 'SyncSN'):
        kind, pretrain = row(path).split('-')
        released = CHECKPOINTS[backbone_and_row(path)[0]]
        sparse = kind == 'ssn'
        assert cfg.model.backbone.init_cfg.checkpoint == (
            f'checkpoints/{released}_{"ssn" if sparse else "sn"}_{pretrain}'
            '_mm.pth')
        layers = [m for m in model.modules() if isinstance(m, SwitchableNorm)]
        assert layers and all(
            (m.ratio_fn == 'sparsestmax') == sparse for m in layers)
        groups = 2 if kind == 'gsn2' else 1
        assert all(m.ratio_groups == groups for m in layers)
        hooks = [h['type'] for h in cfg.get('custom_hooks', [])]
        assert ('SSNRadiusHook' in hooks) == sparse
    resizes = cfg.tta_pipeline[1].transforms[0]
    if 'ade20k' in path:
        assert [r.scale[1] for r in resizes] == [300, 400, 500, 600]
    else:
        assert [r.scale_factor for r in resizes] == [1.0, 1.25, 1.5, 1.75]


@pytest.fixture(scope='module')
def toy_images(tmp_path_factory):
    root = tmp_path_factory.mktemp('seg')
    make_toy_seg(str(root), num_train=1, num_val=0, size=48)
    return root


def tta_sample(cfg, root, path):
    """The config's own TTA pipeline on a toy image. ADE20K's absolute
    scales (shorter side 300-600) are divided by 10 to keep a CPU test
    quick; the scales themselves are checked in test_config_builds."""
    tta = cfg.tta_pipeline
    if 'ade20k' in path:
        for t in tta[1].transforms[0]:
            t.scale = (t.scale[0] // 10, t.scale[1] // 10)
    with DefaultScope.overwrite_default_scope('mmseg'):
        pipeline = Compose(tta)
    sample = pipeline(
        dict(
            img_path=str(root / 'images' / 'training' / '00000.png'),
            seg_map_path=str(root / 'annotations' / 'training' / '00000.png'),
            reduce_zero_label='ade20k' in path,
            seg_fields=[]))
    return pseudo_collate([sample])


@pytest.mark.parametrize(
    'path', distinct_models(SEG_CONFIGS) + TOY_CONFIGS, ids=config_id)
def test_train_step_and_multiscale_predict(path, toy_images):
    cfg = Config.fromfile(path)
    # The preprocessor pads training batches to the crop size (713x713 for
    # Cityscapes): a CPU test steps on its own 64x64 batch instead.
    cfg.model.data_preprocessor.size = (64, 64)
    torch.manual_seed(0)
    # One process: SyncBN becomes BN as mmengine's runner does; SyncSN runs
    # as SN by itself.
    model = revert_sync_batchnorm(build(cfg))
    with DefaultScope.overwrite_default_scope('mmseg'):
        optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    model.train()
    data = toy_seg_batch(model)
    sn_layers = [m for m in model.modules() if isinstance(m, SwitchableNorm)]
    ratios_before = [m.mean_weight.detach().clone() for m in sn_layers]
    losses = model(**data, mode='loss')
    loss, _ = model.parse_losses(losses)
    assert torch.isfinite(loss)
    optim_wrapper.update_params(loss)
    if sn_layers:
        assert any(not torch.equal(m.mean_weight, before)
                   for m, before in zip(sn_layers, ratios_before))

    if 'tta_pipeline' not in cfg:  # the toy configs test at one scale
        return
    from mmseg.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmseg'):
        tta_model = MODELS.build(dict(**cfg.tta_model, module=model))
    tta_model.eval()
    with torch.no_grad():
        out = tta_model.test_step(tta_sample(cfg, toy_images, path))
    pred = out[0].pred_sem_seg.data
    assert pred.shape[-2:] == (48, 48)
    num_classes = cfg.model.decode_head.num_classes
    assert 0 <= int(pred.min()) and int(pred.max()) < num_classes
