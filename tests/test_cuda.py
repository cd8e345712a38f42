"""SN on a GPU: what `make gpu-check` verifies on the device.

Marked ``cuda``: they run where CUDA is available and are skipped
elsewhere, except that ``SN_MM_TEST_DEVICE=cpu`` runs them on the CPU at
toy sizes (the GPU check does so without a GPU, so that its driver is tested
before GPU minutes are spent; the Triton kernels then run in Triton's
interpreter). Against the float64 reference of the paper's formulas on each
kernel path; gradcheck and gradgradcheck; autocast; channels_last without a
full-size copy; SyncSN's collective path on a one-rank group; the fused
Triton kernels against the reference on every agreement case; the default
taking the fused kernels; float32 precision at large offsets against
PyTorch's norms on the device; a non-finite batch leaving the running
statistics untouched; activation checkpointing's recomputation updating
the running statistics once. (`make gpu-check` also runs
test_sync_sn_triton.py: SyncSN in two processes on the one GPU.)
"""
import concurrent.futures
import math
import multiprocessing
import os

import pytest
import torch
import torch.distributed as dist
from helpers import free_port, random_input, require_kernels

from sn_mm import SwitchableNorm
from sn_mm.models.sync_switchable_norm import end_process_group
from sn_mm.ops import native_available, switchable_norm, triton_problem
from sn_mm.testing import make_layer, reference_sn
from sn_mm.testing.kernel_agreement import all_cases, compare_case
from sn_mm.testing.precision import (OFFSETS, SPREADS, float32_errors,
                                     offset_inputs, pytorch_norms)

DEVICE = os.environ.get('SN_MM_TEST_DEVICE') or (
    'cuda' if torch.cuda.is_available() else None)
ON_GPU = DEVICE == 'cuda'
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        DEVICE is None, reason='needs a GPU (or '
        'SN_MM_TEST_DEVICE=cpu)')
]


def kernel_paths():
    paths = ['torch']
    if ON_GPU:
        if triton_problem() is None:
            paths.append('triton')
    elif native_available():
        paths.append('native')
    return paths


def layer(c, using_bn=True, **kwargs):
    return make_layer(c, using_bn, **kwargs).to(DEVICE)


def sample(shape, seed=1):
    return random_input(shape, seed)


def reference_step(sn, shape, training, grad):
    """The float64 reference's output, running statistics and gradients
    for layer ``sn``'s state."""
    params = {
        n: p.detach().double().cpu().requires_grad_()
        for n, p in sn.named_parameters()
    }
    running = ((sn.running_mean.double().cpu(),
                sn.running_var.double().cpu()) if sn.using_bn else
               (None, None))
    x = sample(shape).requires_grad_()
    out, rm, rv = reference_sn(
        x,
        params['weight'],
        params['bias'],
        params['mean_weight'],
        params['var_weight'],
        *running,
        training,
        momentum=sn.momentum,
        eps=sn.eps,
        using_bn=sn.using_bn)
    out.backward(grad)
    grads = {f'{n} grad': p.grad for n, p in params.items()}
    return dict(
        output=out,
        **{'input grad': x.grad},
        running_mean=rm,
        running_var=rv,
        **grads)


SHAPES = [(4, 8, 6, 5), (3, 8), (2, 8, 1, 1), (2, 8, 3, 4, 5), (1, 8, 7, 7),
          (16, 8, 7, 7)]


@pytest.mark.parametrize('kernels', kernel_paths())
@pytest.mark.parametrize('shape', SHAPES, ids=str)
@pytest.mark.parametrize('using_bn', [True, False])
@pytest.mark.parametrize('training', [True, False])
def test_against_float64_reference(kernels, shape, using_bn, training):
    sn = layer(8, using_bn, kernels=kernels).train(training)
    grad = sample(shape, seed=2)
    want = reference_step(sn, shape, training, grad)
    x = sample(shape).float().to(DEVICE).requires_grad_()
    y = sn(x)
    y.backward(grad.float().to(DEVICE))
    got = {'output': y, 'input grad': x.grad}
    got.update({f'{n} grad': p.grad for n, p in sn.named_parameters()})
    if using_bn:
        got.update(running_mean=sn.running_mean, running_var=sn.running_var)
    for what, value in got.items():
        ref = want[what].detach().double()
        err = float((value.detach().double().cpu() - ref).abs().max()) \
            if ref.numel() else 0.
        scale = 1 + (float(ref.abs().max()) if ref.numel() else 0.)
        assert err <= 2e-4 * scale, (what, err)


@pytest.mark.parametrize('kernels', kernel_paths())
def test_empty_batch(kernels):
    """RoI heads without RoIs: an empty output that still carries (zero)
    gradients; running statistics untouched."""
    sn = layer(8, kernels=kernels)
    before = sn.running_mean.clone()
    x = torch.zeros(0, 8, 4, 4, device=DEVICE, requires_grad=True)
    y = sn(x)
    y.sum().backward()
    assert y.shape == x.shape and x.grad.shape == x.shape
    assert torch.equal(sn.running_mean, before)
    assert not sn.weight.grad.any()


@pytest.mark.parametrize('training', [True, False])
@pytest.mark.parametrize('shape', [(2, 3, 3, 3), (4, 3)], ids=str)
def test_gradcheck_and_gradgradcheck(training, shape):
    sn = layer(3).double().train(training)
    names = ('weight', 'bias', 'mean_weight', 'var_weight')

    def f(x, *p):
        return torch.func.functional_call(sn, dict(zip(names, p)), (x, ))

    args = (sample(shape).to(DEVICE).requires_grad_(),
            *(getattr(sn, n).detach().clone().requires_grad_() for n in names))
    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args)


@pytest.mark.parametrize(
    'dtype', [torch.bfloat16, torch.float16] if ON_GPU else [torch.bfloat16])
def test_autocast(dtype):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 16, 3, padding=1).to(DEVICE)
    sn, fp32 = layer(16), layer(16)
    x = torch.randn(2, 3, 12, 12, device=DEVICE)
    with torch.autocast(DEVICE, dtype=dtype):
        h = conv(x)
        y = sn(h)
    assert y.dtype == h.dtype == dtype
    y.float().square().sum().backward()
    assert torch.isfinite(sn.weight.grad).all()
    with torch.no_grad():
        ref = fp32(h.float())
    # the input's own rounding (8 bits of mantissa in bf16) bounds it
    assert float((y.detach().float() - ref).abs().max()) < 0.1


@pytest.mark.parametrize('kernels', kernel_paths())
def test_channels_last_without_a_full_size_copy(kernels):
    sn, twin = layer(8, kernels=kernels), layer(8, kernels=kernels)
    x = sample((2, 8, 6, 5)).float().to(DEVICE)
    grad = sample((2, 8, 6, 5), seed=2).float().to(DEVICE)
    x_ref = x.clone().requires_grad_()
    twin(x_ref).backward(grad)
    x_cl = x.to(memory_format=torch.channels_last).requires_grad_()
    grad_cl = grad.to(memory_format=torch.channels_last)
    with torch.profiler.profile(record_shapes=True) as prof:
        y = sn(x_cl)
        y.backward(grad_cl)
    torch.testing.assert_close(y, twin(x_ref.detach()), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(x_cl.grad, x_ref.grad, rtol=1e-4, atol=1e-4)
    if kernels == 'native':  # the C++ kernels want contiguous rows
        return
    copies = [
        e.name for e in prof.events()
        if e.name in ('aten::copy_', 'aten::clone', 'aten::contiguous',
                      'aten::_to_copy') and any(
                          s and math.prod(s) == x.numel()
                          for s in e.input_shapes)
    ]
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert x_cl.grad.is_contiguous(memory_format=torch.channels_last)
    assert not copies, copies


@pytest.fixture
def one_rank_group():
    if not dist.is_initialized():
        dist.init_process_group(
            'nccl' if ON_GPU else 'gloo',
            init_method=f'tcp://127.0.0.1:{free_port()}',
            rank=0,
            world_size=1)
    yield dist.group.WORLD
    end_process_group()


def test_syncsn_collective_path_on_one_rank(one_rank_group):
    """The all-gather forward and all-reduce backward on a one-rank group
    give what SN gives."""
    for kernels in ['torch'] + (['triton'] if ON_GPU else []):
        results = []
        for group in (None, one_rank_group):
            sn = layer(8)
            x = sample((4, 8, 5, 5)).float().to(DEVICE).requires_grad_()
            y = switchable_norm(x, sn.weight, sn.bias, sn.mean_weight,
                                sn.var_weight, sn.running_mean, sn.running_var,
                                sn.num_batches_tracked, True, sn.momentum,
                                sn.eps, True, kernels, group)
            y.square().sum().backward()
            results.append(
                (y.detach(), x.grad, sn.mean_weight.grad, sn.weight.grad,
                 sn.running_var.clone()))
        for a, b in zip(*results):
            torch.testing.assert_close(a, b)


def agreement_cases():
    """Every case on a GPU; on the CPU (Triton's interpreter) a few."""
    if ON_GPU:
        return all_cases((torch.float32, torch.bfloat16, torch.float16))
    return all_cases((torch.float32, ))[::41]


@pytest.mark.skipif(
    not ON_GPU and os.environ.get('TRITON_INTERPRET') != '1',
    reason='the Triton kernels need a GPU or the interpreter')
def test_fused_kernels_agree_with_the_reference():
    """Outputs, every gradient, running statistics and the batch counter
    after two steps, case by case; on a GPU in worker processes that compile
    Triton's specialisations in parallel."""
    require_kernels('triton')
    cases = agreement_cases()
    # compare_case raises, naming the case and the quantity, past the
    # dtype's tolerance.
    if ON_GPU:
        workers = max(1, min(14, (os.cpu_count() or 2) - 2))
        context = multiprocessing.get_context('spawn')
        with concurrent.futures.ProcessPoolExecutor(
                workers, mp_context=context) as pool:
            list(pool.map(compare_case, ['cuda'] * len(cases), *zip(*cases)))
    else:
        for case in cases:
            compare_case(DEVICE, *case)


@pytest.mark.skipif(not ON_GPU, reason='the default on a GPU')
def test_the_default_takes_the_fused_kernels():
    from sn_mm.ops import implementation
    x = torch.randn(2, 3, 4, 4, device='cuda')
    assert implementation(None, x, torch.ones(3, device='cuda'), None) == \
        'triton', 'the fused kernels failed their self-check (see the warning)'


@pytest.mark.skipif(not ON_GPU, reason='launches compiled kernels')
def test_repeated_calls_launch_the_compiled_kernels_directly():
    """After a shape's first call compiles its kernels, later calls skip
    Triton's launch path (the direct launcher, _compat.launch_directly)."""
    from sn_mm.ops import triton_fused
    sn = layer(8, kernels='triton')
    x = torch.randn(2, 8, 5, 5, device='cuda', requires_grad=True)
    sn(x).sum().backward()
    before = triton_fused.path_counts()['direct_launch']
    sn(x).sum().backward()
    # three kernels forward, three backward
    assert triton_fused.path_counts()['direct_launch'] - before == 6


@pytest.mark.parametrize('kernels', kernel_paths())
def test_float32_precision_at_large_offsets(kernels):
    """As tests/test_numerics.py's, on the device: SN's float32 outputs
    within 2x the worst of PyTorch's BN, IN and LN there, its running
    statistics within 2x BN's (floor 1e-6)."""
    shape = (4, 16, 8, 8)
    for offset in OFFSETS:
        for spread in SPREADS:
            inputs = [
                x.to(DEVICE) for x in offset_inputs(shape, offset, spread, 6)
            ]
            theirs = {
                name:
                float32_errors(
                    lambda make=make: make().to(DEVICE),
                    inputs,
                    offset,
                    spread)
                for name, make in pytorch_norms(shape[1]).items()
            }
            ours = float32_errors(
                lambda: SwitchableNorm(shape[1], kernels=kernels).to(DEVICE),
                inputs, offset, spread)
            for what in ('train', 'eval'):
                bound = 2 * max(e[what] for e in theirs.values())
                assert ours[what] <= bound, (offset, spread, what, ours,
                                             theirs)
            for what in ('running_mean', 'running_var'):
                bound = 2 * max(theirs['BN'][what], 1e-6)
                assert ours[what] <= bound, (offset, spread, what, ours,
                                             theirs)


@pytest.mark.parametrize('kernels', kernel_paths())
def test_nonfinite_batch_leaves_running_statistics(kernels):
    sn = layer(8, kernels=kernels).float()
    x = sample((4, 8, 5, 5)).float().to(DEVICE)
    sn(x)
    before = {k: v.clone() for k, v in sn.state_dict().items()}
    x[1, 3, 2, 2] = float('nan')
    y = sn(x.requires_grad_())
    y.sum().backward()
    after = sn.state_dict()
    for name in ('running_mean', 'running_var', 'num_batches_tracked'):
        assert torch.equal(after[name], before[name]), name
    assert int(sn.nonfinite_batches) == 1


@pytest.mark.parametrize('training', [True, False])
def test_group_sn_on_the_device_equals_the_cpu(training):
    """Group SN (ratio_groups=4) on the device, on whatever computes it
    there, against the same layer on the CPU in float64: outputs,
    gradients per group and running statistics."""
    torch.manual_seed(0)
    cpu = SwitchableNorm(8, ratio_groups=4).double()
    with torch.no_grad():
        for p in cpu.parameters():
            p.normal_()
        cpu.running_var.uniform_(.5, 1.5)
    dev = SwitchableNorm(8, ratio_groups=4).to(DEVICE)
    dev.load_state_dict(cpu.state_dict())
    cpu.train(training)
    dev.train(training)
    x = sample((4, 8, 6, 5))
    grad = torch.randn(4, 8, 6, 5, dtype=torch.float64)
    results = []
    for layer_, dtype in ((cpu, torch.float64), (dev, torch.float32)):
        xi = x.to(DEVICE if layer_ is dev else 'cpu',
                  dtype).detach().requires_grad_()
        out = layer_(xi)
        out.backward(grad.to(out))
        results.append([
            out, xi.grad, layer_.mean_weight.grad, layer_.var_weight.grad,
            layer_.running_mean, layer_.running_var
        ])
    for want, got in zip(*results):
        torch.testing.assert_close(
            got.double().cpu(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('ratio_groups', [1, 2])
@pytest.mark.parametrize('kernels', kernel_paths())
def test_checkpoint_recomputation_updates_statistics_once(
        kernels, ratio_groups):
    """torch.utils.checkpoint's recomputation in the backward leaves the
    running statistics as the step's forward left them; the gradients are
    those of the same step without checkpointing."""
    results = []
    for with_cp in (False, True):
        torch.manual_seed(0)
        sn = layer(8, kernels=kernels, ratio_groups=ratio_groups).float()
        conv = torch.nn.Conv2d(8, 8, 3, padding=1).to(DEVICE)
        block = torch.nn.Sequential(conv, sn)
        x = sample((4, 8, 6, 5)).float().to(DEVICE).requires_grad_()
        out = torch.utils.checkpoint.checkpoint(
            block, x, use_reentrant=False) if with_cp else block(x)
        out.square().sum().backward()
        results.append([
            x.grad, conv.weight.grad, sn.mean_weight.grad, sn.running_mean,
            sn.running_var, sn.num_batches_tracked
        ])
    assert int(results[1][-1]) == 1
    for want, got in zip(*results):
        torch.testing.assert_close(got, want)
