#!/usr/bin/env python
"""SN on an NVIDIA GPU: the whole check as one prepared script.

``make gpu-check`` runs it. Made for a GPU machine that is lent for minutes
at a time and has PyTorch, Triton and numpy but no mmengine and no package
registry: it installs the pure-Python wheels that ``make gpu-wheels`` put
in ``gpu_wheels/`` (mmengine and what the image lacks) into a temporary
folder, imports sn_mm from the working tree (no build: on a GPU SN runs on
PyTorch ops or Triton) and then

1. checks the layer on the device: SN against the float64 reference of the
   paper's formulas (outputs and every gradient) on each kernel path, empty
   batches and one-position inputs included; gradcheck and gradgradcheck in
   float64; fp16/bf16 autocast; channels_last inputs; SyncSN's collective
   path on a one-rank NCCL group;
2. times SN, SyncSN, BN, GN(32), IN and LN at the detector shapes, large and
   small, in float32 and bf16 (autocast), and reports SN's forward as a
   fraction of the card's device-to-device copy bandwidth;
3. times a training step of a torchvision-style ResNet-50 (batch 32,
   224x224, bf16 autocast, channels_last) with BN, GN(32) and SN in every
   norm layer.

It prints one table and writes the figures to a JSON file. Without a GPU
it says so, runs the same code on the CPU at toy sizes (so that it is
tested before GPU minutes are spent) and exits 0 if those checks pass.
Meant to finish in under 6 minutes on an H100.
"""
import argparse
import functools
import glob
import json
import math
import os
import os.path as osp
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--wheels', default=osp.join(ROOT, 'gpu_wheels'),
                        help='folder of carried wheels (make gpu-wheels); '
                        'skipped with a note where it does not exist')
    parser.add_argument('--out', default=None,
                        help='JSON file (default: $OUT/gpu_check.json if '
                        '$OUT is set, else work_dirs/gpu_check.json)')
    parser.add_argument('--repeats', type=int, default=None,
                        help='timed repeats per measurement (default: 10 '
                        'on a GPU, 1 on the CPU)')
    parser.add_argument('--skip-bench', action='store_true',
                        help='correctness checks only')
    return parser.parse_args(argv)


def install_wheels(folder):
    """pip-installs the wheels (no index, no dependencies) into a temporary
    folder put first on sys.path; returns what it installed."""
    wheels = sorted(glob.glob(osp.join(folder, '*.whl')))
    if not wheels:
        return []
    target = tempfile.mkdtemp(prefix='sn_mm_wheels_')
    subprocess.run([sys.executable, '-m', 'pip', 'install', '-q',
                    '--no-index', '--no-deps', '--no-compile',
                    '--no-cache-dir', '--target', target, *wheels],
                   check=True)
    sys.path.insert(0, target)
    return [osp.basename(w) for w in wheels]


# -- correctness ---------------------------------------------------------

class Checks:
    """Named checks; each failure is recorded (with its message), none
    stops the others."""

    def __init__(self):
        self.results = []

    def run(self, name, fn, *args):
        start = time.perf_counter()
        try:
            detail = fn(*args) or ''
            ok = True
        except Exception as err:  # every failure is a result to report
            detail = f'{type(err).__name__}: {err}'.splitlines()[0][:300]
            ok = False
            traceback.print_exc()
        self.results.append(dict(check=name, ok=ok, detail=detail,
                                 seconds=round(time.perf_counter() - start,
                                               2)))
        print(f'  {"ok  " if ok else "FAIL"} {name}  {detail}', flush=True)


def kernel_paths(device):
    from sn_mm.ops import native_available
    paths = ['torch']
    if device == 'cuda':
        try:
            import triton  # noqa: F401  (whether it is there)
            paths.append('triton')
        except ImportError:
            pass
    elif native_available():
        paths.append('native')
    return paths


def make_layer(c, device, using_bn=True, seed=0, **kwargs):
    from sn_mm.testing.kernel_agreement import make_layer as layer_with_state
    return layer_with_state(c, using_bn, seed=seed, **kwargs).to(device)


def sample(shape, seed=1):
    import torch
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    offset = torch.randn(shape[:2], generator=gen, dtype=torch.float64) * 3
    return x * 2 + offset.reshape(*shape[:2], *([1] * (len(shape) - 2)))


def against_reference(device, kernels):
    """Outputs, running statistics and the gradients of input, affine and
    ratio logits against the float64 reference, float32 on the device."""
    import torch
    tests = osp.join(ROOT, 'tests')
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from sn_reference import reference_sn
    shapes = [(4, 8, 6, 5), (3, 8), (2, 8, 1, 1), (2, 8, 3, 4, 5),
              (1, 8, 7, 7), (16, 8, 7, 7)]
    worst = 0.
    for shape in shapes:
        for using_bn in (True, False):
            for training in (True, False):
                layer = make_layer(8, device, using_bn, kernels=kernels)
                layer.train(training)
                params = {n: p.detach().double().cpu().requires_grad_()
                          for n, p in layer.named_parameters()}
                rm = (layer.running_mean.double().cpu()
                      if using_bn else None)
                rv = layer.running_var.double().cpu() if using_bn else None
                x64 = sample(shape).requires_grad_()
                ref, ref_rm, ref_rv = reference_sn(
                    x64, params['weight'], params['bias'],
                    params['mean_weight'], params['var_weight'], rm, rv,
                    training, momentum=layer.momentum, eps=layer.eps,
                    using_bn=using_bn)
                grad = sample(shape, seed=2)
                ref.backward(grad)
                x = x64.detach().float().to(device).requires_grad_()
                y = layer(x)
                y.backward(grad.float().to(device))
                pairs = [('output', y, ref), ('input grad', x.grad,
                                              x64.grad)]
                pairs += [(f'{n} grad', p.grad, params[n].grad)
                          for n, p in layer.named_parameters()]
                if using_bn:
                    pairs += [('running_mean', layer.running_mean, ref_rm),
                              ('running_var', layer.running_var, ref_rv)]
                for what, got, want in pairs:
                    if got is None or want is None:
                        if got is None and want is None:
                            continue
                        got = torch.zeros(()) if got is None else got
                        want = torch.zeros(()) if want is None else want
                    want = want.detach().double()
                    err = float((got.detach().double().cpu() - want).abs()
                                .max()) if want.numel() else 0.
                    scale = 1 + (float(want.abs().max())
                                 if want.numel() else 0.)
                    worst = max(worst, err / scale)
                    if err > 2e-4 * scale:
                        raise AssertionError(
                            f'{kernels}: {what} off by {err:.2e} at shape '
                            f'{shape}, using_bn={using_bn}, '
                            f'training={training}')
    # An empty batch (RoI heads without RoIs): an empty output that still
    # carries (zero) gradients; running statistics untouched.
    layer = make_layer(8, device, kernels=kernels)
    before = layer.running_mean.clone()
    x = torch.zeros(0, 8, 4, 4, device=device, requires_grad=True)
    y = layer(x)
    y.sum().backward()
    assert y.shape == x.shape and x.grad.shape == x.shape
    assert torch.equal(layer.running_mean, before)
    assert not layer.weight.grad.any()
    return (f'worst relative error {worst:.1e} over {len(shapes) * 4} '
            'cases; empty batch ok')


def gradchecks(device):
    import torch
    layer = make_layer(3, device).double()
    names = ('weight', 'bias', 'mean_weight', 'var_weight')
    done = 0
    for training in (True, False):
        for shape in ((2, 3, 3, 3), (4, 3)):
            layer.train(training)

            def f(x, *p):
                return torch.func.functional_call(layer, dict(zip(names, p)),
                                                  (x, ))
            args = (sample(shape).to(device).requires_grad_(),
                    *(getattr(layer, n).detach().clone().requires_grad_()
                      for n in names))
            assert torch.autograd.gradcheck(f, args), (training, shape)
            assert torch.autograd.gradgradcheck(f, args), (training, shape)
            done += 1
    return f'gradcheck and gradgradcheck, float64, {done} cases'


def autocast_check(device):
    import torch
    dtypes = [torch.bfloat16] + ([torch.float16] if device == 'cuda' else [])
    out = []
    for dtype in dtypes:
        torch.manual_seed(0)
        conv = torch.nn.Conv2d(3, 16, 3, padding=1).to(device)
        layer = make_layer(16, device)
        fp32 = make_layer(16, device)
        x = torch.randn(2, 3, 12, 12, device=device)
        with torch.autocast(device, dtype=dtype):
            h = conv(x)
            y = layer(h)
        assert y.dtype == h.dtype == dtype, (y.dtype, h.dtype)
        y.float().square().sum().backward()
        assert torch.isfinite(layer.weight.grad).all()
        with torch.no_grad():
            ref = fp32(h.float())
        err = float((y.detach().float() - ref).abs().max())
        # the input's own rounding (8 bits of mantissa in bf16) bounds it
        assert err < 0.1, err
        out.append(f'{str(dtype)[6:]} max err {err:.1e}')
    return ', '.join(out)


def channels_last_check(device):
    """A channels_last input gives the contiguous input's output and
    gradients, in channels_last, and (on the PyTorch kernels, the CUDA
    default) no full-size copy in forward or backward."""
    import torch
    out = []
    for kernels in kernel_paths(device):
        layer = make_layer(8, device, kernels=kernels)
        twin = make_layer(8, device, kernels=kernels)
        x = sample((2, 8, 6, 5)).float().to(device)
        grad = sample((2, 8, 6, 5), seed=2).float().to(device)
        x_ref = x.clone().requires_grad_()
        twin(x_ref).backward(grad)
        x_cl = x.to(memory_format=torch.channels_last).requires_grad_()
        grad_cl = grad.to(memory_format=torch.channels_last)
        with torch.profiler.profile(record_shapes=True) as prof:
            y = layer(x_cl)
            y.backward(grad_cl)
        torch.testing.assert_close(y, twin(x_ref.detach()), rtol=1e-4,
                                   atol=1e-4)
        torch.testing.assert_close(x_cl.grad, x_ref.grad, rtol=1e-4,
                                   atol=1e-4)
        copies = [e.name for e in prof.events()
                  if e.name in ('aten::copy_', 'aten::clone',
                                'aten::contiguous', 'aten::_to_copy')
                  and any(s and math.prod(s) == x.numel()
                          for s in e.input_shapes)]
        layout = y.is_contiguous(memory_format=torch.channels_last)
        if kernels in ('torch', 'triton'):
            assert layout and x_cl.grad.is_contiguous(
                memory_format=torch.channels_last), 'layout not kept'
            assert not copies, f'full-size copies: {copies}'
        out.append(f'{kernels}: out channels_last {layout}, full-size '
                   f'copies {len(copies)}')
    return '; '.join(out)


def one_rank_group_check(device):
    """SyncSN's collective path (all-gather in forward, all-reduce in
    backward) on a one-rank group equals SN."""
    import torch
    import torch.distributed as dist
    from sn_mm.ops.functional import switchable_norm
    if not dist.is_initialized():
        os.environ.setdefault('MASTER_ADDR', '127.0.0.1')
        os.environ.setdefault('MASTER_PORT', str(29500 + os.getpid() % 1000))
        dist.init_process_group('nccl' if device == 'cuda' else 'gloo',
                                rank=0, world_size=1)
    paths = ['torch'] + (['triton'] if device == 'cuda' else [])
    for kernels in paths:
        results = []
        for group in (None, dist.group.WORLD):
            layer = make_layer(8, device)
            x = sample((4, 8, 5, 5)).float().to(device).requires_grad_()
            y = switchable_norm(
                x, layer.weight, layer.bias, layer.mean_weight,
                layer.var_weight, layer.running_mean, layer.running_var,
                layer.num_batches_tracked, True, layer.momentum, layer.eps,
                True, kernels, group)
            y.square().sum().backward()
            results.append((y.detach(), x.grad, layer.mean_weight.grad,
                            layer.weight.grad, layer.running_var.clone()))
        for a, b in zip(*results):
            torch.testing.assert_close(a, b)
    backend = dist.get_backend()
    dist.destroy_process_group()
    return (f'{backend}, kernels {"/".join(paths)}: output, gradients, '
            'running statistics equal SN')


def default_is_fused():
    """SN's default on this GPU ('auto') runs the fused Triton kernels:
    their self-check on the device passed."""
    import torch
    from sn_mm.ops import triton_fused
    assert triton_fused.works_on(torch.empty(1, device='cuda')), \
        'the fused kernels failed their self-check (see the warning)'
    return 'self-check passed'


# -- work for a pool of processes ----------------------------------------
# Triton compiles a kernel on its first call with each specialisation
# (seconds each, hundreds of them here); processes compile in parallel into
# Triton's on-disk cache, which the timed runs then read.

def pool_task(kind, payload):
    """One job in a worker process: 'compare' runs one case of
    sn_mm.testing.kernel_agreement (returns its worst difference); 'warm'
    runs SN forward, backward and eval once at (shape, dtype, layout)."""
    import torch
    if kind == 'compare':
        from sn_mm.testing.kernel_agreement import compare_case
        return compare_case('cuda', *payload)
    from sn_mm import SwitchableNorm
    shape, dtype, channels_last, contiguous_grad = payload
    layer = SwitchableNorm(shape[1]).cuda()
    x = torch.randn(shape, device='cuda', dtype=dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    grad = torch.randn(shape, device='cuda', dtype=dtype)
    if not contiguous_grad:
        grad = grad.to(memory_format=torch.channels_last)
    x.requires_grad_()
    layer(x).backward(grad)
    layer.eval()
    with torch.no_grad():
        layer(x)
    torch.cuda.synchronize()
    return 0.


def warm_payloads(shapes):
    """The benchmark's shapes (both dtypes) and the SN layers' inputs in
    the ResNet-50 step (bf16, channels_last)."""
    import torch
    jobs = [(shape, dtype, False, True) for shape in shapes
            for dtype in (torch.float32, torch.bfloat16)]
    resnet = [(64, 112), (64, 56), (256, 56), (128, 56), (128, 28),
              (512, 28), (256, 28), (256, 14), (1024, 14), (512, 14),
              (512, 7), (2048, 7)]
    jobs += [((32, c, s, s), torch.bfloat16, True, False)
             for c, s in resnet]
    return jobs


def collect_comparisons(futures):
    worst, failures = 0., []
    for future in futures:
        try:
            worst = max(worst, future.result())
        except AssertionError as err:
            failures.append(str(err))
    if failures:
        raise AssertionError(f'{len(failures)} of {len(futures)} cases '
                             f'differ; first: {failures[0]}')
    return (f'{len(futures)} cases (2D-5D, channels_last, one position, '
            f'fixed and SparsestMax ratios, cumulative momentum, fp32/bf16/'
            f'fp16) equal the PyTorch kernels; worst relative difference '
            f'{worst:.1e}')


# -- timing --------------------------------------------------------------

@functools.lru_cache(maxsize=None)  # one module, however many sections
def load_benchmark():
    import importlib.util
    path = osp.join(ROOT, 'tools', 'analysis_tools', 'benchmark_norm.py')
    spec = importlib.util.spec_from_file_location('benchmark_norm', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_bandwidth(device, repeats):
    """Device-to-device copy bandwidth in GB/s (bytes read + written)."""
    import torch
    numel = (1 << 28) if device == 'cuda' else (1 << 22)
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    bench = load_benchmark()
    dst.copy_(src)
    seconds = bench.median_time(lambda: dst.copy_(src), max(repeats, 3))
    return 2 * src.numel() * src.element_size() / seconds / 1e9


def layer_times(device, shapes, repeats, dtype_name):
    """Per shape and layer: forward, backward, both, eval forward (ms),
    under bf16 autocast for 'bfloat16'."""
    import torch
    bench = load_benchmark()
    dtype = getattr(torch, dtype_name)
    rows = []
    for shape in shapes:
        makers = bench.norm_layers(shape[1], device)
        makers.pop('naive SN', None)
        torch.manual_seed(0)
        x = torch.randn(shape, device=device, dtype=dtype)
        x.requires_grad_()
        grad = torch.randn(shape, device=device, dtype=dtype)
        layers = {name: make().to(device).train()
                  for name, make in makers.items()}
        autocast = torch.autocast(device, dtype=torch.bfloat16,
                                  enabled=dtype_name == 'bfloat16')
        times = {name: dict(fwd=[], both=[], eval=[], both_x10=[],
                            eval_x10=[])
                 for name in layers}

        def ten(fn):
            # Ten calls between two synchronisations: the time per call
            # when launches overlap the GPU's work, as inside a network.
            def run():
                for _ in range(10):
                    fn()
            return bench.timed(run) / 10
        with autocast:
            for layer in layers.values():
                layer(x).backward(grad)
            for _ in range(repeats):
                for name, layer in layers.items():
                    t = times[name]
                    t['fwd'].append(bench.timed(lambda: layer(x)))
                    layer.eval()
                    with torch.no_grad():
                        t['eval'].append(bench.timed(lambda: layer(x)))
                        t['eval_x10'].append(ten(lambda: layer(x)))
                    layer.train()
                    t['both'].append(bench.timed(
                        lambda: layer(x).backward(grad)))
                    t['both_x10'].append(ten(
                        lambda: layer(x).backward(grad)))
        for name, t in times.items():
            rows.append(dict(shape='x'.join(map(str, shape)), layer=name,
                             dtype=dtype_name,
                             **{k: statistics.median(v) * 1e3
                                for k, v in t.items()}))
    return rows


def two_read_pass(device, shape, repeats):
    """What the bandwidth figure of an exact SN forward can reach at most.
    SN reads its input twice (the statistics, then the normalisation), so
    time a pass that reads two arrays of the input's size and writes one,
    ten calls queued as for the layers' eval_x10; print_tables counts its
    bytes as it counts SN's (input + output) to give the ceiling."""
    import torch
    bench = load_benchmark()
    rows = []
    for dtype_name in ('float32', 'bfloat16'):
        dtype = getattr(torch, dtype_name)
        a = torch.randn(shape, device=device, dtype=dtype)
        b = torch.randn_like(a)
        out = torch.empty_like(a)

        def ten():
            for _ in range(10):
                torch.add(a, b, out=out)
        ten()
        rows.append(dict(shape='x'.join(map(str, shape)), dtype=dtype_name,
                         ms=bench.median_time(ten, max(repeats, 3)) * 1e2))
    return rows


def kernel_launches(device, shapes):
    """What one train forward+backward and one eval forward launch, per
    layer, at the smallest and the largest shape: the number of GPU kernels
    (on the CPU: of operators), their summed device time and the costliest
    three; where SN's time goes, and how much of it is per-call cost."""
    import torch
    from torch.autograd import DeviceType
    bench = load_benchmark()
    picks = [min(shapes, key=math.prod), max(shapes, key=math.prod)]
    rows = []
    for shape in picks:
        makers = bench.norm_layers(shape[1], device)
        for name in ('naive SN', 'IN', 'LN', 'SyncSN'):
            makers.pop(name, None)
        x = torch.randn(shape, device=device, requires_grad=True)
        grad = torch.randn(shape, device=device)
        for name, make in makers.items():
            layer = make().to(device)
            for mode in ('train', 'eval'):
                layer.train(mode == 'train')

                def call():
                    if mode == 'train':
                        layer(x).backward(grad)
                    else:
                        with torch.no_grad():
                            layer(x)
                call()
                bench.sync()
                with torch.profiler.profile() as prof:
                    call()
                    bench.sync()
                if device == 'cuda':
                    kernels = [e for e in prof.events()
                               if e.device_type == DeviceType.CUDA]
                else:
                    kernels = [e for e in prof.events()
                               if e.name.startswith(('aten::', 'sn_mm::'))]
                spent = {}
                for e in kernels:
                    us = getattr(e, 'device_time', None)
                    if us is None:
                        us = getattr(e, 'cuda_time', 0.)
                    spent[e.name] = spent.get(e.name, 0.) + (
                        us if device == 'cuda' else e.cpu_time)
                top = sorted(spent.items(), key=lambda kv: -kv[1])[:3]
                rows.append(dict(
                    shape='x'.join(map(str, shape)), layer=name, mode=mode,
                    kernels=len(kernels), us=round(sum(spent.values()), 1),
                    top=[(k[:60], round(v, 1)) for k, v in top]))
                print(f'  {rows[-1]}', flush=True)
    return rows


def host_costs(device, repeats=300):
    """Time per call (us) with the calls queued back to back and one
    synchronisation at the end, at a shape whose GPU work is negligible:
    what each call costs the host (Python, dispatch, kernel launches)."""
    import torch
    import torch.nn as nn
    from sn_mm import SwitchableNorm
    bench = load_benchmark()
    shape = (1, 64, 8, 8)
    x = torch.randn(shape, device=device, requires_grad=True)
    grad = torch.randn(shape, device=device)
    layers = {'GN(32)': nn.GroupNorm(32, 64).to(device),
              'SN': SwitchableNorm(64).to(device),
              'SN torch': SwitchableNorm(64, kernels='torch').to(device)}
    rows = {}
    for name, layer in layers.items():
        def eval_fwd():
            with torch.no_grad():
                layer(x)
        calls = {'eval fwd': eval_fwd, 'train fwd': lambda: layer(x),
                 'train fwd+bwd': lambda: layer(x).backward(grad)}
        for what, fn in calls.items():
            layer.train(what != 'eval fwd')
            fn()

            def loop():
                for _ in range(repeats):
                    fn()
            rows[f'{name} {what}'] = round(
                bench.median_time(loop, 3) / repeats * 1e6, 1)
    if device == 'cuda':
        # One kernel launch: through Triton's launch path, directly, and
        # an ATen op for scale.
        from sn_mm.ops import triton_fused as tf
        x3 = x.detach().reshape(1, 64, 64)
        plan = tf._plan(1, 64, 64, 64, 1, x3.device)
        ws = torch.empty(plan['ws'], device=device)
        args = (x3, ws, 64, 64, 64, plan['chunk'], 4096, 64, 1,
                plan['split'], plan['rows'], plan['block'],
                plan['chunk'] == plan['block'])
        key = ('diagnostic', ) + args[2:]
        index = x3.get_device()
        small = torch.randn(16, device=device)
        launches = {
            'triton launch path': lambda: tf._launch(
                tf._moments_kernel, None, plan['grid'], args, index),
            'direct launch': lambda: tf._launch(
                tf._moments_kernel, key, plan['grid'], args, index),
            'torch.add': lambda: torch.add(small, small)}
        for what, fn in launches.items():
            fn()

            def loop():
                for _ in range(repeats):
                    fn()
            rows[what] = round(bench.median_time(loop, 3) / repeats * 1e6, 1)
    print(f'  host us per call at {shape}: {rows}', flush=True)
    return rows


def resnet50(norm_layer, num_classes=1000):
    """A torchvision-style ResNet-50 (v1.5: the stride on the 3x3 conv)
    with ``norm_layer(channels)`` in every norm position."""
    import torch.nn as nn

    class Bottleneck(nn.Module):
        def __init__(self, inplanes, planes, stride):
            super().__init__()
            width, out = planes, planes * 4
            self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
            self.bn1 = norm_layer(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = norm_layer(width)
            self.conv3 = nn.Conv2d(width, out, 1, bias=False)
            self.bn3 = norm_layer(out)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or inplanes != out:
                self.downsample = nn.Sequential(
                    nn.Conv2d(inplanes, out, 1, stride, bias=False),
                    norm_layer(out))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            return self.relu(self.bn3(self.conv3(out)) + identity)

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), norm_layer(64),
              nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    inplanes = 64
    for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512),
                                             (3, 4, 6, 3))):
        for b in range(blocks):
            layers.append(Bottleneck(inplanes, planes,
                                     2 if (b == 0 and i > 0) else 1))
            inplanes = planes * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(),
               nn.Linear(2048, num_classes)]
    return nn.Sequential(*layers)


def resnet_steps(device, repeats, batch, size):
    import torch
    import torch.nn as nn
    from sn_mm import SwitchableNorm
    norms = {'BN': nn.BatchNorm2d, 'GN(32)': lambda c: nn.GroupNorm(32, c),
             'SN': SwitchableNorm}
    if device == 'cuda':
        norms['SN torch'] = lambda c: SwitchableNorm(c, kernels='torch')
    bench = load_benchmark()
    torch.manual_seed(0)
    x = torch.randn(batch, 3, size, size, device=device).to(
        memory_format=torch.channels_last)
    target = torch.randint(0, 1000, (batch, ), device=device)
    rows = []
    for name, norm in norms.items():
        model = resnet50(norm).to(device).to(
            memory_format=torch.channels_last).train()
        optim = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step():
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x), target)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
        for _ in range(2):
            step()
        rows.append(dict(norm=name, ms=bench.median_time(step, repeats) *
                         1e3))
    gn = next(r['ms'] for r in rows if r['norm'] == 'GN(32)')
    for r in rows:
        r['vs_gn'] = r['ms'] / gn
    return rows


# -- main ----------------------------------------------------------------

def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    report = dict(date=time.strftime('%Y-%m-%d %H:%M:%S %Z'),
                  python=platform.python_version())
    if osp.isdir(args.wheels):
        report['wheels'] = install_wheels(args.wheels)
    else:
        report['wheels'] = []
        print(f'(no {args.wheels}: using the packages installed here; '
              '`make gpu-wheels` prepares them for a GPU machine)')
    sys.path.insert(0, ROOT)
    try:
        import mmengine
    except ImportError as err:
        sys.exit(f'gpu_check: {err}: sn_mm needs mmengine. Run `make '
                 'gpu-wheels` where pip reaches the registry and carry '
                 'gpu_wheels/ along (--wheels DIR names another folder).')
    import torch
    import sn_mm
    report['mmengine'] = f'{mmengine.__version__} from {mmengine.__file__}'
    cuda = torch.cuda.is_available()
    device = 'cuda' if cuda else 'cpu'
    report.update(torch=torch.__version__, sn_mm=sn_mm.__version__,
                  device=(torch.cuda.get_device_name() if cuda else
                          f'CPU ({os.cpu_count()} cores)'))
    try:
        import triton
        report['triton'] = triton.__version__
    except ImportError:
        report['triton'] = None
    print(f'sn_mm {report["sn_mm"]}, torch {report["torch"]}, triton '
          f'{report["triton"]}, Python {report["python"]}, on '
          f'{report["device"]}; carried wheels: {len(report["wheels"])}')
    if not cuda:
        print('No GPU here: the CPU parts run at toy sizes so that the '
              'script is tested; the GPU figures need a GPU machine.')
    repeats = args.repeats or (10 if cuda else 1)

    pool = warm = compare = None
    if cuda:
        import concurrent.futures
        import multiprocessing
        from sn_mm.testing.kernel_agreement import all_cases
        pool = concurrent.futures.ProcessPoolExecutor(
            max(1, min(14, (os.cpu_count() or 2) - 2)),
            mp_context=multiprocessing.get_context('spawn'))
        compare = [pool.submit(pool_task, 'compare', case) for case in
                   all_cases((torch.float32, torch.bfloat16, torch.float16))]
        if not args.skip_bench:
            warm = [pool.submit(pool_task, 'warm', job) for job in
                    warm_payloads(load_benchmark().SHAPES)]

    print('\nChecks')
    checks = Checks()
    for kernels in kernel_paths(device):
        checks.run(f'float64 reference, kernels={kernels}',
                   against_reference, device, kernels)
    checks.run('gradcheck/gradgradcheck', gradchecks, device)
    checks.run('autocast', autocast_check, device)
    checks.run('channels_last', channels_last_check, device)
    checks.run('SyncSN on a one-rank group', one_rank_group_check, device)
    if compare is not None:
        checks.run('fused Triton kernels vs PyTorch kernels',
                   collect_comparisons, compare)
        checks.run('the default takes the fused Triton kernels',
                   default_is_fused)
    report['checks'] = checks.results
    out = args.out or osp.join(os.environ.get('OUT') or
                               osp.join(ROOT, 'work_dirs'), 'gpu_check.json')

    def save():
        # After every section, so that a run cut off at its time limit
        # still brings back what it measured.
        report['seconds'] = round(time.perf_counter() - start, 1)
        os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
        with open(out, 'w') as f:
            json.dump(report, f, indent=1)

    save()
    if not args.skip_bench:
        bench = load_benchmark()
        shapes = bench.SHAPES if cuda else [(2, 32, 8, 8), (1, 64, 7, 7)]
        report['errors'] = []
        if warm is not None:
            begin = time.perf_counter()
            concurrent.futures.wait(warm)
            for future in warm:
                if future.exception() is not None:  # reported, not hidden
                    report['errors'].append(
                        f'compiling ahead: {future.exception()!r}'[:300])
                    break
            report['warm_seconds'] = round(time.perf_counter() - begin, 1)
            print(f'\n(Triton kernels compiled; waited '
                  f'{report["warm_seconds"]} s for the last)')
        report['copy_gb_s'] = copy_bandwidth(device, repeats)
        sections = [('kernel launches', 'launches',
                     lambda: kernel_launches(device, shapes)),
                    ('host cost per call', 'host_us',
                     lambda: host_costs(device))]
        for dtype_name in ('float32', 'bfloat16'):
            sections.append((f'layer times {dtype_name}', 'layers',
                             lambda d=dtype_name: layer_times(
                                 device, shapes, repeats, d)))
        sections.append(('two-read ceiling', 'two_read',
                         lambda: two_read_pass(device,
                                               max(shapes, key=math.prod),
                                               repeats)))
        batch, size = (32, 224) if cuda else (2, 64)
        sections.append(('ResNet-50 step', 'resnet50_step',
                         lambda: dict(batch=batch, size=size,
                                      rows=resnet_steps(
                                          device, max(repeats // 2, 1),
                                          batch, size))))
        for title, key, fn in sections:
            print(f'\n{title} ...', flush=True)
            try:
                value = fn()
            except Exception as err:  # report it, measure the rest
                traceback.print_exc()
                report['errors'].append(f'{title}: {type(err).__name__}: '
                                        f'{err}'[:300])
                continue
            if isinstance(value, list):
                report.setdefault(key, []).extend(value)
            else:
                report[key] = value
            save()
        print_tables(report)
        if report['errors']:
            checks.results.append(dict(
                check='timings ran', ok=False,
                detail='; '.join(report['errors']), seconds=0))

    save()
    if pool is not None:
        pool.shutdown()
    failed = [c['check'] for c in report['checks'] if not c['ok']]
    print(f'\n{len(report["checks"]) - len(failed)} of '
          f'{len(report["checks"])} checks passed'
          + (f'; FAILED: {", ".join(failed)}' if failed else '')
          + f'; {report["seconds"]} s; figures in {out}')
    return 1 if failed else 0


def print_tables(report):
    rows = report.get('layers', [])
    copy_bw = report['copy_gb_s']
    print(f'\nDevice-to-device copy: {copy_bw:.0f} GB/s')
    print('\n| shape | dtype | layer | fwd ms | fwd+bwd ms | fwd+bwd ms, 10 '
          'in a row | eval ms | SN/GN fwd+bwd | SN/GN 10 in a row | '
          'SN/GN eval | eval fwd (10 in a row) / copy bw |')
    print('|---|---|---|---|---|---|---|---|---|---|---|')
    by_key = {(r['shape'], r['dtype'], r['layer']): r for r in rows}
    for r in rows:
        gn = by_key[(r['shape'], r['dtype'], 'GN(32)')]
        numel = math.prod(int(s) for s in r['shape'].split('x'))
        itemsize = 2 if r['dtype'] == 'bfloat16' else 4
        # The fewest bytes a forward moves: the input read, the output
        # written.
        frac = 2 * numel * itemsize / (r['eval_x10'] * 1e-3) / 1e9 / copy_bw
        r['eval_bw_fraction'] = frac
        sn_row = 'SN' in r['layer']
        print(f'| {r["shape"]} | {r["dtype"]} | {r["layer"]} | '
              f'{r["fwd"]:.3f} | {r["both"]:.3f} | {r["both_x10"]:.3f} | '
              f'{r["eval"]:.3f} | '
              + (f'{r["both"] / gn["both"]:.2f} | '
                 f'{r["both_x10"] / gn["both_x10"]:.2f} | '
                 f'{r["eval"] / gn["eval"]:.2f} | {frac:.2f} |'
                 if sn_row else ' | | | |'))
    for r in report.get('two_read', []):
        numel = math.prod(int(s) for s in r['shape'].split('x'))
        itemsize = 2 if r['dtype'] == 'bfloat16' else 4
        r['bw_fraction'] = 2 * numel * itemsize / (r['ms'] * 1e-3) / 1e9 \
            / copy_bw
        sn = by_key.get((r['shape'], r['dtype'], 'SN'))
        print(f'\nCeiling of the eval-bandwidth column at {r["shape"]} '
              f'{r["dtype"]}: a pass reading two such arrays and writing '
              f'one, counted as SN is (input + output bytes), reaches '
              f'{r["bw_fraction"]:.2f} of copy bandwidth'
              + (f'; SN {sn["eval_bw_fraction"]:.2f}' if sn else ''))
    step = report.get('resnet50_step')
    if step:
        print(f'\n| ResNet-50 train step, batch {step["batch"]}, '
              f'{step["size"]}x{step["size"]}, bf16, channels_last | ms | '
              'vs GN(32) |')
        print('|---|---|---|')
        for r in step['rows']:
            print(f'| {r["norm"]} | {r["ms"]:.1f} | {r["vs_gn"]:.2f} |')


if __name__ == '__main__':
    sys.exit(main())
