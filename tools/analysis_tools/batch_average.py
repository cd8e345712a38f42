#!/usr/bin/env python
"""Re-estimate SN's BN statistics of a trained model by batch average.

The paper's inference (Sec. 3): freeze the network, feed K training batches
with SN layers in training-statistics mode, and set each SN layer's running
mean and variance to the average over them. No parameter and no other buffer
changes. The checkpoint is loaded with weights_only=False (mmengine training
checkpoints need it): use it on checkpoints you trust.

Example::

    python tools/analysis_tools/batch_average.py CONFIG \\
        work_dirs/x/iter_160.pth --num-batches 50 \\
        --out work_dirs/x/iter_160_batch_average.pth
"""
import argparse
import os.path as osp
import sys

import torch
from mmengine.config import DictAction
from mmengine.registry import init_default_scope
from mmengine.runner import Runner

import sn_mm  # noqa: F401
from sn_mm import SwitchableNorm, revert_sync_sn
from sn_mm.cli import load_config
from sn_mm.engine import BatchAverageProgress, sn_batch_average


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        'config',
        help='the config the model was trained '
        'with (its train_dataloader supplies the batches)')
    parser.add_argument('checkpoint', help='trained checkpoint')
    parser.add_argument(
        '--num-batches',
        type=int,
        default=100,
        help='training batches to average over (default 100)')
    parser.add_argument('--out', required=True, help='new checkpoint file')
    parser.add_argument(
        '--force', action='store_true', help='overwrite --out if it exists')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config entries, key=value')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.num_batches < 1:
        sys.exit(f'--num-batches must be >= 1, got {args.num_batches}')
    if osp.exists(args.out) and not args.force:
        sys.exit(f'{args.out} exists; pass --force to overwrite it')
    cfg = load_config(args.config, cfg_options=args.cfg_options)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    from mmengine.registry import MODELS
    model = revert_sync_sn(MODELS.build(cfg.model))
    checkpoint = torch.load(
        args.checkpoint, map_location='cpu', weights_only=False)
    state = checkpoint.get('state_dict', checkpoint)
    model.load_state_dict(state, strict=True)
    if not any(
            isinstance(m, SwitchableNorm) and m.using_bn
            for m in model.modules()):
        sys.exit(f'{args.checkpoint} has no SN layer with a BN branch: '
                 'nothing to average')

    loader = Runner.build_dataloader(cfg.train_dataloader)
    seen = sn_batch_average(
        model,
        loader,
        model.test_step,
        args.num_batches,
        progress=BatchAverageProgress(
            args.num_batches, log=lambda line: print(line, flush=True)))
    checkpoint = dict(checkpoint) if 'state_dict' in checkpoint else {}
    checkpoint['state_dict'] = model.state_dict()
    meta = dict(checkpoint.get('meta') or {})
    meta['sn_batch_average'] = dict(
        num_batches=seen, source=osp.basename(args.checkpoint))
    checkpoint['meta'] = meta
    torch.save(checkpoint, args.out)
    print(f'Averaged the BN statistics of every SN layer over {seen} '
          f'training batches; wrote {args.out}')


if __name__ == '__main__':
    main()
