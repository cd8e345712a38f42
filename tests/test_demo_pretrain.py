"""`make demo-pretrain` at toy size: tools/train.py pretrains the SN
ResNet-18 classifier with mmpretrain, and the toy Mask R-CNN starts from its
checkpoint and trains."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope
from tool_runner import ROOT, run_python, tool

from sn_mm import SwitchableNorm
from sn_mm.testing import SHAPE_CLASSES, make_toy_cls, make_toy_coco

PRETRAIN = osp.join(ROOT, 'configs', 'toy', 'resnet18-sn_toy-cls.py')
FINETUNE = osp.join(ROOT, 'configs', 'toy',
                    'mask-rcnn_r18-sn-pretrained_fpn_sn-head_toy-coco.py')


def train(config, work_dir, options, cwd):
    result = run_python([
        tool('train.py'), config, '--work-dir', work_dir, '--cfg-options',
        *options
    ], cwd)
    return result.stdout + result.stderr


@pytest.fixture(scope='module')
def pretrained(tmp_path_factory):
    """A one-epoch classifier on 16 generated images."""
    cwd = tmp_path_factory.mktemp('pretrain')
    make_toy_cls(
        str(cwd / 'data' / 'toy_cls'), num_train=16, num_val=8, size=32)
    log = train(PRETRAIN, cwd / 'cls', [
        'train_cfg.max_epochs=1', 'train_cfg.val_interval=1',
        'train_dataloader.batch_size=8', 'default_hooks.checkpoint.interval=1',
        'default_hooks.logger.interval=1'
    ], cwd)
    return cwd, cwd / 'cls' / 'epoch_1.pth', log


def test_toy_classification_set_has_every_class_in_folders(tmp_path):
    make_toy_cls(str(tmp_path), num_train=8, num_val=4, size=32)
    for split, count in (('train', 8), ('val', 4)):
        folders = sorted(p.name for p in (tmp_path / split).iterdir())
        assert folders == sorted(SHAPE_CLASSES)
        assert len(list((tmp_path / split).glob('*/*.png'))) == count


def test_pretraining_reports_accuracy_and_batch_averages(pretrained):
    _, checkpoint, log = pretrained
    assert 'accuracy/top1:' in log
    assert 'SN batch average: BN statistics of every SN layer' in log
    state = torch.load(checkpoint, weights_only=False)['state_dict']
    assert 'backbone.layer4.1.sn2.mean_weight' in state
    assert 'head.fc.weight' in state


def test_the_detector_starts_from_every_backbone_entry(pretrained):
    _, checkpoint, _ = pretrained
    cfg = Config.fromfile(FINETUNE)
    cfg.model.backbone.init_cfg.checkpoint = str(checkpoint)
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope('mmdet'):
        backbone = MODELS.build(cfg.model.backbone)
    backbone.init_weights()
    source = torch.load(checkpoint, weights_only=False)['state_dict']
    got = backbone.state_dict()
    assert sum(isinstance(m, SwitchableNorm) for m in backbone.modules()) \
        == 20
    for key, value in got.items():
        assert torch.equal(value, source[f'backbone.{key}']), key


def test_finetuning_trains_and_evaluates(pretrained):
    cwd, checkpoint, _ = pretrained
    make_toy_coco(
        str(cwd / 'data' / 'toy_coco'), num_train=4, num_val=2, size=96)
    log = train(FINETUNE, cwd / 'det', [
        f'model.backbone.init_cfg.checkpoint={checkpoint}',
        'train_cfg.max_iters=2', 'train_cfg.val_interval=2',
        'train_dataloader.batch_size=2', 'default_hooks.logger.interval=1',
        'custom_hooks.1.num_batches=1'
    ], cwd)
    assert 'ratios=source): 20 SN layers from 20 SN' in log
    assert 'Iter(train) [2/2]' in log and 'Iter(val)' in log
