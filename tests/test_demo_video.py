"""`make demo-video` at toy size: the toy clips, and tools/train.py training
the I3D ResNet-18 with SN on them (mmaction2) in a real process."""
import os.path as osp

import cv2
import numpy as np
import pytest
import torch
from tool_runner import ROOT, run_python, tool

from sn_mm.testing import MOTION_CLASSES, make_toy_video

pytest.importorskip('mmaction')
CONFIG = osp.join(ROOT, 'configs', 'toy', 'i3d_r18-sn_toy-video.py')


def test_toy_clips_move_their_way(tmp_path):
    """Each clip's shape moves in its class's direction, and one frame does
    not tell the class: shapes of every class start anywhere."""
    make_toy_video(str(tmp_path), num_train=8, num_val=4, size=32, frames=8)
    lines = (tmp_path / 'train_list.txt').read_text().split('\n')[:-1]
    assert len(lines) == 8
    for line in lines:
        clip, frames, label = line.split()
        assert frames == '8'
        first, last = (
            cv2.imread(
                str(tmp_path / 'rawframes' / clip / f'img_{t:05d}.png'))
            for t in (1, 8))
        # The shape is the one flat colour on a noisy background.
        colours, counts = np.unique(
            first.reshape(-1, 3), axis=0, return_counts=True)
        colour = colours[counts.argmax()]
        (y0, x0), (y1, x1) = (
            np.argwhere((image == colour).all(-1)).mean(0)
            for image in (first, last))
        moved = dict(right=x1 - x0, left=x0 - x1, down=y1 - y0, up=y0 - y1)
        direction = MOTION_CLASSES[int(label)]
        assert moved[direction] > 5, (clip, direction, moved)


def test_toy_video_training(tmp_path):
    make_toy_video(
        str(tmp_path / 'data' / 'toy_video'), num_train=16, num_val=8)
    result = run_python([
        tool('train.py'), CONFIG, '--work-dir', tmp_path / 'w',
        '--cfg-options', 'train_cfg.max_epochs=1', 'train_cfg.val_interval=1',
        'default_hooks.checkpoint.interval=1'
    ], tmp_path)
    log = result.stdout + result.stderr
    assert 'acc/top1:' in log
    assert 'SN batch average: BN statistics of every SN layer' in log
    state = torch.load(
        tmp_path / 'w' / 'epoch_1.pth', weights_only=False)['state_dict']
    # 3x3x3 kernels and SN layers in every block.
    assert state['backbone.layer1.0.conv1.conv.weight'].shape[2:] == (3, 3, 3)
    assert 'backbone.layer4.1.conv2.sn.mean_weight' in state
