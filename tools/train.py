#!/usr/bin/env python
"""Train a detector or segmentor (mmdet or mmseg config) with SN available.

The flags are mmdet's and mmseg's own. Examples::

    python tools/train.py configs/toy/mask-rcnn_r18-sn_fpn_sn-head_toy-coco.py
    python tools/train.py CONFIG --resume            # latest in --work-dir
    python tools/train.py CONFIG --resume work_dirs/x/iter_200.pth
    bash tools/dist_train.sh CONFIG 8                 # 8 GPUs
"""
import argparse

import torch

import sn_mm  # noqa: F401  (registers SN, SyncSN, hooks, constructors)
from sn_mm.cli import (build_runner, end_distributed, load_config,
                       parse_tool_args)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config', help='train config file')
    parser.add_argument(
        '--amp',
        action='store_true',
        help='automatic mixed precision: on GPUs mmengine\'s '
        'AmpOptimWrapper (float16 with dynamic loss scaling, or '
        '--amp-dtype bfloat16); on the CPU bfloat16 (BF16OptimWrapper)')
    parser.add_argument(
        '--amp-dtype',
        choices=['float16', 'bfloat16'],
        help='the --amp dtype (default: float16 on GPUs; the CPU runs '
        'bfloat16 only)')
    parser.add_argument(
        '--auto-scale-lr',
        action='store_true',
        help='scale the LR by the actual total batch size '
        '(the config\'s auto_scale_lr.base_batch_size)')
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='resume from this checkpoint, or, with no value, from the '
        'latest one in the work dir')
    return parse_tool_args(parser, argv)


def use_amp(cfg, dtype=None):
    """Mixed precision as mmdet's --amp sets it on GPUs; bfloat16 on the
    CPU, where mmengine's AmpOptimWrapper does not run."""
    if torch.cuda.is_available():
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.loss_scale = 'dynamic'
        if dtype is not None:
            cfg.optim_wrapper.dtype = dtype
    elif dtype == 'float16':
        raise SystemExit('--amp-dtype float16: the CPU runs bfloat16 only')
    else:
        cfg.optim_wrapper.type = 'BF16OptimWrapper'


def main(argv=None):
    args = parse_args(argv)
    cfg = load_config(args.config, args.work_dir, args.cfg_options,
                      args.launcher)
    if args.amp:
        use_amp(cfg, args.amp_dtype)
    elif args.amp_dtype:
        raise SystemExit('--amp-dtype: add --amp')
    if args.auto_scale_lr:
        if 'base_batch_size' not in cfg.get('auto_scale_lr', {}):
            raise SystemExit('--auto-scale-lr: the config has no '
                             'auto_scale_lr.base_batch_size')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        cfg.resume, cfg.load_from = True, args.resume
    build_runner(cfg).train()
    end_distributed()


if __name__ == '__main__':
    main()
