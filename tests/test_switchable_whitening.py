"""Switchable Whitening (SW, SyncSW): against the released formulation in
float64, the decisions where the release is inconsistent, errors, autograd,
autocast, export, and SyncSW over real gloo processes."""
import copy
import math

import pytest
import torch
from helpers import require_onnx_exporter
from mmcv.cnn import build_norm_layer

from sn_mm.models.switchable_whitening import (SwitchableWhitening,
                                               SyncSwitchableWhitening)
from sn_mm.ops._compat import onnx_export_kwargs
from sn_mm.testing.processes import run_on_ranks


def released_sw(x,
                layer,
                training,
                running_mean=None,
                running_cov=None,
                release_type5=False):
    """The release's formulation (models/ops/switchwhiten.py), written out:
    batch covariance straight from the centred data, per-sample instance
    covariances, LN's unbiased variance, Newton's iteration. sw_type=5 with
    each component's own covariance weight (the paper's, SW's here), or
    with ``release_type5`` as the release mixes it: the BN and IN variances
    weighed by the BW and IW covariance weights (indices 0 and 1)."""
    n, channels = x.shape[:2]
    g, c = layer.num_groups, layer.num_pergroup
    hw = x[0, 0].numel()
    by_channel = x.transpose(0, 1).reshape(g, c, -1)
    if training:
        mean_bn = by_channel.mean(-1, keepdim=True)
        d = by_channel - mean_bn
        cov_bn = d @ d.transpose(1, 2) / (n * hw)
    else:
        mean_bn, cov_bn = running_mean, running_cov
    mean_bn = mean_bn.unsqueeze(0).expand(n, g, c, 1).reshape(n * g, c, 1)
    cov_bn = cov_bn.unsqueeze(0).expand(n, g, c, c).reshape(n * g, c, c)
    rows = x.reshape(n * g, c, -1)
    eye = torch.eye(c, dtype=x.dtype).expand(n * g, c, c)
    mean_in = rows.mean(-1, keepdim=True)
    d = rows - mean_in
    cov_in = d @ d.transpose(1, 2) / hw
    flat = x.reshape(n, -1)
    mean_ln = flat.mean(-1).repeat_interleave(g).view(n * g, 1, 1)
    var_ln = flat.var(-1).repeat_interleave(g).view(n * g, 1, 1) * eye
    var_bn = torch.diag_embed(torch.diagonal(cov_bn, dim1=1, dim2=2))
    var_in = torch.diag_embed(torch.diagonal(cov_in, dim1=1, dim2=2))
    wm = torch.softmax(layer.sw_mean_weight, 0)
    wv = wm if layer.tie_weight else torch.softmax(layer.sw_var_weight, 0)
    means = {
        'bw': mean_bn,
        'iw': mean_in,
        'bn': mean_bn,
        'in': mean_in,
        'ln': mean_ln
    }
    covs = {
        'bw': cov_bn,
        'iw': cov_in,
        'bn': var_bn,
        'in': var_in,
        'ln': var_ln
    }
    mean = sum(wm[k] * means[name] for k, name in enumerate(layer.components))
    weight_of = {'bn': 0, 'in': 1} if release_type5 else {}
    cov = sum(wv[weight_of.get(name, k)] * covs[name]
              for k, name in enumerate(layer.components)) + layer.eps * eye
    p = torch.eye(c, dtype=x.dtype).expand(n * g, c, c)
    r_tr = 1 / (cov * p).sum((1, 2), keepdim=True)
    cov_n = cov * r_tr
    for _ in range(layer.T):
        p = torch.baddbmm(
            p, torch.matrix_power(p, 3), cov_n, beta=1.5, alpha=-0.5)
    y = (p * r_tr.sqrt()) @ (rows - mean)
    y = y.view(x.shape)
    shape = (1, channels) + (1, ) * (x.dim() - 2)
    return y * layer.weight.view(shape) + layer.bias.view(shape)


def make_sw(channels=8,
            seed=0,
            dtype=torch.float64,
            cls=SwitchableWhitening,
            **kwargs):
    kwargs.setdefault('num_pergroup', 4)
    layer = cls(channels, **kwargs).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(
                torch.randn(p.shape, generator=gen, dtype=dtype) * 0.5 +
                (1 if p is layer.weight else 0))
    return layer


def data(shape, seed=0, dtype=torch.float64, offset=0.):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=dtype)
    # Correlated channels, so that whitening differs from standardising.
    mix = torch.randn(shape[1], shape[1], generator=gen, dtype=dtype)
    return torch.einsum('dc,nc...->nd...', mix, x) + offset


@pytest.mark.parametrize('sw_type', [2, 3, 5])
@pytest.mark.parametrize('tie_weight', [False, True])
def test_equals_the_released_formulation(sw_type, tie_weight):
    layer = make_sw(sw_type=sw_type, tie_weight=tie_weight)
    x = data((3, 8, 5, 4))
    y = layer(x)
    torch.testing.assert_close(y, released_sw(x, layer, True))
    layer.eval()
    torch.testing.assert_close(
        layer(x),
        released_sw(x, layer, False, layer.running_mean, layer.running_cov))


def test_other_spatial_shapes_and_a_large_offset():
    layer = make_sw(sw_type=5)
    for shape in ((4, 8, 7), (2, 8, 3, 2, 2)):
        x = data(shape, offset=1e3)
        torch.testing.assert_close(layer(x), released_sw(x, layer, True))


def test_type_5_differs_from_the_release_exactly_where_it_should():
    """The release weighs BN's and IN's variances with the BW and IW
    covariance weights; SW here with their own. The two differ, and
    coincide where the BN and IN logits equal the BW and IW ones."""
    layer = make_sw(sw_type=5)
    x = data((3, 8, 5, 4))
    for mode in (True, False):
        layer.train(mode)
        args = (x, layer, mode, layer.running_mean, layer.running_cov)
        ours = layer(x)
        torch.testing.assert_close(ours, released_sw(*args))
        assert (ours - released_sw(*args, release_type5=True)).abs().max() \
            > 1e-3
    with torch.no_grad():
        layer.sw_var_weight[2:4] = layer.sw_var_weight[0:2]
    for mode in (True, False):
        layer.train(mode)
        torch.testing.assert_close(
            layer(x),
            released_sw(
                x,
                layer,
                mode,
                layer.running_mean,
                layer.running_cov,
                release_type5=True))


def test_running_statistics_take_pytorchs_momentum():
    """momentum is the batch's weight, as in PyTorch's norms: by hand,
    from zero over two batches, running = (1 - m) m b1 + m b2 for the
    batch mean and (biased) covariance of each group."""
    m = 0.3
    layer = make_sw(momentum=m)
    assert SwitchableWhitening(8, num_pergroup=4).momentum == 0.1
    batches = [data((3, 8, 5, 4), seed=s) for s in (1, 2)]
    stats = []
    for x in batches:
        layer(x)
        rows = x.transpose(0, 1).reshape(2, 4, -1)
        mean = rows.mean(-1, keepdim=True)
        d = rows - mean
        stats.append((mean, d @ d.transpose(1, 2) / rows.shape[-1]))
    (mean1, cov1), (mean2, cov2) = stats
    torch.testing.assert_close(layer.running_mean,
                               (1 - m) * m * mean1 + m * mean2)
    torch.testing.assert_close(layer.running_cov,
                               (1 - m) * m * cov1 + m * cov2)


def test_whitens_with_many_newton_steps():
    layer = make_sw(16, num_pergroup=8, T=40, eps=1e-9)
    with torch.no_grad():
        layer.sw_mean_weight.copy_(torch.tensor([30., -30.]))
        layer.sw_var_weight.copy_(torch.tensor([30., -30.]))
        layer.weight.fill_(1)
        layer.bias.zero_()
    # Correlated channels, well enough conditioned for Newton's iteration.
    gen = torch.Generator().manual_seed(0)
    mix = torch.eye(
        16, dtype=torch.float64) + 0.3 * torch.randn(
            16, 16, generator=gen, dtype=torch.float64) / 4
    x = torch.randn(64, 16, 4, 4, generator=gen, dtype=torch.float64)
    y = layer(torch.einsum('dc,nchw->ndhw', mix, x) + 5)
    rows = y.transpose(0, 1).reshape(2, 8, -1)
    rows = rows - rows.mean(-1, keepdim=True)
    cov = rows @ rows.transpose(1, 2) / rows.shape[-1]
    torch.testing.assert_close(
        cov, torch.eye(8).expand(2, 8, 8).double(), atol=1e-4, rtol=0)


@pytest.mark.parametrize('sw_type', [2, 3, 5])
def test_inputs_without_instance_statistics_leave_iw_and_in_out(sw_type):
    layer = make_sw(sw_type=sw_type)
    x = data((6, 8))
    y = layer(x)
    assert torch.isfinite(y).all()
    y.square().sum().backward()
    instance = [k for k, n in enumerate(layer.components) if n in ('iw', 'in')]
    assert layer.sw_mean_weight.grad[instance].abs().max() == 0
    # The same as a layer whose instance components weigh nothing.
    ref = make_sw(sw_type=sw_type)
    with torch.no_grad():
        for p in (ref.sw_mean_weight, ref.sw_var_weight):
            p[instance] = -math.inf
    torch.testing.assert_close(
        y,
        ref(x.view(6, 8, 1, 1).expand(6, 8, 1, 1)).view(6, 8))


@pytest.mark.parametrize('sw_type,mode,shape', [
    (2, 'train', (3, 8, 3, 2)),
    (5, 'train', (3, 8, 3, 2)),
    (5, 'eval', (3, 8, 3, 2)),
    (3, 'train', (5, 8)),
])
def test_gradcheck_and_double_backward(sw_type, mode, shape):
    layer = make_sw(sw_type=sw_type, T=3)
    if mode == 'eval':
        layer(data(shape, seed=1))  # running statistics to evaluate with
        layer.eval()
    buffers = dict(layer.named_buffers())
    names = ('weight', 'bias', 'sw_mean_weight', 'sw_var_weight')

    def call(x, *params):
        # Fresh running statistics each call: the check re-runs it.
        state = {k: v.clone() for k, v in buffers.items()}
        state.update(zip(names, params))
        return torch.func.functional_call(layer, state, (x, ))

    inputs = (data(shape), ) + tuple(getattr(layer, n).detach() for n in names)
    inputs = tuple(t.clone().requires_grad_() for t in inputs)
    assert torch.autograd.gradcheck(call, inputs)
    assert torch.autograd.gradgradcheck(call, inputs)


def test_keeps_one_input_sized_tensor_for_backward():
    x = data((2, 16, 12, 10), dtype=torch.float32).requires_grad_()
    for affine in (True, False):
        layer = make_sw(
            16, num_pergroup=16, sw_type=5, affine=affine, dtype=torch.float32)
        saved = []

        def keep(t):
            saved.append(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            layer(x)
        storages = {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in saved
        }
        # The centred rows, with a row of ones under each group's (16 + 1
        # rows where the input has 16).
        large = [b for b in storages.values() if b >= x.numel() * 4]
        assert large == [x.numel() * 4 * 17 // 16], (affine, storages)


def test_autocast_whitens_in_float32():
    layer = make_sw(16, num_pergroup=8, dtype=torch.float32)
    x = data((4, 16, 6, 6), dtype=torch.float32)
    expected = make_sw(16, num_pergroup=8, dtype=torch.float32)(x)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y = layer(x.bfloat16())
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(
        y.float(),
        make_sw(16, num_pergroup=8, dtype=torch.float32)(x.bfloat16().float()),
        atol=0.05,
        rtol=0.02)
    assert (y.float() - expected).abs().max() < 0.2


def test_a_non_finite_batch_leaves_the_running_statistics():
    layer = make_sw()
    layer(data((3, 8, 4, 4)))
    before = (layer.running_mean.clone(), layer.running_cov.clone())
    x = data((3, 8, 4, 4))
    x[1, 2, 0, 0] = math.nan
    layer(x)
    torch.testing.assert_close(layer.running_mean, before[0])
    torch.testing.assert_close(layer.running_cov, before[1])
    assert int(layer.nonfinite_batches) == 1


@pytest.mark.parametrize('kwargs, message', [
    (dict(sw_type=4), 'unknown sw_type 4'),
    (dict(num_pergroup=3), 'num_pergroup=3 must divide num_features=8'),
    (dict(T=-1), 'T must be an integer >= 0'),
    (dict(momentum=1.5), 'momentum must be in'),
])
def test_bad_options_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SwitchableWhitening(8, **{'num_pergroup': 4, **kwargs})


def test_bad_inputs_are_refused():
    layer = make_sw()
    with pytest.raises(ValueError, match=r'shape \(N, 8, \*\), got \(3, 6'):
        layer(torch.randn(3, 6, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r'got \(8,\)'):
        layer(torch.randn(8, dtype=torch.float64))


def test_mmcv_builds_it_and_loads_the_release_keys():
    name, layer = build_norm_layer(dict(type='SW', num_pergroup=16), 64, 2)
    assert name == 'sw2' and isinstance(layer, SwitchableWhitening)
    released = {
        k: v
        for k, v in layer.state_dict().items() if k != 'nonfinite_batches'
    }
    assert set(released) == {
        'sw_mean_weight', 'sw_var_weight', 'weight', 'bias', 'running_mean',
        'running_cov'
    }
    layer.load_state_dict(released)
    _, sync = build_norm_layer(dict(type='SyncSW', sw_type=5), 32)
    assert isinstance(sync, SyncSwitchableWhitening)


def test_norm_eval_freezes_sw_in_a_stock_backbone():
    from mmdet.models.backbones import ResNet

    from sn_mm import SwitchableNorm
    SwitchableNorm(4)  # SN first: its norm_eval hook must serve SW too
    model = ResNet(
        18, norm_cfg=dict(type='SW', num_pergroup=16), norm_eval=True)
    model.train()
    layers = [m for m in model.modules() if isinstance(m, SwitchableWhitening)]
    assert layers and not any(m.training for m in layers)


def test_export_and_compile():
    layer = make_sw(dtype=torch.float32).eval()
    x = data((2, 8, 5, 5), dtype=torch.float32)
    program = torch.export.export(layer, (x, ))
    torch.testing.assert_close(program.module()(x), layer(x))
    layer.train()
    compiled = torch.compile(layer, fullgraph=True, backend='aot_eager')
    eager = make_sw(dtype=torch.float32)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = compiled(x1), eager(x2)
    torch.testing.assert_close(y1, y2)
    # and the hand-written backward of the input-sized part, traced
    g = torch.randn_like(y1)
    y1.backward(g)
    y2.backward(g)
    torch.testing.assert_close(x1.grad, x2.grad)


# SyncSW across processes: uneven shares, one of them empty.
SHARES = [(0, 3), (3, 3), (3, 5)]


def sync_worker(rank):
    results = []
    for sw_type in (2, 5):
        layer = make_sw(sw_type=sw_type, cls=SyncSwitchableWhitening)
        x = data((5, 8, 4, 3), seed=sw_type)
        grad_out = data((5, 8, 4, 3), seed=10 + sw_type)
        lo, hi = SHARES[rank]
        x = x[lo:hi].clone().requires_grad_()
        y = layer(x)
        (y * grad_out[lo:hi]).sum().backward()
        results.append(
            dict(
                y=y.detach(),
                x_grad=x.grad,
                grads={
                    k: p.grad
                    for k, p in layer.named_parameters()
                },
                running_cov=layer.running_cov.clone()))
    return results


def test_sync_sw_equals_sw_on_the_whole_batch():
    ranks = run_on_ranks(sync_worker, len(SHARES))
    for case, sw_type in enumerate((2, 5)):
        layer = make_sw(sw_type=sw_type)
        x = data((5, 8, 4, 3), seed=sw_type).requires_grad_()
        y = layer(x)
        (y * data((5, 8, 4, 3), seed=10 + sw_type)).sum().backward()
        per_rank = [r[case] for r in ranks]
        torch.testing.assert_close(
            torch.cat([r['y'] for r in per_rank]), y.detach())
        torch.testing.assert_close(
            torch.cat([r['x_grad'] for r in per_rank]), x.grad)
        for name, p in layer.named_parameters():
            torch.testing.assert_close(
                sum(r['grads'][name] for r in per_rank), p.grad)
        for r in per_rank:
            torch.testing.assert_close(r['running_cov'], layer.running_cov)


def test_digits_study_runs():
    from helpers import load_tool
    study = load_tool('analysis_tools', 'digits_sw_study.py')
    rows = study.main(
        ['--epochs', '1', '--batches', '32', '--norms', 'SN', 'SW5'])
    assert [r['norm'] for r in rows] == ['SN', 'SW5']
    for row in rows:
        assert 0 <= row['accuracy'] <= 1
        for stat in (0, 1):  # each statistic's shares add up to 1
            assert sum(v[stat] for v in row['kinds'].values()) == \
                pytest.approx(1)
    assert rows[0]['whitening'] is None
    # The covariance weights moved from their start (0.4 on BW + IW).
    assert 0 < rows[1]['whitening'] < 1
    assert rows[1]['whitening'] != pytest.approx(0.4, abs=1e-4)


def test_sync_conversion_turns_sw_and_syncsw_as_sn_and_syncsn():
    """convert_sync_sn / revert_sync_sn (and the runner on one process,
    which reverts) swap SW and SyncSW as they swap SN and SyncSN: the same
    parameter and buffer objects, the same settings and mode."""
    from sn_mm import (SwitchableNorm, SyncSwitchableNorm, convert_sync_sn,
                       revert_sync_sn)
    model = torch.nn.Sequential(
        make_sw(sw_type=5, momentum=0.2, T=3), SwitchableNorm(8),
        torch.nn.Sequential(make_sw(tie_weight=True).eval()))
    params = [id(p) for p in model.parameters()]
    buffers = [id(b) for b in model.buffers()]
    x = data((3, 8, 4, 4))
    model(x)  # running statistics away from their start
    expected = copy.deepcopy(model).eval()(x)
    synced = convert_sync_sn(model, group='node')
    assert [type(m) for m in (synced[0], synced[1], synced[2][0])] == [
        SyncSwitchableWhitening, SyncSwitchableNorm, SyncSwitchableWhitening
    ]
    assert synced[0].group == 'node' and synced[0].sw_type == 5
    assert (synced[0].momentum, synced[0].T) == (0.2, 3)
    assert synced[2][0].tie_weight and not synced[2][0].training
    assert [id(p) for p in synced.parameters()] == params
    assert [id(b) for b in synced.buffers()] == buffers
    back = revert_sync_sn(synced)
    assert [type(m) for m in (back[0], back[1], back[2][0])
            ] == [SwitchableWhitening, SwitchableNorm, SwitchableWhitening]
    assert [id(p) for p in back.parameters()] == params
    torch.testing.assert_close(back.eval()(x), expected)


@pytest.mark.parametrize('exporter', ['torchscript', 'dynamo'])
@pytest.mark.parametrize('sw_type', [2, 5])
def test_onnx_export_as_standard_operators(tmp_path, exporter, sw_type):
    onnx = pytest.importorskip('onnx')
    ort = pytest.importorskip('onnxruntime')
    require_onnx_exporter(exporter)
    layer = make_sw(sw_type=sw_type, dtype=torch.float32)
    layer(data((4, 8, 5, 5), dtype=torch.float32))  # running statistics
    layer.eval()
    x = data((2, 8, 5, 5), seed=3, dtype=torch.float32)
    path = str(tmp_path / 'sw.onnx')
    torch.onnx.export(
        layer, (x, ),
        path,
        input_names=['input'],
        opset_version=11 if exporter == 'torchscript' else None,
        **onnx_export_kwargs(exporter))
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert 'MatMul' in ops
    assert all(not n.domain for n in onnx.load(path).graph.node), ops
    (got, ) = ort.InferenceSession(path).run(None, {'input': x.numpy()})
    torch.testing.assert_close(
        torch.from_numpy(got), layer(x).detach(), rtol=1e-4, atol=1e-4)
