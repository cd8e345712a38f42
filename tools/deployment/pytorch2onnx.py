#!/usr/bin/env python
"""Export a model with SN to ONNX and check it against PyTorch.

What is exported: an mmseg segmentor's logits (``EncoderDecoder``: backbone
and decode head, as mmseg's ``mode='tensor'``), or an mmdet detector's
backbone and neck (the FPN features; the detection heads' post-processing is
not exported). SN layers export in eval mode as standard ONNX operators
(ReduceMean, Sub, Mul, Sqrt, Div, ...), their BN term a constant from the
running statistics. SyncSN layers become SN first. onnxruntime then runs the
file on a random input of --shape and the tool prints the largest absolute
difference from PyTorch's output, and fails if it exceeds 1e-4 of the
output's largest magnitude. The checkpoint is loaded with weights_only=False
(mmengine training checkpoints need it): use it on checkpoints you trust.

Example::

    python tools/deployment/pytorch2onnx.py CONFIG CHECKPOINT --out model.onnx
    python tools/deployment/pytorch2onnx.py CONFIG none --out untrained.onnx
"""
import argparse
import os.path as osp
import sys

import numpy as np
import torch
import torch.nn as nn
from mmengine.registry import MODELS, init_default_scope

import sn_mm  # noqa: F401
from sn_mm import revert_sync_sn
from sn_mm.cli import load_config
from sn_mm.ops._compat import ONNX_EXPORTERS, onnx_export_kwargs

RTOL = 1e-4


class Exported(nn.Module):
    """The part of the model that is exported, as a plain tensor function."""

    def __init__(self, model, kind):
        super().__init__()
        self.model = model
        self.kind = kind

    def forward(self, x):
        if self.kind == 'segmentor':
            return self.model(x, mode='tensor')
        feats = self.model.extract_feat(x)
        return tuple(feats)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config', help='mmdet or mmseg config')
    parser.add_argument(
        'checkpoint', help='checkpoint, or "none" for the initial weights')
    parser.add_argument('--out', required=True, help='the .onnx file')
    parser.add_argument(
        '--shape',
        type=int,
        nargs=2,
        default=[512, 512],
        metavar=('H', 'W'),
        help='input height and width '
        '(default: 512 512)')
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument(
        '--exporter',
        choices=['dynamo', 'torchscript'],
        default=ONNX_EXPORTERS[0],
        help='torch.onnx.export\'s dynamo=True (the default from torch '
        '2.5 on, where it exists) or its TorchScript exporter')
    parser.add_argument(
        '--force', action='store_true', help='overwrite --out if it exists')
    return parser.parse_args(argv)


def build(cfg, checkpoint):
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    model = revert_sync_sn(MODELS.build(cfg.model))
    if checkpoint != 'none':
        ckpt = torch.load(checkpoint, map_location='cpu', weights_only=False)
        state = ckpt.get('state_dict', ckpt) if isinstance(ckpt, dict) else {}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            sys.exit(f'{checkpoint} does not fit the config\'s model: '
                     f'{len(missing)} missing keys (e.g. {missing[:3]}), '
                     f'{len(unexpected)} unexpected (e.g. {unexpected[:3]})')
    if hasattr(model, 'decode_head') and hasattr(model, '_forward'):
        kind = 'segmentor'
    elif hasattr(model, 'extract_feat') and hasattr(model, 'backbone'):
        kind = 'detector'
    else:
        sys.exit(f'cannot export {type(model).__name__}: expected an mmseg '
                 'segmentor or an mmdet detector')
    return Exported(model, kind).eval(), kind


def main(argv=None):
    args = parse_args(argv)
    if osp.exists(args.out) and not args.force:
        sys.exit(f'{args.out} exists; pass --force to overwrite it')
    try:
        import onnxruntime as ort
    except ImportError:
        sys.exit('onnxruntime is needed to check the export: '
                 'pip install onnxruntime')
    cfg = load_config(args.config)
    model, kind = build(cfg, args.checkpoint)
    x = torch.randn(
        args.batch, 3, *args.shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(x)
    expected = expected if isinstance(expected, tuple) else (expected, )
    try:
        kwargs = onnx_export_kwargs(args.exporter)
        if args.exporter == 'dynamo':
            torch.onnx.export(
                model, (x, ), args.out, input_names=['input'], **kwargs)
        else:
            # The TorchScript exporter's initializer de-duplication drops
            # parameters that equal another bit for bit (fresh SN layers'
            # weights) while nodes still read them; keeping initializers as
            # graph inputs avoids that pass.
            torch.onnx.export(
                model, (x, ),
                args.out,
                input_names=['input'],
                keep_initializers_as_inputs=True,
                **kwargs)
    except Exception as err:  # report what the exporter said, no traceback
        sys.exit(f'cannot export {kind} of {args.config} with the '
                 f'{args.exporter} exporter: {type(err).__name__}: {err}')
    session = ort.InferenceSession(
        args.out, providers=['CPUExecutionProvider'])
    outputs = session.run(None, {'input': x.numpy()})
    worst = 0.0
    for i, (got, want) in enumerate(zip(outputs, expected)):
        want = want.numpy()
        err = float(np.abs(got - want).max())
        scale = float(np.abs(want).max()) or 1.0
        worst = max(worst, err / scale)
        print(f'output {i} {tuple(want.shape)}: max abs error {err:.3e} '
              f'(relative {err / scale:.3e})')
    print(f'Exported the {kind} of {args.config} to {args.out} '
          f'({args.exporter} exporter), input {tuple(x.shape)}')
    if len(outputs) != len(expected) or worst > RTOL:
        sys.exit(f'onnxruntime disagrees with PyTorch: relative error '
                 f'{worst:.3e} > {RTOL}')


if __name__ == '__main__':
    main()
