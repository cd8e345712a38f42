"""tools/train.py, --resume and tools/test.py on generated toy COCO data."""
import os.path as osp

import pytest
import torch
from tool_runner import ROOT, run_python, tool

from sn_mm.engine.runner import CHECKPOINT_DOC
from sn_mm.testing import make_toy_coco

CONFIG = osp.join(ROOT, 'configs', 'toy',
                  'mask-rcnn_r18-sn_fpn_sn-head_toy-coco.py')
# Small and quick: 2 images a step, 4 steps, a checkpoint every 2.
SHORT_RUN = [
    'train_cfg.max_iters=4', 'train_dataloader.batch_size=2',
    'default_hooks.checkpoint.interval=2',
    'default_hooks.checkpoint.max_keep_ckpts=2',
    'default_hooks.logger.interval=1'
]


def run(name, *args, cwd):
    result = run_python([tool(name), *args], cwd)
    return result.stdout + result.stderr


@pytest.fixture(scope='module')
def workspace(tmp_path_factory):
    """A folder with data/toy_coco, where the config's relative data_root
    points, and a first 4-iteration training run."""
    cwd = tmp_path_factory.mktemp('toy')
    make_toy_coco(
        str(cwd / 'data' / 'toy_coco'), num_train=12, num_val=4, size=96)
    log = run(
        'train.py',
        CONFIG,
        '--work-dir',
        cwd / 'first',
        '--cfg-options',
        *SHORT_RUN,
        cwd=cwd)
    return cwd, log


def test_train_logs_progress_and_saves_checkpoints(workspace):
    cwd, log = workspace
    assert 'Iter(train) [4/4]' in log and 'eta:' in log
    assert (cwd / 'first' / 'iter_2.pth').exists()
    ckpt = torch.load(cwd / 'first' / 'iter_4.pth', weights_only=False)
    assert ckpt['meta']['iter'] == 4
    assert any(k.endswith('sn1.mean_weight') for k in ckpt['state_dict'])


def test_resume_continues_the_iteration_count(workspace):
    cwd, _ = workspace
    log = run(
        'train.py',
        CONFIG,
        '--work-dir',
        cwd / 'resumed',
        '--resume',
        cwd / 'first' / 'iter_2.pth',
        '--cfg-options',
        *SHORT_RUN,
        cwd=cwd)
    assert 'resumed epoch: 0, iter: 2' in log
    assert 'Iter(train) [3/4]' in log and 'Iter(train) [1/4]' not in log
    ckpt = torch.load(cwd / 'resumed' / 'iter_4.pth', weights_only=False)
    assert ckpt['meta']['iter'] == 4


def test_test_tool_prints_coco_metrics(workspace):
    # A 4-iteration model may predict nothing: the tool then says so. What
    # it prints must not depend on what 4 CPU iterations happen to learn.
    cwd, _ = workspace
    log = run(
        'test.py',
        CONFIG,
        cwd / 'first' / 'iter_4.pth',
        '--work-dir',
        cwd / 'test',
        cwd=cwd)
    assert 'Iter(test)' in log
    if 'No metrics: the model made no prediction' in log:
        assert 'bbox_mAP_copypaste' not in log
    else:
        assert 'bbox_mAP_copypaste' in log and 'segm_mAP_copypaste' in log
        assert 'Average Precision  (AP) @[ IoU=0.50:0.95' in log


def test_train_names_a_missing_checkpoint_before_building_data(tmp_path):
    """A config whose pretrained file is not on disk stops at once, naming
    the file, the config key and the docs section."""
    config = osp.join(ROOT, 'configs', 'toy',
                      'mask-rcnn_r18-sn-pretrained_fpn_sn-head_toy-coco.py')
    missing = tmp_path / 'nowhere' / 'epoch_8.pth'
    result = run_python(
        [
            tool('train.py'),
            config,
            '--work-dir',
            tmp_path / 'work',
            '--cfg-options',
            f'model.backbone.init_cfg.checkpoint={missing}',
            # no data: the check comes before any dataset is built
            'train_dataloader.dataset.data_root=' + str(tmp_path / 'no_data')
        ],
        cwd=tmp_path,
        ok=False,
        timeout=300)
    assert result.returncode != 0
    err = result.stderr
    assert 'FileNotFoundError' in err and str(missing) in err, err[-2000:]
    assert 'model.backbone.init_cfg.checkpoint' in err
    assert CHECKPOINT_DOC in err
