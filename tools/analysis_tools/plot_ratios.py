#!/usr/bin/env python
"""Plot the IN/LN/BN ratios of every SN layer in a checkpoint.

Like the paper's Fig. 4: per SN layer, in network order, stacked bars of the
ratios for the mean and for the variance, plus a panel with the symmetric KL
divergence between each layer's mean and variance ratios (Fig. 7c). Also
prints the table. Works on any checkpoint with SN layers: detection,
segmentation, converted ImageNet backbones. The checkpoint is loaded with
weights_only=False (mmengine training checkpoints need it): use it on
checkpoints you trust.

Example::

    python tools/analysis_tools/plot_ratios.py work_dirs/demo/iter_160.pth --out ratios.png
"""
import argparse
import sys

import matplotlib

matplotlib.use('Agg')  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from sn_mm.analysis import average_ratios, sn_ratios, symmetric_kl  # noqa
from sn_mm.models.switchable_norm import TERMS  # noqa: E402

COLOURS = {'in': '#4c72b0', 'ln': '#dd8452', 'bn': '#55a868'}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('checkpoint', help='checkpoint with SN layers')
    parser.add_argument('--out', default='ratios.png',
                        help='figure file (default: ratios.png)')
    return parser.parse_args(argv)


def print_table(ratios, kls):
    header = (f'{"layer":<40}' + ''.join(f' mean_{t:<3}' for t in TERMS) +
              ''.join(f'  var_{t:<3}' for t in TERMS) + '  sym_KL')
    print(header)
    for (name, r), kl in zip(ratios.items(), kls):
        print(f'{name:<40}' +
              ''.join(f' {r["mean"].get(t, 0.):8.3f}' for t in TERMS) +
              ''.join(f' {r["var"].get(t, 0.):8.3f}' for t in TERMS) +
              f' {kl:7.3f}')
    avg = average_ratios(ratios)
    print(f'{"model average":<40}' +
          ''.join(f' {avg["mean"][t]:8.3f}' for t in TERMS) +
          ''.join(f' {avg["var"][t]:8.3f}' for t in TERMS) +
          f' {sum(kls) / len(kls):7.3f}')


def make_figure(ratios, kls, title):
    """The figure: axes[0] the mean ratios and axes[1] the variance ratios
    (one bar container per term, IN/LN/BN, one bar per layer), axes[2] the
    symmetric KL divergences."""
    names = list(ratios)
    x = range(len(names))
    fig, axes = plt.subplots(3, 1, figsize=(max(8, 0.22 * len(names)), 9),
                             sharex=True)
    for ax, stat in zip(axes[:2], ('mean', 'var')):
        bottom = [0.] * len(names)
        for term in TERMS:
            values = [ratios[n][stat].get(term, 0.) for n in names]
            ax.bar(x, values, bottom=bottom, color=COLOURS[term],
                   label=term.upper(), width=0.85)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_ylim(0, 1)
        ax.set_ylabel(f'{stat} ratios')
        ax.legend(loc='upper right', ncol=3, fontsize=8)
    axes[2].bar(x, kls, color='#8172b2', width=0.85)
    axes[2].set_ylabel('sym. KL(mean, var)')
    axes[2].set_xticks(list(x))
    axes[2].set_xticklabels(names, rotation=90, fontsize=6)
    axes[0].set_title(title)
    fig.tight_layout()
    return fig


def plot(ratios, kls, out, title):
    fig = make_figure(ratios, kls, title)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    ckpt = torch.load(args.checkpoint, map_location='cpu', weights_only=False)
    state = ckpt.get('state_dict', ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(state, dict):
        sys.exit(f'{args.checkpoint} is not a checkpoint with a state dict')
    ratios = sn_ratios(state)
    if not ratios:
        sys.exit(f'{args.checkpoint} has no SN layers (no key ends in '
                 '".mean_weight")')
    kls = [symmetric_kl(r['mean'], r['var']) for r in ratios.values()]
    print_table(ratios, kls)
    plot(ratios, kls, args.out,
         f'SN ratios of {len(ratios)} layers: {args.checkpoint}')
    print(f'Wrote {args.out}')


if __name__ == '__main__':
    main()
