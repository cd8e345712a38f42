"""SN on video: 5D inputs on every path against the float64 reference, and
mmaction2's I3D ResNet inflated from 2D BN and SN checkpoints
(sn_mm.video)."""
import glob
import os
import os.path as osp

import pytest
import torch
from helpers import make_sn, random_input, reference_of, require_kernels
from mmdet.models.backbones import ResNet
from tool_runner import ROOT

import sn_mm
from sn_mm.ops import native_available

pytest.importorskip('mmaction')
# sn_mm.video before mmaction.models, which needs its DRN stand-in.
from sn_mm.video import MODELS  # noqa: E402

VIDEO = (2, 4, 3, 4, 5)  # N, C, T, H, W
PATHS = ['torch'] + (['native'] if native_available() else []) + (
    ['triton'] if os.environ.get('TRITON_INTERPRET') == '1' else [])


def run(layer, x, kernels):
    """Output, every gradient (for one fixed float64 output gradient) and
    the running statistics of a training call, all in float64."""
    layer.kernels = kernels
    x = x.detach().clone().requires_grad_()
    out = layer(x)
    grad = torch.randn(
        out.shape,
        generator=torch.Generator().manual_seed(5),
        dtype=torch.float64)
    out.backward(grad.to(out.dtype))
    result = dict(
        out=out,
        x_grad=x.grad,
        running_mean=layer.running_mean,
        running_var=layer.running_var)
    result.update((n, p.grad) for n, p in layer.named_parameters())
    return {k: v.detach().double() for k, v in result.items()}


@pytest.mark.parametrize('groups', [1, 2])
@pytest.mark.parametrize('path', PATHS)
def test_5d_on_every_path(path, groups):
    """Output, every gradient and the running statistics of a video-shaped
    call, float32 on the path, against the float64 reference (the
    paper's formulas; for group SN the reference implementation, which
    tests/test_group_sn.py holds to them)."""
    if path == 'triton':
        require_kernels('triton')
    want_layer = make_sn(VIDEO[1], ratio_groups=groups)
    x = random_input(VIDEO)
    want = run(want_layer, x, 'torch')
    if groups == 1:
        out, _, _ = reference_of(make_sn(VIDEO[1]), x, training=True)
        torch.testing.assert_close(want['out'], out, rtol=1e-10, atol=1e-10)
    layer = make_sn(VIDEO[1], dtype=torch.float32, ratio_groups=groups)
    got = run(layer, x.float(), path)
    for key, value in want.items():
        torch.testing.assert_close(
            got[key], value, rtol=2e-4, atol=2e-4 * value.abs().max(), msg=key)


@pytest.mark.parametrize('groups', [1, 2])
def test_5d_exported(groups):
    """torch.export of an SN layer, eval and training, at a video shape,
    against the float64 reference (for group SN, the float64 layer)."""
    x = random_input(VIDEO, dtype=torch.float32)
    for training in (False, True):
        layer = make_sn(
            VIDEO[1], dtype=torch.float32, ratio_groups=groups).train(training)
        if groups == 1:
            want, _, _ = reference_of(layer, x.double(), training)
        else:
            twin = make_sn(VIDEO[1], ratio_groups=groups).train(training)
            with torch.no_grad():
                want = twin(x.double())
        program = torch.export.export(layer, (x, ))
        got = program.module()(x)
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def sn_resnet18_state(path, unbiased):
    """A 2D SN ResNet-18 (mmdet's, the released checkpoints' names) with
    every SN layer's logits, affine parameters and running statistics set
    to random values, saved to ``path``."""
    torch.manual_seed(0)
    net = ResNet(
        depth=18,
        norm_cfg=dict(type='SN', unbiased=unbiased),
        norm_eval=False,
        out_indices=(0, 1, 2, 3))
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, sn_mm.SwitchableNorm):
                m.mean_weight.normal_()
                m.var_weight.normal_()
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_()
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.)
    torch.save(net.state_dict(), path)
    return net


def i3d(depth, pretrained, norm_cfg, **kwargs):
    backbone = MODELS.build(
        dict(
            type='InflatedResNet3d',
            depth=depth,
            pretrained=str(pretrained),
            pretrained2d=True,
            norm_cfg=norm_cfg,
            conv_cfg=dict(type='Conv3d'),
            norm_eval=False,
            zero_init_residual=False,
            **kwargs))
    backbone.init_weights()
    return backbone


@pytest.mark.parametrize('training', [False, True])
def test_inflated_features_equal_2d_on_a_still_clip(tmp_path, training):
    """With 1-frame kernels, a clip whose frames are all one image: IN, LN
    and BN statistics over (T, H, W) equal those over (H, W), so every
    stage's features equal the 2D network's, frame by frame, in eval and in
    training, and so do the running statistics after the step. (The
    paper's Eq. 4 estimators, unbiased=False: Bessel's correction counts T
    frames as more values.)"""
    net2d = sn_resnet18_state(tmp_path / 'r18.pth', unbiased=False)
    net3d = i3d(
        18,
        tmp_path / 'r18.pth',
        dict(type='SN', unbiased=False),
        out_indices=(0, 1, 2, 3),
        conv1_kernel=(1, 7, 7),
        conv1_stride_t=1,
        pool1_stride_t=1,
        inflate=(0, 0, 0, 0),
        with_pool2=False)
    for name, value in net2d.state_dict().items():
        if name.rsplit('.', 1)[-1] in ('mean_weight', 'var_weight'):
            where = name.replace('sn1', 'conv1.sn').replace(
                'sn2', 'conv2.sn').replace('downsample.1', 'downsample.sn')
            assert torch.equal(net3d.state_dict()[where], value), name
    image = torch.randn(2, 3, 96, 96)
    clip = image.unsqueeze(2).expand(-1, -1, 4, -1, -1).contiguous()
    net2d.train(training)
    net3d.train(training)
    with torch.no_grad():
        for want, got in zip(net2d(image), net3d(clip)):
            assert got.shape[2] == 4
            scale = want.abs().max()
            assert (got - want.unsqueeze(2)).abs().max() < 1e-5 * scale
    assert torch.allclose(net3d.conv1.sn.running_var, net2d.sn1.running_var)


def test_inflate_i3d_r50_from_a_bn_checkpoint(tmp_path):
    """The paper's I3D ResNet-50 with SN, started from a torchvision-layout
    BN ResNet-50: every SN layer takes its BN layer's affine parameters
    and running statistics, every conv its 2D kernel spread over time (its
    time slices sum to the 2D kernel), nothing is left as initialised."""
    import torchvision
    torch.manual_seed(0)
    bn = torchvision.models.resnet50()
    with torch.no_grad():
        for m in bn.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.running_var.uniform_(0.5, 2.)
    torch.save(bn.state_dict(), tmp_path / 'r50.pth')
    net = i3d(
        50,
        tmp_path / 'r50.pth',
        dict(type='SN'),
        ratios='uniform',
        conv1_kernel=(5, 7, 7),
        conv1_stride_t=2,
        pool1_stride_t=2,
        inflate=((1, 1, 1), (1, 0, 1, 0), (1, 0, 1, 0, 1, 0), (0, 1, 0)))
    state = bn.state_dict()
    assert torch.equal(net.conv1.sn.running_var, state['bn1.running_var'])
    block = net.layer3[2]
    assert torch.equal(block.conv2.sn.weight, state['layer3.2.bn2.weight'])
    assert torch.equal(block.conv1.sn.running_mean,
                       state['layer3.2.bn1.running_mean'])
    assert torch.equal(net.layer4[0].downsample.sn.bias,
                       state['layer4.0.downsample.1.bias'])
    assert torch.equal(block.conv1.sn.mean_weight, torch.zeros(3))
    for conv3d, conv2d in ((net.conv1.conv, 'conv1'), (block.conv1.conv,
                                                       'layer3.2.conv1'),
                           (block.conv2.conv, 'layer3.2.conv2')):
        torch.testing.assert_close(
            conv3d.weight.sum(2), state[conv2d + '.weight'])
    assert net.conv1.conv.weight.shape[2] == 5
    fresh = i3d(50, tmp_path / 'r50.pth', dict(type='SN'))
    assert torch.equal(fresh.layer1[0].conv1.sn.weight,
                       state['layer1.0.bn1.weight'])


def test_mmaction_imports_and_drn_says_why(monkeypatch):
    from mmaction.models.localizers import DRN
    with pytest.raises(ImportError, match='2714'):
        DRN()


I3D_CONFIGS = sorted(glob.glob(osp.join(ROOT, 'configs', 'i3d', 'i3d_*.py')))


def two_d_start(kind, path):
    """A 2D ResNet-50 checkpoint as each row's start is published: BN in
    torchvision's layout, GN and SN in mmdet's (gn1, sn1, ...)."""
    torch.manual_seed(0)
    if kind == 'bn':
        import torchvision
        state = torchvision.models.resnet50().state_dict()
    else:
        norm = dict(
            type='GN', num_groups=32) if kind == 'gn' else dict(type='SN')
        net = ResNet(depth=50, norm_cfg=norm)
        with torch.no_grad():
            for p in net.parameters():
                if p.dim() == 1:  # affine parameters and ratio logits
                    p.uniform_(0.5, 1.5)
        state = net.state_dict()
    torch.save(state, path)
    return state


@pytest.mark.parametrize(
    'config',
    I3D_CONFIGS,
    ids=[osp.basename(c)[28:].split('-32x')[0] for c in I3D_CONFIGS])
def test_i3d_configs_start_every_norm_layer(config, tmp_path):
    """Each row of the paper's video table builds, starts every norm layer
    and conv from its 2D checkpoint (a generated one in the published
    layout), and classifies a clip."""
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    cfg = Config.fromfile(config)
    backbone = cfg.model.backbone
    assert backbone.pretrained2d
    kind = osp.basename(config).split('-')[3].split('_')[0]
    start = 'bn' if '-from-bn' in config else kind
    state = two_d_start(start, tmp_path / 'start.pth')
    backbone.pretrained = str(tmp_path / 'start.pth')
    with DefaultScope.overwrite_default_scope('mmaction'):
        model = MODELS.build(cfg.model)
    model.init_weights()
    norm = {
        'bn': torch.nn.BatchNorm3d,
        'gn': torch.nn.GroupNorm,
        'sn': sn_mm.SwitchableNorm
    }[kind]
    layers = [m for m in model.backbone.modules() if isinstance(m, norm)]
    assert len(layers) == 53
    source = f'layer2.3.{start}2'
    torch.testing.assert_close(model.backbone.layer2[3].conv2.norm.weight,
                               state[source + '.weight'])
    if kind == 'sn':
        torch.testing.assert_close(
            model.backbone.layer2[3].conv2.norm.mean_weight,
            state[source +
                  '.mean_weight'] if start == 'sn' else torch.zeros(3))
    torch.testing.assert_close(
        model.backbone.conv1.conv.weight.sum(2), state['conv1.weight'])
    model.eval()
    with torch.no_grad():
        feats = model(torch.randn(1, 1, 3, 8, 32, 32), mode='tensor')
        scores = model.cls_head(feats)
    assert scores.shape == (1, 400) and torch.isfinite(scores).all()
