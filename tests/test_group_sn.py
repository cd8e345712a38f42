"""Group SN (``ratio_groups=G``): G = 1 is SN exactly; G > 1 against a
float64 implementation written here from the definition, channel by
channel; gradients, double backward, SN checkpoints, hard and sparse ratios
per group, folding, configs and tracing."""
import copy

import pytest
import torch
from helpers import require_kernels

from sn_mm import SwitchableNorm, fuse_conv_sn, harden_sn
from sn_mm.models.hard_ratios import harden_state_dict
from sn_mm.ops._compat import onnx_export_kwargs


def group_sn_float64(x,
                     weight,
                     bias,
                     mean_logits,
                     var_logits,
                     running_mean,
                     running_var,
                     training,
                     momentum=0.1,
                     eps=1e-5):
    """The definition, channel by channel, in float64: IN over a channel's
    positions, LN over a sample's channels and positions, BN over the
    batch's samples and positions, each variance with the released
    convention (IN's Bessel-corrected, LN's and BN's from IN's second
    moments); channel c of group g mixes with softmax(logits[g]). Returns
    (output, new running mean, new running var)."""
    x = x.double()
    n, c = x.shape[:2]
    x3 = x.reshape(n, c, -1)
    groups = mean_logits.shape[0]
    y = torch.empty_like(x3)
    new_mean, new_var = running_mean.double().clone(), \
        running_var.double().clone()
    # IN moments and the second moments the released code derives LN/BN from
    mean_in = x3.mean(-1)
    var_in = x3.var(-1, correction=1)
    second = var_in + mean_in**2
    for ch in range(c):
        g = ch // (c // groups)
        wm = torch.softmax(mean_logits[g].double(), 0)
        wv = torch.softmax(var_logits[g].double(), 0)
        if training:
            mean_bn = x3[:, ch].mean()
            var_bn = second[:, ch].mean() - mean_bn**2
            new_mean[ch] = (1 - momentum) * new_mean[ch] + momentum * mean_bn
            new_var[ch] = (1 - momentum) * new_var[ch] + momentum * var_bn
        else:
            mean_bn = running_mean[ch].double()
            var_bn = running_var[ch].double()
        for s in range(n):
            mean_ln = x3[s].mean()
            var_ln = second[s].mean() - mean_ln**2
            mu = wm[0] * mean_in[s, ch] + wm[1] * mean_ln + wm[2] * mean_bn
            var = wv[0] * var_in[s, ch] + wv[1] * var_ln + wv[2] * var_bn
            y[s, ch] = (x3[s, ch] - mu) / torch.sqrt(var + eps) * \
                weight[ch].double() + bias[ch].double()
    return y.reshape(x.shape), new_mean, new_var


def group_layer(c, groups, seed=0, dtype=torch.float64, **kwargs):
    layer = SwitchableNorm(c, ratio_groups=groups, **kwargs).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (layer.weight, layer.bias, layer.mean_weight,
                  layer.var_weight):
            p.copy_(torch.randn(p.shape, generator=gen, dtype=dtype))
        layer.running_mean.copy_(torch.randn(c, generator=gen, dtype=dtype))
        layer.running_var.copy_(torch.rand(c, generator=gen, dtype=dtype) + .5)
    return layer


def inputs(shape, seed=1, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    offset = torch.randn(shape[:2], generator=gen, dtype=dtype) * 3
    return torch.randn(shape, generator=gen, dtype=dtype) * 2 + \
        offset.reshape(*shape[:2], *([1] * (len(shape) - 2)))


def test_one_group_is_sn_bit_for_bit():
    sn = group_layer(8, 1, dtype=torch.float32)
    same = SwitchableNorm(8, ratio_groups=1)
    same.load_state_dict(sn.state_dict())
    assert same.mean_weight.shape == (3, )
    x = inputs((4, 8, 5, 5), dtype=torch.float32)
    for layer in (sn, same):
        layer.train()
    outs = []
    for layer in (sn, same):
        xi = x.clone().requires_grad_()
        out = layer(xi)
        out.square().sum().backward()
        outs.append(
            (out, xi.grad, layer.mean_weight.grad, layer.var_weight.grad,
             layer.running_var.clone()))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


@pytest.mark.parametrize('groups', [2, 4, 8])
@pytest.mark.parametrize('training', [True, False], ids=['train', 'eval'])
def test_matches_the_definition(groups, training):
    layer = group_layer(8, groups)
    layer.train(training)
    x = inputs((3, 8, 4, 5))
    want, want_mean, want_var = group_sn_float64(x, layer.weight, layer.bias,
                                                 layer.mean_weight,
                                                 layer.var_weight,
                                                 layer.running_mean,
                                                 layer.running_var, training)
    out = layer(x)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(layer.running_mean, want_mean)
    torch.testing.assert_close(layer.running_var, want_var)


def test_logit_gradients_are_per_group():
    """Each group's logits take the gradient of its own channels only."""
    layer = group_layer(8, 2)
    x = inputs((3, 8, 4, 5))
    grad = torch.zeros(3, 8, 4, 5, dtype=torch.float64)
    grad[:, :4] = torch.randn(3, 4, 4, 5, dtype=torch.float64)
    (layer(x) * grad).sum().backward()
    assert layer.mean_weight.grad[0].abs().sum() > 0
    assert torch.equal(layer.mean_weight.grad[1],
                       torch.zeros(3, dtype=torch.float64))
    assert torch.equal(layer.var_weight.grad[1],
                       torch.zeros(3, dtype=torch.float64))


@pytest.mark.parametrize('training', [True, False], ids=['train', 'eval'])
def test_gradcheck_and_gradgradcheck(training):
    layer = group_layer(4, 2)
    layer.train(training)
    x = inputs((3, 4, 2, 3)).requires_grad_()
    params = [layer.weight, layer.bias, layer.mean_weight, layer.var_weight]
    buffers = dict(layer.named_buffers())

    def fn(x, *ps):
        # Each evaluation on fresh copies of the running statistics.
        state = {k: v.clone() for k, v in buffers.items()}
        state.update(zip(('weight', 'bias', 'mean_weight', 'var_weight'), ps))
        return torch.func.functional_call(layer, state, (x, ))

    assert torch.autograd.gradcheck(fn, (x, *params))
    assert torch.autograd.gradgradcheck(fn, (x, *params))


def test_groups_must_divide_the_channels():
    with pytest.raises(ValueError, match=r'ratio_groups=3 .*num_features=8'):
        SwitchableNorm(8, ratio_groups=3)
    with pytest.raises(ValueError, match='ratio_groups must be a positive'):
        SwitchableNorm(8, ratio_groups=0)


def run(layer, x, grad, kernels):
    layer.kernels = kernels
    layer.zero_grad()
    x = x.detach().clone().requires_grad_()
    out = layer(x)
    (out * grad).sum().backward()
    return [out, x.grad] + [p.grad for p in layer.parameters()] + [
        b.clone() for b in layer.buffers() if b is not None
    ]


@pytest.mark.parametrize('groups', [1, 2, 8])
@pytest.mark.parametrize(
    'shape', [(3, 8, 4, 5), (3, 8), (2, 8, 1, 1), (1, 8, 3, 3), (0, 8, 3, 3)],
    ids=['4d', '2d', 'one_position', 'one_sample', 'empty'])
@pytest.mark.parametrize('training', [True, False], ids=['train', 'eval'])
def test_native_kernels_match_the_reference(groups, shape, training):
    require_kernels('native')
    layer = group_layer(8, groups)
    layer.train(training)
    x = inputs(shape)
    grad = torch.randn(shape, dtype=torch.float64)
    state = copy.deepcopy(layer.state_dict())
    got = run(layer, x, grad, 'native')
    layer.load_state_dict(state)
    want = run(layer, x, grad, 'torch')
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize('fn', ['softmax', 'sparsestmax'])
def test_native_kernels_with_fixed_ratios_per_group(fn):
    require_kernels('native')
    layer = group_layer(8, 4, ratio_fn=fn)
    if fn == 'sparsestmax':
        layer.set_radius(0.3)
    with torch.no_grad():  # groups 1 and 3 of the mean fixed
        layer.ratio_fixed[0, 1] = layer.ratio_fixed[0, 3] = True
        layer.fixed_ratios[0, 1] = torch.tensor([0., 1, 0],
                                                dtype=torch.float64)
        layer.fixed_ratios[0, 3] = torch.tensor([.2, 0, .8],
                                                dtype=torch.float64)
    x = inputs((3, 8, 4, 5))
    grad = torch.randn(3, 8, 4, 5, dtype=torch.float64)
    state = copy.deepcopy(layer.state_dict())
    got = run(layer, x, grad, 'native')
    assert torch.equal(layer.mean_weight.grad[1],
                       torch.zeros(3, dtype=torch.float64))
    layer.load_state_dict(state)
    want = run(layer, x, grad, 'torch')
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_an_sn_checkpoint_starts_every_group():
    """A released-style checkpoint (one ratio vector per statistic) loads
    into a group SN layer strictly; every group starts from it, so the layer
    computes what the SN layer computes."""
    sn = group_layer(8, 1)
    grouped = SwitchableNorm(8, ratio_groups=4).double()
    grouped.load_state_dict(sn.state_dict())
    for g in range(4):
        assert torch.equal(grouped.mean_weight[g], sn.mean_weight)
    sn.eval()
    grouped.eval()
    x = inputs((2, 8, 3, 3))
    torch.testing.assert_close(grouped(x), sn(x), rtol=1e-12, atol=1e-12)


def test_hard_ratios_per_group_fold_to_the_same_output():
    layer = group_layer(8, 2)
    with torch.no_grad():  # group 0 leans to IN/BN, group 1 to BN/BN
        layer.mean_weight.copy_(torch.tensor([[3., 0, 0], [0, 0, 3]]))
        layer.var_weight.copy_(torch.tensor([[0., 0, 3], [0, 0, 3]]))
    assert harden_sn(layer) == 1
    assert torch.equal(
        layer.fixed_ratios[0],
        torch.tensor([[1., 0, 0], [0, 0, 1]], dtype=torch.float64))
    assert layer.fixed() == dict(mean=True, var=True)
    layer.eval()
    x = inputs((2, 8, 3, 3))
    want, _, _ = group_sn_float64(x, layer.weight, layer.bias,
                                  torch.tensor([[50., 0, 0], [0, 0, 50]]),
                                  torch.tensor([[0., 0, 50], [0, 0, 50]]),
                                  layer.running_mean, layer.running_var, False)
    torch.testing.assert_close(layer(x), want, rtol=1e-9, atol=1e-9)
    # Groups that select differently stay a layer; equal ones fold.
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1).double(), layer).eval()
    folded = fuse_conv_sn(copy.deepcopy(net))
    assert isinstance(folded[1], SwitchableNorm)
    with torch.no_grad():
        layer.fixed_ratios[0, 0] = torch.tensor([0., 0, 1])
    folded = fuse_conv_sn(copy.deepcopy(net))
    assert isinstance(folded[1], torch.nn.Identity)
    x = inputs((2, 3, 3, 3))
    torch.testing.assert_close(folded(x), net(x), rtol=1e-9, atol=1e-9)


def test_harden_state_dict_per_group():
    layer = group_layer(8, 2)
    state = {f'neck.sn.{k}': v for k, v in layer.state_dict().items()}
    with torch.no_grad():
        state['neck.sn.mean_weight'].copy_(
            torch.tensor([[3., 0, 0], [0, 3, 0]]))
    assert harden_state_dict(state) == 1
    assert state['neck.sn.ratio_fixed'].shape == (2, 2)
    assert torch.equal(
        state['neck.sn.fixed_ratios'][0],
        torch.tensor([[1., 0, 0], [0, 1, 0]], dtype=torch.float64))
    layer.load_state_dict({k[len('neck.sn.'):]: v for k, v in state.items()})
    assert layer.fixed() == dict(mean=True, var=True)


def test_sparse_sn_per_group():
    layer = group_layer(8, 2, ratio_fn='sparsestmax')
    with torch.no_grad():
        layer.mean_weight.copy_(torch.tensor([[2., 0, 0], [0, 0, 2]]))
    layer.set_radius(1.0)  # every vector one-hot, and fixed in training
    layer.train()
    layer(inputs((2, 8, 3, 3)))
    assert layer.ratio_fixed.all()
    groups = layer.group_ratios()
    assert groups[0]['mean']['in'] == 1
    assert groups[1]['mean']['bn'] == 1


def test_ratios_summary_and_groups():
    layer = group_layer(8, 4)
    groups = layer.group_ratios()
    assert len(groups) == 4
    summary = layer.ratios()
    for stat in ('mean', 'var'):
        for term in ('in', 'ln', 'bn'):
            assert summary[stat][term] == pytest.approx(
                sum(g[stat][term] for g in groups) / 4)
    assert 'ratio_groups=4' in repr(layer)


def test_builds_from_norm_cfg_and_traces():
    from mmcv.cnn import ConvModule
    block = ConvModule(
        3, 8, 3, padding=1, norm_cfg=dict(type='SN', ratio_groups=2))
    assert block.norm.ratio_groups == 2
    block.eval()
    x = torch.randn(2, 3, 6, 6)
    exported = torch.export.export(block, (x, ))
    torch.testing.assert_close(exported.module()(x), block(x))
    compiled = torch.compile(block, fullgraph=True, backend='eager')
    torch.testing.assert_close(compiled(x), block(x))


def test_digits_study_runs():
    from helpers import load_tool
    study = load_tool('analysis_tools', 'digits_group_sn_study.py')
    rows = study.main(
        ['--epochs', '1', '--batches', '32', '--groups', '1', '2'])
    assert [r['groups'] for r in rows] == ['1', '2']
    assert rows[0]['spread'] == dict(mean=0.0, var=0.0)
    assert rows[1]['spread']['mean'] > 0
    assert all(0 <= r['accuracy'] <= 1 for r in rows)


def test_plot_ratios_per_group_and_per_layer(tmp_path):
    from helpers import load_tool
    net = torch.nn.Sequential()
    net.add_module('conv', torch.nn.Conv2d(3, 8, 3))
    net.add_module('sn', group_layer(8, 2))
    ckpt = tmp_path / 'group_sn.pth'
    torch.save(
        dict(state_dict={
            f'neck.{k}': v
            for k, v in net.state_dict().items()
        }), ckpt)
    tool = load_tool('analysis_tools', 'plot_ratios.py')
    from sn_mm.analysis import sn_ratios
    state = tool.load_state(str(ckpt))
    per_group = sn_ratios(state, per_group=True)
    assert list(per_group) == ['neck.sn[0]', 'neck.sn[1]']
    assert per_group['neck.sn[1]'] == net.sn.group_ratios()[1]
    assert list(sn_ratios(state)) == ['neck.sn']
    assert tool.layer_kind(state, 'neck.sn[1]') == '3x3'
    for extra in ([], ['--groups'], ['--hard', '--groups']):
        tool.main([str(ckpt), '--out', str(tmp_path / 'r.png'), *extra])
        assert (tmp_path / 'r.png').exists()


def test_onnx_export(tmp_path):
    ort = pytest.importorskip('onnxruntime')
    layer = group_layer(8, 2, dtype=torch.float32).eval()
    x = torch.randn(2, 8, 5, 5)
    path = tmp_path / 'group_sn.onnx'
    torch.onnx.export(
        layer, (x, ),
        str(path),
        opset_version=17,
        **onnx_export_kwargs('torchscript'))
    session = ort.InferenceSession(str(path))
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    torch.testing.assert_close(
        torch.from_numpy(got), layer(x).detach(), rtol=1e-5, atol=1e-5)


def build_mmdet(cfg):
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.registry import DefaultScope
    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope('mmdet'):
        return MODELS.build(cfg)


def resnet18(norm_cfg, init_cfg=None):
    return build_mmdet(
        dict(
            type='ResNet',
            depth=18,
            style='pytorch',
            norm_cfg=norm_cfg,
            init_cfg=init_cfg))


def sn_layers(model):
    return {
        n: m
        for n, m in model.named_modules() if isinstance(m, SwitchableNorm)
    }


def test_group_sn_configs_start_every_group_from_the_released_vectors(
        tmp_path):
    import os.path as osp

    from mmengine.config import Config
    root = osp.dirname(osp.dirname(osp.abspath(__file__)))
    cfg = Config.fromfile(
        osp.join(root, 'configs', 'mask_rcnn',
                 'mask-rcnn_r50-gsn2_fpn_gsn2-head_2x_coco.py'))
    released = build_mmdet(
        dict(
            type='ResNet', depth=50, style='pytorch',
            norm_cfg=dict(type='SN')))
    with torch.no_grad():
        for layer in sn_layers(released).values():
            layer.mean_weight.normal_()
            layer.var_weight.normal_()
    path = tmp_path / 'resnet50_sn_8x2_mm.pth'
    torch.save(dict(state_dict=released.state_dict()), path)
    cfg.model.backbone.init_cfg.checkpoint = str(path)
    backbone = build_mmdet(cfg.model.backbone)
    backbone.init_weights()
    want = sn_layers(released)
    for name, layer in sn_layers(backbone).items():
        assert layer.ratio_groups == 2
        for g in range(2):
            assert torch.equal(layer.mean_weight[g], want[name].mean_weight)
            assert torch.equal(layer.var_weight[g], want[name].var_weight)


@pytest.mark.parametrize('ratios', ['uniform', 'source'])
def test_sn_pretrained_into_group_sn(tmp_path, ratios):
    from sn_mm.models.convert import SOURCE_RATIO
    bn = resnet18(dict(type='BN'))
    sn = resnet18(dict(type='SN'))
    with torch.no_grad():
        for layer in sn_layers(sn).values():
            layer.mean_weight.normal_()
    torch.save(bn.state_dict(), tmp_path / 'bn.pth')
    torch.save(sn.state_dict(), tmp_path / 'sn.pth')
    gsn = dict(type='SN', ratio_groups=4)
    from_bn = resnet18(
        gsn,
        dict(
            type='SNPretrained',
            ratios=ratios,
            checkpoint=str(tmp_path / 'bn.pth')))
    from_bn.init_weights()
    bn_share = SOURCE_RATIO if ratios == 'source' else 1 / 3
    for layer in sn_layers(from_bn).values():
        for group in layer.group_ratios():
            assert group['mean']['bn'] == pytest.approx(bn_share, abs=1e-6)
    from_sn = resnet18(
        gsn,
        dict(
            type='SNPretrained',
            ratios=ratios,
            checkpoint=str(tmp_path / 'sn.pth')))
    from_sn.init_weights()
    layer, source = sn_layers(from_sn)['layer2.1.sn2'], \
        sn_layers(sn)['layer2.1.sn2']
    for g in range(4):
        assert torch.equal(layer.mean_weight[g], source.mean_weight) == (
            ratios == 'source')
