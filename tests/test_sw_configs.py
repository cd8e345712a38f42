"""configs/sw: Switchable Whitening in mmpretrain, mmseg and mmdet configs.
Each builds in its scope with SW where the authors' ResNets have it and the
release's recipe; one model of each kind takes a training step."""
import glob
import os.path as osp

import pytest
import torch
from helpers import toy_cls_batch, toy_det_batch, toy_seg_batch
from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope

import sn_mm  # noqa: F401
from sn_mm.models.switchable_whitening import SwitchableWhitening

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS = sorted(glob.glob(osp.join(ROOT, 'configs', 'sw', '*.py')))
# The stem, and blocks 1, 3, ... of stages 1-3 (3, 4 and 6 or 23 blocks).
SW_LAYERS = {50: 1 + 1 + 2 + 3, 101: 1 + 1 + 2 + 11}


def config_id(path):
    return osp.splitext(osp.basename(path))[0]


def scope(path):
    name = config_id(path)
    return ('mmpretrain' if name.startswith('resnet') else
            'mmseg' if name.startswith('pspnet') else 'mmdet')


def build(cfg, scope_name):
    import importlib
    registry = importlib.import_module(f'{scope_name}.registry')
    importlib.import_module(f'{scope_name}.utils').register_all_modules(
        init_default_scope=False)
    with DefaultScope.overwrite_default_scope(scope_name):
        model = registry.MODELS.build(cfg.model)
        optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    return model, optim_wrapper


def test_the_rows_are_all_there():
    assert {config_id(p)
            for p in CONFIGS} == {
                'resnet50-sw_4xb64_in1k', 'resnet101-sw_4xb64_in1k',
                'mask-rcnn_r50-syncsw_fpn_2x_coco'
            } | {
                f'pspnet_r{d}-syncsw-d8_8xb2-{s}'
                for d in (50, 101)
                for s in ('100k_ade20k-450x450', '74k_cityscapes-713x713')
            }


@pytest.mark.parametrize('path', CONFIGS, ids=config_id)
def test_config_builds_with_the_release_layout(path):
    cfg = Config.fromfile(path)
    assert 'sn_mm' in cfg.custom_imports.imports
    backbone = cfg.model.backbone
    depth = backbone.depth
    assert f'r{depth}-' in config_id(path) or config_id(path).startswith(
        f'resnet{depth}-')
    sw_type = 'SW' if scope(path) == 'mmpretrain' else 'SyncSW'
    assert backbone.type == 'SWResNet'
    assert dict(backbone.sw_cfg) == dict(
        type=sw_type,
        sw_type=2,
        num_pergroup=16,
        T=5,
        tie_weight=False,
        momentum=0.1)
    model, _ = build(cfg, scope(path))
    sw = [m for m in model.modules() if isinstance(m, SwitchableWhitening)]
    assert len(sw) == SW_LAYERS[depth]
    assert all(
        type(m).__name__ == ('SwitchableWhitening' if sw_type ==
                             'SW' else 'SyncSwitchableWhitening') for m in sw)
    assert isinstance(model.backbone.norm1, SwitchableWhitening)
    if scope(path) == 'mmpretrain':
        # The release's recipe (experiments/resnet50_sw/run.sh): 4 GPUs of
        # 64 images, as the config's name says.
        optimizer = cfg.optim_wrapper.optimizer
        assert (optimizer.lr, optimizer.momentum,
                optimizer.weight_decay) == (0.1, 0.9, 1e-4)
        assert '_4xb64_' in path and cfg.train_dataloader.batch_size == 64
        assert cfg.auto_scale_lr.base_batch_size == 4 * 64
        assert cfg.param_scheduler.milestones == [30, 60, 90]
        assert cfg.train_cfg.max_epochs == 100
        assert not backbone.zero_init_residual
    else:
        checkpoint = backbone.init_cfg.checkpoint
        assert checkpoint == f'checkpoints/resnet{depth}_sw_mm.pth'
        # BW's statistics of 2 images a GPU: learned, over all GPUs.
        assert backbone.get('norm_eval', False) is False


def one_step(model, optim_wrapper, data):
    model.train()
    # One that learns (mmdet's configs freeze the stem and stage 1).
    sw = [
        m for m in model.modules() if isinstance(m, SwitchableWhitening)
        and m.training and m.sw_mean_weight.requires_grad
    ][-1]
    before = sw.sw_mean_weight.detach().clone()
    losses = model(**data, mode='loss')
    loss, _ = model.parse_losses(losses)
    assert torch.isfinite(loss)
    optim_wrapper.update_params(loss)
    assert not torch.equal(before, sw.sw_mean_weight)
    assert sw.running_cov.abs().sum() > 0


def test_imagenet_row_trains_a_step():
    cfg = Config.fromfile(
        osp.join(ROOT, 'configs', 'sw', 'resnet50-sw_4xb64_in1k.py'))
    model, optim_wrapper = build(cfg, 'mmpretrain')
    torch.manual_seed(0)
    one_step(model, optim_wrapper, toy_cls_batch(model))


def test_segmentation_row_trains_a_step():
    cfg = Config.fromfile(
        osp.join(ROOT, 'configs', 'sw',
                 'pspnet_r50-syncsw-d8_8xb2-100k_ade20k-450x450.py'))
    cfg.model.data_preprocessor.size = (64, 64)
    model, optim_wrapper = build(cfg, 'mmseg')
    # One process: SyncBN runs as BN, SyncSW as SW.
    model = revert_sync_batchnorm(model)
    torch.manual_seed(0)
    one_step(model, optim_wrapper, toy_seg_batch(model))


def test_detection_row_trains_a_step():
    cfg = Config.fromfile(
        osp.join(ROOT, 'configs', 'sw', 'mask-rcnn_r50-syncsw_fpn_2x_coco.py'))
    cfg.model.train_cfg.rpn_proposal.max_per_img = 64
    cfg.model.train_cfg.rcnn.sampler.num = 16
    model, optim_wrapper = build(cfg, 'mmdet')
    model = revert_sync_batchnorm(model)
    one_step(model, optim_wrapper, toy_det_batch(model))
