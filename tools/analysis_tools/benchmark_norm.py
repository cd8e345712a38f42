#!/usr/bin/env python
"""Benchmark SN against the native normalizers, a ResNet-50 and a detector.

Prints, per input shape, forward / backward / forward+backward times and the
bytes each layer saves for backward, for BN, GN(32), IN, LN, SN, SyncSN (one
process) and a naive SN written straight from the paper's formulas; the
eval forward of a batch-1 ResNet-50 with BN, GN(32) and SN; and one Mask
R-CNN R50-FPN training step (2 images, 512x512) with frozen BN, GN
everywhere and SN everywhere. Times are medians over --repeats runs, every
candidate timed in turn within each run; ratios compare numbers from this
same run.

On a GPU (``--device cuda``) SN runs on its default there, the fused Triton
kernels; a row 'SN torch' adds SN on the reference (``kernels='torch'``), the
layer table runs in float32 and bf16 (autocast) with a column of ten calls
queued between two synchronisations and the eval forward's fraction of the
card's copy bandwidth, and the GPU sections follow (``--gpu-sections`` runs
them on the CPU too): the two-read ceiling of that column, the host cost per
call, the kernels one call launches, every kernel of one call at the middle
detector shapes with the bandwidth SN's streaming kernels reach, a
torchvision Mask R-CNN R50-FPN training step (2 images of 800x1216, bf16)
with GN(32), SN and SyncSN on a one-rank group in the backbone, FPN and
heads (where torchvision is installed), and a ResNet-50 training step
(batch 32, 224x224, bf16, channels_last). ``--json FILE`` writes every
figure.

Example::

    python tools/analysis_tools/benchmark_norm.py --repeats 5
    python tools/analysis_tools/benchmark_norm.py --device cuda --repeats 10 \
        --skip-detector --json work_dirs/benchmark.json
"""
import argparse
import contextlib
import json
import math
import os
import statistics

import torch
import torch.nn as nn

import sn_mm  # noqa: F401
from sn_mm import SwitchableNorm, SyncSwitchableNorm
from sn_mm.models.sync_switchable_norm import end_process_group
from sn_mm.ops import (cpu_isa, cpu_isas, default_kernels, native_available,
                       set_cpu_isa)
from sn_mm.ops._compat import own_tensors
from sn_mm.ops.operator import CUDA_ROUTE
from sn_mm.testing.timing import (add_allocator_option, calls_filling,
                                  gradient_clearer, median_time, median_times,
                                  per_call, run_with_steady_malloc, timed)

SHAPES = [
    (2, 256, 200, 304),
    (2, 512, 100, 152),
    (2, 1024, 50, 76),
    (8, 256, 56, 56),
    (512, 256, 7, 7),
    (1024, 256, 14, 14),
    # Small, where a fixed per-call cost shows: FPN's top levels,
    # RoI heads with few RoIs, batch-1 inference.
    (1, 64, 8, 8),
    (1, 256, 7, 7),
    (16, 256, 7, 7),
    (1, 2048, 7, 7),
    (2, 256, 25, 38),
    (1, 512, 28, 28)
]
TOY_SHAPES = [(2, 32, 8, 8), (1, 64, 7, 7)]


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


def cpu_model():
    """The CPU's model name and its widest vector instructions, from
    /proc/cpuinfo (Linux; 'unknown CPU' elsewhere)."""
    try:
        with open('/proc/cpuinfo') as f:
            info = f.read()
    except OSError:
        return 'unknown CPU'
    name = next(
        (line.split(':', 1)[1].strip()
         for line in info.splitlines() if line.startswith('model name')),
        'unknown CPU')
    flags = set(
        next((line.split(':', 1)[1].split() for line in info.splitlines()
              if line.startswith(('flags', 'Features'))), []))
    simd = [
        f for f in ('avx512f', 'avx2', 'fma', 'asimd', 'sve') if f in flags
    ]
    return f'{name} ({" ".join(simd) or "no AVX2"})'


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


def bench_shape(makers, shape, repeats, device, dtype='float32', queued=False):
    """Times every layer on one shared input (bf16 under autocast for
    ``dtype='bfloat16'``). Each repeat times all layers in turn, so that
    drift on the machine (other load, clock) reaches every layer alike
    rather than whichever was measured at the time. ``queued``: also ten
    calls between two synchronisations (the time per call when launches
    overlap the GPU's work, as inside a network). On the CPU a layer whose
    call takes under a millisecond is timed over as many calls as fill
    one (at most 200) and the time per call kept: a single 10-microsecond
    call's time is mostly the timer's and the caches' noise."""
    torch.manual_seed(0)
    x = torch.randn(shape, device=device, dtype=getattr(torch, dtype))
    x.requires_grad_()
    grad = torch.randn_like(x)
    layers = {name: make().to(device).train() for name, make in makers.items()}
    keys = ['fwd', 'bwd', 'both', 'eval'
            ] + (['both_x10', 'eval_x10'] if queued else [])
    times = {name: {k: [] for k in keys} for name in layers}

    with torch.autocast(
            device, dtype=torch.bfloat16, enabled=dtype == 'bfloat16'):
        calls = {}
        for name, layer in layers.items():  # warm-up
            layer(x).backward(grad)
            calls[name] = _calls_per_timing(layer, x, grad, device)
        for _ in range(repeats):
            for name, layer in layers.items():
                _time_layer(layer, x, grad, times[name], queued, calls[name])
        x.grad = None
        return {
            name:
            dict({
                k: statistics.median(v)
                for k, v in t.items()
            },
                 saved=saved_bytes(layers[name], x))
            for name, t in times.items()
        }


def _calls_per_timing(layer, x, grad, device):
    """How many calls in a row each of a layer's timings takes: on the CPU
    as many as fill a millisecond, counted for each kind of call (an eval
    forward is several times shorter than a training step); one on a
    GPU."""
    if device != 'cpu':
        return dict(fwd=1, eval=1, both=1)

    def eval_fwd():
        with torch.no_grad():
            layer.eval()
            layer(x)
            layer.train()

    timed(eval_fwd)
    return dict(
        fwd=calls_filling(timed(lambda: layer(x))),
        eval=calls_filling(timed(eval_fwd)),
        both=calls_filling(timed(lambda: layer(x).backward(grad))))


def _time_layer(layer, x, grad, t, queued, calls):
    no_grads = gradient_clearer(x, *layer.parameters())
    no_grads()
    # Eval right after train forward: the same state of the caches.
    t['fwd'].append(per_call(lambda: layer(x), calls['fwd']))
    with torch.no_grad():
        layer.eval()
        t['eval'].append(per_call(lambda: layer(x), calls['eval']))
        if queued:
            t['eval_x10'].append(per_call(lambda: layer(x), 10))
    layer.train()
    out = layer(x)
    no_grads()
    t['bwd'].append(timed(lambda: out.backward(grad)))

    def both():
        no_grads()
        layer(x).backward(grad)

    t['both'].append(per_call(both, calls['both']))
    if queued:
        t['both_x10'].append(per_call(both, 10))


def resnet_eval_call(norm_cfg, device='cpu'):
    """An eval forward of mmdet's ResNet-50 at batch 1, 224x224, with
    ``norm_cfg`` in every norm layer: the batch-1 inference a fixed cost
    per layer call would show in."""
    from mmdet.models.backbones import ResNet
    x = torch.randn(1, 3, 224, 224, device=device)
    torch.manual_seed(0)
    model = ResNet(depth=50, norm_cfg=norm_cfg, norm_eval=False).to(device)
    model.eval()  # (mmdet's ResNet.train() returns None)

    def call():
        with torch.no_grad():
            model(x)

    return call


def resnet_eval_times(repeats, device):
    """:func:`resnet_eval_call`'s time with BN, GN(32) and SN."""
    variants = {
        'BN': dict(type='BN'),
        'GN(32)': dict(type='GN', num_groups=32),
        'SN': dict(type='SN')
    }
    calls = {
        name: resnet_eval_call(norm, device)
        for name, norm in variants.items()
    }
    for call in calls.values():
        for _ in range(3):  # warm-up
            call()
    return median_times(calls, repeats)


def mask_rcnn(norm_cfg, device='cpu'):
    """mmdet's Mask R-CNN R50-FPN with ``norm_cfg`` in the backbone, the
    FPN and the 4conv1fc box and mask heads (None: the config's own frozen
    BN), in training mode."""
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import DefaultScope

    # mmdet:: paths resolve inside _base_ only.
    cfg = Config.fromstring(
        "_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'",
        '.py').model
    cfg.backbone.init_cfg = None
    if norm_cfg is not None:
        cfg.backbone.norm_cfg = norm_cfg
        cfg.backbone.norm_eval = False
        cfg.neck.norm_cfg = norm_cfg
        cfg.roi_head.bbox_head.type = 'Shared4Conv1FCBBoxHead'
        cfg.roi_head.bbox_head.conv_out_channels = 256
        cfg.roi_head.bbox_head.norm_cfg = norm_cfg
        cfg.roi_head.mask_head.norm_cfg = norm_cfg
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope('mmdet'):
        return MODELS.build(cfg).to(device).train()


def detector_step_call(norm_cfg, device='cpu'):
    """One training step of :func:`mask_rcnn` on 2 images of 512x512."""
    from mmdet.testing import demo_mm_inputs
    model = mask_rcnn(norm_cfg, device)
    optim = torch.optim.SGD([p for p in model.parameters() if p.requires_grad],
                            lr=1e-4)
    packed = demo_mm_inputs(
        batch_size=2,
        image_shapes=[(3, 512, 512)] * 2,
        num_items=[5, 5],
        num_classes=80,
        with_mask=True)
    data = model.data_preprocessor(packed, True)

    def step():
        losses = model(**data, mode='loss')
        loss, _ = model.parse_losses(losses)
        optim.zero_grad()
        loss.backward()
        optim.step()

    return step


def detector_test_call(norm_cfg, device='cpu'):
    """Inference of :func:`mask_rcnn` on one image of 800x1216, as mmdet
    tests: the RoI heads in eval over the RPN's 1000 proposals."""
    from mmdet.testing import demo_mm_inputs
    model = mask_rcnn(norm_cfg, device).eval()
    packed = demo_mm_inputs(
        batch_size=1, image_shapes=[(3, 800, 1216)], num_classes=80)
    data = model.data_preprocessor(packed, False)

    def call():
        with torch.no_grad():
            model(**data, mode='predict')

    return call


def detector_step_times(repeats, device):
    """:func:`detector_step_call`'s time with frozen BN, GN and SN."""
    variants = {
        'frozen BN': None,
        'GN everywhere': dict(type='GN', num_groups=32, requires_grad=True),
        'SN everywhere': dict(type='SN', requires_grad=True),
    }
    results = {}
    for name, norm in variants.items():
        step = detector_step_call(norm, device)
        step()  # warm-up
        results[name] = median_time(step, repeats)
    return results


# -- the GPU sections -----------------------------------------------------


def copy_bandwidth(device, repeats):
    """Device-to-device copy bandwidth in GB/s (bytes read + written)."""
    numel = (1 << 28) if device == 'cuda' else (1 << 22)
    src = torch.empty(numel, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds = median_time(lambda: dst.copy_(src), max(repeats, 3))
    return 2 * src.numel() * src.element_size() / seconds / 1e9


def eval_bandwidth(shape, dtype, seconds, copy_gb_s):
    """An eval forward's fraction of copy bandwidth, counting the fewest
    bytes it moves: the input read and the output written."""
    itemsize = 2 if dtype == 'bfloat16' else 4
    return 2 * math.prod(shape) * itemsize / seconds / 1e9 / copy_gb_s


def two_read_pass(device, shape, repeats, copy_gb_s):
    """The ceiling of the eval-bandwidth column: SN reads its input twice
    (the statistics, then the normalisation), so time a pass that reads two
    arrays of the input's size and writes one, ten calls queued, and count
    its bytes as SN's are counted (input + output)."""
    rows = []
    for dtype in ('float32', 'bfloat16'):
        a = torch.randn(shape, device=device, dtype=getattr(torch, dtype))
        b, out = torch.randn_like(a), torch.empty_like(a)

        def ten():
            for _ in range(10):
                torch.add(a, b, out=out)

        ten()
        seconds = median_time(ten, max(repeats, 3)) / 10
        rows.append(
            dict(
                shape='x'.join(map(str, shape)),
                dtype=dtype,
                ms=seconds * 1e3,
                bw_fraction=eval_bandwidth(shape, dtype, seconds, copy_gb_s)))
    return rows


def host_costs(device, repeats=300):
    """Microseconds per call with the calls queued back to back and one
    synchronisation at the end, at a shape whose GPU work is negligible:
    what each call costs the host (Python, dispatch, kernel launches)."""
    shape = (1, 64, 8, 8)
    x = torch.randn(shape, device=device, requires_grad=True)
    grad = torch.randn(shape, device=device)
    layers = {
        'GN(32)': nn.GroupNorm(32, 64).to(device),
        'SN': SwitchableNorm(64).to(device),
        'SN torch': SwitchableNorm(64, kernels='torch').to(device)
    }
    rows = {}
    for name, layer in layers.items():

        def eval_fwd():
            with torch.no_grad():
                layer(x)

        calls = {
            'eval fwd': eval_fwd,
            'train fwd': lambda: layer(x),
            'train fwd+bwd': lambda: layer(x).backward(grad)
        }
        for what, fn in calls.items():
            layer.train(what != 'eval fwd')
            fn()
            rows[f'{name} {what}'] = round(
                median_time(lambda: [fn() for _ in range(repeats)], 3) /
                repeats * 1e6, 1)
    return rows


def kernel_launches(device, shapes):
    """What one train forward+backward and one eval forward launch, per
    layer, at the smallest and the largest shape: the number of GPU kernels
    (on the CPU: of operators), their summed device time and the costliest
    three; where SN's time goes, and how much of it is per-call cost."""
    rows = []
    for shape in (min(shapes, key=math.prod), max(shapes, key=math.prod)):
        x = torch.randn(shape, device=device, requires_grad=True)
        grad = torch.randn(shape, device=device)
        for name, make in norm_layers(shape[1], device).items():
            if name in ('naive SN', 'IN', 'LN', 'SyncSN'):
                continue
            layer = make().to(device)
            for mode in ('train', 'eval'):
                rows.append(
                    dict(
                        shape='x'.join(map(str, shape)),
                        layer=name,
                        mode=mode,
                        **_launches(layer, x, grad, mode, device)))
    return rows


def _profiled_kernels(layer, x, grad, mode, device):
    """(name, microseconds) of every kernel (on the CPU: operator) of one
    train forward+backward or eval forward of ``layer``."""
    from torch.autograd import DeviceType
    layer.train(mode == 'train')

    def call():
        if mode == 'train':
            layer(x).backward(grad)
        else:
            with torch.no_grad():
                layer(x)

    timed(call)
    with torch.profiler.profile() as prof:
        timed(call)
    if device == 'cuda':
        return [(e.name, getattr(e, 'device_time', None)
                 or getattr(e, 'cuda_time', 0.)) for e in prof.events()
                if e.device_type == DeviceType.CUDA]
    return [(e.name, e.cpu_time) for e in prof.events()
            if e.name.startswith(('aten::', 'sn_mm::'))]


def _launches(layer, x, grad, mode, device):
    spent = {}
    kernels = _profiled_kernels(layer, x, grad, mode, device)
    for name, us in kernels:
        spent[name] = spent.get(name, 0.) + us
    top = sorted(spent.items(), key=lambda kv: -kv[1])[:3]
    return dict(
        kernels=len(kernels),
        us=round(sum(spent.values()), 1),
        top=[(k[:60], round(v, 1)) for k, v in top])


# The detector shapes whose kernels the profile section lists one by one.
PROFILE_SHAPES = [(2, 1024, 50, 76), (8, 256, 56, 56), (512, 256, 7, 7)]
# Bytes each of SN's Triton kernels must move, in input-sized arrays: what
# its achieved bandwidth is counted from.
SN_KERNEL_ARRAYS = {
    'moments_kernel': 1,
    'normalize_kernel': 2,
    'grad_sums_kernel': 2,
    'input_grad_kernel': 3
}


def kernel_profile(device, shapes, copy_gb_s):
    """Every kernel of one train forward+backward and one eval forward of SN
    and GN(32) at the middle detector shapes (the toy shapes on the CPU):
    its device time and, for SN's kernels that stream the input, the
    fraction of copy bandwidth it reaches for the bytes it must move."""
    rows = []
    for shape in shapes:
        x = torch.randn(shape, device=device, requires_grad=True)
        grad = torch.randn(shape, device=device)
        for name in ('GN(32)', 'SN'):
            layer = norm_layers(shape[1], device)[name]().to(device)
            for mode in ('train', 'eval'):
                kernels = []
                for kernel, us in _profiled_kernels(layer, x, grad, mode,
                                                    device):
                    row = dict(kernel=kernel[:60], us=round(us, 1))
                    arrays = next(
                        (v
                         for k, v in SN_KERNEL_ARRAYS.items() if k in kernel),
                        None)
                    if arrays and us > 0:
                        gb_s = arrays * x.numel() * 4 / (us * 1e-6) / 1e9
                        row['bw_fraction'] = round(gb_s / copy_gb_s, 2)
                    kernels.append(row)
                rows.append(
                    dict(
                        shape='x'.join(map(str, shape)),
                        layer=name,
                        mode=mode,
                        kernels=kernels))
    return rows


def torchvision_mask_rcnn(norm_layer, toy):
    """torchvision's Mask R-CNN R50-FPN (the v2 builder's layout, no
    pretrained weights) with ``norm_layer`` in the backbone, the FPN and the
    box and mask heads."""
    from torchvision.models import resnet50 as tv_resnet50
    from torchvision.models.detection import MaskRCNN
    from torchvision.models.detection.backbone_utils import \
        _resnet_fpn_extractor
    from torchvision.models.detection.faster_rcnn import (FastRCNNConvFCHead,
                                                          _default_anchorgen)
    from torchvision.models.detection.mask_rcnn import MaskRCNNHeads
    from torchvision.models.detection.rpn import RPNHead
    backbone = _resnet_fpn_extractor(
        tv_resnet50(norm_layer=norm_layer), 5, norm_layer=norm_layer)
    anchors = _default_anchorgen()
    channels = backbone.out_channels
    size = dict(
        min_size=64,
        max_size=96,
        box_batch_size_per_image=32,
        rpn_post_nms_top_n_train=64) if toy else {}
    return MaskRCNN(
        backbone,
        num_classes=91,
        rpn_anchor_generator=anchors,
        rpn_head=RPNHead(
            channels, anchors.num_anchors_per_location()[0], conv_depth=2),
        box_head=FastRCNNConvFCHead((channels, 7, 7), [256] * 4, [1024],
                                    norm_layer=norm_layer),
        mask_head=MaskRCNNHeads(channels, [256] * 4, 1, norm_layer=norm_layer),
        **size)


def _one_rank_group(device) -> bool:
    """Start a one-rank process group unless one runs; whether it started
    one (its caller then ends it: end_process_group)."""
    import torch.distributed as dist
    if dist.is_initialized():
        return False
    # An in-process store: one rank has no one to meet.
    dist.init_process_group(
        'nccl' if device == 'cuda' else 'gloo',
        store=dist.HashStore(),
        rank=0,
        world_size=1)
    return True


@contextlib.contextmanager
def cuda_route(via):
    """SN's CUDA calls through the dispatcher ('operator') or straight
    to the Triton module ('direct') inside the block."""
    before = CUDA_ROUTE['via']
    CUDA_ROUTE['via'] = via
    try:
        yield
    finally:
        CUDA_ROUTE['via'] = before


def route_host_costs(device, rounds=5, calls=300):
    """Host microseconds per SN call at 1x64x8x8 (calls queued) by route,
    in alternating rounds: the layer through the dispatcher, the layer
    calling the Triton module directly, and the Triton module's own entry
    point alone (no layer, no router): where SN's per-call cost goes."""
    from sn_mm.ops.operator import triton_module
    shape = (1, 64, 8, 8)
    x = torch.randn(shape, device=device, requires_grad=True)
    grad = torch.randn(shape, device=device)
    layer = SwitchableNorm(64).to(device)
    fused = triton_module() if device == 'cuda' else None

    def bare(training):
        p, b = own_tensors(layer)
        return fused.switchable_norm(x, p['weight'], p['bias'],
                                     p['mean_weight'], p['var_weight'],
                                     b['running_mean'], b['running_var'],
                                     b['num_batches_tracked'],
                                     b['ratio_fixed'], b['fixed_ratios'],
                                     training, 0.1, 1e-5, True)

    def variants(training):
        out = {
            'layer, operator': ('operator', lambda: layer(x)),
            'layer, direct': ('direct', lambda: layer(x))
        }
        if fused is not None:
            out['Triton entry point'] = ('direct', lambda: bare(training))
        return out

    times = {}
    for mode in ('eval fwd', 'train fwd+bwd'):
        training = mode != 'eval fwd'
        layer.train(training)
        for name, (via, call) in variants(training).items():

            def fn(call=call, via=via, training=training):
                layer.train(training)
                with cuda_route(via), torch.set_grad_enabled(training):
                    for _ in range(calls):
                        y = call()
                        if training:
                            y.backward(grad)

            fn()
            times[f'{name} {mode}'] = fn
    per_call = median_times(times, rounds)
    return {k: round(t / calls * 1e6, 1) for k, t in per_call.items()}


def torchvision_detector_step(device, repeats, toy):
    """One training step of torchvision's Mask R-CNN R50-FPN, 2 images of
    800x1216 (64x96 with ``toy``), bf16 autocast on GPUs (float32 on the
    CPU, where bfloat16 convolutions without native support took 18 s a toy
    step on an AVX2 CPU), SGD, with GN(32), SN (as
    it runs, and on CUDA through the dispatcher: the route A/B) and SyncSN
    (a one-rank NCCL group) in the same layers; None where torchvision is
    missing."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return None
    own_group = _one_rank_group(device)
    bf16 = device == 'cuda'
    gen = torch.Generator().manual_seed(0)
    h, w = (64, 96) if toy else (800, 1216)
    images = [torch.rand(3, h, w, generator=gen).to(device) for _ in '12']
    targets = []
    for _ in images:
        xy = torch.rand(4, 2, generator=gen) * torch.tensor([w, h]) * 0.6
        boxes = torch.cat([xy, xy + torch.tensor([w, h]) * 0.3], 1)
        masks = torch.zeros(4, h, w, dtype=torch.uint8)
        for i, (x0, y0, x1, y1) in enumerate(boxes.int().tolist()):
            masks[i, y0:y1, x0:x1] = 1
        targets.append(
            dict(
                boxes=boxes.to(device),
                labels=torch.randint(1, 91, (4, ), generator=gen).to(device),
                masks=masks.to(device)))
    # (name, norm layer, how SN's CUDA calls reach the Triton kernels: the
    # route differs on CUDA only)
    norms = [('GN(32)', lambda c: nn.GroupNorm(32, c), 'direct'),
             ('SN', SwitchableNorm, 'direct')]
    if device == 'cuda':
        norms.append(('SN through the dispatcher', SwitchableNorm, 'operator'))
    norms.append(('SyncSN, one-rank group', SyncSwitchableNorm, 'direct'))
    steps = {}
    for name, norm, via in norms:
        torch.manual_seed(0)
        model = torchvision_mask_rcnn(norm, toy).to(device).train()
        optim = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)

        def step(model=model, optim=optim, via=via):
            with cuda_route(via):
                with torch.autocast(
                        device, dtype=torch.bfloat16, enabled=bf16):
                    loss = sum(model(images, targets).values())
                optim.zero_grad(set_to_none=True)
                loss.backward()
            optim.step()

        steps[name] = step
    # warm: an untimed step before each timed one (the first compiles)
    times = median_times(steps, repeats, warm=True)
    if own_group:
        end_process_group()
    return [
        dict(norm=name, ms=t * 1e3, vs_gn=t / times['GN(32)'])
        for name, t in times.items()
    ]


def resnet50(norm):
    """A ResNet-50 classifier with ``norm`` in every norm position:
    torchvision's where it is installed (``norm`` a layer constructor),
    else mmdet's backbone with a pooled linear head."""
    try:
        from torchvision.models import resnet50 as tv_resnet50
        return tv_resnet50(norm_layer=norm['layer'])
    except ImportError:
        from mmdet.models.backbones import ResNet
        return nn.Sequential(
            ResNet(
                depth=50,
                norm_cfg=norm['cfg'],
                norm_eval=False,
                out_indices=(3, )), _LastMapHead())


class _LastMapHead(nn.Module):

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2048, 1000)

    def forward(self, feats):
        return self.fc(feats[-1].mean((2, 3)))


RESNET_NORMS = {
    'BN':
    dict(layer=nn.BatchNorm2d, cfg=dict(type='BN')),
    'GN(32)':
    dict(
        layer=lambda c: nn.GroupNorm(32, c),
        cfg=dict(type='GN', num_groups=32)),
    'SN':
    dict(layer=SwitchableNorm, cfg=dict(type='SN')),
    'SN torch':
    dict(
        layer=lambda c: SwitchableNorm(c, kernels='torch'),
        cfg=dict(type='SN', kernels='torch')),
}


def resnet_step_times(device, repeats, batch, size):
    """A ResNet-50 training step (bf16 autocast on GPUs, float32 on the
    CPU as in :func:`torchvision_detector_step`; channels_last, SGD) with
    each norm in every norm layer."""
    torch.manual_seed(0)
    x = torch.randn(
        batch, 3, size, size,
        device=device).to(memory_format=torch.channels_last)
    target = torch.randint(0, 1000, (batch, ), device=device)
    steps = {}
    for name, norm in RESNET_NORMS.items():
        if name == 'SN torch' and device != 'cuda':
            continue  # (minutes on a CPU)
        model = resnet50(norm).to(device).to(
            memory_format=torch.channels_last).train()
        optim = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step(model=model, optim=optim):
            with torch.autocast(
                    device, dtype=torch.bfloat16, enabled=device == 'cuda'):
                loss = nn.functional.cross_entropy(model(x), target)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()

        for _ in range(2):
            step()
        steps[name] = step
    times = median_times(steps, repeats, warm=True)
    return [
        dict(norm=name, ms=t * 1e3, vs_gn=t / times['GN(32)'])
        for name, t in times.items()
    ]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument(
        '--shapes',
        type=int,
        nargs='*',
        help='indices into the shape list (default: all)')
    parser.add_argument(
        '--toy',
        action='store_true',
        help='two toy shapes and small networks (to test '
        'the tool, not to measure)')
    parser.add_argument('--skip-detector', action='store_true')
    parser.add_argument(
        '--skip-resnet',
        action='store_true',
        help='skip the batch-1 ResNet-50 eval table')
    parser.add_argument(
        '--threads',
        type=int,
        default=None,
        help='torch threads (default: torch\'s choice)')
    parser.add_argument(
        '--device',
        choices=['cpu', 'cuda'],
        default='cpu',
        help='cuda: time on the GPU, with the GPU sections')
    parser.add_argument(
        '--gpu-sections',
        action='store_true',
        help='the GPU sections on the CPU too')
    parser.add_argument(
        '--json', default=None, help='write every figure to this JSON file')
    parser.add_argument(
        '--group-sn',
        action='store_true',
        help='instead of the other tables: group SN '
        '(ratio_groups 2 and 32) against SN at each shape')
    parser.add_argument(
        '--sw',
        action='store_true',
        help='instead of the other tables: Switchable Whitening (SW, '
        'sw_type 2 and 5, 16 channels a group) against SN at each shape, '
        'time and memory saved for backward')
    parser.add_argument(
        '--cpu-isa',
        choices=['avx512', 'avx2', 'baseline'],
        help='instruction set of SN\'s C++ kernels (default: '
        '$SN_MM_CPU_ISA, else the best this CPU has)')
    add_allocator_option(parser)
    args = parser.parse_args(argv)
    if args.device == 'cuda' and not torch.cuda.is_available():
        parser.error('--device cuda: no GPU is visible to torch')
    return args


def layer_section(args, shapes, report):
    """The per-layer table (and, on a GPU, its bf16 twin) and the ratios."""
    gpu = args.device == 'cuda' or args.gpu_sections
    if gpu:
        report['copy_gb_s'] = copy_bandwidth(args.device, args.repeats)
    dtypes = ('float32', 'bfloat16') if gpu else ('float32', )
    print('| shape | dtype | layer | forward ms | backward ms | fwd+bwd ms | '
          'eval fwd ms | saved for backward MB |' +
          (' fwd+bwd, 10 queued ms | eval, 10 queued ms | eval / copy '
           'bandwidth |' if gpu else ''))
    print('|---' * (11 if gpu else 8) + '|')
    rows = report.setdefault('layers', [])
    for dtype in dtypes:
        for shape in shapes:
            res = bench_shape(
                norm_layers(shape[1], args.device), shape, args.repeats,
                args.device, dtype, gpu)
            for name, r in res.items():
                row = dict(
                    shape='x'.join(map(str, shape)),
                    dtype=dtype,
                    layer=name,
                    **{
                        k: v * 1e3
                        for k, v in r.items() if k != 'saved'
                    },
                    saved_mb=r['saved'] / 2**20)
                if gpu:
                    row['eval_bw_fraction'] = eval_bandwidth(
                        shape, dtype, r['eval_x10'], report['copy_gb_s'])
                rows.append(row)
                print(_layer_row(row, gpu))
    print_ratios(rows)


GROUPS = (2, 32)


def against_sn(args, shapes, variants):
    """Each shape's SN and ``variants(c)`` ({name: maker}) timed in turn:
    one row per layer with its times, saved bytes and ratios to SN's."""
    for shape in shapes:
        c = shape[1]
        makers = dict(SN=lambda: SwitchableNorm(c), **variants(c))
        res = bench_shape(makers, shape, args.repeats, args.device)
        sn = res['SN']
        for name, r in res.items():
            yield dict(
                shape='x'.join(map(str, shape)),
                layer=name,
                **{
                    k: v * 1e3
                    for k, v in r.items() if k != 'saved'
                },
                saved_mb=r['saved'] / 2**20,
                both_vs_sn=r['both'] / sn['both'],
                eval_vs_sn=r['eval'] / sn['eval'],
                saved_vs_sn=r['saved'] / sn['saved'])


def group_sn_section(args, shapes, report):
    """Group SN against SN (G = 1), layer by layer, timed in turn."""
    print('| shape | dtype | layer | forward ms | backward ms | fwd+bwd ms | '
          'eval fwd ms | fwd+bwd / SN | eval fwd / SN |')
    print('|---' * 9 + '|')
    rows = report.setdefault('group_sn', [])
    for row in against_sn(
            args, shapes, lambda c: {
                f'SN G={g}': (lambda g=g: SwitchableNorm(c, ratio_groups=g))
                for g in GROUPS
            }):
        rows.append(row)
        print(
            f'| {row["shape"]} | float32 | {row["layer"]} | {_ms(row["fwd"])} '
            f'| {_ms(row["bwd"])} | {_ms(row["both"])} | {_ms(row["eval"])} | '
            f'{row["both_vs_sn"]:.2f} | {row["eval_vs_sn"]:.2f} |',
            flush=True)


def sw_section(args, shapes, report):
    """Switchable Whitening (sw_type 2 and 5, in PyTorch ops: batched
    matmuls) against SN on its kernels, layer by layer, timed in turn."""
    from sn_mm.models.switchable_whitening import SwitchableWhitening

    def variants(c):
        return {
            f'SW sw_type={t}': (lambda t=t: SwitchableWhitening(
                c, num_pergroup=min(16, c), sw_type=t))
            for t in (2, 5)
        }

    print('| shape | layer | fwd+bwd ms | eval fwd ms | saved for backward '
          'MB | fwd+bwd / SN | eval fwd / SN | saved / SN |')
    print('|---' * 8 + '|')
    rows = report.setdefault('sw', [])
    for row in against_sn(args, shapes, variants):
        rows.append(row)
        print(
            f'| {row["shape"]} | {row["layer"]} | {_ms(row["both"])} | '
            f'{_ms(row["eval"])} | {row["saved_mb"]:.1f} | '
            f'{row["both_vs_sn"]:.2f} | {row["eval_vs_sn"]:.2f} | '
            f'{row["saved_vs_sn"]:.2f} |',
            flush=True)


def _ms(ms: float) -> str:
    """Four significant digits: a 10 us call keeps enough for its ratio."""
    return f'{ms:.4g}'


def _layer_row(r, gpu):
    line = (f'| {r["shape"]} | {r["dtype"]} | {r["layer"]} | '
            f'{_ms(r["fwd"])} | {_ms(r["bwd"])} | {_ms(r["both"])} | '
            f'{_ms(r["eval"])} | {r["saved_mb"]:.1f} |')
    if gpu:
        line += (f' {_ms(r["both_x10"])} | {_ms(r["eval_x10"])} | '
                 f'{r["eval_bw_fraction"]:.2f} |')
    return line


def print_ratios(rows):
    by_key = {(r['shape'], r['dtype'], r['layer']): r for r in rows}
    queued = 'both_x10' in rows[0]
    print('\n| shape | dtype | SN/GN fwd+bwd | SN/GN eval fwd | SN/naive '
          'fwd+bwd | SN/BN saved bytes | SN eval/train fwd |' +
          (' SN/GN fwd+bwd, 10 queued |' if queued else ''))
    print('|---' * (8 if queued else 7) + '|')
    for (shape, dtype, layer), sn in by_key.items():
        if layer != 'SN':
            continue
        gn = by_key[(shape, dtype, 'GN(32)')]
        naive = by_key.get((shape, dtype, 'naive SN'))
        bn = by_key[(shape, dtype, 'BN')]
        print(f'| {shape} | {dtype} | {sn["both"] / gn["both"]:.2f} | '
              f'{sn["eval"] / gn["eval"]:.2f} | ' +
              (f'{sn["both"] / naive["both"]:.2f}' if naive else '-') +
              f' | {sn["saved_mb"] / bn["saved_mb"]:.2f} | '
              f'{sn["eval"] / sn["fwd"]:.2f} |' +
              (f' {sn["both_x10"] / gn["both_x10"]:.2f} |' if queued else ''))


def gpu_sections(args, shapes, report):
    device, toy = args.device, args.toy
    # At the first shape: FPN's largest level (2x256x200x304) in the full
    # list, where the eval forward streams the most per call.
    report['two_read'] = two_read_pass(device, shapes[0], args.repeats,
                                       report['copy_gb_s'])
    for r in report['two_read']:
        sn = next(x for x in report['layers'] if x['layer'] == 'SN'
                  and x['dtype'] == r['dtype'] and x['shape'] == r['shape'])
        print(f'\nCeiling of the eval-bandwidth column at {r["shape"]} '
              f'{r["dtype"]}: a pass reading two such arrays and writing '
              f'one, counted as SN is, reaches {r["bw_fraction"]:.2f} of '
              f'copy bandwidth; SN {sn["eval_bw_fraction"]:.2f}')
    report['host_us'] = host_costs(device, 20 if toy else 300)
    print(f'\nHost microseconds per call at 1x64x8x8: {report["host_us"]}')
    report['route_host_us'] = route_host_costs(device, 3 if toy else 5,
                                               20 if toy else 300)
    print(
        'Same, SN by route (alternating rounds): '
        f'{report["route_host_us"]}',
        flush=True)
    report['launches'] = kernel_launches(device, shapes)
    for r in report['launches']:
        print(f'  launches: {r}')
    middle = shapes if toy else [s for s in PROFILE_SHAPES if s in shapes]
    report['kernel_profile'] = kernel_profile(device, middle,
                                              report['copy_gb_s'])
    print('\nKernels of one call at the middle shapes (us; SN\'s streaming '
          'kernels: fraction of copy bandwidth):')
    for r in report['kernel_profile']:
        print(f'  {r["shape"]} {r["layer"]} {r["mode"]}: ' + ', '.join(
            f'{k["kernel"]} {k["us"]}' +
            (f' ({k["bw_fraction"]})' if 'bw_fraction' in k else '')
            for k in r['kernels']))
    precision = 'bf16' if device == 'cuda' else 'float32'
    rows = torchvision_detector_step(device, max(args.repeats // 2, 1), toy)
    report['mask_rcnn_step'] = rows
    if rows is None:
        print('\nMask R-CNN step: torchvision is not installed, skipped')
    else:
        print('\n| torchvision Mask R-CNN R50-FPN train step, 2 images '
              f'{"64x96" if toy else "800x1216"}, {precision} | ms | '
              'vs GN(32) |')
        print('|---|---|---|')
        for r in rows:
            print(f'| {r["norm"]} | {r["ms"]:.1f} | {r["vs_gn"]:.2f} |')
    batch, size = (2, 64) if toy else (32, 224)
    rows = resnet_step_times(device, max(args.repeats // 2, 1), batch, size)
    report['resnet50_step'] = dict(batch=batch, size=size, rows=rows)
    print(f'\n| ResNet-50 train step, batch {batch}, {size}x{size}, '
          f'{precision}, channels_last | ms | vs GN(32) |')
    print('|---|---|---|')
    for r in rows:
        print(f'| {r["norm"]} | {r["ms"]:.1f} | {r["vs_gn"]:.2f} |')


def model_sections(args, report):
    if not args.skip_resnet:
        times = resnet_eval_times(max(args.repeats, 10), args.device)
        report['resnet50_eval'] = {k: v * 1e3 for k, v in times.items()}
        print('\n| ResNet-50 eval, batch 1, 224x224 | ms | vs GN(32) |')
        print('|---|---|---|')
        for name, t in times.items():
            print(f'| {name} in every norm layer | {t * 1e3:.1f} | '
                  f'{t / times["GN(32)"]:.2f} |')
    if not args.skip_detector:
        times = detector_step_times(max(args.repeats // 2, 2), args.device)
        report['detector_step'] = times
        print('\n| Mask R-CNN R50-FPN train step, 2 x 512x512 | seconds | '
              'vs GN |')
        print('|---|---|---|')
        for name, t in times.items():
            print(f'| {name} | {t:.2f} | '
                  f'{t / times["GN everywhere"]:.2f} |')


def main(argv=None):
    args = parse_args(argv)
    run_with_steady_malloc(args.allocator)
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = (
        TOY_SHAPES if args.toy else
        [SHAPES[i] for i in args.shapes] if args.shapes else SHAPES)
    if args.device == 'cuda':
        where = (f'{torch.cuda.get_device_name()}, SN kernels: '
                 f'{default_kernels()}')
    else:
        if args.cpu_isa:
            set_cpu_isa(args.cpu_isa)
        isa = (f'{cpu_isa()} (this CPU: {", ".join(cpu_isas())})'
               if native_available() else 'not built')
        where = (f'{cpu_model()}, {torch.get_num_threads()} threads, SN\'s '
                 f'C++ kernels: {isa}, malloc: {args.allocator}')
    print(f'torch {torch.__version__}, {where}, median of {args.repeats}\n')
    report = dict(device=where, repeats=args.repeats)
    if args.group_sn:
        group_sn_section(args, shapes, report)
        return report
    if args.sw:
        sw_section(args, shapes, report)
        return report
    layer_section(args, shapes, report)
    if args.device == 'cuda' or args.gpu_sections:
        gpu_sections(args, shapes, report)
    model_sections(args, report)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, 'w') as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == '__main__':
    main()
