"""The native CPU kernels and the reference compute the same SN, and the
kernel setting picks what it says."""
import pytest
import torch
from helpers import make_sn, random_input, reference_of, run_layer
from tool_runner import ROOT, run_python_together

from sn_mm import SwitchableNorm, ops
from sn_mm.ops import native_available
from sn_mm.testing.precision import ulps_of_largest

# 7x7 (RoI features) and 13x11 rows take the kernels' short- and long-row
# paths, both with a remainder after the vector lanes (13x11: six rows, one
# block of four and two more); rows of 8 and 16 values fill one register of
# float32 under AVX2 and AVX-512 exactly, and 127 is the short-row path's
# last length. In float32 also 14x14 (RoI masks: 18 rows, a remainder of 4
# values) and 136 (whole vectors, an odd number of them).
SHAPES = {
    '2d': (6, 5),
    '4d': (4, 5, 6, 7),
    '5d': (3, 5, 2, 4, 3),
    'roi_7x7': (6, 5, 7, 7),
    'rows_of_8': (3, 5, 2, 4),
    'rows_of_16': (3, 5, 4, 4),
    'rows_of_127': (2, 6, 127),
    'long_rows': (2, 3, 13, 11),
    'one_position': (4, 5, 1, 1),
    'empty': (0, 5, 3, 3)
}


@pytest.fixture(autouse=True, params=ops.cpu_isas() or [None])
def isa(request):
    """Every test here under every instruction set the kernels are built
    for and this CPU runs (the best one is what runs by default)."""
    if request.param is None:
        yield None
        return
    before = ops.cpu_isa()
    ops.set_cpu_isa(request.param)
    try:
        yield request.param
    finally:
        ops.set_cpu_isa(before)


class Taken:
    """How many calls took special path ``path`` inside the block."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.before = ops.cpu_path_counts()[self.path]
        return self

    def __exit__(self, *exc):
        self.calls = ops.cpu_path_counts()[self.path] - self.before


def on_and_off(path, make_layer, x, grad=None, threads=None):
    """A fresh layer's call on ``x`` (and, given ``grad``, a training
    backward) with special ``path`` on, then off: the calls that took the
    path each time, and the output with, in training, every gradient."""
    taken, results = [], []
    before = torch.get_num_threads()
    for on in (True, False):
        sn = make_layer().train(grad is not None)
        xs = x.clone().requires_grad_(grad is not None)
        was_on = ops.set_cpu_path(path, on)
        torch.set_num_threads(threads or before)
        try:
            with Taken(path) as t:
                y = sn(xs)
                if grad is not None:
                    y.backward(grad)
        finally:
            ops.set_cpu_path(path, was_on)
            torch.set_num_threads(before)
        taken.append(t.calls)
        grads = [] if grad is None else [xs.grad
                                         ] + [p.grad for p in sn.parameters()]
        results.append([y.detach()] + grads)
    return taken, results


@pytest.mark.skipif(not native_available(), reason='extension not built')
def test_auto_picks_native_on_this_cpu_machine(monkeypatch):
    # Pins the default, so that the native-vs-PyTorch tests below compare two
    # different implementations and cannot pass vacuously.
    monkeypatch.delenv(ops.KERNELS_ENV, raising=False)
    x = torch.randn(2, 3, 4)
    w = torch.ones(3)
    assert ops.default_kernels() == 'auto'
    assert ops.implementation(None, x, w, None) == 'native'
    assert ops.implementation('auto', x.double(), w.double(), None) == \
        'native'
    assert ops.implementation('torch', x, w, None) == 'torch'
    # Inputs the C++ kernels do not take: the reference.
    assert ops.implementation(None, x.half(), w, None) == 'torch'
    assert ops.implementation(None, x, w.double(), None) == 'torch'
    # The route says what switchable_norm calls: the operator, through the
    # dispatcher, or the reference; nothing after it decides again.
    assert ops.route(None, x, w, None).call.__name__ == '_call_operator'
    assert ops.route('torch', x, w, None).call.__name__ == '_call_reference'


def test_dispatch_table():
    """The operator's kernels are registered per dispatch key."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for key in ('CUDA', 'AutogradCUDA', 'Meta'):
        assert has('sn_mm::switchable_norm', key), key
    assert has('sn_mm::switchable_norm_graph_grads',
               'CompositeImplicitAutograd')
    for key in ('CPU', 'AutogradCPU'):
        assert has('sn_mm::switchable_norm', key) == native_available(), key


@pytest.mark.skipif(not native_available(), reason='extension not built')
@pytest.mark.parametrize('shape', SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize('using_bn', [True, False])
@pytest.mark.parametrize('unbiased', [True, False])
@pytest.mark.parametrize('training', [True, False])
def test_native_equals_pytorch_float64(shape, using_bn, unbiased, training):
    x = random_input(shape)
    results = [
        run_layer(
            make_sn(shape[1], using_bn, unbiased).train(training), x, kernels)
        for kernels in ('native', 'torch')
    ]
    for key in results[0]:
        torch.testing.assert_close(
            results[0][key], results[1][key], rtol=1e-12, atol=1e-12, msg=key)


@pytest.mark.skipif(not native_available(), reason='extension not built')
@pytest.mark.parametrize(
    'shape', [(4, 16, 9, 9), SHAPES['roi_7x7'], SHAPES['rows_of_8'],
              SHAPES['rows_of_16'], SHAPES['rows_of_127'], SHAPES['long_rows'],
              (3, 6, 14, 14), (2, 5, 136)])
def test_native_equals_pytorch_float32(shape):
    x = random_input(shape, dtype=torch.float32)
    results = [
        run_layer(make_sn(shape[1], dtype=torch.float32), x, kernels)
        for kernels in ('native', 'torch')
    ]
    for key in results[0]:
        torch.testing.assert_close(
            results[0][key], results[1][key], rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.skipif(not native_available(), reason='extension not built')
@pytest.mark.parametrize(
    'shape,dtype',
    [
        ((64, 256, 7, 7), torch.float32),  # RoI features: short rows
        ((300, 256, 3, 3), torch.float64),
        ((2, 16, 70, 70), torch.float32),  # long rows
    ],
    ids=['7x7', 'float64_3x3', '70x70'])
@pytest.mark.parametrize('training', [True, False], ids=['train', 'eval'])
def test_calls_split_across_threads(shape, dtype, training):
    """Calls of many tasks: every value against the reference, on one
    thread and on two."""
    x = random_input(shape, dtype=dtype)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            sn = make_sn(shape[1], dtype=dtype).train(training)
            state = {k: v.clone() for k, v in sn.state_dict().items()}
            with torch.no_grad():
                got = sn(x)
                sn.load_state_dict(state)
                sn.kernels = 'torch'
                want = sn(x)
            torch.testing.assert_close(got, want)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(not native_available(), reason='extension not built')
@pytest.mark.parametrize(
    'case',
    [
        dict(shape=(8, 64, 24, 24), dtype=torch.float32),  # 144 KiB a sample
        dict(shape=(9, 64, 16, 32), dtype=torch.float64),  # 256 KiB
        # 64 KiB: blocks of four samples, the last one of two
        dict(shape=(30, 64, 16, 16), dtype=torch.float32),
        dict(shape=(8, 64, 24, 24), dtype=torch.float32, ratio_groups=4),
        dict(
            shape=(9, 64, 16, 32),
            dtype=torch.float64,
            using_bn=False,
            training=True),
        # 13 blocks of four: on three threads, shares of 4, 4 and 5 blocks
        dict(shape=(50, 64, 16, 16), dtype=torch.float32, threads=(1, 2, 3)),
    ],
    ids=[
        'float32', 'float64', 'blocks', 'group_sn', 'train_without_bn',
        'uneven_shares'
    ])
def test_samples_normalised_one_by_one(case):
    """Without the batch's BN statistics, samples of up to 512 KiB in
    batches that keep every thread busy are taken a block of about 256 KiB
    at a time (moments, LN statistics, normalisation while the block is in
    cache): output, and in training every gradient, against the reference
    on one thread and on two (and three, where the threads' shares of the
    blocks differ)."""
    check_path_against_reference('by_sample', case)


@pytest.mark.skipif(not native_available(), reason='extension not built')
@pytest.mark.parametrize(
    'case',
    [
        dict(shape=(1, 64, 24, 24), dtype=torch.float64, training=True),
        dict(shape=(1, 64, 24, 24), dtype=torch.float32),
        # two tasks of 48 channels: the middle ratio group spans both
        dict(
            shape=(1, 96, 24, 24),
            dtype=torch.float64,
            ratio_groups=3,
            training=True),
        dict(
            shape=(1, 64, 24, 24),
            dtype=torch.float64,
            using_bn=False,
            training=True),
    ],
    ids=['train', 'eval', 'group_sn', 'train_without_bn'])
def test_one_sample_against_the_reference(case):
    """One sample (batch-1 inference, a one-image training step): output,
    running statistics and every gradient against the reference on one
    thread and on two."""
    check_path_against_reference(None, case)


def check_path_against_reference(path, case):
    """SN on ``case`` takes special path ``path`` (None: any way) and
    computes what the reference computes."""
    case = dict(case)
    shape, dtype = case.pop('shape'), case.pop('dtype')
    training = case.pop('training', False)
    thread_counts = case.pop('threads', (1, 2))
    x = random_input(shape, dtype=dtype)
    grad = random_input(shape, seed=3, dtype=dtype)
    threads = torch.get_num_threads()
    try:
        for count in thread_counts:
            torch.set_num_threads(count)
            results = []
            for kernels in ('native', 'torch'):
                sn = SwitchableNorm(
                    shape[1], kernels=kernels,
                    **case).to(dtype).train(training)
                with torch.no_grad():
                    sn.mean_weight.normal_(
                        generator=torch.Generator().manual_seed(0))
                    sn.var_weight.normal_(
                        generator=torch.Generator().manual_seed(1))
                    if sn.running_var is not None:
                        sn.running_mean.fill_(0.5)
                        sn.running_var.fill_(2.0)
                xs = x.clone().requires_grad_(training)
                with Taken(path or 'short_rows') as taken:
                    y = sn(xs)
                    if training:
                        y.backward(grad)
                assert path is None or (taken.calls > 0) == (
                    kernels == 'native')
                results.append([y.detach()] + list(sn.buffers()) + (
                    [xs.grad] +
                    [p.grad for p in sn.parameters()] if training else []))
            for got, want in zip(*results):
                torch.testing.assert_close(got, want)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize('training', [True, False])
def test_pytorch_fallback_matches_reference(training):
    sn = make_sn(5, kernels='torch').train(training)
    x = random_input((4, 5, 6, 7))
    expected, exp_rm, exp_rv = reference_of(sn, x, training)
    torch.testing.assert_close(sn(x), expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(sn.running_mean, exp_rm)
    torch.testing.assert_close(sn.running_var, exp_rv)


def test_pytorch_fallback_gradcheck():
    sn = make_sn(3, kernels='torch')
    x = random_input((3, 3, 4, 2)).requires_grad_()
    assert torch.autograd.gradcheck(sn, (x, ))


def test_unknown_kernel_choices_are_refused(monkeypatch):
    x = random_input((2, 3, 4, 4))
    with pytest.raises(ValueError, match="kernels='Triton'"):
        SwitchableNorm(3, kernels='Triton')
    with pytest.raises(ValueError, match="kernels='cuda'"):
        ops.set_default_kernels('cuda')
    sn = make_sn(3)
    running = sn.running_mean.clone()
    sn.kernels = 'Triton'
    with pytest.raises(ValueError, match="kernels='Triton'"):
        sn(x)
    sn.kernels = None
    monkeypatch.setenv(ops.KERNELS_ENV, 'cuda')
    with pytest.raises(ValueError, match="SN_MM_KERNELS='cuda'"):
        sn(x)
    monkeypatch.delenv(ops.KERNELS_ENV)
    assert torch.equal(running, sn.running_mean)  # refused before touching
    sn(x)
    assert not torch.equal(running, sn.running_mean)


def test_global_default_and_per_layer_setting(monkeypatch):
    x = random_input((2, 3, 4, 4))
    expected = run_layer(make_sn(3), x, 'torch')
    monkeypatch.setenv(ops.KERNELS_ENV, 'torch')
    assert ops.default_kernels() == 'torch'
    try:
        ops.set_default_kernels('auto')  # wins over the environment
        assert ops.default_kernels() == 'auto'
    finally:
        ops.set_default_kernels(None)
    assert ops.default_kernels() == 'torch'
    # A layer's own setting wins over the global one.
    layer = make_sn(3, kernels='native' if native_available() else 'torch')
    result = run_layer(layer, x, layer.kernels)
    for key in expected:
        torch.testing.assert_close(result[key], expected[key], msg=key)


@pytest.mark.skipif(not native_available(), reason='extension not built')
def test_native_refuses_what_it_cannot_run():
    x = torch.zeros(2, 3, 4, dtype=torch.half)
    with pytest.raises(ValueError, match="kernels='native' runs on"):
        ops.implementation('native', x, torch.ones(3), None)
    sn = make_sn(3, dtype=torch.float32, kernels='native')
    with pytest.raises(ValueError, match="kernels='native' runs on"):
        sn(x)


@pytest.mark.skipif(not native_available(), reason='extension not built')
def test_instruction_sets(isa):
    """The set chosen is the one that runs; the best one the CPU has comes
    first; an unknown name and $SN_MM_CPU_ISA's are refused by name."""
    assert ops.cpu_isa() == isa
    assert ops.cpu_isas()[-1] == 'baseline'
    with pytest.raises(ValueError, match="unknown instruction set 'sse9'"):
        ops.set_cpu_isa('sse9')
    assert ops.cpu_isa() == isa


@pytest.mark.skipif(not native_available(), reason='extension not built')
def test_the_environment_picks_the_instruction_set(isa):
    if isa != ops.cpu_isas()[0]:
        pytest.skip('a fresh process per set would repeat this')
    code = 'from sn_mm.ops import cpu_isa; print(cpu_isa())'
    settings = ops.cpu_isas() + ['x87']
    runs = run_python_together(
        [['-c', code]] * len(settings),
        ROOT,
        ok=False,
        timeout=300,
        envs=[{
            'SN_MM_CPU_ISA': wanted
        } for wanted in settings])
    for wanted, run in zip(settings[:-1], runs):
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.split()[-1] == wanted
    bad = runs[-1]
    assert bad.returncode != 0
    assert "unknown instruction set 'x87'" in bad.stderr


@pytest.mark.skipif(not native_available(), reason='extension not built')
@pytest.mark.parametrize('path,shape', [
    ('short_rows', (52, 5, 7, 7)),
    ('by_sample', (8, 64, 24, 24)),
])
@pytest.mark.parametrize('training', [True, False], ids=['train', 'eval'])
def test_each_special_path_off_computes_the_same(isa, path, shape, training):
    """A special path switched off: the call takes the general way, which
    gives what the path gives (float64: to rounding) and every gradient."""
    if path == 'by_sample' and training:
        pytest.skip('an eval-forward path')
    taken, results = on_and_off(
        path,
        lambda: make_sn(shape[1], using_bn=path != 'by_sample'),
        random_input(shape),
        random_input(shape, seed=3) if training else None,
        threads=1)  # the paths' thresholds count per thread
    assert taken[0] > 0 and taken[1] == 0, taken
    for on, off in zip(*results):
        torch.testing.assert_close(on, off, rtol=1e-12, atol=1e-12)


# The kernels' float32 results against the float64 reference, in ulps of
# each result's largest value, at most: about twice the worst of the
# kernels measured (a logit's gradient sums products that cancel to a small
# value: several hundred ulps of it in float32 for every kernel set).
ULPS_AT_MOST = {
    'out': 16,
    'x_grad': 16,
    'weight': 16,
    'bias': 8,
    'mean_weight': 1024,
    'var_weight': 256,
    'running_mean': 8,
    'running_var': 8
}


@pytest.mark.skipif(not native_available(), reason='extension not built')
@pytest.mark.parametrize('rows', ['general', 'short_rows'])
def test_float32_in_ulps_at_every_row_length(isa, rows):
    """Rows of 1 to 2W + 1 values (W = 16, AVX-512's float32 lanes: whole
    vectors, a part of one, a row shorter than one) and 4k to 4k + 3 rows
    (the kernels take four at a time), training and backward, within
    ULPS_AT_MOST of the float64 reference on the same float32 values, with
    the short rows' one-pass sums and without."""
    worst = {}
    was_on = ops.set_cpu_path('short_rows', rows == 'short_rows')
    try:
        for length in range(1, 34):
            for channels in range(4, 8):  # 3 x channels rows: each % 4
                shape = (3, channels, length)
                x = random_input(shape, seed=length).float()
                grad = random_input(shape, seed=length + 50).float()
                with Taken('short_rows') as taken:
                    got = run_layer(
                        make_sn(channels, dtype=torch.float32), x, 'native',
                        grad)
                assert (taken.calls > 0) == (rows == 'short_rows')
                want = run_layer(
                    make_sn(channels, dtype=torch.float32).double().train(),
                    x.double(), 'torch', grad.double())
                for key, value in got.items():
                    ulps = ulps_of_largest(value, want[key])
                    worst[key] = max(worst.get(key, 0), ulps)
    finally:
        ops.set_cpu_path('short_rows', was_on)
    assert all(worst[k] <= ULPS_AT_MOST[k] for k in worst), worst
