#!/usr/bin/env python
"""Convert a released SN ImageNet checkpoint into an OpenMMLab backbone.

The authors' checkpoints (``torch.save``d dicts with ``state_dict``,
``epoch``, ``best_prec1``, ...) become mmengine checkpoints that load with
``strict=True``:

* v1 ResNets (ResNet50v1+SN, ResNet101v1+SN) into mmdet's and mmseg's
  ``ResNet(depth=50 or 101, norm_cfg=dict(type='SN'))``;
* pre-activation v2 ResNets (ResNet50v2+SN, ResNet101v2+SN) into sn_mm's
  ``PreActResNet(depth=50 or 101, norm_cfg=dict(type='SN'))``;
* Sparse SN v1 ResNets (ResNet50v1+SSN, Shao et al., CVPR 2019: the same
  layout with the buffers ``mean_fixed``, ``var_fixed`` and ``radius``; a
  fixed layer's ``mean_weight``/``var_weight`` hold its one-hot ratio vector
  itself) into the same backbones, each layer carrying its ratios as fixed
  ratios (``ratio_fixed``/``fixed_ratios``). A layer that is not fixed is
  refused unless ``--allow-unfixed``: its SparsestMax ratios at the stored
  radius are then fixed as they are.

The tool detects v1 or v2 and the depth from the keys, prints what it found
and the backbone config to use. The classifier is dropped; SN parameters are
reshaped from (1, C, 1, 1) / (1, C, 1) to (C,).

Example::

    python tools/model_converters/sn2mm.py \\
        'ResNet50v1+SN(8,32)-76.92.pth' checkpoints/resnet50_sn_8x32_mm.pth
    python tools/model_converters/sn2mm.py \\
        'ResNet101v2+SN(8,32).pth' checkpoints/resnet101v2_sn_8x32_mm.pth

(The authors' file names; docs/configs_and_checkpoints.md lists them.)
"""
import argparse
import os
import os.path as osp
import re
import sys
import tempfile
from collections import OrderedDict

import torch

# Blocks per stage -> depth, for bottleneck (conv3) and basic-block nets.
BOTTLENECK_DEPTHS = {(3, 4, 6, 3): 50, (3, 4, 23, 3): 101, (3, 8, 36, 3): 152}
BASIC_DEPTHS = {(2, 2, 2, 2): 18, (3, 4, 6, 3): 34}
SN_KEYS = ('weight', 'bias', 'running_mean', 'running_var', 'mean_weight',
           'var_weight')
SSN_KEYS = ('mean_fixed', 'var_fixed', 'radius')
CLASSIFIER_PREFIX = 'fc.'


class ConversionError(Exception):
    """The source is not a released SN ResNet checkpoint we can convert."""


def add_common_args(parser):
    """SRC, DST, --force and --allow-pickle: what every converter of
    released checkpoints takes (this one and sw2mm.py)."""
    parser.add_argument('src', help='released checkpoint (.pth / .pth.tar)')
    parser.add_argument('dst', help='where to write the converted checkpoint')
    parser.add_argument(
        '--force', action='store_true', help='overwrite DST if it exists')
    parser.add_argument(
        '--allow-pickle',
        action='store_true',
        help='load SRC with weights_only=False: only for a file you trust '
        'whose extra entries (optimizer, ...) torch refuses to load safely')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Convert a released SN ImageNet checkpoint (authors\' '
        'PyTorch code) into an mmengine checkpoint for mmdet/mmseg ResNet '
        'backbones with norm_cfg=dict(type="SN").')
    add_common_args(parser)
    parser.add_argument(
        '--allow-unfixed',
        action='store_true',
        help='Sparse SN checkpoints: convert layers whose ratios are not yet '
        'fixed (one-hot), fixing their SparsestMax ratios at the stored '
        'radius; without it such a layer is refused')
    return parser.parse_args(argv)


def load_released(path, allow_pickle=False):
    if not osp.isfile(path):
        raise ConversionError(f'{path}: no such file')
    try:
        ckpt = torch.load(
            path, map_location='cpu', weights_only=not allow_pickle)
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
    return [
        k[:-len('.mean_weight')] for k in state if k.endswith('.mean_weight')
    ]


def is_preactivation(state, layers):
    """v2: each block's sn1 normalises conv1's input (in a v1 ResNet, snK
    normalises convK's output), and an sn_out follows the last stage."""
    if 'sn_out.weight' in state:
        return True
    for name in layers:
        m = re.match(r'(layer\d+\.\d+)\.sn1$', name)
        conv = f'{m.group(1)}.conv1.weight' if m else None
        if conv in state:
            c = state[f'{name}.weight'].numel()
            out_c, in_c = state[conv].shape[:2]
            if in_c != out_c:  # otherwise this block cannot tell
                return c == in_c
    return False


def check_layout(state, layers, preact):
    """Refuse what the target backbone cannot take, naming why."""
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
        expected = {
            'weight': [(1, c, 1, 1), (c, )],
            'bias': [(1, c, 1, 1), (c, )],
            'mean_weight': [(3 if using_bn else 2, )],
            'var_weight': [(3 if using_bn else 2, )]
        }
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
        # Blocks of a v1 ResNet: snK normalises convK's output; of a v2
        # one: convK's input. (Both stems normalise conv1's output.)
        conv = re.sub(r'sn(\d)$', r'conv\1', name)
        stem = name == 'sn1'
        if conv != name and f'{conv}.weight' in state and not stem:
            out_c, in_c = state[f'{conv}.weight'].shape[:2]
            want, what = (in_c, 'input') if preact else (out_c, 'output')
            if c != want:
                raise ConversionError(
                    f'{name} has {c} channels but {conv}\'s {what} has '
                    f'{want}: neither a v1 nor a v2 SN ResNet')
    if preact and not using_bn:
        raise ConversionError('a v2 ResNet without the BN branch: no such '
                              'model was released, and none is supported')
    return using_bn


def stage_blocks(state):
    """Blocks per stage, from the keys."""
    counts = []
    for i in range(1, 5):
        blocks = {
            int(m.group(1))
            for k in state
            for m in [re.match(rf'layer{i}\.(\d+)\.', k)] if m
        }
        counts.append(len(blocks))
    return tuple(counts)


def sparse_sn_ratios(state, layers, allow_unfixed):
    """For a Sparse SN checkpoint: {layer: (2, K) fixed ratios}, its SSN
    buffers checked; None for an SN checkpoint."""
    ssn = [n for n in layers if f'{n}.mean_fixed' in state]
    if not ssn:
        return None
    if len(ssn) != len(layers):
        missing = sorted(set(layers) - set(ssn))[0]
        raise ConversionError(
            f'a Sparse SN checkpoint whose layer {missing} has no mean_fixed')
    from sn_mm.ops.sparsestmax import sparsestmax
    ratios, unfixed = {}, []
    for name in layers:
        for key, shape in (('mean_fixed', (1, )), ('var_fixed', (1, )),
                           ('radius', (1, ))):
            full = f'{name}.{key}'
            if full not in state:
                raise ConversionError(f'Sparse SN layer {name} has no {key}')
            if tuple(state[full].reshape(-1).shape) != shape:
                raise ConversionError(
                    f'{full} has shape {tuple(state[full].shape)}, expected '
                    f'{shape}')
        rows = []
        for stat in ('mean', 'var'):
            values = state[f'{name}.{stat}_weight'].double()
            if bool(state[f'{name}.{stat}_fixed'].reshape(-1)[0]):
                # SSN keeps the one-hot vector itself in the logits' place.
                if (values < 0).any() or abs(float(values.sum()) - 1) > 1e-6:
                    raise ConversionError(
                        f'{name}.{stat}_weight is marked fixed but holds '
                        f'{values.tolist()}, not a ratio vector')
                rows.append(values)
            else:
                unfixed.append(f'{name} ({stat})')
                radius = state[f'{name}.radius'].double().reshape(-1)[0]
                rows.append(sparsestmax(values, radius))
        ratios[name] = torch.stack(rows).float()
    if unfixed and not allow_unfixed:
        raise ConversionError(
            f'{len(unfixed)} Sparse SN ratio vectors are not fixed yet (a '
            f'model still in training?), e.g. {unfixed[0]}; pass '
            '--allow-unfixed to fix their SparsestMax ratios at the stored '
            'radius')
    return ratios, len(unfixed)


def convert(state, allow_unfixed=False):
    layers = sn_layers(state)
    preact = is_preactivation(state, layers)
    using_bn = check_layout(state, layers, preact)
    blocks = stage_blocks(state)
    bottleneck = any(k.endswith('.conv3.weight') for k in state)
    depth = (BOTTLENECK_DEPTHS if bottleneck else BASIC_DEPTHS).get(blocks)
    if depth is None:
        raise ConversionError(
            f'stages of {blocks} {"bottleneck" if bottleneck else "basic"} '
            'blocks: not a ResNet-18/34/50/101/152')
    if not preact and depth not in (50, 101):
        raise ConversionError(
            f'a v1 ResNet-{depth}: only v1 ResNet-50 and ResNet-101 (the '
            'released models) are converted for mmdet/mmseg\'s ResNet')
    sparse = sparse_sn_ratios(state, layers, allow_unfixed)
    sn_set = set(layers)
    converted, dropped = OrderedDict(), []
    for key, value in state.items():
        if key.startswith(CLASSIFIER_PREFIX):
            dropped.append(key)
            continue
        layer, _, leaf = key.rpartition('.')
        if layer in sn_set and leaf in SSN_KEYS:
            continue  # replaced by the fixed ratios below
        if layer in sn_set and leaf in ('weight', 'bias', 'running_mean',
                                        'running_var'):
            value = value.reshape(-1)
        converted[key] = value.clone()
        if sparse is not None and layer in sn_set and leaf == 'var_weight':
            converted[f'{layer}.ratio_fixed'] = torch.ones(2, dtype=torch.bool)
            converted[f'{layer}.fixed_ratios'] = sparse[0][layer]
    return converted, dict(
        depth=depth,
        using_bn=using_bn,
        preact=preact,
        num_sn_layers=len(layers),
        dropped=dropped,
        sparse=sparse is not None,
        unfixed=sparse[1] if sparse else 0)


def verify_loads(state, depth, using_bn, preact):
    """Load strictly into the backbone it is meant for (mmdet's ResNet for
    v1, sn_mm's PreActResNet for v2): the converted file is checked against
    that model, not only against our expectations."""
    import sn_mm  # noqa: F401  (registers SN)
    norm_cfg = dict(type='SN', using_bn=using_bn)
    if preact:
        model = sn_mm.PreActResNet(depth=depth, norm_cfg=norm_cfg)
        name = f'PreActResNet-{depth}'
    else:
        from mmdet.models.backbones import ResNet
        model = ResNet(depth=depth, style='pytorch', norm_cfg=norm_cfg)
        name = f'mmdet ResNet-{depth}'
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ConversionError(f'the converted weights do not fit {name}: {e}')


def backbone_config(info, dst):
    norm_cfg = ("dict(type='SN')"
                if info['using_bn'] else "dict(type='SN', using_bn=False)")
    init = f"init_cfg=dict(type='Pretrained', checkpoint='{dst}')"
    if info['preact']:
        return (f"backbone=dict(type='PreActResNet', depth={info['depth']}, "
                f"norm_cfg={norm_cfg}, norm_eval=False, {init})")
    return (f"backbone=dict(type='ResNet', depth={info['depth']}, "
            f"style='pytorch', norm_cfg={norm_cfg}, norm_eval=False, {init})")


def write_atomically(obj, dst, force):
    if osp.exists(dst) and not force:
        raise ConversionError(f'{dst} exists; pass --force to overwrite it')
    os.makedirs(osp.dirname(osp.abspath(dst)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        dir=osp.dirname(osp.abspath(dst)), suffix='.part')
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
        converted, info = convert(state, args.allow_unfixed)
        verify_loads(converted, info['depth'], info['using_bn'],
                     info['preact'])
        norm_cfg = ("dict(type='SN')"
                    if info['using_bn'] else "dict(type='SN', using_bn=False)")
        write_atomically(
            dict(
                state_dict=converted,
                meta=dict(
                    source=osp.basename(args.src),
                    converter='sn_mm/tools/model_converters/sn2mm.py',
                    depth=info['depth'],
                    using_bn=info['using_bn'],
                    preactivation=info['preact'],
                    sparse_sn=info['sparse'])), args.dst, args.force)
    except ConversionError as e:
        print(f'sn2mm: error: {e}', file=sys.stderr)
        return 1
    kind = 'v2 (pre-activation)' if info['preact'] else 'v1'
    what = 'Sparse SN' if info['sparse'] else 'SN'
    print(f'Found a {kind} ResNet-{info["depth"]} with '
          f'{info["num_sn_layers"]} {what} layers')
    if info['sparse']:
        print('Every layer carries its ratios as fixed ratios' +
              (f' ({info["unfixed"]} ratio vectors were not fixed: their '
               'SparsestMax ratios at the stored radius are now)'
               if info['unfixed'] else ' (all were one-hot)'))
    print(f'Converted it ({len(converted)} tensors) to {args.dst}')
    if info['dropped']:
        print(f'Dropped the classifier: {", ".join(info["dropped"])}')
    print(f'Use it with: norm_cfg={norm_cfg}, and')
    print(f'  {backbone_config(info, args.dst)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
