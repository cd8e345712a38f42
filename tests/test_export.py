"""SN under torch.fx, torch.export, torch.compile, torch.jit.trace and ONNX:
each traces without breaks and computes what eager SN computes."""
import copy
import os.path as osp

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import require_onnx_exporter
from mmengine.registry import MODELS, DefaultScope
from tool_runner import ROOT, run_python_together, tool

import sn_mm  # noqa: F401
from sn_mm import SwitchableNorm
from sn_mm.ops._compat import ONNX_EXPORTERS, onnx_export_kwargs


def randomise(model, seed=0):
    """Distinct, non-trivial SN parameters and running statistics."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, SwitchableNorm):
                for t in (m.mean_weight, m.var_weight, m.bias):
                    t.copy_(torch.randn(t.shape, generator=gen))
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + .5)
                m.running_mean.copy_(
                    torch.randn(m.num_features, generator=gen))
                m.running_var.copy_(
                    torch.rand(m.num_features, generator=gen) + .5)
    return model


def small_net():
    torch.manual_seed(0)
    return randomise(
        nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), SwitchableNorm(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3), SwitchableNorm(8, unbiased=False),
            nn.AdaptiveAvgPool2d(1), SwitchableNorm(8)))


def det_backbone_and_neck():
    """A detector's ResNet and FPN with SN, two stages deep: every kind of
    SN layer they hold (stem, blocks, downsampling, lateral and output
    convolutions) at a size that compiles in seconds."""
    with DefaultScope.overwrite_default_scope('mmdet'):
        import mmdet.models  # noqa: F401
        norm = dict(type='SN')
        backbone = MODELS.build(
            dict(
                type='mmdet.ResNet',
                depth=18,
                num_stages=2,
                strides=(1, 2),
                dilations=(1, 1),
                out_indices=(0, 1),
                norm_cfg=norm,
                norm_eval=False,
                frozen_stages=-1,
                style='pytorch'))
        neck = MODELS.build(
            dict(
                type='mmdet.FPN',
                in_channels=[64, 128],
                out_channels=32,
                num_outs=3,
                norm_cfg=norm))
    return randomise(nn.Sequential(backbone, neck))


def flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def sn_state(model):
    return {
        k: v.clone()
        for k, v in model.state_dict().items()
        if 'running' in k or 'num_batches' in k
    }


def assert_same(a, b, **tol):
    for p, q in zip(flat(a), flat(b)):
        torch.testing.assert_close(p, q, **tol)


@pytest.mark.parametrize('training', [True, False])
def test_fx_symbolic_trace(training):
    model = det_backbone_and_neck().train(training)
    traced = torch.fx.symbolic_trace(copy.deepcopy(model))
    x = torch.randn(2, 3, 64, 64)
    assert_same(traced(x), model(x))
    assert sn_state(traced).keys() == sn_state(model).keys()
    for key, value in sn_state(model).items():  # the same update in train
        torch.testing.assert_close(sn_state(traced)[key], value)


@pytest.mark.parametrize('training', [True, False])
def test_torch_export(training):
    model = small_net().train(training)
    x = torch.randn(4, 3, 12, 12)
    exported = torch.export.export(copy.deepcopy(model), (x, ))
    module = exported.module()
    assert_same(module(x), model(x))
    after = dict(module.named_buffers())
    for key, value in sn_state(model).items():
        if key not in after:
            # torch 2.1 names buffers by the traced access, and in eval
            # keeps them as constants
            if not training:
                continue
            owner, _, name = key.rpartition('.')
            key = f'self___{owner.replace(".", "___")}__buffers__{name}'
        torch.testing.assert_close(after[key], value)


def test_torch_compile_fullgraph_train_and_eval_steps():
    # fullgraph=True: any graph break raises.
    model = det_backbone_and_neck()
    compiled_model = copy.deepcopy(model)
    compiled = torch.compile(
        compiled_model, fullgraph=True, backend='aot_eager')
    x = torch.randn(2, 3, 64, 64)
    for m in (model, compiled):
        out = m(x)
        sum((o * o).mean() for o in out).backward()
    assert_same(compiled(x), model(x), rtol=1e-4, atol=1e-5)  # 2nd step
    for (name, p), q in zip(model.named_parameters(),
                            compiled_model.parameters()):
        torch.testing.assert_close(
            q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    for key, value in sn_state(model).items():
        torch.testing.assert_close(
            sn_state(compiled_model)[key], value, rtol=1e-5, atol=1e-6)
    model.eval()
    compiled_model.eval()
    with torch.no_grad():
        assert_same(compiled(x), model(x), rtol=1e-4, atol=1e-5)


def test_torch_compile_segmentor_eval():
    from mmengine.config import Config
    cfg = Config.fromfile(
        osp.join(ROOT, 'configs', 'toy', 'deeplabv3_r18-sn-d8_toy-seg.py'))
    with DefaultScope.overwrite_default_scope('mmseg'):
        import mmseg.models  # noqa: F401
        model = randomise(MODELS.build(cfg.model)).eval()
    x = torch.randn(1, 3, 64, 64)
    compiled = torch.compile(
        model._forward, fullgraph=True, backend='aot_eager')
    with torch.no_grad():
        torch.testing.assert_close(
            compiled(x), model._forward(x), rtol=1e-4, atol=1e-5)


def test_jit_trace():
    model = small_net().eval()
    x = torch.randn(4, 3, 12, 12)
    traced = torch.jit.trace(model, (x, ))
    y = torch.randn(2, 3, 12, 12)  # another batch size
    torch.testing.assert_close(traced(y), model(y))


@pytest.mark.parametrize('exporter', ['dynamo', 'torchscript'])
def test_onnx_export_uses_standard_ops(tmp_path, exporter):
    onnx = pytest.importorskip('onnx')
    ort = pytest.importorskip('onnxruntime')
    require_onnx_exporter(exporter)
    model = small_net().eval()
    x = torch.randn(2, 3, 12, 12)
    path = str(tmp_path / 'sn.onnx')
    torch.onnx.export(
        model, (x, ),
        path,
        input_names=['input'],
        **onnx_export_kwargs(exporter))
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert {'ReduceMean', 'Sqrt'} <= ops
    assert not any('sn_mm' in op or 'Python' in op for op in ops), ops
    session = ort.InferenceSession(path)
    (got, ) = session.run(None, {'input': x.numpy()})
    want = model(x).detach().numpy()
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


# Each model and each exporter once (the segmentor under dynamo repeated
# what these two cover; test_torch_compile_segmentor_eval traces it).
def test_pytorch2onnx_tool(tmp_path):
    """The tool's three runs, started together: an export of each model,
    each under one exporter and compared with PyTorch in onnxruntime, and a
    refusal of a checkpoint that does not fit."""
    pytest.importorskip('onnxruntime')
    ckpt = tmp_path / 'bn.pth'
    torch.save(dict(state_dict=nn.BatchNorm2d(3).state_dict()), ckpt)
    seg = 'deeplabv3_r18-sn-d8_toy-seg.py'
    # (what the tool does, config, checkpoint, exporter): the detector
    # under the newer exporter where this torch has it
    runs = [('segmentor', seg, 'none', 'torchscript'),
            ('detector', 'mask-rcnn_r18-sn_fpn_sn-head_toy-coco.py', 'none',
             ONNX_EXPORTERS[0]), ('refused', seg, ckpt, ONNX_EXPORTERS[0])]
    results = run_python_together([[
        tool('deployment', 'pytorch2onnx.py'),
        osp.join(ROOT, 'configs', 'toy', config), checkpoint, '--out',
        tmp_path / f'{i}.onnx', '--shape', '64', '64', '--exporter', exporter
    ] for i, (_, config, checkpoint, exporter) in enumerate(runs)],
                                  tmp_path,
                                  ok=False)
    for i, ((name, *_), result) in enumerate(zip(runs, results)):
        out = tmp_path / f'{i}.onnx'
        if name == 'refused':
            assert result.returncode != 0
            assert 'does not fit' in result.stderr
            assert not out.exists()
            continue
        assert result.returncode == 0, result.stderr[-3000:]
        assert out.stat().st_size > 0
        errors = [
            float(line.split('relative ')[1].rstrip(')'))
            for line in result.stdout.splitlines() if 'max abs error' in line
        ]
        assert errors and max(errors) <= 1e-4, name
        assert f'Exported the {name}' in result.stdout
