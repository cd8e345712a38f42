"""init_cfg=dict(type='SNPretrained'): SN backbones started from BN, GN and
SN checkpoints (built here, in torchvision's and mmdet's layouts), inside
mmdet's own builders."""
import pytest
import torch
from mmengine.registry import DefaultScope

import sn_mm  # noqa: F401  (registers SN and SNPretrained)
from sn_mm import SwitchableNorm
from sn_mm.models.convert import SOURCE_RATIO


def build(cfg):
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope('mmdet'):
        return MODELS.build(cfg)


def resnet(norm, depth=50, init_cfg=None, **kwargs):
    norm_cfg = dict(
        BN=dict(type='BN'),
        SN=dict(type='SN'),
        GN=dict(type='GN', num_groups=32))[norm]
    return build(
        dict(
            type='ResNet',
            depth=depth,
            style='pytorch',
            norm_eval=False,
            norm_cfg=norm_cfg,
            init_cfg=init_cfg,
            **kwargs))


def randomise(model, seed=0):
    """Non-trivial affine parameters and running statistics, as a trained
    network has."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._NormBase) or \
                    isinstance(m, torch.nn.GroupNorm):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + .5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * .1)
    return model


@pytest.fixture(scope='module')
def bn_checkpoint(tmp_path_factory):
    """A BN ResNet-50 in torchvision's layout (mmdet's BN ResNet has its
    keys; torchvision's classifier adds fc), running statistics from a few
    batches."""
    torch.manual_seed(0)
    model = randomise(resnet('BN'))
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 3, 64, 64))
    state = dict(
        model.state_dict(), **{
            'fc.weight': torch.randn(1000, 2048),
            'fc.bias': torch.zeros(1000)
        })
    path = tmp_path_factory.mktemp('ckpt') / 'resnet50_bn.pth'
    torch.save(state, path)
    model.eval()  # (mmdet's ResNet.train returns None)
    return path, model


def sn_layers(model):
    return {
        n: m
        for n, m in model.named_modules() if isinstance(m, SwitchableNorm)
    }


def backbone_of(config, options):
    """The backbone of ``configs/<config>`` with ``options`` merged in (as
    ``--cfg-options`` does), built in its scope (mmseg's for the
    segmentation configs, else mmdet's) and initialised."""
    import os.path as osp

    from mmengine.config import Config
    root = osp.dirname(osp.dirname(osp.abspath(__file__)))
    cfg = Config.fromfile(osp.join(root, 'configs', config))
    cfg.merge_from_dict(options)
    if config.startswith(('deeplabv3', 'pspnet')):
        from mmseg.registry import MODELS
        from mmseg.utils import register_all_modules
        scope = 'mmseg'
    else:
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules
        scope = 'mmdet'
    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope(scope):
        backbone = MODELS.build(cfg.model.backbone)
    backbone.init_weights()
    return backbone


@pytest.mark.parametrize('ratios', ['uniform', 'source'])
def test_from_a_torchvision_bn_resnet50(bn_checkpoint, ratios):
    path, bn_model = bn_checkpoint
    model = resnet(
        'SN',
        init_cfg=dict(
            type='SNPretrained', checkpoint=str(path), ratios=ratios))
    model.init_weights()
    source = bn_model.state_dict()
    layers = sn_layers(model)
    assert len(layers) == 53
    for name, layer in layers.items():
        src = name.replace('.sn', '.bn') if '.sn' in name else \
            name.replace('sn', 'bn', 1) if name.startswith('sn') else name
        for key in ('weight', 'bias', 'running_mean', 'running_var'):
            torch.testing.assert_close(
                getattr(layer, key), source[f'{src}.{key}'], rtol=0, atol=0)
        bn_ratio = layer.ratios()['mean']['bn']
        if ratios == 'uniform':
            assert bn_ratio == pytest.approx(1 / 3)
        else:
            assert bn_ratio == pytest.approx(SOURCE_RATIO, abs=1e-6)
    torch.testing.assert_close(model.conv1.weight, source['conv1.weight'])
    if ratios == 'source':
        # Eval: what the BN network computes, within 1e-3 of the output's
        # scale (the other terms keep 1e-4 of the ratios).
        x = torch.randn(2, 3, 64, 64)
        model.eval()
        with torch.no_grad():
            got, want = model(x)[-1], bn_model(x)[-1]
        assert (got - want).abs().max() <= 1e-3 * want.abs().max()


def test_from_an_mmdet_gn_resnet50(tmp_path):
    gn_model = randomise(resnet('GN'))
    path = tmp_path / 'gn.pth'
    torch.save(dict(state_dict=gn_model.state_dict(), meta={}), path)
    model = resnet(
        'SN',
        init_cfg=dict(
            type='SNPretrained', checkpoint=str(path), ratios='source'))
    model.init_weights()
    layers = sn_layers(model)
    torch.testing.assert_close(layers['layer2.1.sn2'].weight,
                               gn_model.layer2[1].gn2.weight)
    torch.testing.assert_close(layers['layer3.0.downsample.1'].bias,
                               gn_model.layer3[0].downsample[1].bias)
    ratios = layers['sn1'].ratios()['var']
    assert ratios['in'] == pytest.approx(SOURCE_RATIO / 2, abs=1e-6)
    assert ratios['ln'] == pytest.approx(SOURCE_RATIO / 2, abs=1e-6)
    assert torch.equal(layers['sn1'].running_var, torch.ones(64))


def test_from_an_sn_checkpoint_keeps_or_resets_ratios(tmp_path):
    source = resnet('SN', depth=18)
    with torch.no_grad():
        for layer in sn_layers(source).values():
            layer.mean_weight.normal_()
            layer.running_mean.normal_()
    path = tmp_path / 'sn.pth'
    torch.save(source.state_dict(), path)
    for ratios in ('source', 'uniform'):
        model = resnet(
            'SN',
            depth=18,
            init_cfg=dict(
                type='SNPretrained', checkpoint=str(path), ratios=ratios))
        model.init_weights()
        got, want = sn_layers(model)['layer1.0.sn1'], \
            sn_layers(source)['layer1.0.sn1']
        assert torch.equal(got.running_mean, want.running_mean)
        assert torch.equal(got.mean_weight, want.mean_weight) == (
            ratios == 'source')


@pytest.fixture(scope='module')
def mmpretrain_checkpoint(tmp_path_factory):
    """An mmpretrain SN ResNet-50 classifier's training checkpoint: the
    backbone under ``backbone.``, a head beside, and mmengine's log history
    (objects PyTorch's safe loader refuses)."""
    from mmengine.logging import HistoryBuffer
    from mmpretrain.registry import MODELS
    from mmpretrain.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        classifier = MODELS.build(
            dict(
                type='ImageClassifier',
                backbone=dict(
                    type='ResNet', depth=50, norm_cfg=dict(type='SN')),
                neck=dict(type='GlobalAveragePooling'),
                head=dict(
                    type='LinearClsHead', num_classes=10, in_channels=2048)))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in sn_layers(classifier).values():
            for t in (layer.weight, layer.bias, layer.mean_weight,
                      layer.var_weight, layer.running_mean):
                t.copy_(torch.randn(t.shape, generator=gen))
            layer.running_var.copy_(
                torch.rand(layer.running_var.shape, generator=gen) + .5)
    path = tmp_path_factory.mktemp('mmpretrain') / 'epoch_100.pth'
    torch.save(
        dict(
            state_dict=classifier.state_dict(),
            meta={},
            message_hub=dict(
                log_scalars=dict(loss=HistoryBuffer([1.0, 0.5], [1, 1])))),
        path)
    backbone = {
        k[len('backbone.'):]: v
        for k, v in classifier.state_dict().items()
        if k.startswith('backbone.')
    }
    return path, backbone


def assert_loaded_as_is(model, backbone_state):
    got = model.state_dict()
    assert set(got) == set(backbone_state)
    for key, value in got.items():
        assert torch.equal(value, backbone_state[key]), key


def test_from_an_mmpretrain_sn_resnet50(mmpretrain_checkpoint, tmp_path):
    """mmpretrain's SN ResNet-50 starts mmdet's as it is: every SN layer's
    affine, ratio logits and running statistics. Its training checkpoint
    needs trusted=True; its weights alone load with ``Pretrained`` too."""
    path, backbone_state = mmpretrain_checkpoint
    model = resnet(
        'SN',
        init_cfg=dict(
            type='SNPretrained',
            checkpoint=str(path),
            prefix='backbone.',
            ratios='source',
            trusted=True))
    model.init_weights()
    assert_loaded_as_is(model, backbone_state)

    with pytest.raises(RuntimeError, match='trusted=True'):
        resnet(
            'SN',
            init_cfg=dict(
                type='SNPretrained', checkpoint=str(path),
                prefix='backbone.')).init_weights()

    weights = tmp_path / 'weights.pth'
    torch.save(
        dict(state_dict={
            f'backbone.{k}': v
            for k, v in backbone_state.items()
        }), weights)
    model = resnet(
        'SN',
        init_cfg=dict(
            type='Pretrained', checkpoint=str(weights), prefix='backbone.'))
    model.init_weights()
    assert_loaded_as_is(model, backbone_state)


# The README's command for a checkpoint of configs/pretrain.
README_OPTIONS = {
    'model.backbone.init_cfg.type': 'SNPretrained',
    'model.backbone.init_cfg.prefix': 'backbone.',
    'model.backbone.init_cfg.ratios': 'source',
    'model.backbone.init_cfg.trusted': True,
}


@pytest.mark.parametrize('config', [
    'mask_rcnn/mask-rcnn_r50-sn_fpn_sn-head_2x_coco.py',
    'faster_rcnn/faster-rcnn_r50-sn-c4_120k_coco.py',
    'deeplabv3/deeplabv3_r50-sn-8x2-d8_8xb2-100k_ade20k-450x450.py',
    'pspnet/pspnet_r50-sn-8x32-d8_8xb2-74k_cityscapes-713x713.py'
])
def test_mmpretrain_checkpoint_into_det_and_seg_configs(
        mmpretrain_checkpoint, config):
    path, backbone_state = mmpretrain_checkpoint
    backbone = backbone_of(
        config,
        dict(README_OPTIONS,
             **{'model.backbone.init_cfg.checkpoint': str(path)}))
    # The C4 detector's backbone stops before layer4 (the RoI head's).
    state = backbone.state_dict()
    assert len(state) > 250
    for key, value in state.items():
        assert torch.equal(value, backbone_state[key]), key


# The same for a C4 detector's res5, which its RoI head holds.
C4_OPTIONS = {
    k.replace('model.backbone.', 'model.roi_head.shared_head.'): v
    for k, v in README_OPTIONS.items()
}


def test_mmpretrain_checkpoint_into_the_c4_res5_head(mmpretrain_checkpoint):
    """The C4 configs' RoI head holds conv5 (res5) with its own init_cfg:
    the documented options for it start every one of its entries from the
    checkpoint's layer4."""
    import os.path as osp

    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.config import Config
    path, backbone_state = mmpretrain_checkpoint
    root = osp.dirname(osp.dirname(osp.abspath(__file__)))
    cfg = Config.fromfile(
        osp.join(root, 'configs', 'faster_rcnn',
                 'faster-rcnn_r50-sn-c4_120k_coco.py'))
    options = dict(README_OPTIONS, **C4_OPTIONS)
    for key in ('model.backbone.init_cfg.checkpoint',
                'model.roi_head.shared_head.init_cfg.checkpoint'):
        options[key] = str(path)
    cfg.merge_from_dict(options)
    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope('mmdet'):
        head = MODELS.build(cfg.model.roi_head.shared_head)
    head.init_weights()
    state = head.state_dict()
    assert len(state) > 50
    for key, value in state.items():
        assert torch.equal(value, backbone_state[key]), key


def test_shapes_that_do_not_fit_are_refused_with_nothing_loaded(bn_checkpoint):
    path, _ = bn_checkpoint
    model = resnet(
        'SN',
        depth=18,
        init_cfg=dict(type='SNPretrained', checkpoint=str(path)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r'layer1\.0\.conv1\.weight'):
        model.init_weights()
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_prefix_and_report(bn_checkpoint, tmp_path):
    path, _ = bn_checkpoint
    state = torch.load(path)
    classifier = tmp_path / 'classifier.pth'
    torch.save(
        dict(state_dict={
            f'backbone.{k}': v
            for k, v in state.items()
        }), classifier)
    from sn_mm.engine import SNPretrainedInit
    init = SNPretrainedInit(str(classifier), prefix='backbone.')
    model = resnet('SN')
    init(model)
    assert init.report['sn_layers']['layer4.2.sn3'] == 'BN layer4.2.bn3'
    assert init.report['sn_layers']['layer4.0.downsample.1'] == \
        'BN layer4.0.downsample.1'
    assert init.report['unused'] == ['fc.bias', 'fc.weight']
    assert init.report['uninitialised'] == []
    with pytest.raises(ValueError, match='ratios'):
        SNPretrainedInit(str(path), ratios='bn')


@pytest.mark.parametrize('arch', [
    dict(type='ResNeXt', depth=50, groups=32, base_width=4),
    dict(type='RegNet', arch='regnetx_400mf')
])
def test_resnext_and_regnet(arch, tmp_path):
    source = randomise(build(dict(arch, norm_cfg=dict(type='BN'))))
    path = tmp_path / 'bn.pth'
    torch.save(source.state_dict(), path)
    model = build(
        dict(
            arch,
            norm_cfg=dict(type='SN'),
            init_cfg=dict(type='SNPretrained', checkpoint=str(path))))
    model.init_weights()
    src = source.state_dict()
    count = 0
    for name, layer in sn_layers(model).items():
        src_name = '.'.join(
            name.split('.')[:-1] + [name.split('.')[-1].replace('sn', 'bn')])
        torch.testing.assert_close(layer.running_var,
                                   src[f'{src_name}.running_var'])
        count += 1
    assert count > 10


@pytest.mark.parametrize('config', [
    'mask_rcnn/mask-rcnn_r50-sn-from-bn_fpn_sn-head_2x_coco.py',
    'deeplabv3/deeplabv3_r50-sn-from-bn-d8_8xb2-100k_ade20k-450x450.py'
])
def test_from_bn_configs_start_from_the_bn_checkpoint(bn_checkpoint, config):
    path, bn_model = bn_checkpoint
    backbone = backbone_of(config,
                           {'model.backbone.init_cfg.checkpoint': str(path)})
    layer = sn_layers(backbone)['layer3.2.sn2']
    torch.testing.assert_close(layer.running_var,
                               bn_model.layer3[2].bn2.running_var)
    assert layer.ratios()['mean']['bn'] == pytest.approx(1 / 3)


def test_from_bn_configs_start_from_torchvisions_name(bn_checkpoint, tmp_path,
                                                      monkeypatch):
    """`torchvision://resnet50`, as the configs name it, from torch's hub
    cache (a generated file where mmengine looks: nothing downloads)."""
    import shutil
    path, bn_model = bn_checkpoint
    cache = tmp_path / 'torch_home' / 'hub' / 'checkpoints'
    cache.mkdir(parents=True)
    shutil.copy(path, cache / 'resnet50-0676ba61.pth')
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    backbone = backbone_of(
        'faster_rcnn/faster-rcnn_r50-sn-from-bn_fpn_sn-head_1x_coco.py', {})
    layer = sn_layers(backbone)['layer2.1.sn1']
    torch.testing.assert_close(layer.running_mean,
                               bn_model.layer2[1].bn1.running_mean)


def test_digits_study_runs():
    from helpers import load_tool
    study = load_tool('analysis_tools', 'digits_from_bn_study.py')
    rows = study.main(['--epochs', '1', '--batches', '32'])
    assert [r['start'] for r in rows] == [
        'the BN source', 'BN source, ratios=uniform',
        'BN source, ratios=source', 'scratch'
    ]
    assert all(0 <= r['accuracy'] <= 1 for r in rows)
    # Started at BN, the 'source' network's ratios are still BN's.
    assert float(rows[2]['ratios'][0]) > 0.99


def test_missing_checkpoints_are_found_by_key(tmp_path):
    from sn_mm.engine.runner import missing_checkpoints
    there = tmp_path / 'there.pth'
    there.write_bytes(b'')
    cfg = dict(
        backbone=dict(init_cfg=dict(type='SNPretrained', checkpoint='a.pth')),
        roi_head=dict(
            shared_head=dict(init_cfg=[
                dict(type='Pretrained', checkpoint=str(there)),
                dict(type='Pretrained', checkpoint='torchvision://resnet50'),
                dict(type='Pretrained', checkpoint='b.pth')
            ])))
    assert missing_checkpoints(cfg) == [
        ('model.backbone.init_cfg.checkpoint', 'a.pth'),
        ('model.roi_head.shared_head.init_cfg[2].checkpoint', 'b.pth')
    ]
