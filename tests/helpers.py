"""What several test modules share: SN layers with non-trivial state, inputs,
the float64 reference of a layer, running a layer forward and backward,
free ports."""
import importlib.util
import os.path as osp
import socket

import torch

from sn_mm.ops import native_available, triton_problem
from sn_mm.testing import make_layer, reference_sn


def free_port():
    """A free TCP port on 127.0.0.1 for a process group's rendezvous."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def make_sn(c,
            using_bn=True,
            unbiased=True,
            dtype=torch.float64,
            seed=0,
            **kwargs):
    """An SN layer with non-trivial parameters and running statistics."""
    return make_layer(
        c, using_bn, unbiased=unbiased, seed=seed, **kwargs).to(dtype)


def random_input(shape, seed=1, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    # A per-channel offset and scale, so that the normalisers differ.
    x = torch.randn(shape, generator=gen, dtype=dtype)
    offset = torch.randn(shape[:2], generator=gen, dtype=dtype) * 3
    return x * 2 + offset.reshape(*shape[:2], *([1] * (len(shape) - 2)))


def reference_of(sn, x, training):
    """(output, new running mean, new running var) of the float64
    reference for layer ``sn``'s current state."""
    return reference_sn(
        x,
        sn.weight.detach(),
        sn.bias.detach(),
        sn.mean_weight.detach(),
        sn.var_weight.detach(),
        sn.running_mean,
        sn.running_var,
        training,
        momentum=sn.momentum,
        eps=sn.eps,
        using_bn=sn.using_bn,
        unbiased=sn.unbiased)


def run_layer(sn, x, kernels, grad=None):
    """Forward and backward (output gradient ``grad``, else a fixed random
    one in the output's dtype) with ``sn.kernels = kernels``; returns the
    output, every gradient and the running statistics."""
    sn.kernels = kernels
    x = x.detach().clone().requires_grad_()
    sn.zero_grad()
    out = sn(x)
    if grad is None:
        gen = torch.Generator().manual_seed(5)
        grad = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    out.backward(grad)
    result = dict(out=out.detach(), x_grad=x.grad)
    for name, p in sn.named_parameters():
        result[name] = p.grad.clone()
    if sn.using_bn:
        result['running_mean'] = sn.running_mean.clone()
        result['running_var'] = sn.running_var.clone()
    return result


def load_tool(*parts):
    """A tool script under tools/ as a module, to call its functions."""
    path = osp.join(
        osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools', *parts)
    spec = importlib.util.spec_from_file_location(
        osp.splitext(parts[-1])[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def require_kernels(name, allow_module_level=False):
    """Skip the calling test (or module) where kernel set ``name`` cannot
    run here."""
    import pytest
    if name == 'native' and not native_available():
        pytest.skip(
            'native extension not built (SN_MM_NO_EXT=1)',
            allow_module_level=allow_module_level)
    if name == 'triton' and triton_problem() is not None:
        pytest.skip(triton_problem(), allow_module_level=allow_module_level)


def require_onnx_exporter(exporter):
    """Skip the calling test where this torch lacks ONNX exporter
    ``exporter`` (the dynamo one before torch 2.5)."""
    import pytest

    from sn_mm.ops._compat import ONNX_EXPORTERS
    if exporter not in ONNX_EXPORTERS:
        pytest.skip(f'torch.onnx.export(dynamo=True), the {exporter} '
                    f'exporter, needs torch >= 2.5 (this is '
                    f'{torch.__version__})')


def toy_seg_batch(model, size=64):
    """Two random images of ``size`` x ``size`` with random labels (classes
    0-3), through ``model``'s data preprocessor for training (mmseg)."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    samples = []
    for _ in range(2):
        s = SegDataSample(
            metainfo=dict(img_shape=(size, size), pad_shape=(size, size)))
        s.gt_sem_seg = PixelData(
            data=torch.randint(0, 4, (1, size, size), dtype=torch.long))
        samples.append(s)
    return model.data_preprocessor(
        dict(
            inputs=[
                torch.randint(0, 255, (3, size, size), dtype=torch.uint8)
                for _ in range(2)
            ],
            data_samples=samples), True)


def toy_cls_batch(model):
    """Two random 64 x 64 images labelled 3 and 7, through ``model``'s data
    preprocessor for training (mmpretrain)."""
    from mmpretrain.structures import DataSample
    return model.data_preprocessor(
        dict(
            inputs=[
                torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8)
                for _ in range(2)
            ],
            data_samples=[DataSample().set_gt_label(i) for i in (3, 7)]), True)


def toy_det_batch(model, with_mask=True):
    """mmdet's demo inputs (two images of 96 x 128, 3 and 2 objects of 4
    classes), seeded, through ``model``'s data preprocessor for training."""
    from mmdet.testing import demo_mm_inputs
    torch.manual_seed(0)
    packed = demo_mm_inputs(
        batch_size=2,
        image_shapes=[(3, 96, 128)] * 2,
        num_items=[3, 2],
        num_classes=4,
        with_mask=with_mask)
    return model.data_preprocessor(packed, True)
