"""Segmentors with SN (DeepLabV3 and PSPNet, SN in backbone and heads)
deployed as OpenMMLab users deploy them, at a fixed and at any input size:
briefly trained on the toy data, converted by mmdeploy's ``torch2onnx`` with
the deploy configs of configs/deploy/ (the graph gives the logits), run by
its ONNX Runtime backend, and their logits and class maps compared with
mmseg's predict (tools/deployment/mmdeploy_onnx.py). On the oldest leg, as
tests/test_mmdeploy.py."""
import os.path as osp

import pytest
from PIL import Image
from tool_runner import ROOT, run_python, tool, train_toy

from sn_mm.testing import make_toy_seg

pytest.importorskip(
    'mmdeploy',
    reason='mmdeploy 1.3.1 and onnxruntime 1.16 are installed on the oldest '
    'leg (make test-oldest)')
pytest.importorskip('onnxruntime')

STEPS = 30
# Segmentors, whose logits are compared: (deploy config, model config).
SEG_CASES = {
    'deeplabv3-sn':
    ('segmentation_onnxruntime_static-96x96', 'deeplabv3_r18-sn-d8_toy-seg'),
    'pspnet-sn':
    ('segmentation_onnxruntime_static-96x96', 'pspnet_r18-sn-d8_toy-seg'),
    # A 96 x 96 image and an 80 x 64 one.
    'deeplabv3-sn-dynamic':
    ('segmentation_onnxruntime_dynamic', 'deeplabv3_r18-sn-d8_toy-seg'),
}


@pytest.fixture(scope='module')
def workspace(tmp_path_factory):
    cwd = tmp_path_factory.mktemp('deploy_seg')
    make_toy_seg(str(cwd / 'data' / 'toy_seg'), num_train=24, num_val=4)
    return cwd


@pytest.mark.parametrize('case', list(SEG_CASES))
def test_onnx_runtime_gives_mmsegs_logits(workspace, case):
    deploy, model = SEG_CASES[case]
    checkpoint = train_toy(workspace, model, STEPS)
    images = [
        workspace / 'data' / 'toy_seg' / 'images' / 'validation' /
        f'{i:05d}.png' for i in range(2)
    ]
    if case.endswith('dynamic'):  # its top left 80 x 64
        cropped = workspace / f'{case}.png'
        Image.open(images[1]).crop((0, 0, 80, 64)).save(cropped)
        images[1] = cropped
    result = run_python([
        tool('deployment', 'mmdeploy_onnx.py'),
        osp.join(ROOT, 'configs', 'deploy', f'{deploy}.py'),
        osp.join(ROOT, 'configs', 'toy', f'{model}.py'), checkpoint, *images,
        '--work-dir', workspace / case / 'onnx'
    ], workspace)
    out = result.stdout
    assert 'ONNX Runtime agrees with PyTorch' in out, out[-3000:]
    exported = next(line for line in out.splitlines()
                    if line.startswith('Exported'))
    assert 'ReduceMean' in exported and 'sn_mm' not in exported
    sizes = [
        '(96, 96)', '(64, 80)' if case.endswith('dynamic') else '(96, 96)'
    ]
    compared = [line for line in out.splitlines() if 'logits differ' in line]
    assert [line.split(': ')[0].split(' ', 1)[1]
            for line in compared] == sizes, compared
