"""fuse_conv_sn: SN layers with hard fixed ratios folded away for eval, with
outputs equal to the unfused network's."""
import itertools
import os.path as osp
import re

import pytest
import torch
import torch.nn as nn
from helpers import make_sn, random_input
from mmengine.config import Config
from mmengine.registry import DefaultScope
from tool_runner import ROOT, run_python, run_python_together, tool

from sn_mm import SwitchableNorm, fuse_conv_sn
from sn_mm.models import SelectedNorm, SNAffine

ONE_HOT = {'in': [1., 0., 0.], 'ln': [0., 1., 0.], 'bn': [0., 0., 1.]}
CHOICES = list(itertools.product(ONE_HOT, repeat=2))


def hard_sn(c, mean, var, seed=0, unbiased=True):
    sn = make_sn(c, seed=seed, unbiased=unbiased).eval()
    sn.fix_ratios(ONE_HOT[mean], ONE_HOT[var])
    return sn


def test_bn_bn_folds_into_the_preceding_conv():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 5, 3, padding=1).double(), hard_sn(5, 'bn', 'bn'),
        nn.ReLU(), hard_sn(5, 'bn', 'bn', seed=1)).eval()
    x = random_input((2, 3, 6, 6))
    expected = model(x)
    fuse_conv_sn(model)
    assert isinstance(model[1], nn.Identity)
    assert isinstance(model[3], SNAffine)  # no conv right before it
    torch.testing.assert_close(model(x), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('mean,var', [c for c in CHOICES if c != ('bn', 'bn')])
@pytest.mark.parametrize(
    'shape', [(3, 5, 4, 3), (6, 5), (4, 5, 1, 1)],
    ids=['4d', '2d', 'one_position'])
@pytest.mark.parametrize('unbiased', [True, False])
def test_selected_norm_computes_what_sn_computes(mean, var, shape, unbiased):
    sn = hard_sn(5, mean, var, unbiased=unbiased)
    model = nn.Sequential(sn)
    x = random_input(shape)
    expected = model(x)
    fuse_conv_sn(model)
    assert isinstance(model[0], SelectedNorm)
    assert (model[0].mean_term, model[0].var_term) == (mean, var)
    torch.testing.assert_close(model(x), expected, rtol=1e-10, atol=1e-10)


def test_layers_without_hard_ratios_stay():
    soft = make_sn(4)
    half = make_sn(4)
    half.fix_ratios(mean=ONE_HOT['bn'])  # the variance still learned
    blurred = make_sn(4)
    blurred.fix_ratios([0.5, 0.5, 0.], [0., 0., 1.])
    model = nn.Sequential(nn.Conv2d(4, 4, 1), soft, half, blurred)
    fuse_conv_sn(model)
    assert all(isinstance(m, SwitchableNorm) for m in model[1:])


def randomly_hardened(model, seed=0):
    gen = torch.Generator().manual_seed(seed)
    layers = [m for m in model.modules() if isinstance(m, SwitchableNorm)]
    with torch.no_grad():
        for i, m in enumerate(layers):
            mean, var = (('bn', 'bn') if i % 2 == 0 else CHOICES[int(
                torch.randint(8, (), generator=gen))])
            m.fix_ratios(ONE_HOT[mean], ONE_HOT[var])
            m.running_mean.normal_(0, 0.1, generator=gen)
            m.running_var.uniform_(0.5, 1.5, generator=gen)
            m.weight.uniform_(0.5, 1.5, generator=gen)
            m.bias.normal_(0, 0.1, generator=gen)
    return layers


def assert_close_rel(a, b, rtol=1e-4):
    assert (a - b).abs().max() <= rtol * b.abs().max()


def test_fuse_detector():
    from mmdet.registry import MODELS
    cfg = Config.fromfile(
        osp.join(ROOT, 'configs', 'toy',
                 'mask-rcnn_r18-sn_fpn_sn-head_toy-coco.py'))
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model).eval()
    layers = randomly_hardened(model)
    x = torch.randn(1, 3, 64, 64)
    rois = torch.randn(3, 128, 7, 7)
    mask_rois = torch.randn(3, 128, 14, 14)
    with torch.no_grad():
        expected = (model.extract_feat(x), model.roi_head.bbox_head(rois),
                    model.roi_head.mask_head(mask_rois))
        fuse_conv_sn(model)
        got = (model.extract_feat(x), model.roi_head.bbox_head(rois),
               model.roi_head.mask_head(mask_rois))
    for a, b in zip(
            itertools.chain(got[0], got[1], [got[2]]),
            itertools.chain(expected[0], expected[1], [expected[2]])):
        assert_close_rel(a, b)
    remaining = [m for m in model.modules() if isinstance(m, SwitchableNorm)]
    assert not remaining
    selected = [m for m in model.modules() if isinstance(m, SelectedNorm)]
    assert len(selected) == len(layers) // 2
    # The backbone's and the heads' BN/BN layers went into their convs.
    assert isinstance(model.backbone.sn1, nn.Identity)
    assert isinstance(model.neck.fpn_convs[0].sn, nn.Identity)


def test_fuse_segmentor():
    from mmseg.registry import MODELS
    cfg = Config.fromfile(
        osp.join(ROOT, 'configs', 'toy', 'deeplabv3_r18-sn-d8_toy-seg.py'))
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(cfg.model).eval()
    randomly_hardened(model, seed=1)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = model._forward(x)
        fuse_conv_sn(model)
        assert_close_rel(model._forward(x), expected)
    assert not any(isinstance(m, SwitchableNorm) for m in model.modules())


def soft_checkpoint(config, path, seed=2):
    """A checkpoint of the segmentor with learned-looking SN layers:
    random logits (soft ratios) and running statistics."""
    from mmseg.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(Config.fromfile(config).model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, SwitchableNorm):
                m.mean_weight.normal_(0, 1, generator=gen)
                m.var_weight.normal_(0, 1, generator=gen)
                m.running_mean.normal_(0, 0.1, generator=gen)
                m.running_var.uniform_(0.5, 1.5, generator=gen)
    torch.save(dict(state_dict=model.state_dict(), meta=dict()), path)


def test_test_tool_fuses_a_hardened_checkpoint(toy_seg_workspace):
    cwd = toy_seg_workspace
    config = osp.join(ROOT, 'configs', 'toy', 'deeplabv3_r18-sn-d8_toy-seg.py')
    soft_checkpoint(config, cwd / 'soft.pth')
    run_python(
        [tool('model_converters', 'harden_sn.py'), 'soft.pth', 'hard.pth'],
        cwd=cwd)
    logs = [
        r.stdout for r in run_python_together([[
            tool('test.py'), config, 'hard.pth', '--work-dir', f'fuse_test{i}',
            *flags
        ] for i, flags in enumerate(([], ['--fuse-conv-sn']))], cwd)
    ]
    assert 'fuse_conv_sn:' in logs[1] and 'fuse_conv_sn:' not in logs[0]
    miou = [re.search(r'mIoU: ([\d.]+)', log).group(1) for log in logs]
    assert miou[0] == miou[1]


def test_benchmark_fuse_tool():
    result = run_python([
        tool('analysis_tools', 'benchmark_fuse.py'), '--size', '64',
        '--repeats', '1', '--batch', '1'
    ],
                        cwd=ROOT)
    assert 'fused / BN fused' in result.stdout
    err = float(
        re.search(r'max relative error ([\d.e+-]+)', result.stdout).group(1))
    assert err < 1e-4
