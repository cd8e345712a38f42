"""Detectors with SN (RetinaNet and Mask R-CNN: backbone, neck and heads)
and with SW (Mask R-CNN on SWResNet) deployed as OpenMMLab users deploy
them: briefly trained on the toy data, converted end to end by mmdeploy's
``torch2onnx`` with the deploy configs of configs/deploy/, run by its ONNX
Runtime backend and compared with PyTorch (tools/deployment/mmdeploy_onnx.py).
mmdeploy 1.3.1 supports torch up to 2.x's early releases: these run on the
oldest leg (make test-oldest)."""
import os.path as osp

import pytest
from tool_runner import ROOT, run_python, tool

from sn_mm.testing import make_toy_coco

pytest.importorskip(
    'mmdeploy',
    reason='mmdeploy 1.3.1 and onnxruntime 1.16 are installed on the oldest '
    'leg (make test-oldest)')
pytest.importorskip('onnxruntime')

# (deploy config, model config) under configs/
CASES = {
    'retinanet-sn': ('detection_onnxruntime_static-128x128',
                     'retinanet_r18-sn_fpn_sn-head_toy-coco'),
    'mask-rcnn-sn': ('instance-seg_onnxruntime_static-128x128',
                     'mask-rcnn_r18-sn_fpn_sn-head_toy-coco'),
    'mask-rcnn-sw': ('instance-seg_onnxruntime_static-128x128',
                     'mask-rcnn_r18-syncsw_fpn_toy-coco'),
}
STEPS = 30
# 30 steps leave a Mask R-CNN's scores near its untrained ones, often all
# below the stock 0.05: a lower threshold keeps detections to compare.
CFG_OPTIONS = {
    'mask-rcnn-sn': ['model.test_cfg.rcnn.score_thr=0.005'],
    'mask-rcnn-sw': ['model.test_cfg.rcnn.score_thr=0.005'],
}


@pytest.fixture(scope='module')
def workspace(tmp_path_factory):
    cwd = tmp_path_factory.mktemp('deploy')
    make_toy_coco(
        str(cwd / 'data' / 'toy_coco'), num_train=24, num_val=4, size=128)
    return cwd


@pytest.mark.parametrize('case', list(CASES))
def test_onnx_runtime_gives_pytorchs_detections(workspace, case):
    deploy, model = CASES[case]
    config = osp.join(ROOT, 'configs', 'toy', f'{model}.py')
    # Seeded, so that a failure reproduces on the same CPU.
    run_python([
        tool('train.py'), config, '--work-dir', case, '--cfg-options',
        f'train_cfg.max_iters={STEPS}', f'train_cfg.val_interval={STEPS}',
        f'default_hooks.checkpoint.interval={STEPS}', 'randomness.seed=0'
    ], workspace)
    images = [
        workspace / 'data' / 'toy_coco' / 'val' / f'{i:05d}.png'
        for i in range(2)
    ]
    result = run_python([
        tool('deployment', 'mmdeploy_onnx.py'),
        osp.join(ROOT, 'configs', 'deploy', f'{deploy}.py'), config,
        workspace / case / f'iter_{STEPS}.pth', *images, '--work-dir',
        workspace / case / 'onnx',
        *(['--cfg-options', *CFG_OPTIONS[case]] if case in CFG_OPTIONS else [])
    ], workspace)
    out = result.stdout
    assert 'ONNX Runtime agrees with PyTorch' in out, out[-3000:]
    # SN and SW as standard operators: ReduceMean and Sqrt for SN's
    # moments, MatMul for SW's whitening; nothing of sn_mm's own.
    exported = next(line for line in out.splitlines()
                    if line.startswith('Exported'))
    assert 'MatMul' in exported if 'sw' in case else 'ReduceMean' in exported
    assert 'sn_mm' not in exported and 'Python' not in exported
    # Every image: the exported graph agrees with the model it was traced
    # from on every detection; a one-stage detector's with mmdet's own.
    traced = [
        line for line in out.splitlines()
        if 'the exported graph against' in line
    ]
    assert len(traced) == len(images)
    assert all(line.endswith('all agree') for line in traced), traced
    if case == 'retinanet-sn':
        own = [line for line in out.splitlines() if 'mmdet\'s predict' in line]
        assert all(line.endswith('all agree') for line in own), own
