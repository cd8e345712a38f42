#!/usr/bin/env python
"""SyncSN across processes on the CPU: the C++ kernels split at their
collectives (``kernels='auto'``) against the reference (``kernels='torch'``).

Starts ``--ranks`` processes joined by gloo, each holding its share of the
batch, and times one training forward+backward of a SyncSN layer (one
all-gather, one all-reduce) on each candidate in alternating rounds, at
detector shapes (the whole batch's). Prints one table on rank 0: the
median milliseconds per call and the ratio reference/C++ (above 1: the C++
kernels are the faster), and which route each candidate took.

Example::

    python tools/analysis_tools/benchmark_sync.py --rounds 7
"""
import argparse
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sn_mm import SyncSwitchableNorm
from sn_mm.ops import native_available, route
from sn_mm.testing.timing import calls_filling, median_times

SHAPES = [(8, 256, 56, 56), (2, 256, 100, 152), (2, 1024, 50, 76),
          (512, 256, 7, 7), (16, 256, 7, 7), (2, 1024, 14, 14), (2, 64, 8, 8)]
TOY_SHAPES = [(2, 8, 5, 6)]
CANDIDATES = {'C++ kernels': 'auto', 'reference': 'torch'}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument(
        '--rounds', type=int, default=7, help='alternating rounds')
    parser.add_argument(
        '--ranks', type=int, default=2, help='processes (gloo ranks)')
    parser.add_argument(
        '--threads',
        type=int,
        default=1,
        help='torch threads per process (default 1: one core per rank on '
        'a 2-core machine)')
    parser.add_argument(
        '--toy', action='store_true', help='one tiny shape (tests)')
    return parser.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def time_shape(shape, args, rank):
    """Median seconds per training call of each candidate at ``shape``
    (the whole batch's; this rank holds its share), and their routes."""
    share = shape[0] // args.ranks + (rank < shape[0] % args.ranks)
    x = torch.randn((share, ) + tuple(shape[1:])).requires_grad_()
    grad = torch.randn_like(x)
    layers = {
        name: SyncSwitchableNorm(shape[1], kernels=kernels)
        for name, kernels in CANDIDATES.items()
    }

    def step(layer):
        x.grad = None
        layer(x).backward(grad)

    # Every rank makes the same number of calls (each call's collectives
    # pair them): rank 0's count, broadcast.
    first = median_times({'': lambda: step(layers['C++ kernels'])}, 3)['']
    calls = torch.tensor([calls_filling(first, 0.05)])
    dist.broadcast(calls, 0)
    calls = int(calls)

    def loop(layer):
        for _ in range(calls):
            step(layer)

    fns = {
        name: (lambda layer=layer: loop(layer))
        for name, layer in layers.items()
    }
    times = {
        name: seconds / calls
        for name, seconds in median_times(fns, args.rounds).items()
    }
    routes = {
        name:
        route(layer.kernels, x, layer.weight, layer.running_mean,
              dist.group.WORLD).call.__name__
        for name, layer in layers.items()
    }
    return times, routes


def worker(rank, port, args):
    torch.set_num_threads(args.threads)
    dist.init_process_group(
        'gloo',
        init_method=f'tcp://127.0.0.1:{port}',
        rank=rank,
        world_size=args.ranks)
    rows = []
    for shape in TOY_SHAPES if args.toy else SHAPES:
        times, routes = time_shape(shape, args, rank)
        rows.append((shape, times, routes))
    if rank == 0:
        print(f'SyncSN training forward+backward, {args.ranks} gloo ranks, '
              f'{args.threads} thread(s) each, medians of {args.rounds}')
        print('| shape (whole batch) | C++ kernels ms | reference ms | '
              'reference / C++ | routes |')
        print('|---|---|---|---|---|')
        for shape, t, routes in rows:
            native, ref = t['C++ kernels'] * 1e3, t['reference'] * 1e3
            print(f'| {"x".join(map(str, shape))} | {native:.3f} | '
                  f'{ref:.3f} | {ref / native:.2f} | '
                  f'{routes["C++ kernels"]}, {routes["reference"]} |')
    dist.destroy_process_group()


def main(argv=None):
    args = parse_args(argv)
    if not native_available():
        raise SystemExit('benchmark_sync.py: the C++ extension was not built')
    mp.spawn(worker, args=(free_port(), args), nprocs=args.ranks, join=True)


if __name__ == '__main__':
    main()
