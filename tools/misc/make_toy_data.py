#!/usr/bin/env python
"""Generate the bundled toy datasets (deterministic, no download)."""
import argparse
import os.path as osp

from sn_mm.testing import (make_toy_cls, make_toy_coco, make_toy_seg,
                           make_toy_video)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        'kind',
        choices=['coco', 'seg', 'cls', 'video'],
        help='coco: instances (boxes, masks) in COCO format; '
        'seg: semantic labels in ADE20K layout; cls: one '
        'shape per image in class folders; video: clips of a moving shape '
        '(class: its direction) as frame folders')
    parser.add_argument(
        '--out', default=None, help='output folder (default: data/toy_<kind>)')
    parser.add_argument(
        '--num-train',
        type=int,
        default=None,
        help='default: 400 (coco), 300 (seg), 800 (cls), 320 (video)')
    parser.add_argument(
        '--num-val',
        type=int,
        default=None,
        help='default: 100 (coco), 60 (seg), 200 (cls), 80 (video)')
    parser.add_argument(
        '--size',
        type=int,
        default=None,
        help='image side in pixels (default: 128 coco, 96 '
        'seg, 64 cls, 32 video)')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    out = args.out or osp.join('data', f'toy_{args.kind}')
    make = dict(
        coco=make_toy_coco,
        seg=make_toy_seg,
        cls=make_toy_cls,
        video=make_toy_video)[args.kind]
    sizes = {
        k: v
        for k, v in (('num_train', args.num_train), ('num_val', args.num_val),
                     ('size', args.size)) if v is not None
    }
    make(out, seed=args.seed, **sizes)
    print(f'Wrote toy {args.kind} data to {out}')


if __name__ == '__main__':
    main()
