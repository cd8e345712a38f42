#!/usr/bin/env python
"""float32 precision of SN against PyTorch's BN, IN and LN on inputs far
from zero (mean 1e2 to 1e4, spread 1e-2 to 1): each layer in float32 and in
float64 on the same inputs, trained for a few steps and then evaluated.

Prints one markdown table: per offset and spread, the largest absolute
output error in training and in eval, and the largest relative error of
the running mean and variance after training, for PyTorch's norms and for
SN on each kernel set (Triton in its interpreter where there is no GPU).

Example::

    python tools/analysis_tools/precision_norm.py --kernels native torch
    python tools/analysis_tools/precision_norm.py --steps 3 --start layer
"""
import argparse
import os


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument(
        '--shape',
        type=int,
        nargs=4,
        default=[8, 32, 16, 16],
        metavar=('N', 'C', 'H', 'W'))
    parser.add_argument(
        '--steps',
        type=int,
        default=10,
        help='training steps before eval (default: 10)')
    parser.add_argument(
        '--start',
        choices=['data', 'layer'],
        default='data',
        help='where the running statistics start: at the data\'s mean and '
        'variance, or at the layer\'s own 0 and 1 (eval after a few steps '
        'then sits far from the data and magnifies any error of the '
        'variances)')
    parser.add_argument(
        '--kernels',
        nargs='+',
        default=['native', 'triton', 'torch'],
        choices=['native', 'triton', 'torch'])
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if 'triton' in args.kernels:
        import torch
        if not torch.cuda.is_available():  # before sn_mm reads it
            os.environ.setdefault('TRITON_INTERPRET', '1')
    import torch

    from sn_mm import SwitchableNorm
    from sn_mm.testing.precision import (METRICS, OFFSETS, SPREADS,
                                         float32_errors, offset_inputs,
                                         pytorch_norms)
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    shape = tuple(args.shape)
    layers = dict(pytorch_norms(shape[1]))
    for k in args.kernels:
        layers[f'SN {k}'] = (lambda k=k: SwitchableNorm(shape[1], kernels=k))
    print(f'float32 vs float64, input {"x".join(map(str, shape))}, '
          f'{args.steps} training steps from running statistics at the '
          f'{args.start}\'s start, then eval; outputs: largest '
          f'absolute error, running statistics: largest relative error; '
          f'worst/ours: SN\'s worst kernel set over the worst PyTorch norm '
          f'(running statistics: over BN). Device: {device}.\n')
    print('| offset | spread | measure | ' + ' | '.join(layers) +
          ' | SN / PyTorch |')
    print('|---' * (len(layers) + 4) + '|')
    for offset in OFFSETS:
        for spread in SPREADS:
            inputs = [
                x.to(device)
                for x in offset_inputs(shape, offset, spread, args.steps + 1)
            ]
            errors = {
                name:
                float32_errors(
                    lambda make=make: make().to(device),
                    inputs,
                    offset,
                    spread,
                    args.start)
                for name, make in layers.items()
            }
            for metric in METRICS:
                theirs = ['BN'] if metric.startswith('running') else [
                    'BN', 'IN', 'LN'
                ]
                worst = max(errors[n][metric] for n in theirs)
                ours = max(errors[n][metric] for n in layers
                           if n.startswith('SN'))
                cells = [
                    '-' if metric.startswith('running') and n in ('IN', 'LN')
                    else f'{errors[n][metric]:.1e}' for n in layers
                ]
                print(f'| {offset:.0e} | {spread:.0e} | {metric} | ' +
                      ' | '.join(cells) + f' | {ours / worst:.2f} |')


if __name__ == '__main__':
    main()
