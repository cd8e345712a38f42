"""sn_mm/ops/_compat.py: each private API it uses gives what its public
fallback gives, and the fallback runs where the private API is missing."""
import os

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


def test_direct_launch_falls_back_to_tritons_launch_path(monkeypatch):
    """A compiled kernel whose launcher takes other arguments (another
    Triton): the launch goes through kernel[grid] and direct launches are
    switched off, with a warning."""
    tf = pytest.importorskip('sn_mm.ops.triton_fused')

    class OtherLauncher:
        function = packed_metadata = None

        def run(self, *args):
            raise TypeError('run() takes other arguments')

    launched = []

    class Kernel:

        def __getitem__(self, grid):
            return lambda *args: launched.append(args) or OtherLauncher()

    monkeypatch.setattr(_compat, '_RAW_STREAM', lambda index: 0)
    monkeypatch.setitem(tf._DIRECT, 'on', True)
    monkeypatch.setattr(tf, '_COMPILED', {'key': OtherLauncher()})
    with pytest.warns(
            UserWarning, match='launching Triton kernels directly '
            'failed'):
        tf._launch(Kernel(), 'key', (1, 1), (1, 2), 0)
    assert launched == [(1, 2)]
    assert tf._DIRECT['on'] is False and not tf._COMPILED


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
