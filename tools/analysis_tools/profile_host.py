#!/usr/bin/env python
"""Where SN's host time per call goes: cProfile of SN layer calls at a
small shape (1x64x8x8 by default), where a call costs the host more than
the device.

Profiles ``--calls`` training calls (forward and backward) and as many eval
forwards of one SwitchableNorm, after a warm-up, and prints the functions
with the most time of their own; ``--route direct`` makes CUDA calls skip
the dispatcher (see ``sn_mm.ops.operator.CUDA_ROUTE``).

Example::

    python tools/analysis_tools/profile_host.py --device cuda --calls 300
"""
import argparse
import cProfile
import io
import pstats

import torch

from sn_mm import SwitchableNorm
from sn_mm.ops.operator import CUDA_ROUTE


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--device',
        default='cpu',
        help='device of the layer and input (default cpu)')
    parser.add_argument('--shape', type=int, nargs='+', default=[1, 64, 8, 8])
    parser.add_argument('--calls', type=int, default=200)
    parser.add_argument(
        '--route',
        choices=['operator', 'direct'],
        default='operator',
        help='how CUDA calls reach the Triton kernels')
    parser.add_argument(
        '--top', type=int, default=25, help='functions to print per mode')
    return parser.parse_args(argv)


def profile(layer, x, grad, training, calls, top):
    """The ``top`` functions by own time over ``calls`` calls, as text."""
    layer.train(training)

    def run():
        with torch.set_grad_enabled(training):
            for _ in range(calls):
                y = layer(x)
                if training:
                    y.backward(grad)
        if x.is_cuda:
            torch.cuda.synchronize()

    run()  # warm-up: compilation, caches
    prof = cProfile.Profile()
    prof.runcall(run)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats('tottime').print_stats(top)
    return text.getvalue()


def main(argv=None):
    args = parse_args(argv)
    CUDA_ROUTE['via'] = args.route
    x = torch.randn(args.shape, device=args.device, requires_grad=True)
    grad = torch.randn(args.shape, device=args.device)
    layer = SwitchableNorm(args.shape[1]).to(args.device)
    for training in (True, False):
        mode = 'training forward+backward' if training else 'eval forward'
        print(
            f'# {mode}, {args.calls} calls at {"x".join(map(str, args.shape))}'
            f' on {args.device}, route {args.route}')
        print(profile(layer, x, grad, training, args.calls, args.top))


if __name__ == '__main__':
    main()
