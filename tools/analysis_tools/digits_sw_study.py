#!/usr/bin/env python
"""Switchable Whitening against SN and BN on real data: scikit-learn's
bundled handwritten digits (1797 8x8 images, nothing downloaded).

The digits CNN of the other studies (three conv-norm-ReLU blocks of 16, 32
and 64 channels, global pooling, a linear layer) is trained from scratch
with BN, SN, SW with BW + IW (``sw_type`` 2) and SW with BW, IW, BN, IN and
LN (``sw_type`` 5), 8 channels a whitening group and the release's momentum
(0.9), at each batch size, every run on the same images (the learning rate
scales linearly with the batch).
Prints, per run, the test accuracy and the model-average share of each kind
of statistic in the mean's and the covariance's (variance's) weights: batch
(SW: BW + BN; SN: BN), instance (SW: IW + IN; SN: IN) and layer (LN), and
for SW the share of whitening (BW + IW) in the covariance; then each layer's
batch share of the variance weights.

Example (about 10 minutes on 2 CPU cores)::

    python tools/analysis_tools/digits_sw_study.py --epochs 6
"""
import argparse

import torch

import sn_mm  # noqa: F401
from sn_mm.analysis import SW_TERMS, average_ratios, sn_ratios, sw_weights
from sn_mm.testing.digits import (DigitsCNN, add_digits_arguments,
                                  digits_accuracy, load_digits_split,
                                  train_digits)

NORMS = {
    'BN': dict(norm='BN'),
    'SN': dict(norm='SN'),
    # The release trains with momentum 0.9 (its convention: the running
    # statistics keep 0.9 of themselves a step).
    'SW2': dict(norm='SW', sw_type=2, num_pergroup=8, momentum=0.9),
    'SW5': dict(norm='SW', sw_type=5, num_pergroup=8, momentum=0.9),
}
KINDS = {'batch': ('bw', 'bn'), 'instance': ('iw', 'in'), 'layer': ('ln', )}


def shares(model, norm):
    """{kind: (mean share, variance share)} and the covariance's whitening
    share (None for BN and SN)."""
    if norm == 'BN':
        return None, None
    avg = (
        average_ratios(sn_ratios(model)) if norm == 'SN' else average_ratios(
            sw_weights(model), SW_TERMS))
    kinds = {
        kind:
        tuple(
            sum(avg[stat].get(t, 0.) for t in terms)
            for stat in ('mean', 'var'))
        for kind, terms in KINDS.items()
    }
    whitening = (
        avg['var']['bw'] + avg['var']['iw'] if norm.startswith('SW') else None)
    return kinds, whitening


def layer_batch_shares(model, norm):
    """Each layer's batch share of the variance weights (BN and SN: the
    model average hides layers that move apart)."""
    if norm == 'BN':
        return []
    ratios = sn_ratios(model) if norm == 'SN' else sw_weights(model)
    return [
        sum(r['var'].get(t, 0.) for t in KINDS['batch'])
        for r in ratios.values()
    ]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    add_digits_arguments(parser, 'training epochs')
    parser.add_argument(
        '--norms', nargs='+', default=list(NORMS), choices=list(NORMS))
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    train_set, test_set = load_digits_split(args.seed)
    print('| norm | batch | test accuracy | batch (mean / var) | '
          'instance (mean / var) | layer (mean / var) | whitening (var) | '
          'batch (var), by layer |')
    print('|---|---|---|---|---|---|---|---|')
    rows = []
    for batch in args.batches:
        for norm in args.norms:
            torch.manual_seed(args.seed + 1)
            model = DigitsCNN(**NORMS[norm])
            train_digits(model, train_set, batch, args.epochs,
                         args.lr * batch / 32, args.seed + 2)
            kinds, whitening = shares(model, norm)
            row = dict(
                norm=norm,
                batch=batch,
                accuracy=digits_accuracy(model, test_set),
                kinds=kinds,
                whitening=whitening,
                layers=layer_batch_shares(model, norm))
            rows.append(row)
            cells = ['-'] * 3 if kinds is None else [
                f'{m:.3f} / {v:.3f}' for m, v in kinds.values()
            ]
            print(
                f'| {norm} | {batch} | {row["accuracy"]:.3f} | ' +
                ' | '.join(cells) + ' | ' +
                ('-' if whitening is None else f'{whitening:.3f}') + ' | ' +
                (', '.join(f'{b:.2f}' for b in row['layers']) or '-') + ' |',
                flush=True)
    return rows


if __name__ == '__main__':
    main()
