#!/usr/bin/env python
"""SN started from a BN-trained network, on real data: scikit-learn's
bundled handwritten digits (1797 8x8 images, nothing downloaded).

A small CNN (three conv-norm-ReLU blocks, global pooling, a linear layer) is
trained with BN at batch 32. Then SN networks of the same shape are
finetuned at batch 2 and at batch 32, started from the BN network with
``SNPretrained``'s mapping (``sn_state_from``) with ``ratios='uniform'`` and
``ratios='source'``, and from scratch; the BN network is finetuned the same
way for comparison. Every finetuning run sees the same number of images (the
learning rate scales linearly with the batch). Prints, per run, the test
accuracy and the model-average BN ratio of the mean and of the variance
(the paper's claim: SN moves weight from BN to IN and LN as the batch
shrinks).

Example (about 2 minutes on 2 CPU cores)::

    python tools/analysis_tools/digits_from_bn_study.py --epochs 20
"""
import argparse

import torch

import sn_mm  # noqa: F401
from sn_mm.analysis import average_ratios, sn_ratios
from sn_mm.engine import sn_state_from
from sn_mm.testing.digits import (DigitsCNN, add_digits_arguments,
                                  digits_accuracy, load_digits_split,
                                  train_digits)


def bn_ratios(model):
    ratios = sn_ratios(model)
    if not ratios:
        return '-', '-'
    avg = average_ratios(ratios)
    return f'{avg["mean"]["bn"]:.3f}', f'{avg["var"]["bn"]:.3f}'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    add_digits_arguments(
        parser, 'finetuning epochs (the BN source trains '
        'as many at batch 32)')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    train_set, test_set = load_digits_split(args.seed)
    source = train_digits(
        DigitsCNN('BN'), train_set, 32, args.epochs, args.lr, args.seed)
    print(f'BN source, batch 32, {args.epochs} epochs: test accuracy '
          f'{digits_accuracy(source, test_set):.3f}\n')
    print('| network | start | finetuning batch | test accuracy | '
          'BN ratio (mean) | BN ratio (var) |')
    print('|---|---|---|---|---|---|')
    starts = ['BN source', 'uniform', 'source', 'scratch']
    rows = []
    for batch in args.batches:
        for start in starts:
            torch.manual_seed(args.seed + 1)
            model = DigitsCNN('BN' if start == 'BN source' else 'SN')
            if start == 'BN source':
                model.load_state_dict(source.state_dict())
            elif start != 'scratch':
                model.load_state_dict(
                    sn_state_from(model, source.state_dict(), start)[0])
            train_digits(model, train_set, batch, args.epochs,
                         args.lr * batch / 32, args.seed + 2)
            row = dict(
                network='BN' if start == 'BN source' else 'SN',
                start={
                    'BN source': 'the BN source',
                    'uniform': 'BN source, ratios=uniform',
                    'source': 'BN source, ratios=source',
                    'scratch': 'scratch'
                }[start],
                batch=batch,
                accuracy=digits_accuracy(model, test_set),
                ratios=bn_ratios(model))
            rows.append(row)
            print(
                f'| {row["network"]} | {row["start"]} | {batch} | '
                f'{row["accuracy"]:.3f} | {row["ratios"][0]} | '
                f'{row["ratios"][1]} |',
                flush=True)
    return rows


if __name__ == '__main__':
    main()
