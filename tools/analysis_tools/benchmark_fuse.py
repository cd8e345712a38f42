#!/usr/bin/env python
"""Benchmark eval forward of a ResNet-50 with hard SN ratios, before and
after ``fuse_conv_sn``, against BN after mmcv's ``fuse_conv_bn``.

mmdet's ResNet-50 with SN in every norm layer and hard fixed ratios, half of
the layers BN/BN (as the paper reports for hard-ratio networks) and the
other half cycling through the other eight (mean, variance) choices; the
same network with soft (learned) ratios; and with BN, its BN folded into the
convs. Prints median eval times, the ratios between them, and how far the
fused network's output is from the unfused one's.

Example::

    python tools/analysis_tools/benchmark_fuse.py --repeats 5
"""
import argparse
import itertools

import torch

import sn_mm  # noqa: F401
from sn_mm import SwitchableNorm, fuse_conv_sn
from sn_mm.testing.timing import median_times

OTHER_CHOICES = [
    c for c in itertools.product(('in', 'ln', 'bn'), repeat=2)
    if c != ('bn', 'bn')
]
ONE_HOT = {'in': [1., 0., 0.], 'ln': [0., 1., 0.], 'bn': [0., 0., 1.]}


def build(norm_cfg, seed=0):
    from mmdet.models.backbones import ResNet
    torch.manual_seed(seed)
    model = ResNet(
        depth=50, style='pytorch', norm_cfg=norm_cfg, norm_eval=False)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, SwitchableNorm):
                m.mean_weight.normal_()
                m.var_weight.normal_()
            if hasattr(m, 'running_var'):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
    model.eval()  # mmdet's ResNet.train() returns None
    return model


def make_hard(model):
    """Half the SN layers BN/BN, the rest cycling through the others."""
    layers = [m for m in model.modules() if isinstance(m, SwitchableNorm)]
    for i, m in enumerate(layers):
        mean, var = (('bn', 'bn') if i %
                     2 == 0 else OTHER_CHOICES[(i // 2) % len(OTHER_CHOICES)])
        m.fix_ratios(ONE_HOT[mean], ONE_HOT[var])
    return sum(i % 2 == 0 for i in range(len(layers))), len(layers)


def eval_times(models, x, repeats):
    """Median eval time of each model, every repeat timing all of them in
    turn (drift on the machine reaches all alike)."""
    with torch.no_grad():
        for model in models.values():
            model(x)  # warm-up
        return median_times(
            {
                name: lambda m=model: m(x)
                for name, model in models.items()
            }, repeats)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument(
        '--size',
        type=int,
        default=512,
        help='input height and width (default 512)')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    from mmcv.cnn import fuse_conv_bn
    x = torch.randn(
        args.batch,
        3,
        args.size,
        args.size,
        generator=torch.Generator().manual_seed(0))
    bn = fuse_conv_bn(build(dict(type='BN')))
    soft = build(dict(type='SN'))
    hard = build(dict(type='SN'))
    num_bn, num_layers = make_hard(hard)
    with torch.no_grad():
        reference = hard(x)
    fused = fuse_conv_sn(hard)
    with torch.no_grad():
        out = fused(x)
    err = max(
        float((a - b).abs().max() / b.abs().max())
        for a, b in zip(out, reference))
    times = eval_times(
        {
            'BN after fuse_conv_bn': bn,
            'SN, soft ratios': soft,
            'SN, hard ratios after fuse_conv_sn': fused,
        }, x, args.repeats)
    print(f'torch {torch.__version__}, {torch.get_num_threads()} threads, '
          f'ResNet-50 eval, input {tuple(x.shape)}, median of '
          f'{args.repeats}; hard ratios: {num_bn} of {num_layers} SN layers '
          'BN/BN\n')
    print('| network | eval forward s |')
    print('|---|---|')
    for name, t in times.items():
        print(f'| {name} | {t:.3f} |')
    t_fused = times['SN, hard ratios after fuse_conv_sn']
    print(f'\nfused / BN fused: {t_fused / times["BN after fuse_conv_bn"]:.2f}'
          f' (goal <= 1.10); fused / soft: '
          f'{t_fused / times["SN, soft ratios"]:.2f} (goal <= 0.90)')
    print(f'fused vs unfused output: max relative error {err:.2e}')


if __name__ == '__main__':
    main()
