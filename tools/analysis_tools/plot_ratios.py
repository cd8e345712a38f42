#!/usr/bin/env python
"""Plot the IN/LN/BN ratios of every SN layer in a checkpoint, and the
importance weights of every Switchable Whitening (SW) layer.

Like the paper's Fig. 4: per SN layer, in network order, stacked bars of the
ratios for the mean and for the variance, plus a panel with the symmetric KL
divergence between each layer's mean and variance ratios (Fig. 7c). Also
prints the table.

With ``--hard``, the paper's hard-ratio view (Fig. 8): per layer, the
normaliser with the largest ratio for the mean and for the variance, the
layers marked by what they normalise (a 3x3 conv, a 1x1 conv, a shortcut,
other); it prints how many layers choose differently for the mean and the
variance, and, given ``--compare OTHER``, how many layers changed their
choice between the two checkpoints. Group SN layers show each layer's
average over its groups, or with ``--groups`` a bar (and a hard choice)
per group. Works on any checkpoint with SN layers: detection,
segmentation, converted ImageNet backbones. The checkpoint is loaded with
weights_only=False (mmengine training checkpoints need it): use it on
checkpoints you trust.

A checkpoint with SW layers also gets their table and figure (the five
weights BW, IW, BN, IN, LN of the mean and of the covariance, per layer),
in ``--out``'s name with ``_sw`` before the suffix (or in ``--out`` itself
when there is no SN layer).

Example::

    python tools/analysis_tools/plot_ratios.py work_dirs/demo/iter_100.pth \\
        --out ratios.png
    python tools/analysis_tools/plot_ratios.py hard.pth --hard \\
        --compare soft.pth
"""
import argparse
import os.path as osp
import sys

import matplotlib

matplotlib.use('Agg')  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import sn_mm.analysis as analysis  # noqa: E402
from sn_mm.models import hard_choices  # noqa: E402
from sn_mm.models.switchable_norm import TERMS  # noqa: E402

COLOURS = {
    'in': '#4c72b0',
    'ln': '#dd8452',
    'bn': '#55a868',
    'bw': '#c44e52',
    'iw': '#8172b2'
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('checkpoint', help='checkpoint with SN layers')
    parser.add_argument(
        '--out',
        default='ratios.png',
        help='figure file (default: ratios.png)')
    parser.add_argument(
        '--hard',
        action='store_true',
        help='the hard-ratio view (the paper\'s Fig. 8): '
        'the normaliser each layer picks for mean and var')
    parser.add_argument(
        '--compare',
        metavar='OTHER',
        help='with --hard: count the layers whose choice '
        'differs in this other checkpoint')
    parser.add_argument(
        '--groups',
        action='store_true',
        help='group SN layers: a bar per group (default: '
        'each layer\'s average over its groups)')
    return parser.parse_args(argv)


def layer_kind(state, layer):
    """What an SN layer normalises, from the conv beside it: '3x3', '1x1'
    (or another kernel size), 'shortcut', or 'other'."""
    layer = layer.split('[')[0]  # a group's entry: its layer's
    if layer.endswith('downsample.1'):
        return 'shortcut'
    parent, _, leaf = layer.rpartition('.')
    prefix = f'{parent}.' if parent else ''
    candidates = [f'{prefix}conv.weight']
    if leaf.startswith('sn') and leaf[2:].isdigit():
        candidates.insert(0, f'{prefix}conv{leaf[2:]}.weight')
    for key in candidates:
        w = state.get(key)
        if w is not None and w.dim() == 4:
            return f'{w.shape[-2]}x{w.shape[-1]}'
    return 'other'


def print_table(ratios, kls, terms=TERMS):
    header = (f'{"layer":<40}' + ''.join(f' mean_{t:<3}' for t in terms) +
              ''.join(f'  var_{t:<3}' for t in terms) + '  sym_KL')
    print(header)
    for (name, r), kl in zip(ratios.items(), kls):
        print(f'{name:<40}' + ''.join(f' {r["mean"].get(t, 0.):8.3f}'
                                      for t in terms) +
              ''.join(f' {r["var"].get(t, 0.):8.3f}'
                      for t in terms) + f' {kl:7.3f}')
    avg = analysis.average_ratios(ratios, terms)
    print(f'{"model average":<40}' + ''.join(f' {avg["mean"][t]:8.3f}'
                                             for t in terms) +
          ''.join(f' {avg["var"][t]:8.3f}'
                  for t in terms) + f' {sum(kls) / len(kls):7.3f}')


def make_figure(ratios, kls, title, terms=TERMS):
    """The figure: axes[0] the mean ratios and axes[1] the variance ratios
    (one bar container per term, IN/LN/BN or SW's five, one bar per layer),
    axes[2] the symmetric KL divergences."""
    names = list(ratios)
    x = range(len(names))
    fig, axes = plt.subplots(
        3, 1, figsize=(max(8, 0.22 * len(names)), 9), sharex=True)
    for ax, stat in zip(axes[:2], ('mean', 'var')):
        bottom = [0.] * len(names)
        for term in terms:
            values = [ratios[n][stat].get(term, 0.) for n in names]
            ax.bar(
                x,
                values,
                bottom=bottom,
                color=COLOURS[term],
                label=term.upper(),
                width=0.85)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_ylim(0, 1)
        ax.set_ylabel(f'{stat} ratios')
        ax.legend(loc='upper right', ncol=len(terms), fontsize=8)
    axes[2].bar(x, kls, color='#8172b2', width=0.85)
    axes[2].set_ylabel('sym. KL(mean, var)')
    axes[2].set_xticks(list(x))
    axes[2].set_xticklabels(names, rotation=90, fontsize=6)
    axes[0].set_title(title)
    fig.tight_layout()
    return fig


def plot(ratios, kls, out, title, terms=TERMS):
    fig = make_figure(ratios, kls, title, terms)
    fig.savefig(out, dpi=120)
    plt.close(fig)


HARD_CODES = {t: i for i, t in enumerate(TERMS)}
KIND_MARKERS = {
    '3x3': ('^', '3x3 conv'),
    '1x1': ('o', '1x1 conv'),
    'shortcut': ('s', 'shortcut')
}


def make_hard_figure(choices, kinds, title):
    """axes[0]: a 2 x layers image, row 0 the mean's and row 1 the
    variance's chosen normaliser (0 IN, 1 LN, 2 BN); markers above it say
    what each layer normalises."""
    from matplotlib.colors import ListedColormap
    names = list(choices)
    grid = [[HARD_CODES[choices[n][stat]] for n in names]
            for stat in ('mean', 'var')]
    fig, ax = plt.subplots(figsize=(max(8, 0.22 * len(names)), 3.2))
    ax.imshow(
        grid,
        aspect='auto',
        vmin=0,
        vmax=len(TERMS) - 1,
        cmap=ListedColormap([COLOURS[t] for t in TERMS]),
        interpolation='nearest')
    ax.set_yticks([0, 1])
    ax.set_yticklabels(['mean', 'var'])
    for kind, (marker, label) in KIND_MARKERS.items():
        xs = [i for i, n in enumerate(names) if kinds[n] == kind]
        if xs:
            ax.scatter(
                xs, [-0.8] * len(xs),
                marker=marker,
                color='k',
                s=12,
                label=label,
                clip_on=False)
    ax.set_ylim(1.5, -1.2)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=90, fontsize=6)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[t]) for t in TERMS]
    markers, labels = ax.get_legend_handles_labels()
    ax.legend(
        handles + markers, [t.upper() for t in TERMS] + labels,
        loc='upper left',
        bbox_to_anchor=(1.0, 1.0),
        fontsize=7)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def load_state(path):
    ckpt = torch.load(path, map_location='cpu', weights_only=False)
    state = ckpt.get('state_dict', ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(state, dict):
        sys.exit(f'{path} is not a checkpoint with a state dict')
    if not analysis.sn_ratios(state) and not analysis.sw_weights(state):
        sys.exit(f'{path} has no SN or SW layers (no key ends in '
                 '".mean_weight" or ".sw_mean_weight")')
    return state


def hard_view(args, state):
    choices = hard_choices(analysis.sn_ratios(state, per_group=args.groups))
    kinds = {n: layer_kind(state, n) for n in choices}
    print(f'{"layer":<40} {"conv":<8} mean var')
    for name, c in choices.items():
        print(f'{name:<40} {kinds[name]:<8} {c["mean"]:<4} {c["var"]}')
    differ = sum(c['mean'] != c['var'] for c in choices.values())
    print(f'{differ} of {len(choices)} layers choose a different normaliser '
          'for the mean than for the variance')
    if args.compare:
        other = hard_choices(
            analysis.sn_ratios(
                load_state(args.compare), per_group=args.groups))
        common = [n for n in choices if n in other]
        moved = sum(choices[n] != other[n] for n in common)
        print(f'{moved} of {len(common)} layers changed their choice '
              f'between {args.checkpoint} and {args.compare}')
    fig = make_hard_figure(
        choices, kinds, f'Hard ratios of {len(choices)} SN layers: '
        f'{args.checkpoint}')
    fig.savefig(args.out, dpi=120)
    plt.close(fig)
    print(f'Wrote {args.out}')


def main(argv=None):
    args = parse_args(argv)
    if args.compare and not args.hard:
        sys.exit('--compare needs --hard')
    state = load_state(args.checkpoint)
    if args.hard:
        if not analysis.sn_ratios(state):
            sys.exit(f'--hard: {args.checkpoint} has no SN layers')
        return hard_view(args, state)
    ratios = analysis.sn_ratios(state, per_group=args.groups)
    if ratios:
        kls = [
            analysis.symmetric_kl(r['mean'], r['var'])
            for r in ratios.values()
        ]
        print_table(ratios, kls)
        plot(ratios, kls, args.out,
             f'SN ratios of {len(ratios)} layers: {args.checkpoint}')
        print(f'Wrote {args.out}')
    weights = analysis.sw_weights(state)
    if weights:
        stem, suffix = osp.splitext(args.out)
        out = f'{stem}_sw{suffix}' if ratios else args.out
        kls = [
            analysis.symmetric_kl(r['mean'], r['var'])
            for r in weights.values()
        ]
        print(f'\nSW importance weights ({len(weights)} layers; var: the '
              'covariance\'s)')
        print_table(weights, kls, analysis.SW_TERMS)
        plot(
            weights, kls, out,
            f'SW importance weights of {len(weights)} layers: '
            f'{args.checkpoint}', analysis.SW_TERMS)
        print(f'Wrote {out}')


if __name__ == '__main__':
    main()
