#!/usr/bin/env python
"""Group SN on real data: scikit-learn's bundled handwritten digits (1797
8x8 images, nothing downloaded), the study the paper did not publish.

A small SN CNN (three conv-norm-ReLU blocks of 16, 32 and 64 channels,
global pooling, a linear layer) is trained from scratch with
``ratio_groups`` G = 1 (SN), 2, 4 and C (every channel its own ratios), at
batch 2 and at batch 32, every run on the same images (the learning rate
scales linearly with the batch). Prints, per run, the test accuracy, the
model-average BN ratio of the mean and of the variance, and how far the
groups' ratios drift apart: the total-variation distance of each group's
ratio vector from its layer's average, averaged over groups and layers
(0: every group alike; 1: disjoint choices).

Example (about 5 minutes on 2 CPU cores)::

    python tools/analysis_tools/digits_group_sn_study.py --epochs 20
"""
import argparse

import torch

import sn_mm  # noqa: F401
from sn_mm import SwitchableNorm
from sn_mm.analysis import average_ratios, sn_ratios
from sn_mm.testing.digits import (DigitsCNN, add_digits_arguments,
                                  digits_accuracy, load_digits_split,
                                  train_digits)

STATS = ('mean', 'var')


def group_spread(model):
    """Per statistic, the mean total-variation distance of each group's
    ratios from its layer's average (layers with one group count 0)."""
    spread = {stat: [] for stat in STATS}
    for layer in model.modules():
        if not isinstance(layer, SwitchableNorm):
            continue
        groups = layer.group_ratios()
        for stat in STATS:
            rows = torch.tensor([list(g[stat].values()) for g in groups])
            tv = 0.5 * (rows - rows.mean(0)).abs().sum(1)
            spread[stat].append(tv.mean().item())
    return {stat: sum(v) / len(v) for stat, v in spread.items()}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    add_digits_arguments(parser, 'training epochs')
    parser.add_argument(
        '--groups',
        nargs='+',
        default=['1', '2', '4', 'C'],
        help="ratio_groups values; 'C': one per channel")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    train_set, test_set = load_digits_split(args.seed)
    print('| ratio_groups | batch | test accuracy | BN ratio (mean) | '
          'BN ratio (var) | group spread (mean) | group spread (var) |')
    print('|---|---|---|---|---|---|---|')
    rows = []
    for batch in args.batches:
        for groups in args.groups:
            torch.manual_seed(args.seed + 1)
            model = DigitsCNN('SN', groups if groups == 'C' else int(groups))
            train_digits(model, train_set, batch, args.epochs,
                         args.lr * batch / 32, args.seed + 2)
            avg = average_ratios(sn_ratios(model))
            row = dict(
                groups=groups,
                batch=batch,
                accuracy=digits_accuracy(model, test_set),
                bn=(avg['mean']['bn'], avg['var']['bn']),
                spread=group_spread(model))
            rows.append(row)
            print(
                f'| {groups} | {batch} | {row["accuracy"]:.3f} | '
                f'{row["bn"][0]:.3f} | {row["bn"][1]:.3f} | '
                f'{row["spread"]["mean"]:.3f} | '
                f'{row["spread"]["var"]:.3f} |',
                flush=True)
    return rows


if __name__ == '__main__':
    main()
