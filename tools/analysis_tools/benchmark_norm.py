#!/usr/bin/env python
"""Benchmark SN against the native normalizers, and a detector step.

Prints, per input shape, forward / backward / forward+backward times and the
bytes each layer saves for backward, for BN, GN(32), IN, LN, SN, SyncSN (one
process) and a naive SN written straight from the paper's formulas; then the
time of one Mask R-CNN R50-FPN training step (2 images, 512x512) with frozen
BN, GN everywhere and SN everywhere. Times are medians over --repeats runs;
ratios compare numbers from this same run.

On a GPU (``--device cuda``) SN runs on its default there, the fused Triton
kernels, and a row 'SN torch' adds SN on PyTorch ops (``kernels='torch'``)
for comparison.

Example::

    python tools/analysis_tools/benchmark_norm.py --repeats 5
    python tools/analysis_tools/benchmark_norm.py --device cuda --repeats 20
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

import sn_mm  # noqa: F401
from sn_mm import SwitchableNorm, SyncSwitchableNorm
from sn_mm.ops import default_kernels, native_available

# glibc's malloc returns large freed blocks to the OS and page-faults them
# back in on the next allocation; which layer pays for that depends on the
# order of its allocations, and it moved single timings by up to 2x here.
# A long training process keeps its memory; these settings do the same.
STEADY_MALLOC = {'MALLOC_MMAP_THRESHOLD_': str(2**32),
                 'MALLOC_TRIM_THRESHOLD_': str(2**36)}

SHAPES = [(2, 256, 200, 304), (2, 512, 100, 152), (2, 1024, 50, 76),
          (8, 256, 56, 56), (512, 256, 7, 7), (1024, 256, 14, 14),
          # Small, where a fixed per-call cost shows: FPN's top levels,
          # RoI heads with few RoIs, batch-1 inference.
          (1, 64, 8, 8), (1, 256, 7, 7), (16, 256, 7, 7), (1, 2048, 7, 7),
          (2, 256, 25, 38), (1, 512, 28, 28)]


class NaiveSN(nn.Module):
    """SN as the paper's Eq. 3-4 read: three separate sets of statistics,
    each over its own axes, composed from PyTorch ops."""

    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1, c, 1, 1))
        self.bias = nn.Parameter(torch.zeros(1, c, 1, 1))
        self.mean_weight = nn.Parameter(torch.ones(3))
        self.var_weight = nn.Parameter(torch.ones(3))

    def forward(self, x):
        axes = ((2, 3), (1, 2, 3), (0, 2, 3))  # IN, LN, BN
        means = [x.mean(a, keepdim=True) for a in axes]
        variances = [x.var(a, keepdim=True) for a in axes]
        wm = torch.softmax(self.mean_weight, 0)
        wv = torch.softmax(self.var_weight, 0)
        mean = sum(w * m for w, m in zip(wm, means))
        var = sum(w * v for w, v in zip(wv, variances))
        return (x - mean) / (var + 1e-5).sqrt() * self.weight + self.bias


def norm_layers(c, device):
    layers = {
        'BN': lambda: nn.BatchNorm2d(c),
        'GN(32)': lambda: nn.GroupNorm(32, c),
        'IN': lambda: nn.GroupNorm(c, c),
        'LN': lambda: nn.GroupNorm(1, c),
        'SN': lambda: SwitchableNorm(c),
        'SyncSN': lambda: SyncSwitchableNorm(c),
        'naive SN': lambda: NaiveSN(c),
    }
    if device == 'cuda':
        # SN as configured (the fused Triton kernels on GPUs unless
        # SN_MM_KERNELS says otherwise) and on PyTorch ops.
        layers['SN torch'] = lambda: SwitchableNorm(c, kernels='torch')
    return layers


def saved_bytes(layer, x):
    """Bytes of the distinct storages autograd keeps for backward."""
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return sum(storages.values())


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn):
    """Seconds fn takes, including the GPU work it queued."""
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def median_time(fn, repeats):
    return statistics.median(timed(fn) for _ in range(repeats))


def bench_shape(makers, shape, repeats, device):
    """Times every layer on one shared input. Each repeat times all layers
    in turn, so that drift on the machine (other load, clock) reaches every
    layer alike rather than whichever was measured at the time."""
    torch.manual_seed(0)
    x = torch.randn(shape, device=device).requires_grad_()
    grad = torch.randn(shape, device=device)
    layers = {name: make().to(device).train()
              for name, make in makers.items()}
    times = {name: dict(fwd=[], bwd=[], both=[], eval=[]) for name in layers}

    def backward_only(layer):
        out = layer(x)
        return timed(lambda: out.backward(grad))

    for layer in layers.values():  # warm-up
        layer(x).backward(grad)
    for _ in range(repeats):
        for name, layer in layers.items():
            x.grad = None
            t = times[name]
            # Eval right after train forward: the same state of the caches.
            t['fwd'].append(timed(lambda: layer(x)))
            with torch.no_grad():
                layer.eval()
                t['eval'].append(timed(lambda: layer(x)))
            layer.train()
            t['bwd'].append(backward_only(layer))
            t['both'].append(timed(lambda: layer(x).backward(grad)))
    x.grad = None
    return {name: dict({k: statistics.median(v) for k, v in t.items()},
                       saved=saved_bytes(layers[name], x))
            for name, t in times.items()}


def resnet_eval_times(repeats, device):
    """Eval forward of mmdet's ResNet-50 at batch 1, 224x224, with BN,
    GN(32) and SN in every norm layer: the batch-1 inference a fixed cost
    per layer call would show in."""
    from mmdet.models.backbones import ResNet
    variants = {'BN': dict(type='BN'), 'GN(32)': dict(type='GN',
                                                      num_groups=32),
                'SN': dict(type='SN')}
    x = torch.randn(1, 3, 224, 224, device=device)
    models = {}
    for name, norm in variants.items():
        torch.manual_seed(0)
        model = ResNet(depth=50, norm_cfg=norm, norm_eval=False).to(device)
        model.eval()  # (mmdet's ResNet.train() returns None)
        models[name] = model
    # Each repeat times every network in turn (drift reaches all alike).
    times = {name: [] for name in models}
    with torch.no_grad():
        for model in models.values():
            for _ in range(3):  # warm-up
                model(x)
        for _ in range(repeats):
            for name, model in models.items():
                times[name].append(timed(lambda: model(x)))
    return {name: statistics.median(t) for name, t in times.items()}


def detector_step_times(repeats, device):
    from mmdet.registry import MODELS
    from mmdet.testing import demo_mm_inputs
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    # mmdet:: paths resolve inside _base_ only.
    base = Config.fromstring(
        "_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'", '.py')
    variants = {
        'frozen BN': None,
        'GN everywhere': dict(type='GN', num_groups=32, requires_grad=True),
        'SN everywhere': dict(type='SN', requires_grad=True),
    }
    results = {}
    for name, norm in variants.items():
        cfg = base.model.copy()
        cfg.backbone.init_cfg = None
        if norm is not None:
            cfg.backbone.norm_cfg = norm
            cfg.backbone.norm_eval = False
            cfg.neck.norm_cfg = norm
            cfg.roi_head.bbox_head.type = 'Shared4Conv1FCBBoxHead'
            cfg.roi_head.bbox_head.conv_out_channels = 256
            cfg.roi_head.bbox_head.norm_cfg = norm
            cfg.roi_head.mask_head.norm_cfg = norm
        torch.manual_seed(0)
        model = MODELS.build(cfg).to(device).train()
        optim = torch.optim.SGD(
            [p for p in model.parameters() if p.requires_grad], lr=1e-4)
        packed = demo_mm_inputs(batch_size=2,
                                image_shapes=[(3, 512, 512)] * 2,
                                num_items=[5, 5], num_classes=80,
                                with_mask=True)
        data = model.data_preprocessor(packed, True)

        def step():
            losses = model(**data, mode='loss')
            loss, _ = model.parse_losses(losses)
            optim.zero_grad()
            loss.backward()
            optim.step()

        step()  # warm-up
        results[name] = median_time(step, repeats)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--shapes', type=int, nargs='*',
                        help='indices into the shape list (default: all)')
    parser.add_argument('--skip-detector', action='store_true')
    parser.add_argument('--skip-resnet', action='store_true',
                        help='skip the batch-1 ResNet-50 eval table')
    parser.add_argument('--threads', type=int, default=None,
                        help='torch threads (default: torch\'s choice)')
    parser.add_argument('--device', choices=['cpu', 'cuda'], default='cpu',
                        help='cuda: time on the GPU (adds an SN row on '
                        'PyTorch ops)')
    parser.add_argument(
        '--allocator', choices=['steady', 'system'], default='steady',
        help='steady (default): restart under glibc malloc settings that '
        'keep freed memory in the process, as a long training run does; '
        'system: the malloc settings as found')
    args = parser.parse_args()
    if args.allocator == 'steady' and any(
            os.environ.get(k) != v for k, v in STEADY_MALLOC.items()):
        # glibc reads these once, at process start.
        os.execve(sys.executable, [sys.executable] + sys.argv,
                  {**os.environ, **STEADY_MALLOC})
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = [SHAPES[i] for i in args.shapes] if args.shapes else SHAPES
    if args.device == 'cuda':
        if not torch.cuda.is_available():
            parser.error('--device cuda: no GPU is visible to torch')
        where = (f'{torch.cuda.get_device_name()}, SN kernels: '
                 f'{default_kernels()}')
    else:
        where = (f'{torch.get_num_threads()} CPU threads, native SN '
                 f'kernels: {native_available()}, malloc: {args.allocator}')
    print(f'torch {torch.__version__}, {where}, median of {args.repeats}\n')
    print('| shape | layer | forward ms | backward ms | fwd+bwd ms | '
          'eval fwd ms | saved for backward MB |')
    print('|---|---|---|---|---|---|---|')
    summary = []
    for shape in shapes:
        res = bench_shape(norm_layers(shape[1], args.device), shape,
                          args.repeats, args.device)
        for name, r in res.items():
            print(f'| {"x".join(map(str, shape))} | {name} | '
                  f'{r["fwd"] * 1e3:.2f} | {r["bwd"] * 1e3:.2f} | '
                  f'{r["both"] * 1e3:.2f} | {r["eval"] * 1e3:.2f} | '
                  f'{r["saved"] / 2**20:.1f} |')
        sn, gn = res['SN'], res['GN(32)']
        summary.append((shape, sn['both'] / gn['both'],
                        sn['eval'] / gn['eval'],
                        sn['both'] / res['naive SN']['both'],
                        sn['saved'] / res['BN']['saved'],
                        sn['eval'] / sn['fwd']))
    print('\n| shape | SN/GN fwd+bwd | SN/GN eval fwd | SN/naive fwd+bwd '
          '| SN/BN saved bytes | SN eval/train fwd |')
    print('|---|---|---|---|---|---|')
    for shape, gn, gn_eval, naive, mem, ev in summary:
        print(f'| {"x".join(map(str, shape))} | {gn:.2f} | {gn_eval:.2f} | '
              f'{naive:.2f} | {mem:.2f} | {ev:.2f} |')
    if not args.skip_resnet:
        times = resnet_eval_times(max(args.repeats, 10), args.device)
        print('\n| ResNet-50 eval, batch 1, 224x224 | ms | vs GN(32) |')
        print('|---|---|---|')
        for name, t in times.items():
            print(f'| {name} in every norm layer | {t * 1e3:.1f} | '
                  f'{t / times["GN(32)"]:.2f} |')
    if not args.skip_detector:
        times = detector_step_times(max(args.repeats // 2, 2), args.device)
        print('\n| Mask R-CNN R50-FPN train step, 2 x 512x512 | seconds | '
              'vs GN |')
        print('|---|---|---|')
        for name, t in times.items():
            print(f'| {name} | {t:.2f} | '
                  f'{t / times["GN everywhere"]:.2f} |')


if __name__ == '__main__':
    main()
