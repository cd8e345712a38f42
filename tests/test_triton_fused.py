"""SN's fused Triton kernels (sn_mm/ops/triton_fused.py), the GPU default:
they compute what the PyTorch kernels compute (outputs, every gradient,
running statistics, the batch counter), keep channels_last, take bf16
without a float32 copy, give an exact double backward, and lower to GPU
code. Without a GPU they run in Triton's interpreter (tests/conftest.py);
``make gpu-check`` runs every case of sn_mm.testing.kernel_agreement on a
GPU."""
import os
import os.path as osp

import pytest
import torch
from helpers import require_kernels
from tool_runner import ROOT, run_python
from torch.utils._python_dispatch import TorchDispatchMode

from sn_mm import SwitchableNorm

require_kernels('triton', allow_module_level=True)
from sn_mm.ops import _compat  # noqa: E402
from sn_mm.ops import triton_targets  # noqa: E402
from sn_mm.ops import triton_fused, triton_kernels  # noqa: E402
from sn_mm.testing import kernel_agreement as agreement  # noqa: E402

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
needs_interpreter_or_gpu = pytest.mark.skipif(
    DEVICE == 'cpu' and os.environ.get('TRITON_INTERPRET') != '1',
    reason='needs a GPU or Triton\'s interpreter')

# A cross-section of the agreement cases (each takes about a second in the
# interpreter): every shape and layout, with and without BN, train and
# eval, each variant, bf16.
CASES = [
    ((4, 6, 5, 3), False, True, True, torch.float32, {}),
    ((4, 6, 5, 3), True, True, True, torch.float32, {}),
    ((4, 6, 5, 3), True, False, False, torch.bfloat16, {}),
    ((3, 5), False, True, True, torch.float32, {
        'momentum': None
    }),
    ((2, 5, 1, 1), False, True, True, torch.float32, {}),
    ((2, 5, 1, 1), False, False, True, torch.float32, {
        'fixed': True
    }),
    ((2, 3, 40, 50), False, True, True, torch.float32, {}),  # split rows
    ((2, 3, 40, 50), False, True, False, torch.bfloat16, {}),
    ((6, 8, 7, 7), False, True, True, torch.float32, {
        'fixed': True
    }),
    ((6, 8, 7, 7), False, True, True, torch.float32, {
        'ratio_fn': 'sparsestmax'
    }),
    ((6, 8, 7, 7), False, False, False, torch.float32, {
        'ratio_fn': 'sparsestmax'
    }),
    ((2, 3, 2, 2, 3), False, True, True, torch.float32, {}),
    ((2, 3, 2, 2, 3), False, True, False, torch.float32, {
        'momentum': None
    }),
    # Group SN: two groups, one per channel, fixed ratios in one group,
    # SparsestMax per group, channels_last, split rows, bf16.
    ((4, 6, 5, 3), False, True, True, torch.float32, {
        'ratio_groups': 2
    }),
    ((4, 6, 5, 3), True, True, False, torch.float32, {
        'ratio_groups': 6
    }),
    ((6, 8, 7, 7), False, True, True, torch.float32, {
        'ratio_groups': 4,
        'fixed': True
    }),
    ((6, 8, 7, 7), False, False, True, torch.float32, {
        'ratio_groups': 4,
        'ratio_fn': 'sparsestmax'
    }),
    ((2, 4, 40, 50), False, True, True, torch.bfloat16, {
        'ratio_groups': 2
    }),
    ((2, 6, 1, 1), False, True, True, torch.float32, {
        'ratio_groups': 3
    }),
]


@needs_interpreter_or_gpu
@pytest.mark.parametrize(
    'case',
    CASES,
    ids=[
        f'{"x".join(map(str, c[0]))}-cl{int(c[1])}-bn{int(c[2])}-'
        f'train{int(c[3])}-{str(c[4])[6:]}-{"-".join(c[5]) or "plain"}'
        for c in CASES
    ])
def test_fused_kernels_equal_pytorch_kernels(case):
    assert agreement.compare_case(DEVICE, *case) < 3e-2


@needs_interpreter_or_gpu
@pytest.mark.parametrize(
    'path,shape,channels_last',
    [
        # rows of 2000 values in two chunks (three tiles, four programs)
        ('split_rows', (2, 3, 40, 50), False),
        ('channels_last_tiles', (2, 8, 5, 6), True)
    ],
    ids=['split_rows', 'channels_last_tiles'])
def test_each_plan_path_runs_and_agrees(path, shape, channels_last):
    """The plan's special layouts: the call takes the path and computes
    what the reference computes; switched off, the general layout computes
    the same."""
    for on in (True, False):
        triton_fused.set_path(path, on)
        try:
            before = triton_fused.path_counts()[path]
            assert agreement.compare_case(DEVICE, shape, channels_last, True,
                                          True, torch.float32, {}) < 3e-2
            assert (triton_fused.path_counts()[path] > before) == on
        finally:
            triton_fused.set_path(path, True)
    before = triton_fused.path_counts()[path]
    agreement.compare_case(DEVICE, (2, 3, 4, 5), False, True, True,
                           torch.float32, {})
    assert triton_fused.path_counts()[path] == before  # not at other shapes
    with pytest.raises(ValueError, match="unknown Triton path 'tiles'"):
        triton_fused.set_path('tiles', False)


@needs_interpreter_or_gpu
def test_the_comparison_can_fail(monkeypatch):
    # A wrong factor in the input gradient's variance term must be caught.
    mutated = []
    real = triton_fused._launch

    def launch(kernel, key, grid, args, index):
        if kernel is triton_kernels.input_grad_kernel:
            args = list(args)
            at = triton_kernels.input_grad_kernel.arg_names.index(
                'two_over_divisor')
            args[at] = args[at] * 2
            mutated.append(1)
        return real(kernel, None, grid, tuple(args), index)

    monkeypatch.setattr(triton_fused, '_launch', launch)
    with pytest.raises(AssertionError, match='input_grad'):
        agreement.compare_case(DEVICE, (4, 6, 5, 3), False, True, True,
                               torch.float32, {})
    assert mutated


@needs_interpreter_or_gpu
def test_the_layer_takes_the_fused_path(monkeypatch):
    calls = []
    real = triton_fused._forward
    monkeypatch.setattr(triton_fused, '_forward',
                        lambda *a: calls.append(1) or real(*a))
    x = torch.randn(2, 4, 3, 3, device=DEVICE)
    SwitchableNorm(4, kernels='triton').to(DEVICE)(x)
    assert calls == [1]
    SwitchableNorm(4, kernels='torch').to(DEVICE)(x)
    SwitchableNorm(4, kernels='triton').to(DEVICE).double()(x.double())
    assert calls == [1]  # PyTorch ops, and float64 (not a fused dtype)


@needs_interpreter_or_gpu
def test_bfloat16_in_bfloat16_out_without_a_float32_copy():
    x = torch.randn(2, 4, 6, 6, device=DEVICE).bfloat16().requires_grad_()
    grad = torch.randn(2, 4, 6, 6, device=DEVICE).bfloat16()
    layer = SwitchableNorm(4, kernels='triton').to(DEVICE)
    with FloatCopies(x.numel()) as copies:
        y = layer(x)
        y.backward(grad)
    assert y.dtype == x.grad.dtype == torch.bfloat16
    # (The PyTorch kernels make 4 such copies here: float32 in, bf16 out,
    # in forward and in backward.)
    assert not copies.made, copies.made


class FloatCopies(TorchDispatchMode):
    """Records each operator that makes a float32 tensor of ``numel``
    elements. (Triton's interpreter copies each argument in and out in
    its own dtype: not a float32 copy.)"""

    def __init__(self, numel):
        super().__init__()
        self.numel, self.made = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out, )):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32 \
                    and t.numel() == self.numel:
                self.made.append(str(func))
        return out


@needs_interpreter_or_gpu
@pytest.mark.parametrize('training,groups', [(True, 1), (False, 1), (True, 5)])
def test_double_backward_equals_pytorch_kernels(training, groups):
    results = []
    for kernels in ('triton', 'torch'):
        torch.manual_seed(0)
        layer = agreement.make_layer(
            5, True, kernels, ratio_groups=groups).to(DEVICE)
        layer.train(training)
        x = (torch.randn(3, 5, 4, 4) * 2 + 1).to(DEVICE).requires_grad_()
        y = layer(x)
        (gx, ) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
        gx.square().sum().backward()  # a gradient penalty
        results.append([x.grad] + [p.grad for p in layer.parameters()])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# Which cases of the compile check's cross-section each Triton CI runs
# refuses (architecture, data type): Triton 3.0 targets nothing newer than
# sm_90 and has no bf16 below sm_80.
REFUSED_BY_TRITON = {
    (3, 0): lambda arch, dtype: arch >= 100 or (arch < 80 and dtype == 'bf16'),
    (3, 8): lambda arch, dtype: False,
}


def test_fused_kernels_compile_for_nvidia_gpus():
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    result = run_python(
        [osp.join(ROOT, 'tests', 'triton_fused_compile_check.py')],
        cwd=ROOT,
        ok=False,
        timeout=600,
        base_env=env)
    # (Exit status 1: a refusal SN's self-check does not foresee.)
    assert result.returncode == 0, result.stdout[-3000:] + \
        result.stderr[-3000:]
    lines = [
        line for line in result.stdout.splitlines()
        if 'cubin=' in line or ' refused: ' in line
    ]
    assert len(lines) == 72, result.stdout
    assert sum('grouped=True' in line for line in lines) == 24
    # Every architecture from V100's to RTX 50's compiles each of the 9
    # kernel cases of a shape once, in both dtypes over them.
    per_arch, refused = {}, set()
    for line in lines:
        name, _, dtype, grouped, arch = line.split()[:5]
        per_arch.setdefault(arch, []).append((name, grouped, dtype))
        if ' refused: ' in line:
            refused.add((int(arch[3:]), dtype))
        else:
            assert int(line.rsplit('=', 1)[1]) > 0, line
    assert sorted(per_arch) == sorted(f'sm_{a}'
                                      for a in (70, 75, 80, 86, 89, 90, 100,
                                                120)), per_arch
    for arch, compiled in per_arch.items():
        assert len({(name, grouped) for name, grouped, _ in compiled}) == 9
        assert len(compiled) == 9
        assert {dtype for *_, dtype in compiled} == {'fp32', 'bf16'}, arch
    refuses = REFUSED_BY_TRITON.get(_compat.triton_version())
    if refuses is not None:
        expected = {(int(arch[3:]), dtype)
                    for arch, compiled in per_arch.items()
                    for *_, dtype in compiled if refuses(int(arch[3:]), dtype)}
        assert refused == expected, result.stdout


@needs_interpreter_or_gpu
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_the_probe_accepts_working_kernels(dtype):
    assert triton_targets._probe(torch.device(DEVICE), dtype) is None


@needs_interpreter_or_gpu
def test_the_self_check_refuses_failing_kernels_with_a_warning(monkeypatch):
    # 'auto' then runs on PyTorch ops: a Triton the kernels do not compile
    # with must not stop a training run that PyTorch's ops can do.
    def broken(*args, **kwargs):
        raise RuntimeError('no such instruction')

    device = torch.device(DEVICE)
    monkeypatch.setattr(triton_fused, '_launch', broken)
    with pytest.warns(UserWarning, match='no such instruction'):
        assert not triton_targets.self_check(device, None, torch.float32)
    wrong = []
    real = triton_fused._forward

    def off_by_one(*args):
        y, *rest = real(*args)
        wrong.append(1)
        return (y + 1, *rest)

    monkeypatch.undo()
    monkeypatch.setattr(triton_fused, '_forward', off_by_one)
    with pytest.warns(UserWarning, match='output differs by'):
        assert not triton_targets.self_check(device, None, torch.float32)
    assert wrong


# (capability, dtype, whether the kernels compile) by Triton version, for
# the Tritons CI runs: 3.0 (torch 2.4) cannot compile bf16 below sm_80 (its
# PTX converts with cvt.f32.bf16, which ptxas takes from sm_80 on); no
# Triton from 3.0 on targets sm_35 (Kepler; CUDA 12's ptxas dropped it).
TARGETS = [(35, 'float32', False), (90, 'float32', True),
           (80, 'bfloat16', True)]
TARGETS_BY_TRITON = {
    (3, 0): [(75, 'bfloat16', False), (75, 'float32', True)],
    (3, 8): [(75, 'bfloat16', True), (70, 'float16', True)],
}
# In a process without Triton's interpreter (which cannot compile): each
# target's compile, then the self-check of a GPU of a refused one.
FORCED_CAPABILITY = """
import sys, warnings, torch
from sn_mm.ops import triton_targets
for arg in sys.argv[1:]:
    capability, name = arg.split(':')
    dtype = getattr(torch, name)
    problem = triton_targets.target_problem(int(capability), dtype)
    print(arg, 'compiles' if problem is None else 'refused')
    if problem is not None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            works = triton_targets.self_check(
                torch.device('cuda', 0), int(capability), dtype)
        print(arg, works, len(caught), caught[0].message if caught else '')
"""


def test_sn_runs_pytorch_ops_where_triton_cannot_compile_for_the_gpu():
    """The self-check of a GPU of a forced compute capability compiles the
    kernels for it ahead of time; where Triton refuses the architecture or
    the dtype, it says so once, naming both, and SN's default runs on
    PyTorch ops there (for that dtype). (Where they compile, the same check
    then runs them: test_the_probe_accepts_working_kernels.)"""
    targets = TARGETS + TARGETS_BY_TRITON.get(_compat.triton_version(), [])
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    result = run_python(
        ['-c', FORCED_CAPABILITY] +
        [f'{capability}:{dtype}' for capability, dtype, _ in targets],
        cwd=ROOT,
        base_env=env)
    lines = result.stdout.splitlines()
    for capability, dtype, compiles in targets:
        arg = f'{capability}:{dtype}'
        assert f'{arg} {"compiles" if compiles else "refused"}' in lines
        if not compiles:
            (checked, ) = [
                line for line in lines if line.startswith(f'{arg} False ')
            ]
            assert checked.startswith(f'{arg} False 1 '), checked
            assert f'cuda:0 (sm_{capability}) for torch.{dtype} inputs' in \
                checked
            assert f'cannot compile moments_kernel for sm_{capability}' in \
                checked


def test_host_caches_keep_the_most_recently_used(monkeypatch):
    """Keep-ratio resizing brings a new size almost every batch: the plan
    cache forgets the least recently used sizes instead of growing."""
    monkeypatch.setattr(triton_fused, '_PLANS', triton_fused._LRU(64))
    cpu = torch.device('cpu')
    first = triton_fused._plan(2, 8, 1, 1, 8, cpu)
    for length in range(2, 500):
        triton_fused._plan(2, 8, length, 1, 8, cpu)
        # the first size stays in use, as a layer seen every batch does
        assert triton_fused._plan(2, 8, 1, 1, 8, cpu) is first
    assert len(triton_fused._PLANS) == 64
    sizes = {key[:6] for key in triton_fused._PLANS}  # (then the switches)
    assert (2, 8, 2, 1, 8, cpu) not in sizes
    assert (2, 8, 499, 1, 8, cpu) in sizes


def test_layers_over_changing_sizes_settle():
    """SN training steps over a new image size and RoI count each step
    (what the GPU check runs for 200 steps): the caches stay within their
    bounds and the summary says so."""
    from sn_mm.testing import varying_sizes
    rows = varying_sizes.run('cpu', steps=2, toy=True, kernels='triton')
    assert len({r['size'] for r in rows}) > 1
    assert rows[-1]['plans'] > rows[0]['plans'] > 0  # the plans were used
    summary = varying_sizes.summary(rows)
    assert summary['stopped'] and summary['steps'] == 2
    assert summary['plans'] <= summary['plan_bound']


# The plans of a GPU: an H100's and an H200's 132 SMs, four programs each.
GPU_PROGRAMS = 4 * 132


@needs_interpreter_or_gpu
@pytest.mark.parametrize(
    'shape,channels_last',
    [
        # one row pair of 50,176 values in 32 chunks of 2,048 (two rows of
        # 1,024 a tile), the last seven empty: 1x64x224x224's plan, per row
        ((1, 2, 224, 224), False),
        # three tiles of two rows of 2,000, each split in two
        ((2, 3, 40, 50), False),
        # channels_last: tiles across 64 channels, rows split in four
        ((1, 64, 14, 14), True),
    ],
    ids=['empty_trailing_chunks', 'split_rows', 'channels_last_split'])
@pytest.mark.parametrize('training', [True, False], ids=['train', 'eval'])
def test_gpu_sized_plans_against_the_float64_reference(shape, channels_last,
                                                       training):
    """The plans a real GPU chooses (split rows, empty trailing chunks,
    the large tiles), forward and backward, against SN in float64."""
    previous = triton_fused.plan_as_for(GPU_PROGRAMS)
    try:
        n, c = shape[:2]
        length = shape[2] * shape[3]
        strides = (1, c) if channels_last else (length, 1)
        plan = triton_fused._plan(n, c, length, *strides, torch.device(DEVICE))
        assert plan['split'] > 1
        if shape == (1, 2, 224, 224):
            assert (plan['split'], plan['chunk'], plan['rows'],
                    plan['block']) == (32, 2048, 2, 1024)
            assert (plan['split'] * plan['chunk'] - length) // \
                plan['chunk'] == 7
        gen = torch.Generator().manual_seed(2)
        x = torch.randn(shape, generator=gen) * 2 + 3
        grad = torch.randn(shape, generator=gen)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
            grad = grad.to(memory_format=torch.channels_last)
        runs = []
        for kernels, dtype in (('triton', torch.float32), ('torch',
                                                           torch.float64)):
            layer = agreement.make_layer(c, True, kernels).to(DEVICE, dtype)
            layer.train(training)
            xi = x.to(DEVICE, dtype).detach().requires_grad_()
            y = layer(xi)
            y.backward(grad.to(DEVICE, dtype))
            runs.append(
                dict(
                    output=y.detach(),
                    input_grad=xi.grad,
                    running_var=layer.running_var,
                    **{
                        f'{name} grad': p.grad
                        for name, p in layer.named_parameters()
                    }))
        for name, got in runs[0].items():
            want = runs[1][name]
            scale = want.abs().max().clamp(min=1)
            assert (got.double() - want).abs().max() <= 1e-4 * scale, name
    finally:
        triton_fused.plan_as_for(previous)


def test_the_full_compile_check_takes_every_flag_combination():
    """triton_fused_compile_check.py --all (run on its own: about 1,600
    compiles) compiles every flag combination the host can produce, with
    and without the IN term, in every data dtype, on a GPU's plans: the
    one-position tile (BLOCK=1) and the split rows among them."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        'compile_check',
        osp.join(ROOT, 'tests', 'triton_fused_compile_check.py'))
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    cases = check.all_cases()
    flags = ('K', 'BN_BATCH', 'UPDATE', 'COUNT_BAD', 'HAS_IN', 'RATIOS_GIVEN',
             'HAS_FIXED', 'GROUPED', 'CUMULATIVE')
    normalize = {(tuple(c[f] for f in flags), dtype)
                 for name, c, dtype in cases if name == 'normalize_kernel'}
    # 5 settings of the BN term x IN or not x 2^4 free flags, 3 dtypes
    assert len(normalize) == 5 * 2 * 16 * 3
    assert {dtype for _, dtype in normalize} == {'fp32', 'bf16', 'fp16'}
    assert any(c.get('BLOCK') == 1 for _, c, _ in cases)
    assert any(c.get('SPLIT', 1) > 1 for _, c, _ in cases)
    sync = {c['SYNC'] for name, c, _ in cases if name == 'input_grad_kernel'}
    assert sync == {False, True}


@needs_interpreter_or_gpu
@pytest.mark.parametrize('shape', [(2, 3, 2000), (4, 6, 15)])
def test_the_host_reads_the_workspace_where_the_kernels_write(shape):
    """The statistics' places in a forward's workspace (ws_at, stat_at) as
    the host reads them (SyncSN's exchange) hold LN's and BN's batch
    statistics; (2, 3, 2000) splits its rows across programs."""
    n, c, length = shape
    x = torch.randn(shape, dtype=torch.float64).mul(3).add(5)
    x3 = x.float().to(DEVICE)
    params = [torch.ones(c), torch.zeros(c), torch.zeros(3), torch.zeros(3)]
    rmean, rvar = torch.zeros(c), torch.ones(c)
    nbt = torch.zeros((), dtype=torch.long)
    _, ws, plan = triton_fused._forward(
        x3, *(t.to(DEVICE) for t in params + [rmean, rvar, nbt]), None, None,
        True, 0.1, 1e-5, False, False)
    mean_bn, var_bn, _ = triton_fused._bn_slots(ws.cpu(), n, c, plan)
    torch.testing.assert_close(
        mean_bn.double(), x.mean((0, 2)), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        var_bn.double(), x.var((0, 2), unbiased=False), rtol=1e-4, atol=1e-5)
    ln = triton_kernels.ws_at.fn(triton_kernels.WS_LN, n * c, 1, plan['split'])
    mean_ln, var_ln = (
        ws.cpu()[ln + triton_kernels.stat_at.fn(stat, n):][:n].double()
        for stat in (triton_kernels.STAT_MEAN, triton_kernels.STAT_VAR))
    torch.testing.assert_close(mean_ln, x.mean((1, 2)), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        var_ln, x.var((1, 2), unbiased=False), rtol=1e-4, atol=1e-5)
