"""SN in a detection head that runs once per FPN level: each level keeps
its own BN statistics, as each level's own batch statistics normalise it in
training. Checked on the toy RetinaNet's head against one copy of the head
per level, each seeing that level alone."""
import copy
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from tool_runner import ROOT

from sn_mm.cli import build_runner, load_config
from sn_mm.engine.batch_average import sn_batch_average
from sn_mm.models import (SwitchableNorm, SyncSwitchableNorm, convert_sync_sn,
                          fuse_conv_sn, keep_level_statistics, revert_sync_sn)

CONFIG = osp.join(ROOT, 'configs', 'toy',
                  'retinanet_r18-sn_fpn_sn-head_toy-coco.py')
SIZES = (16, 8, 4, 2, 1)


def build_detector():
    """The toy RetinaNet with one set of statistics in its head's SN
    layers (the config states num_levels=5), as mmdet would build it."""
    register_all_modules()
    torch.manual_seed(0)
    cfg = load_config(CONFIG)
    cfg.model.bbox_head.norm_cfg = dict(type='SN', requires_grad=True)
    return MODELS.build(cfg.model)


def level_features(seed):
    """Five levels whose inputs differ in mean and scale, as FPN's do."""
    generator = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(2, 128, s, s, generator=generator) * (k + 1) + k
        for k, s in enumerate(SIZES))


def head_sn(head):
    return [m for m in head.modules() if isinstance(m, SwitchableNorm)]


@pytest.fixture
def heads():
    """(converted head, one unconverted copy per level, blended copy)."""
    model = build_detector()
    blended = copy.deepcopy(model.bbox_head)
    per_level = [copy.deepcopy(model.bbox_head) for _ in SIZES]
    assert keep_level_statistics(model) == {'bbox_head': (5, 4)}
    # The backbone's and FPN's layers (one call per forward) stay as they are.
    assert all(m.num_levels == 1 for m in model.backbone.modules()
               if isinstance(m, SwitchableNorm))
    assert all(m.num_levels == 1 for m in model.neck.modules()
               if isinstance(m, SwitchableNorm))
    return model.bbox_head, per_level, blended


def train_steps(head, per_level, blended, steps=3):
    for m in (head, blended, *per_level):
        m.train()
    for step in range(steps):
        feats = level_features(step)
        outputs = head(feats)
        blended(feats)
        for k, ref in enumerate(per_level):
            cls, box = ref.forward_single(feats[k])
            assert torch.equal(outputs[0][k], cls)
            assert torch.equal(outputs[1][k], box)


def test_each_level_trains_and_tests_with_its_own_statistics(heads):
    head, per_level, blended = heads
    train_steps(head, per_level, blended)
    for m, *refs in zip(head_sn(head), *map(head_sn, per_level)):
        assert m.running_mean.shape == (5, 128)
        for k, ref in enumerate(refs):
            assert torch.equal(m.running_mean[k], ref.running_mean)
            assert torch.equal(m.running_var[k], ref.running_var)
            assert m.num_batches_tracked[k] == ref.num_batches_tracked == 3
    feats = level_features(10)
    for m in (head, blended, *per_level):
        m.eval()
    with torch.no_grad():
        outputs, mixed = head(feats), blended(feats)
    for k, ref in enumerate(per_level):
        cls, box = ref.forward_single(feats[k])
        assert torch.equal(outputs[0][k], cls)
        assert torch.equal(outputs[1][k], box)
    # One set for all levels normalises them otherwise.
    gaps = [
        float((mixed[0][k] - outputs[0][k]).abs().max() /
              outputs[0][k].abs().max()) for k in range(5)
    ]
    assert max(gaps) > 0.1, gaps


def test_levels_follow_the_checkpoint(heads):
    head, per_level, blended = heads
    train_steps(head, per_level, blended, steps=1)
    head.eval()
    feats = level_features(5)
    expected = head(feats)
    # A model built without SNRunner (mmdeploy's, mmdet's init_detector)
    # takes the levels from the checkpoint, and counts its calls itself.
    fresh = build_detector().bbox_head.eval()
    fresh.load_state_dict(head.state_dict())
    assert [m.num_levels for m in head_sn(fresh)] == [5] * 4
    for _ in range(2):
        got = fresh(feats)
        assert all(
            torch.equal(a, b)
            for a, b in zip(got[0] + got[1], expected[0] + expected[1]))
    # One set of statistics (a blended checkpoint) starts every level.
    head.load_state_dict(blended.state_dict())
    for m, ref in zip(head_sn(head), head_sn(blended)):
        assert m.num_levels == 5
        assert torch.equal(m.running_mean, ref.running_mean.expand(5, -1))
        assert torch.equal(m.num_batches_tracked,
                           ref.num_batches_tracked.expand(5))


def test_sync_conversion_and_fusing_keep_levels(heads):
    head = heads[0]
    synced = convert_sync_sn(head)
    layers = [m for m in synced.modules() if isinstance(m, SwitchableNorm)]
    assert all(
        type(m) is SyncSwitchableNorm and m.num_levels == 5 for m in layers)
    reverted = revert_sync_sn(synced)
    assert all(m.num_levels == 5 and type(m) is SwitchableNorm
               for m in head_sn(reverted))
    fused = fuse_conv_sn(reverted)
    assert len(head_sn(fused)) == 4


def test_batch_average_per_level(heads):
    head, per_level, _ = heads
    batches = [level_features(seed) for seed in range(4)]
    assert sn_batch_average(head, batches, head, 4) == 4
    for k, ref in enumerate(per_level):
        sn_batch_average(
            ref, batches, lambda f, ref=ref, k=k: ref((f[k], )), 4)
    for m, *refs in zip(head_sn(head), *map(head_sn, per_level)):
        for k, ref in enumerate(refs):
            torch.testing.assert_close(
                m.running_mean[k], ref.running_mean, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(
                m.running_var[k], ref.running_var, rtol=1e-6, atol=1e-7)


def test_snrunner_keeps_levels(tmp_path):
    cfg = load_config(CONFIG, work_dir=str(tmp_path))
    cfg.model.bbox_head.norm_cfg = dict(type='SN', requires_grad=True)
    runner = build_runner(cfg)
    layers = head_sn(runner.model.bbox_head)
    assert [m.num_levels for m in layers] == [5] * 4
    assert all(m.num_levels == 1 for m in runner.model.neck.modules()
               if isinstance(m, SwitchableNorm))


@pytest.mark.parametrize('kwargs,words', [
    (dict(num_levels=0), 'num_levels must be a positive integer'),
    (dict(num_levels=2, using_bn=False), 'no BN term'),
])
def test_bad_levels(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SwitchableNorm(8, **kwargs)
