#!/usr/bin/env python
"""Generate the bundled toy datasets (deterministic, no download)."""
import argparse
import os.path as osp

from sn_mm.datasets import make_toy_coco


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('kind', choices=['coco'],
                        help='coco: instance detection/segmentation in COCO '
                        'format')
    parser.add_argument('--out', default=None,
                        help='output folder (default: data/toy_<kind>)')
    parser.add_argument('--num-train', type=int, default=400)
    parser.add_argument('--num-val', type=int, default=100)
    parser.add_argument('--size', type=int, default=128,
                        help='image side in pixels')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    out = args.out or osp.join('data', f'toy_{args.kind}')
    make_toy_coco(out, args.num_train, args.num_val, args.size,
                  seed=args.seed)
    print(f'Wrote toy {args.kind} data ({args.num_train} train, '
          f'{args.num_val} val images) to {out}')


if __name__ == '__main__':
    main()
