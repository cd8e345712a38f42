#!/usr/bin/env python
"""Convert a released SN ImageNet checkpoint into an OpenMMLab backbone.

The authors' ResNet50v1+SN / ResNet101v1+SN checkpoints (``torch.save``d
dicts with ``state_dict``, ``epoch``, ``best_prec1``, ...) become an
mmengine checkpoint that loads with ``strict=True`` into mmdet's and mmseg's
``ResNet(depth=50 or 101, norm_cfg=dict(type='SN'))``. The classifier is
dropped; SN parameters are reshaped from (1, C, 1, 1) / (1, C, 1) to (C,).

Example::

    python tools/model_converters/sn2mm.py \\
        resnet50v1_sn_8x2.pth checkpoints/resnet50_sn_8x2_mm.pth
"""
import argparse
import os
import os.path as osp
import re
import sys
import tempfile
from collections import OrderedDict

import torch

DEPTH_BY_LAYER3_BLOCKS = {6: 50, 23: 101}
SN_KEYS = ('weight', 'bias', 'running_mean', 'running_var', 'mean_weight',
           'var_weight')
CLASSIFIER_PREFIX = 'fc.'


class ConversionError(Exception):
    """The source is not a released v1 SN ResNet checkpoint we can convert."""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Convert a released SN ImageNet checkpoint (authors\' '
        'PyTorch code) into an mmengine checkpoint for mmdet/mmseg ResNet '
        'backbones with norm_cfg=dict(type="SN").')
    parser.add_argument('src', help='released checkpoint (.pth / .pth.tar)')
    parser.add_argument('dst', help='where to write the converted checkpoint')
    parser.add_argument('--force', action='store_true',
                        help='overwrite DST if it exists')
    parser.add_argument(
        '--allow-pickle', action='store_true',
        help='load SRC with weights_only=False: only for a file you trust '
        'whose extra entries (optimizer, ...) torch refuses to load safely')
    return parser.parse_args(argv)


def load_released(path, allow_pickle=False):
    if not osp.isfile(path):
        raise ConversionError(f'{path}: no such file')
    try:
        ckpt = torch.load(path, map_location='cpu',
                          weights_only=not allow_pickle)
    except Exception as e:  # torch raises several types for a bad file
        hint = ('' if allow_pickle else
                ' (if it is a checkpoint you trust whose extra entries torch '
                'refuses under weights_only=True, retry with --allow-pickle)')
        raise ConversionError(
            f'{path} is not a loadable checkpoint: '
            f'{type(e).__name__}: {str(e).splitlines()[0]}{hint}')
    if isinstance(ckpt, dict) and 'state_dict' in ckpt:
        state = ckpt['state_dict']
    elif isinstance(ckpt, dict):
        state = ckpt
    else:
        raise ConversionError(
            f'{path} holds a {type(ckpt).__name__}, not a checkpoint dict')
    if not isinstance(state, dict) or not all(
            isinstance(v, torch.Tensor) for v in state.values()):
        raise ConversionError(f'{path}: its state_dict is not a dict of '
                              'tensors')
    return OrderedDict(
        (k[len('module.'):] if k.startswith('module.') else k, v)
        for k, v in state.items())


def sn_layers(state):
    """Names of the SN layers (those with mean_weight), in file order."""
    return [k[:-len('.mean_weight')] for k in state
            if k.endswith('.mean_weight')]


def check_layout(state, layers):
    """Refuse what mmdet/mmseg's v1 ResNet cannot take, naming why."""
    if not layers:
        raise ConversionError(
            'no SN layers found (no key ends in ".mean_weight"): this is not '
            'an SN checkpoint')
    num_logits = {state[f'{n}.mean_weight'].numel() for n in layers}
    if len(num_logits) != 1 or num_logits - {2, 3}:
        raise ConversionError(
            f'SN layers have {sorted(num_logits)} ratio logits; expected 3 '
            '(IN, LN, BN) everywhere, or 2 (IN, LN) everywhere')
    using_bn = num_logits == {3}
    for name in layers:
        c = state[f'{name}.weight'].numel()
        expected = {'weight': [(1, c, 1, 1), (c, )],
                    'bias': [(1, c, 1, 1), (c, )],
                    'mean_weight': [(3 if using_bn else 2, )],
                    'var_weight': [(3 if using_bn else 2, )]}
        if using_bn:
            expected['running_mean'] = [(1, c, 1), (c, )]
            expected['running_var'] = [(1, c, 1), (c, )]
        for key, shapes in expected.items():
            full = f'{name}.{key}'
            if full not in state:
                raise ConversionError(f'SN layer {name} has no {key}')
            if tuple(state[full].shape) not in shapes:
                raise ConversionError(
                    f'{full} has shape {tuple(state[full].shape)}, expected '
                    f'one of {shapes}')
        # v1 ResNet: snK normalises convK's output. A pre-activation (v2)
        # network normalises convK's input instead.
        conv = re.sub(r'sn(\d)$', r'conv\1', name)
        if conv != name and f'{conv}.weight' in state:
            out_c, in_c = state[f'{conv}.weight'].shape[:2]
            if c != out_c:
                kind = ('a pre-activation (v2) ResNet: it normalises '
                        f'{conv}\'s input' if c == in_c else 'unexpected')
                raise ConversionError(
                    f'{name} has {c} channels but {conv} outputs {out_c}: '
                    f'{kind}. Only v1 ResNets (ResNet50v1+SN, '
                    'ResNet101v1+SN) fit mmdet/mmseg\'s ResNet')
    return using_bn


def convert(state):
    layers = sn_layers(state)
    using_bn = check_layout(state, layers)
    blocks = {int(m.group(1)) for k in state
              for m in [re.match(r'layer3\.(\d+)\.', k)] if m}
    depth = DEPTH_BY_LAYER3_BLOCKS.get(len(blocks))
    if depth is None:
        raise ConversionError(
            f'layer3 has {len(blocks)} blocks; expected 6 (ResNet-50) or 23 '
            '(ResNet-101)')
    sn_set = set(layers)
    converted, dropped = OrderedDict(), []
    for key, value in state.items():
        if key.startswith(CLASSIFIER_PREFIX):
            dropped.append(key)
            continue
        layer, _, leaf = key.rpartition('.')
        if layer in sn_set and leaf in ('weight', 'bias', 'running_mean',
                                        'running_var'):
            value = value.reshape(-1)
        converted[key] = value.clone()
    return converted, dict(depth=depth, using_bn=using_bn,
                           num_sn_layers=len(layers), dropped=dropped)


def verify_loads(state, depth, using_bn):
    """Load strictly into mmdet's ResNet: the converted file is checked
    against the model it is meant for, not only against our expectations."""
    import sn_mm  # noqa: F401  (registers SN)
    from mmdet.models.backbones import ResNet
    model = ResNet(depth=depth, style='pytorch',
                   norm_cfg=dict(type='SN', using_bn=using_bn))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ConversionError(
            f'the converted weights do not fit mmdet ResNet-{depth}: {e}')


def write_atomically(obj, dst, force):
    if osp.exists(dst) and not force:
        raise ConversionError(f'{dst} exists; pass --force to overwrite it')
    os.makedirs(osp.dirname(osp.abspath(dst)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=osp.dirname(osp.abspath(dst)),
                               suffix='.part')
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, dst)
    finally:
        if osp.exists(tmp):
            os.remove(tmp)


def main(argv=None):
    args = parse_args(argv)
    try:
        if osp.exists(args.dst) and not args.force:
            raise ConversionError(
                f'{args.dst} exists; pass --force to overwrite it')
        state = load_released(args.src, args.allow_pickle)
        converted, info = convert(state)
        verify_loads(converted, info['depth'], info['using_bn'])
        norm_cfg = ("dict(type='SN')" if info['using_bn'] else
                    "dict(type='SN', using_bn=False)")
        write_atomically(
            dict(state_dict=converted,
                 meta=dict(source=osp.basename(args.src),
                           converter='sn_mm/tools/model_converters/sn2mm.py',
                           depth=info['depth'], using_bn=info['using_bn'])),
            args.dst, args.force)
    except ConversionError as e:
        print(f'sn2mm: error: {e}', file=sys.stderr)
        return 1
    print(f'Converted ResNet-{info["depth"]} with {info["num_sn_layers"]} SN '
          f'layers ({len(converted)} tensors) to {args.dst}')
    if info['dropped']:
        print(f'Dropped the classifier: {", ".join(info["dropped"])}')
    print(f'Use it with: norm_cfg={norm_cfg}, and '
          f"init_cfg=dict(type='Pretrained', checkpoint='{args.dst}')")
    return 0


if __name__ == '__main__':
    sys.exit(main())
