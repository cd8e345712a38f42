#!/usr/bin/env python
"""Convert a released Switchable Whitening ImageNet checkpoint into an
OpenMMLab backbone.

The authors' SW ResNets (``XingangPan/Switchable-Whitening``: ResNet-50 and
ResNet-101, SW at the stem and at the second norm of every other bottleneck
of the first three stages, BN elsewhere) become mmengine checkpoints that
load with ``strict=True`` into ``SWResNet`` (sn_mm's: the config scope's
ResNet with SW where the authors have it):

* ``--to mmdet`` or ``--to mmseg`` (default mmdet): the backbone's weights,
  the classifier dropped;
* ``--to mmpretrain``: an ``ImageClassifier``'s, ``backbone.*`` and the
  classifier as ``head.fc.*``.

The tool reads the depth, ``sw_type``, ``num_pergroup``, tied weights and
which stages have SW from the keys, refuses a layout other than the
authors' and ``sw_type=5`` (whose release formula SW does not compute),
checks the result loads into the OpenMMLab model, and prints the backbone
config to use (``T`` and the momentum are not stored in a checkpoint: the
release trains with 5 Newton steps and its momentum 0.9, the running
value's weight, which is PyTorch's and SW's 0.1).

Example::

    python tools/model_converters/sw2mm.py resnet50_sw.pth \\
        checkpoints/resnet50_sw_mm.pth
    python tools/model_converters/sw2mm.py resnet50_sw.pth \\
        checkpoints/resnet50_sw_cls.pth --to mmpretrain
"""
import argparse
import os.path as osp
import sys
from collections import OrderedDict

# sn2mm.py, beside this file: the released checkpoints' common handling.
sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
import sn2mm  # noqa: E402

BOTTLENECK_DEPTHS = sn2mm.BOTTLENECK_DEPTHS
ConversionError = sn2mm.ConversionError


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Convert a released Switchable Whitening ImageNet '
        'checkpoint into an mmengine checkpoint for SWResNet backbones '
        '(mmdet, mmseg) or an mmpretrain ImageClassifier.')
    sn2mm.add_common_args(parser)
    parser.add_argument(
        '--to',
        choices=('mmdet', 'mmseg', 'mmpretrain'),
        default='mmdet',
        help='the toolbox whose model it is for (default: mmdet)')
    return parser.parse_args(argv)


def sw_layers(state):
    """Names of the SW layers (those with sw_mean_weight), in file order."""
    return [
        k[:-len('.sw_mean_weight')] for k in state
        if k.endswith('.sw_mean_weight')
    ]


def read_layout(state):
    """Depth, sw_cfg and stage_with_sw from a released state dict; a
    ConversionError where the SW layers are not where the authors put
    them."""
    layers = sw_layers(state)
    if not layers:
        raise ConversionError('no SW layers (no key ends in '
                              '".sw_mean_weight"): not a released SW model')
    blocks = sn2mm.stage_blocks(state)
    depth = BOTTLENECK_DEPTHS.get(blocks)
    if depth is None or not any(k.endswith('.conv3.weight') for k in state):
        raise ConversionError(f'stages of {blocks} blocks: not a bottleneck '
                              'ResNet-50/101/152')
    first = layers[0]
    k = state[f'{first}.sw_mean_weight'].numel()
    # sw_type is the number of importance weights (2, 3 or 5).
    if k not in (2, 3, 5):
        raise ConversionError(f'{first}: {k} importance weights, expected '
                              '2, 3 or 5 (sw_type)')
    if k == 5:
        raise ConversionError(
            f'{first}: sw_type=5, which SW here computes otherwise than the '
            'release: the release weighs the BN and IN variances with the '
            'BW and IW covariance weights (var_weight[0] and [1]) instead '
            'of their own ([2] and [3]), so the converted model would not '
            'compute what the checkpoint was trained to (docs/'
            'layer_reference.md#switchable-whitening-sw-syncsw)')
    num_pergroup = state[f'{first}.running_cov'].shape[-1]
    tie = f'{first}.sw_var_weight' not in state
    stages = tuple(
        any(name.startswith(f'layer{i}.') for name in layers)
        for i in range(1, 5))
    expected = ['sw1'] + [
        f'layer{i + 1}.{b}.sw2' for i, with_sw in enumerate(stages) if with_sw
        for b in range(1, blocks[i], 2)
    ]
    if sorted(layers) != sorted(expected):
        raise ConversionError(
            'SW layers not where the authors\' ResNets have them (the stem '
            'and the second norm of blocks 1, 3, ... of a stage): found ' +
            ', '.join(sorted(set(layers) ^ set(expected))) +
            ' unlike that layout')
    for name in layers:
        if (state[f'{name}.sw_mean_weight'].numel() != k
                or state[f'{name}.running_cov'].shape[-1] != num_pergroup):
            raise ConversionError(f'{name}: sw_type or num_pergroup differs '
                                  f'from {first}\'s')
    # T and momentum are not stored: the release trains with T=5 and its
    # momentum 0.9, the running value's weight, which is PyTorch's 0.1.
    sw_cfg = dict(
        type='SW',
        num_pergroup=int(num_pergroup),
        sw_type=k,
        T=5,
        momentum=0.1)
    if tie:
        sw_cfg['tie_weight'] = True
    return dict(
        depth=depth,
        sw_cfg=sw_cfg,
        stage_with_sw=stages,
        num_sw_layers=len(layers))


def convert(state, to='mmdet'):
    """The converted state dict and the layout (:func:`read_layout`)."""
    info = read_layout(state)
    converted, dropped = OrderedDict(), []
    for key, value in state.items():
        if key.startswith('fc.'):
            if to == 'mmpretrain':
                converted[f'head.{key}'] = value.clone()
            else:
                dropped.append(key)
            continue
        prefix = 'backbone.' if to == 'mmpretrain' else ''
        converted[prefix + key] = value.clone()
    info['dropped'] = dropped
    return converted, info


def build_target(info, to):
    """The OpenMMLab model the checkpoint is for."""
    from importlib import import_module

    from mmengine.registry import DefaultScope

    import sn_mm  # noqa: F401  (registers SW and SWResNet)
    import_module(f'{to}.models')
    registry = import_module(f'{to}.registry').MODELS
    backbone = dict(
        type='SWResNet',
        depth=info['depth'],
        sw_cfg=info['sw_cfg'],
        stage_with_sw=info['stage_with_sw'])
    if to == 'mmpretrain':
        cfg = dict(
            type='ImageClassifier',
            backbone=backbone,
            neck=dict(type='GlobalAveragePooling'),
            head=dict(
                type='LinearClsHead', num_classes=1000, in_channels=2048))
    else:
        cfg = dict(backbone, style='pytorch')
    with DefaultScope.overwrite_default_scope(to):
        return registry.build(cfg)


def verify_loads(state, info, to):
    model = build_target(info, to)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ConversionError(
            f'the converted weights do not fit {to}\'s SWResNet-'
            f'{info["depth"]}: {e}')


def backbone_config(info, dst):
    stages = info['stage_with_sw']
    return (f"backbone=dict(type='SWResNet', depth={info['depth']}, "
            f"sw_cfg={info['sw_cfg']}, stage_with_sw={stages}, "
            f"norm_eval=False, init_cfg=dict(type='Pretrained', "
            f"checkpoint='{dst}'))")


def main(argv=None):
    args = parse_args(argv)
    try:
        if osp.exists(args.dst) and not args.force:
            raise ConversionError(
                f'{args.dst} exists; pass --force to overwrite it')
        state = sn2mm.load_released(args.src, args.allow_pickle)
        converted, info = convert(state, args.to)
        verify_loads(converted, info, args.to)
        sn2mm.write_atomically(
            dict(
                state_dict=converted,
                meta=dict(
                    source=osp.basename(args.src),
                    converter='sn_mm/tools/model_converters/sw2mm.py',
                    toolbox=args.to,
                    depth=info['depth'],
                    sw_cfg=info['sw_cfg'],
                    stage_with_sw=info['stage_with_sw'])), args.dst,
            args.force)
    except ConversionError as e:
        print(f'sw2mm: error: {e}', file=sys.stderr)
        return 1
    print(f'Found a ResNet-{info["depth"]} with {info["num_sw_layers"]} SW '
          f'layers ({info["sw_cfg"]})')
    print(f'Converted it ({len(converted)} tensors) for {args.to} to '
          f'{args.dst}')
    if info['dropped']:
        print(f'Dropped the classifier: {", ".join(info["dropped"])}')
    if args.to == 'mmpretrain':
        print('Use it as an ImageClassifier\'s load_from, its backbone:')
    else:
        print('Use it with:')
    print(f'  {backbone_config(info, args.dst)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
