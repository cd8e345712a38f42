"""configs/pretrain: Table 2's ImageNet rows as mmpretrain configs. Each
builds in mmpretrain's scope with the right normaliser, batch setting, LR
and batch average; the SN model takes a training step."""
import glob
import math
import os.path as osp
import re

import pytest
import torch
from helpers import toy_cls_batch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope

import sn_mm  # noqa: F401
from sn_mm import SwitchableNorm

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS = sorted(glob.glob(osp.join(ROOT, 'configs', 'pretrain', '*.py')))
SN_SETTINGS = [
    '8xb32', '8xb16', '8xb8', '8xb4', '8xb2', '1xb16', '1xb32', '8xb1', '1xb8'
]


def config_id(path):
    return osp.splitext(osp.basename(path))[0]


def build(cfg):
    from mmpretrain.registry import MODELS
    from mmpretrain.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(cfg.model)
        optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    return model, optim_wrapper


def test_table_2_rows_are_all_there():
    names = {config_id(p) for p in CONFIGS}
    assert names == ({f'resnet50-sn_{s}_in1k'
                      for s in SN_SETTINGS}
                     | {
                         f'resnet50-{n}_{s}_in1k'
                         for n in ('bn', 'gn')
                         for s in ('8xb32', '8xb2')
                     })


@pytest.mark.parametrize('path', CONFIGS, ids=config_id)
def test_recipe_and_batch_setting(path):
    cfg = Config.fromfile(path)
    norm, gpus, per_gpu = re.match(r'resnet50-(\w+)_(\d+)xb(\d+)_in1k',
                                   config_id(path)).groups()
    gpus, per_gpu = int(gpus), int(per_gpu)
    assert 'sn_mm' in cfg.custom_imports.imports
    assert cfg.train_dataloader.batch_size == per_gpu
    # The paper's recipe: 0.1 per 256 images, /10 at 30, 60, 90 of 100
    # epochs, weight decay 1e-4 on every parameter.
    optimizer = cfg.optim_wrapper.optimizer
    assert optimizer.lr == pytest.approx(0.1 * gpus * per_gpu / 256)
    assert optimizer.weight_decay == 1e-4
    assert 'paramwise_cfg' not in cfg.optim_wrapper
    assert cfg.param_scheduler.milestones == [30, 60, 90]
    assert cfg.train_cfg.max_epochs == 100
    assert cfg.model.backbone.depth == 50
    assert cfg.model.backbone.norm_cfg.type == norm.upper()
    # --auto-scale-lr (mmengine: lr x world size x batch / base_batch_size)
    # keeps the row's LR at its own GPU count and scales it linearly at
    # another.
    base = cfg.auto_scale_lr.base_batch_size
    for world in (gpus, 2 * gpus):
        assert optimizer.lr * world * per_gpu / base == pytest.approx(
            0.1 * world * per_gpu / 256)
    hooks = {h['type']: h for h in cfg.custom_hooks}
    if norm == 'sn':
        # Batch average over about 50k images, whatever the batch.
        assert hooks['SNBatchAverageHook']['num_batches'] == math.ceil(
            50000 / (gpus * per_gpu))
    else:
        assert not hooks

    model, optim_wrapper = build(cfg)
    sn = [m for m in model.modules() if isinstance(m, SwitchableNorm)]
    assert len(sn) == (53 if norm == 'sn' else 0)
    assert not (norm != 'bn' and any(
        isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()))
    if norm == 'sn':
        # The ratio logits decay like every other parameter.
        logits = {id(m.mean_weight) for m in sn}
        decays = {
            g['weight_decay']
            for g in optim_wrapper.param_groups if any(
                id(p) in logits for p in g['params'])
        }
        assert decays == {1e-4}


def test_sn_row_trains_a_step():
    cfg = Config.fromfile(
        osp.join(ROOT, 'configs', 'pretrain', 'resnet50-sn_8xb32_in1k.py'))
    model, optim_wrapper = build(cfg)
    model.train()
    torch.manual_seed(0)
    data = toy_cls_batch(model)
    stem = model.backbone.norm1
    before = stem.mean_weight.detach().clone()
    losses = model(**data, mode='loss')
    loss, _ = model.parse_losses(losses)
    assert torch.isfinite(loss)
    optim_wrapper.backward(loss)
    # Learned from the loss, not only moved by weight decay.
    assert stem.mean_weight.grad.abs().sum() > 0
    optim_wrapper.step()
    assert not torch.equal(before, stem.mean_weight)
