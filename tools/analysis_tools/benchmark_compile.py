#!/usr/bin/env python
"""Time eager vs ``torch.compile`` steps of the toy models with SN.

For the toy DeepLabV3 (the whole network, to the logits, with a
cross-entropy loss) and the toy Mask R-CNN (backbone and FPN, with a squared
output as loss; mmdet's heads and post-processing branch on data and are
left out): the median time of a training step (forward and
backward) and of an eval forward, eager and compiled, and the time of the
first compiled step (compilation included). Under ``torch.compile`` SN runs
as plain PyTorch ops that the compiler fuses; eager SN runs its native
kernels.

Example::

    python tools/analysis_tools/benchmark_compile.py --repeats 7
"""
import argparse
import os.path as osp
import time

import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.registry import DefaultScope

import sn_mm  # noqa: F401
from sn_mm.testing.timing import median_time

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def build(config, scope):
    cfg = Config.fromfile(osp.join(ROOT, 'configs', 'toy', config))
    with DefaultScope.overwrite_default_scope(scope):
        if scope == 'mmseg':
            from mmseg.registry import MODELS
        else:
            from mmdet.registry import MODELS
        return MODELS.build(cfg.model)


def warm_median(fn, repeats):
    fn()  # warm-up (and, compiled, the compilation)
    return median_time(fn, repeats)


def measure(name, net_module, net, loss_fn, x, repeats, backend):
    """``net`` (a call of ``net_module``) eager and compiled."""
    results = {}
    for mode in ('eager', 'compiled'):
        fn = net if mode == 'eager' else torch.compile(net, backend=backend)
        net_module.train()
        start = time.perf_counter()
        loss_fn(fn(x)).backward()
        first = time.perf_counter() - start
        train = warm_median(lambda: loss_fn(fn(x)).backward(), repeats)
        net_module.eval()
        with torch.no_grad():
            infer = warm_median(lambda: fn(x), repeats)
        results[mode] = (train, infer, first)
    (te, ie, _), (tc, ic, first) = results['eager'], results['compiled']
    print(f'| {name} | {tuple(x.shape)} | {te * 1e3:.1f} | {tc * 1e3:.1f} | '
          f'{tc / te:.2f} | {ie * 1e3:.1f} | {ic * 1e3:.1f} | {ic / ie:.2f} '
          f'| {first:.1f} |')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument(
        '--size',
        type=int,
        default=None,
        help='input side (default: 96 seg, 128 det)')
    parser.add_argument(
        '--backend',
        default='inductor',
        help='torch.compile backend (default: inductor)')
    parser.add_argument(
        '--model',
        choices=['all', 'deeplabv3', 'mask-rcnn'],
        default='all',
        help='which toy model to time (default: both)')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(0)
    print(f'torch {torch.__version__}, {torch.get_num_threads()} threads, '
          f'backend {args.backend}, median of {args.repeats}\n')
    print('| model | input | train step eager ms | compiled ms | ratio | '
          'eval eager ms | compiled ms | ratio | first compiled step s |')
    print('|---|---|---|---|---|---|---|---|---|')
    if args.model in ('all', 'deeplabv3'):
        seg = build('deeplabv3_r18-sn-d8_toy-seg.py', 'mmseg')
        x = torch.randn(4, 3, args.size or 96, args.size or 96)
        side = (args.size or 96) // 8
        target = torch.randint(0, 5, (4, side, side))
        measure('DeepLabV3 R18-D8 (toy)', seg, lambda x: seg(x, mode='tensor'),
                lambda out: F.cross_entropy(out, target), x, args.repeats,
                args.backend)
    if args.model in ('all', 'mask-rcnn'):
        det = build('mask-rcnn_r18-sn_fpn_sn-head_toy-coco.py', 'mmdet')
        x = torch.randn(4, 3, args.size or 128, args.size or 128)
        measure('Mask R-CNN R18-FPN backbone+neck (toy)', det,
                det.extract_feat, lambda out: sum((o * o).mean() for o in out),
                x, args.repeats, args.backend)


if __name__ == '__main__':
    main()
