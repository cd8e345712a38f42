#!/usr/bin/env python
"""Fix every SN layer of a checkpoint to hard (one-hot argmax) ratios.

The paper's hard-ratio experiment (Sec. 5, Table 3): each SN layer keeps one
normaliser for the mean and one for the variance, the one with the largest
ratio, and the network is finetuned from there. Works on a training
checkpoint (its ``state_dict``; everything else is kept) or a converted
backbone; the result loads with ``strict=True`` into the same model, so a
config finetunes from it unchanged (``load_from`` or the backbone's
``init_cfg``). Prints how many layers changed and how many pick a different
normaliser for the mean than for the variance. The source is loaded with
weights_only=False (mmengine training checkpoints need it): use it on
checkpoints you trust.

Example::

    python tools/model_converters/harden_sn.py work_dirs/x/iter_90000.pth \\
        work_dirs/x/iter_90000_hard.pth
"""
import argparse
import os.path as osp
import sys

import torch

from sn_mm.analysis import sn_ratios
from sn_mm.models import hard_choices, harden_state_dict


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('src', help='checkpoint with SN layers')
    parser.add_argument('dst', help='where to write the hardened checkpoint')
    parser.add_argument(
        '--force', action='store_true', help='overwrite DST if it exists')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if osp.exists(args.dst) and not args.force:
        sys.exit(f'{args.dst} exists; pass --force to overwrite it')
    ckpt = torch.load(args.src, map_location='cpu', weights_only=False)
    if not isinstance(ckpt, dict):
        sys.exit(f'{args.src} holds a {type(ckpt).__name__}, not a '
                 'checkpoint dict')
    state = ckpt['state_dict'] if 'state_dict' in ckpt else ckpt
    if not sn_ratios(state):
        sys.exit(f'{args.src} has no SN layers (no key ends in '
                 '".mean_weight")')
    state = dict(state)
    changed = harden_state_dict(state)
    choices = hard_choices(sn_ratios(state))
    if 'state_dict' in ckpt:
        ckpt = dict(ckpt, state_dict=state)
        meta = dict(ckpt.get('meta') or {})
        meta['sn_hard_ratios'] = dict(source=osp.basename(args.src))
        ckpt['meta'] = meta
    else:
        ckpt = state
    torch.save(ckpt, args.dst)
    differ = sum(c['mean'] != c['var'] for c in choices.values())
    print(f'Fixed {len(choices)} SN layers to hard ratios ({changed} '
          f'changed); {differ} choose a different normaliser for the mean '
          f'than for the variance; wrote {args.dst}')


if __name__ == '__main__':
    main()
