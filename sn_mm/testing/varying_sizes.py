"""SN training steps over input sizes that change every batch, as mmdet's
keep-ratio resizing (padded to multiples of 32) and a varying number of
RoIs give: how many Triton compilations each step triggers and how large
the host caches and the device's memory grow. ``make gpu-check`` runs it
on a GPU; the tests run it on the CPU at toy sizes."""
import random

import torch

from ..models import SwitchableNorm

# FPN's levels (stride, channels) and a mask head's RoI features.
LEVELS = ((4, 64), (8, 64), (16, 128), (32, 256), (64, 256))
ROI_CHANNELS, ROI_SIZE = 256, 14
KERNELS = ('moments_kernel', 'stats_kernel', 'normalize_kernel',
           'grad_sums_kernel', 'grad_stats_kernel', 'input_grad_kernel')


def triton_compilations() -> int:
    """Specialisations Triton holds compiled for SN's fused kernels (0 in
    Triton's interpreter, which compiles nothing)."""
    from ..ops import triton_kernels
    total = 0
    for name in KERNELS:
        caches = getattr(getattr(triton_kernels, name), 'device_caches', None)
        for entry in (caches or {}).values():
            total += len(entry[0])
    return total


def host_cache_sizes():
    """Entries in the Triton module's plan and launch caches."""
    from ..ops import triton_fused
    return len(triton_fused._PLANS), len(triton_fused._COMPILED)


def run(device, steps=200, seed=0, toy=False, kernels=None):
    """``steps`` training steps of one SN layer per level at a random
    image size (height 512-800, width 512-1344, multiples of 32; toy:
    64-128) and 1-512 RoIs; one row per step: compilations so far, the
    plan and launch caches' sizes, device memory allocated and reserved
    (MiB; 0 on the CPU). ``kernels``: the layers' setting (None: the
    default)."""
    rng = random.Random(seed)
    levels = [(s, c // 16 if toy else c) for s, c in LEVELS]
    layers = [SwitchableNorm(c, kernels=kernels).to(device) for _, c in levels]
    roi_c = ROI_CHANNELS // 16 if toy else ROI_CHANNELS
    layers.append(SwitchableNorm(roi_c, kernels=kernels).to(device))
    cuda = torch.device(device).type == 'cuda'
    rows = []
    for step in range(steps):
        if toy:
            h, w = 32 * rng.randint(2, 4), 32 * rng.randint(2, 4)
        else:
            h, w = 32 * rng.randint(16, 25), 32 * rng.randint(16, 42)
        inputs = [
            torch.randn(2, c, -(-h // s), -(-w // s), device=device)
            for s, c in levels
        ]
        rois = rng.randint(1, 32 if toy else 512)
        inputs.append(
            torch.randn(rois, roi_c, ROI_SIZE, ROI_SIZE, device=device))
        loss = sum(
            layer(x.requires_grad_()).square().mean()
            for layer, x in zip(layers, inputs))
        loss.backward()
        del inputs, loss  # what stays allocated is the layers' own
        if cuda:
            torch.cuda.synchronize(device)
        plans, compiled = host_cache_sizes()
        rows.append(
            dict(
                step=step + 1,
                size=f'{h}x{w}',
                rois=rois,
                compilations=triton_compilations(),
                plans=plans,
                compiled=compiled,
                allocated_mib=(torch.cuda.memory_allocated(device) /
                               2**20 if cuda else 0.),
                reserved_mib=(torch.cuda.memory_reserved(device) /
                              2**20 if cuda else 0.)))
    return rows


def summary(rows):
    """Compilations per quarter of the run, the last step that compiled,
    and whether it settled: no compilation in the second half, the caches
    within their bounds, and the memory allocated between steps (the
    layers' parameters and gradients) what it was after the first step.
    Reserved memory is reported: the caching allocator may still take a
    block for a size larger than any before."""
    from ..ops import triton_fused
    n = len(rows)
    quarters = [rows[i * n // 4:(i + 1) * n // 4] for i in range(4)]
    before = [0] + [r['compilations'] for r in rows]
    new = [r['compilations'] - b for r, b in zip(rows, before)]
    compiled_at = [r['step'] for r, k in zip(rows, new) if k]
    half = rows[n // 2 - 1] if n > 1 else rows[0]
    last = rows[-1]
    return dict(
        steps=n,
        compilations_per_quarter=[
            sum(new[i * n // 4:(i + 1) * n // 4]) for i in range(4)
        ],
        last_step_compiling=compiled_at[-1] if compiled_at else 0,
        total_compilations=last['compilations'],
        plans=last['plans'],
        plan_bound=triton_fused._PLANS.size,
        compiled=last['compiled'],
        compiled_bound=triton_fused._COMPILED.size,
        allocated_mib_first=rows[0]['allocated_mib'],
        allocated_mib_end=last['allocated_mib'],
        reserved_mib_half=half['reserved_mib'],
        reserved_mib_max=max(r['reserved_mib'] for r in rows),
        reserved_mib_end=last['reserved_mib'],
        stopped=(sum(new[n // 2:]) == 0
                 and last['plans'] <= triton_fused._PLANS.size
                 and last['compiled'] <= triton_fused._COMPILED.size
                 and last['allocated_mib'] == rows[0]['allocated_mib']),
        quarter_steps=[
            f'{q[0]["step"]}-{q[-1]["step"]}' for q in quarters if q
        ])
