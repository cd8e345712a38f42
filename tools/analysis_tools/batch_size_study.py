#!/usr/bin/env python
"""The batch-size effect on our own data: BN versus SN at 1 and 8 images.

Trains the toy Mask R-CNN (configs/toy) from the same seeded start with each
norm layer and each batch size, all runs seeing the same number of images
(the LR and warm-up scale linearly with the batch, from the config's 4), then
prints each run's model-average BN ratio (mean and variance; SN only) and
final bbox AP on the toy val split. The paper (Fig. 3) finds SN moves weight
from BN to IN/LN as the batch shrinks and holds up where BN collapses.

Example (about 15 minutes on 2 CPU cores, after `make demo` made the data)::

    python tools/analysis_tools/batch_size_study.py --images 480
"""
import argparse
import os.path as osp

import sn_mm  # noqa: F401
from sn_mm.analysis import average_ratios, sn_ratios
from sn_mm.cli import build_runner, load_config

DEFAULT_CONFIG = osp.join(
    osp.dirname(__file__), '..', '..', 'configs', 'toy',
    'mask-rcnn_r18-sn_fpn_sn-head_toy-coco.py')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--config',
        default=DEFAULT_CONFIG,
        help='toy detection config (SN everywhere)')
    parser.add_argument(
        '--images',
        type=int,
        default=480,
        help='training images each run sees (default 480)')
    parser.add_argument('--batch-sizes', type=int, nargs='+', default=[1, 8])
    parser.add_argument(
        '--norms', nargs='+', default=['BN', 'SN'], choices=['BN', 'SN', 'GN'])
    parser.add_argument('--work-dir', default='work_dirs/batch_size_study')
    parser.add_argument('--seed', type=int, default=0)
    return parser.parse_args(argv)


def study_config(args, norm, batch_size):
    cfg = load_config(
        args.config,
        work_dir=osp.join(args.work_dir, f'{norm.lower()}_b{batch_size}'))
    norm_cfg = dict(type=norm, requires_grad=True)
    if norm == 'GN':
        norm_cfg['num_groups'] = 32
    model = cfg.model
    for part in (model.backbone, model.neck, model.roi_head.bbox_head,
                 model.roi_head.mask_head):
        part.norm_cfg = norm_cfg
    base_batch = cfg.train_dataloader.batch_size
    iters = max(args.images // batch_size, 1)
    cfg.train_dataloader.batch_size = batch_size
    cfg.optim_wrapper.optimizer.lr *= batch_size / base_batch
    warmup = cfg.param_scheduler[0]
    warmup.end = max(int(warmup.end * base_batch / batch_size), 1)
    cfg.param_scheduler[1].end = iters
    cfg.param_scheduler[1].milestones = [int(iters * 0.75), int(iters * 0.9)]
    cfg.train_cfg.max_iters = iters
    cfg.train_cfg.val_interval = iters
    cfg.default_hooks.checkpoint.interval = iters
    cfg.default_hooks.logger.interval = max(iters // 10, 1)
    # Same start for every batch size of a norm: seeded initialisation.
    cfg.randomness = dict(seed=args.seed)
    cfg.custom_hooks = []
    return cfg, iters


def main(argv=None):
    args = parse_args(argv)
    rows = []
    for norm in args.norms:
        for batch_size in args.batch_sizes:
            cfg, iters = study_config(args, norm, batch_size)
            runner = build_runner(cfg)
            model = runner.train()
            bbox_ap = runner.message_hub.get_scalar(
                'val/coco/bbox_mAP').current()
            ratios = sn_ratios(model)
            avg = average_ratios(ratios) if ratios else None
            rows.append((norm, batch_size, iters, avg, bbox_ap))

    print(f'\nBatch-size study: {args.images} training images per run, '
          'toy COCO val split')
    print(f'{"norm":<5} {"batch":>5} {"iters":>6} {"BN ratio (mean)":>16} '
          f'{"BN ratio (var)":>15} {"bbox AP":>8}')
    for norm, batch_size, iters, avg, bbox_ap in rows:
        mean_bn = f'{avg["mean"]["bn"]:.3f}' if avg else '-'
        var_bn = f'{avg["var"]["bn"]:.3f}' if avg else '-'
        print(f'{norm:<5} {batch_size:>5} {iters:>6} {mean_bn:>16} '
              f'{var_bn:>15} {bbox_ap:>8.3f}')
    return rows


if __name__ == '__main__':
    main()
