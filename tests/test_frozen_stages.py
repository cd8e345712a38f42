"""``frozen_stages`` holds from build on, for SN and SW backbones in every
toolbox's ResNet (no parameter of a frozen stage requires grad straight
after ``MODELS.build``, before ``train()``), and a toy SW Mask R-CNN with a
frozen stage trains under the runner's own DDP wrapper (gloo, two
processes) and tests."""
import os.path as osp
from importlib import import_module

import pytest
from helpers import free_port
from mmengine.registry import DefaultScope
from tool_runner import ROOT, run_python, tool

import sn_mm  # noqa: F401
from sn_mm.testing import make_toy_coco

TOOLBOXES = ('mmdet', 'mmseg', 'mmpretrain')
NORMS = {
    'sn':
    dict(type='ResNet', norm_cfg=dict(type='SN')),
    'sw':
    dict(
        type='SWResNet',
        sw_cfg=dict(type='SW', num_pergroup=16),
        norm_cfg=dict(type='BN')),
    'syncsw':
    dict(
        type='SWResNet',
        sw_cfg=dict(type='SyncSW', num_pergroup=16),
        norm_cfg=dict(type='BN')),
}


def frozen_names(backbone, frozen_stages):
    """The parameters of the stem and the first ``frozen_stages`` stages."""
    stem = ('conv1.', 'norm1.', 'bn1.', 'sn1.', 'sw1.', 'stem.')
    stages = tuple(f'layer{i}.' for i in range(1, frozen_stages + 1))
    return [
        name for name, _ in backbone.named_parameters()
        if name.startswith(stem + stages)
    ]


@pytest.mark.parametrize('norm', list(NORMS))
@pytest.mark.parametrize('toolbox', TOOLBOXES)
def test_frozen_stages_hold_from_build(toolbox, norm):
    registry = import_module(f'{toolbox}.registry').MODELS
    import_module(f'{toolbox}.models')
    cfg = dict(NORMS[norm], depth=18, frozen_stages=1)
    with DefaultScope.overwrite_default_scope(toolbox):
        backbone = registry.build(cfg)
    frozen = frozen_names(backbone, 1)
    # The stem's and stage 1's norm layers are there (SW's at sw1 and
    # layer1.1 for SWResNet).
    assert any('sw' in n or 'sn' in n for n in frozen), frozen
    params = dict(backbone.named_parameters())
    trainable = [n for n in frozen if params[n].requires_grad]
    assert not trainable, trainable
    assert all(p.requires_grad for n, p in params.items() if n not in frozen)


def test_preact_resnet_frozen_stages_hold_from_build():
    from mmengine.registry import MODELS
    backbone = MODELS.build(
        dict(type='PreActResNet', depth=50, frozen_stages=1))
    names = [n for n, _ in backbone.named_parameters()]
    frozen = [n for n in names if n.startswith(('conv1.', 'layer1.'))]
    assert frozen and not any(
        p.requires_grad for n, p in backbone.named_parameters() if n in frozen)


SW_DETECTOR = osp.join(ROOT, 'configs', 'toy',
                       'mask-rcnn_r18-syncsw_fpn_toy-coco.py')


def test_ddp_trains_and_tests_a_sw_mask_rcnn_with_a_frozen_stage(tmp_path):
    make_toy_coco(
        str(tmp_path / 'data' / 'toy_coco'), num_train=8, num_val=4, size=96)
    short = [
        'train_cfg.max_iters=3', 'train_cfg.val_interval=3',
        'train_dataloader.batch_size=2', 'default_hooks.logger.interval=1',
        'default_hooks.checkpoint.interval=3'
    ]
    result = run_python([
        '-m', 'torch.distributed.run', '--nproc_per_node', '2',
        '--master_port',
        str(free_port()),
        tool('train.py'), SW_DETECTOR, '--launcher', 'pytorch', '--work-dir',
        'wd', '--cfg-options', *short
    ],
                        tmp_path,
                        env=dict(OMP_NUM_THREADS='1'))
    log = result.stdout + result.stderr
    # DDP (find_unused_parameters=False) finished every step: each
    # parameter that requires grad got one, none of the frozen stage did.
    assert 'Iter(train) [3/3]' in log, log[-3000:]
    result = run_python(
        [tool('test.py'), SW_DETECTOR, 'wd/iter_3.pth', '--work-dir', 'test'],
        tmp_path)
    # (after 3 steps the model may predict nothing, which the tool says)
    assert 'Iter(test) [' in result.stdout + result.stderr
