"""sn_mm/ops/_compat.py: each private API it uses gives what its public
fallback gives, and the fallback runs where the private API is missing."""
import os
import warnings

import pytest
import torch

from sn_mm.ops import _compat


@pytest.mark.parametrize('private', [True, False])
def test_getenv(monkeypatch, private):
    if not private:
        monkeypatch.setattr(_compat, '_ENV_BYTES', None)
    monkeypatch.setenv('SN_MM_COMPAT_PROBE', 'a value')
    assert _compat.getenv('SN_MM_COMPAT_PROBE') == 'a value'
    monkeypatch.delenv('SN_MM_COMPAT_PROBE')
    assert _compat.getenv('SN_MM_COMPAT_PROBE') is None
    assert _compat.getenv('PATH') == os.environ.get('PATH')


@pytest.mark.parametrize('private', [True, False])
def test_in_onnx_export(monkeypatch, private, tmp_path):
    if not private:
        monkeypatch.setattr(_compat, '_ONNX_FLAGS', None)
    assert _compat.in_onnx_export() is False
    seen = []

    class Probe(torch.nn.Module):

        def forward(self, x):
            seen.append(_compat.in_onnx_export())
            return x + 1

    pytest.importorskip('onnx')
    torch.onnx.export(Probe(), (torch.zeros(2), ), str(tmp_path / 'p.onnx'),
                      **_compat.onnx_export_kwargs('torchscript'))
    assert seen and all(seen)


@pytest.mark.parametrize('private', [True, False])
def test_jit_is_tracing(monkeypatch, private):
    if not private:
        monkeypatch.setattr(_compat, '_JIT_TRACING', None)
    assert _compat.jit_is_tracing() is False
    seen = []

    def probe(x):
        seen.append(_compat.jit_is_tracing())
        return x + 1

    torch.jit.trace(probe, (torch.zeros(2), ), check_trace=False)
    assert seen == [True]


def test_op_function_is_the_overloads_call():
    overload = torch.ops.aten.add.Tensor
    call = _compat.op_function(overload)
    a, b = torch.arange(3.), torch.ones(3)
    assert torch.equal(call(a, b), overload(a, b))
    with pytest.raises(RuntimeError, match='add'):
        call(a)  # the dispatcher's own argument check

    class NoBuiltin:

        def __call__(self, *args):
            return 'called'

    assert _compat.op_function(NoBuiltin())() == 'called'


def test_the_private_flags_are_found_on_this_torch():
    # Where this fails, torch moved them: the fallback still answers.
    if _compat.TORCH_VERSION >= (2, 14):
        # (where the main pin's torch keeps them; the oldest supported,
        # 2.1, answers through torch.onnx.is_in_onnx_export())
        assert _compat._ONNX_FLAGS is not None
    assert _compat._ENV_BYTES is not None
    assert _compat._JIT_TRACING is not None
    assert _compat.op_function(torch.ops.aten.add.Tensor) is not \
        torch.ops.aten.add.Tensor
    if torch.cuda.is_available():
        assert _compat._RAW_STREAM is not None


def test_direct_launch_falls_back_per_key_and_warns_once(monkeypatch):
    """Any failure at a key's first direct launch (a launcher that takes
    other arguments, say) launches that call through kernel[grid], keeps
    that key on Triton's path and warns once; other keys still launch
    directly, and a key that launched directly once keeps doing so."""
    tf = pytest.importorskip('sn_mm.ops.triton_fused')
    direct = []

    class Launcher:
        function = packed_metadata = None

        def __init__(self, fails):
            self.fails = fails

        def run(self, *args):
            if self.fails:
                raise TypeError('run() takes other arguments')
            direct.append(args[-2:])

    through_triton = []

    class Kernel:

        def __getitem__(self, grid):
            return lambda *args: through_triton.append(args) or Launcher(False)

    monkeypatch.setattr(_compat, '_RAW_STREAM', lambda index: 0)
    monkeypatch.setattr(tf, '_DIRECT', dict(on=True, warned=False))
    monkeypatch.setattr(
        tf, '_COMPILED',
        dict(bad=[Launcher(True), False], good=[Launcher(False), False]))
    with pytest.warns(
            UserWarning, match='launching a Triton kernel '
            'directly failed'):
        tf._launch(Kernel(), 'bad', (1, 1), (1, 2), 0)
    assert through_triton == [(1, 2)] and tf._COMPILED['bad'] == 'through '\
        'Triton'
    tf._launch(Kernel(), 'good', (1, 1), (3, 4), 0)
    tf._launch(Kernel(), 'good', (1, 1), (5, 6), 0)
    assert direct == [(3, 4), (5, 6)] and tf._COMPILED['good'][1]
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # once: no second warning
        tf._launch(Kernel(), 'bad', (1, 1), (7, 8), 0)
    assert through_triton == [(1, 2), (7, 8)]
    # A new key launches through Triton first, then directly.
    tf._launch(Kernel(), 'new', (1, 1), (9, 10), 0)
    tf._launch(Kernel(), 'new', (1, 1), (11, 12), 0)
    assert through_triton[-1] == (9, 10) and direct[-1] == (11, 12)


def test_the_direct_launch_key_holds_every_dtype_and_flag():
    """Everything the compiled kernel depends on is in its key: a logit,
    bias or fixed-ratio tensor of another dtype, another flag or plan, or
    an unaligned pointer gives another key (or none)."""
    tf = pytest.importorskip('sn_mm.ops.triton_fused')

    class CudaLike:
        """What direct_key reads of a tensor."""
        is_cuda = True

        def __init__(self, dtype, ptr=0):
            self.dtype, self.ptr = dtype, ptr

        def data_ptr(self):
            return self.ptr

    f32, f64 = torch.float32, torch.float64
    plan = dict(key=('plan', 1))
    tensors = [CudaLike(f32) for _ in range(5)]
    saved = dict(tf._DIRECT)
    tf._DIRECT['on'] = True
    try:
        base = tf.direct_key(plan, ('flags', ), tensors)
        keys = {base}
        for i in range(len(tensors)):
            other = list(tensors)
            other[i] = CudaLike(f64)
            keys.add(tf.direct_key(plan, ('flags', ), other))
        keys.add(tf.direct_key(plan, ('other flags', ), tensors))
        keys.add(tf.direct_key(dict(key=('plan', 2)), ('flags', ), tensors))
        assert len(keys) == len(tensors) + 3 and None not in keys
        unaligned = list(tensors)
        unaligned[3] = CudaLike(f32, ptr=8)
        assert tf.direct_key(plan, ('flags', ), unaligned) is None
        tf._DIRECT['on'] = False
        assert tf.direct_key(plan, ('flags', ), tensors) is None
    finally:
        tf._DIRECT.update(saved)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a GPU')
def test_current_raw_stream(monkeypatch):
    private = _compat.current_raw_stream(0)
    monkeypatch.setattr(_compat, '_RAW_STREAM', None)
    assert _compat.current_raw_stream(0) == private


def test_triton_older_than_the_kernels_is_named():
    """A Triton older than the fused kernels' (torch 2.1-2.3 ship 2.1-2.3)
    leaves SN on PyTorch ops on CUDA; kernels='triton' says why."""
    from sn_mm.ops import operator, triton_problem
    problem = operator.triton_version_problem('2.1.0')
    assert 'Triton 2.1.0' in problem and '3.0' in problem
    assert operator.triton_version_problem('3.0.0') is None
    assert operator.triton_version_problem('3.8.1') is None
    try:
        import triton
    except ImportError:
        assert 'cannot be imported' in triton_problem()
        return
    assert triton_problem() == operator.triton_version_problem(
        triton.__version__)
    assert (operator.triton_module() is None) == (triton_problem() is not None)
    if triton_problem() is not None and operator._INTERPRET:
        x = torch.randn(2, 3, 4, 4)
        with pytest.raises(RuntimeError, match=f'Triton {triton.__version__}'):
            operator.route('triton', x, torch.ones(3), None)
