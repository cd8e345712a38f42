#!/usr/bin/env python
"""Test a trained detector or segmentor (mmdet or mmseg config) with SN.

The checkpoint is loaded with ``weights_only=False`` (mmengine's own training
checkpoints need it under torch >= 2.6): test checkpoints you trust, as with
any pickle. On one process, SyncSN layers are turned into SN layers
(:class:`sn_mm.engine.SNRunner` does it, as mmengine does for SyncBN).

Examples::

    python tools/test.py CONFIG work_dirs/NAME/iter_300.pth
    python tools/test.py CONFIG CKPT --tta            # multi-scale testing
    bash tools/dist_test.sh CONFIG CKPT 8
"""
import argparse
import os

import sn_mm  # noqa: F401  (registers SN, SyncSN, hooks, constructors)
from sn_mm.cli import (build_runner, end_distributed, load_config,
                       parse_tool_args)
from sn_mm.engine import trusted_torch_load

# mmdet's CocoMetric returns nothing when the model predicted no box on the
# whole test set (e.g. after a few training iterations); say why.
NO_METRICS = ('No metrics: the model made no prediction on the test set '
              '(an untrained or barely trained model?)')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config', help='test config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument(
        '--out', help='dump the raw predictions to this '
        '.pkl file')
    parser.add_argument(
        '--tta',
        action='store_true',
        help='test-time augmentation (the config\'s '
        'tta_model and tta_pipeline)')
    parser.add_argument(
        '--show-dir',
        help='save drawn predictions under '
        'this folder of the work dir')
    parser.add_argument(
        '--fuse-conv-sn',
        action='store_true',
        help='fold SN layers with hard fixed ratios away '
        '(sn_mm.fuse_conv_sn) before testing')
    return parse_tool_args(parser, argv)


def main(argv=None):
    args = parse_args(argv)
    cfg = load_config(args.config, args.work_dir, args.cfg_options,
                      args.launcher)
    cfg.load_from = args.checkpoint
    if args.tta:
        if 'tta_model' not in cfg or 'tta_pipeline' not in cfg:
            raise SystemExit('--tta: the config defines no tta_model and '
                             'tta_pipeline')
        cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
        cfg.tta_model.module = cfg.model
        cfg.model = cfg.tta_model
    if args.show_dir:
        vis = cfg.default_hooks.visualization
        vis.draw = True
        if cfg.default_scope == 'mmdet':
            vis.test_out_dir = args.show_dir
        else:
            cfg.visualizer.save_dir = os.path.join(cfg.work_dir, args.show_dir)
    if args.out:
        dump = (
            dict(type='DumpDetResults', out_file_path=args.out)
            if cfg.default_scope == 'mmdet' else dict(
                type='DumpResults', out_file_path=args.out))
        evaluators = cfg.test_evaluator
        if not isinstance(evaluators, (list, tuple)):
            evaluators = [evaluators]
        cfg.test_evaluator = [*evaluators, dump]

    if args.fuse_conv_sn:
        cfg.custom_hooks = [
            *cfg.get('custom_hooks', []),
            dict(type='SNFuseHook')
        ]
    runner = build_runner(cfg)
    with trusted_torch_load():
        metrics = runner.test()
    if not metrics:
        print(NO_METRICS)
    end_distributed()


if __name__ == '__main__':
    main()
