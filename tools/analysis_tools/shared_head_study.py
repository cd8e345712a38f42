#!/usr/bin/env python
"""SN in a detection head shared across FPN levels: what the BN term's
running statistics do at test time.

RetinaNet's head (as FCOS's, ATSS's, GFL's) runs one stack of convs on every
FPN level. With SN there, training normalises each level by its own batch
statistics; one set of running statistics, updated by all levels in turn,
would normalise every level at test time with a blend of the levels'. This
study trains the toy RetinaNet (configs/toy) with each head norm from
the same seeded start and prints the toy val split's bbox AP:

- ``sn``: SN with its BN term; evaluated with each level's own running
  statistics (SNRunner's default for such heads, re-estimated by the
  config's batch average) and with one set, the levels' blended (what one
  set of running statistics holds), and the head outputs' largest
  difference between the two, per level, relative to the largest output;
- ``sn-nobn``: SN without the BN term (``using_bn=False``: IN and LN), which
  has no running statistics;
- ``gn``: GroupNorm (32 groups), the head's usual norm.

Example (about 1 minute a run on 2 idle CPU cores, after `make demo` made the
data)::

    python tools/analysis_tools/shared_head_study.py --seeds 0 1 2
"""
import argparse
import copy
import itertools
import os.path as osp
import statistics

import torch

import sn_mm  # noqa: F401
from sn_mm.cli import build_runner, load_config
from sn_mm.models import SwitchableNorm

DEFAULT_CONFIG = osp.join(
    osp.dirname(__file__), '..', '..', 'configs', 'toy',
    'retinanet_r18-sn_fpn_sn-head_toy-coco.py')
HEAD_NORMS = {
    'sn': dict(type='SN', requires_grad=True),
    'sn-nobn': dict(type='SN', using_bn=False, requires_grad=True),
    'gn': dict(type='GN', num_groups=32, requires_grad=True),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--config', default=DEFAULT_CONFIG)
    parser.add_argument(
        '--norms',
        nargs='+',
        default=list(HEAD_NORMS),
        choices=list(HEAD_NORMS))
    parser.add_argument('--seeds', type=int, nargs='+', default=[0])
    parser.add_argument('--work-dir', default='work_dirs/shared_head_study')
    return parser.parse_args(argv)


def head_layers(head):
    return [
        m for m in head.modules()
        if isinstance(m, SwitchableNorm) and m.num_levels > 1
    ]


def run(args, norm, seed):
    cfg = load_config(
        args.config, work_dir=osp.join(args.work_dir, f'{norm}_seed{seed}'))
    cfg.model.bbox_head.norm_cfg = HEAD_NORMS[norm]
    cfg.randomness = dict(seed=seed)
    runner = build_runner(cfg)
    model = runner.train()
    result = dict(
        as_trained=runner.message_hub.get_scalar(
            'val/coco/bbox_mAP').current())
    layers = head_layers(model.bbox_head)
    if norm != 'sn' or not layers:
        return result
    model.eval()
    # One set of statistics for all levels: set_levels(1) averages the
    # levels', which equals one batch average over every level's calls.
    blended = copy.deepcopy(model.bbox_head)
    for m in head_layers(blended):
        m.set_levels(1)
    gaps = []
    with torch.no_grad():
        for batch in itertools.islice(runner.val_dataloader, 4):
            data = model.data_preprocessor(batch, False)
            feats = model.extract_feat(data['inputs'])
            gaps.append(level_gaps(model.bbox_head(feats), blended(feats)))
    for m in layers:
        m.set_levels(1)
    result['blended'] = runner.val_loop.run()['coco/bbox_mAP']
    result['gaps'] = [max(level) for level in zip(*gaps)]
    return result


def level_gaps(own, mixed):
    """Per level: the largest difference of the head's classification and
    box outputs with one blended set of statistics (``mixed``) from those
    with the level's own (``own``), relative to the largest output."""
    return [
        max(
            float((mixed[i][k] - own[i][k]).abs().max() /
                  own[i][k].abs().max()) for i in (0, 1))
        for k in range(len(own[0]))
    ]


def main(argv=None):
    args = parse_args(argv)
    results = {
        norm: [run(args, norm, seed) for seed in args.seeds]
        for norm in args.norms
    }
    print(f'\nShared-head study: toy RetinaNet, head norm by row, seeds '
          f'{args.seeds}; bbox AP on the toy val split (mean, then each '
          'seed)')
    for norm, runs in results.items():
        rows = [('as trained', [r['as_trained'] for r in runs])]
        if norm == 'sn':
            rows = [('each level\'s own statistics', rows[0][1]),
                    ('one set, the levels\' blended',
                     [r['blended'] for r in runs])]
        for what, values in rows:
            each = ' '.join(f'{v:.3f}' for v in values)
            print(f'{norm:<8} {what:<36} {statistics.mean(values):.3f}  '
                  f'({each})')
    if 'sn' in results:
        gaps = [
            max(level) for level in zip(*(r['gaps'] for r in results['sn']))
        ]
        print('sn head outputs, blended against per-level statistics, '
              'largest difference / largest value, P3..P7: ' +
              ' '.join(f'{g:.3f}' for g in gaps))
    return results


if __name__ == '__main__':
    main()
