"""ResNets with Switchable Whitening where the authors' ImageNet models have
it, for mmdet, mmseg and mmpretrain.

The released SW ResNets (``XingangPan/Switchable-Whitening``,
``models/backbones/resnet.py``) keep BN in most layers and use SW at the
stem's norm and at one norm of every other block (blocks 1, 3, ... of a
stage; a bottleneck's second norm, a basic block's first) in the stages that
``stage_with_sw`` selects (the first three by default). ``SWResNet`` builds
the ResNet of the config's scope (mmdet's, mmseg's or mmpretrain's) and puts
SW layers there, named as mmcv names them (``sw1``, ``layer1.1.sw2``), which
are also the release's names, so a converted release checkpoint
(``tools/model_converters/sw2mm.py``) loads with ``strict=True``.
"""
from typing import Sequence

import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmengine.registry import MODELS


def _replace_norm(owner: nn.Module, attr: str, cfg: dict, channels: int,
                  postfix: int) -> None:
    """Replace the norm layer that ``owner.<attr>`` names (a
    ``norm1_name``-style attribute) by one built from ``cfg``."""
    old = getattr(owner, attr)
    name, layer = build_norm_layer(cfg, channels, postfix=postfix)
    delattr(owner, old)
    setattr(owner, attr, name)
    owner.add_module(name, layer)


def apply_sw_layout(backbone: nn.Module,
                    sw_cfg: dict,
                    stage_with_sw: Sequence[bool] = (True, True, True, False),
                    sw_stem: bool = True) -> nn.Module:
    """Put SW layers (built from ``sw_cfg``) into an OpenMMLab ResNet where
    the authors' SW ResNets have them; returns the backbone."""
    if getattr(backbone, 'deep_stem', False):
        raise ValueError('SWResNet: the authors\' layout has a single-conv '
                         'stem; deep_stem=True (ResNetV1c/V1d) has none')
    layers = getattr(backbone, 'res_layers', None)
    if layers is None or len(stage_with_sw) != len(layers):
        raise ValueError(
            f'SWResNet: stage_with_sw={tuple(stage_with_sw)} must give one '
            f'flag per stage ({len(layers or ())} stages)')
    if sw_stem:
        _replace_norm(backbone, 'norm1_name', sw_cfg,
                      getattr(backbone, backbone.norm1_name).num_features, 1)
    for with_sw, layer_name in zip(stage_with_sw, layers):
        if not with_sw:
            continue
        for index, block in enumerate(getattr(backbone, layer_name)):
            if index % 2 == 0:
                continue
            # A bottleneck's 3x3 conv norm; a basic block's first.
            which = 2 if hasattr(block, 'norm3_name') else 1
            attr = f'norm{which}_name'
            channels = getattr(block, getattr(block, attr)).num_features
            _replace_norm(block, attr, sw_cfg, channels, which)
    # The toolboxes' ResNets freeze their first stages in __init__, before
    # the SW layers come in: freeze again, so that from build on no
    # parameter of a frozen stage requires grad (the runner wraps the model
    # in DDP before training, which would wait for their gradients).
    freeze = getattr(backbone, '_freeze_stages', None)
    if callable(freeze):
        freeze()
    return backbone


@MODELS.register_module()
def SWResNet(sw_cfg: dict = dict(
    type='SW', num_pergroup=16, sw_type=2, T=5, momentum=0.1),
             stage_with_sw: Sequence[bool] = (True, True, True, False),
             sw_stem: bool = True,
             **resnet_cfg) -> nn.Module:
    """The config scope's ``ResNet`` (``resnet_cfg``: its arguments) with SW
    layers from ``sw_cfg`` where the authors' SW ResNets have them: the
    stem's norm (``sw_stem``) and the second norm of every other bottleneck
    in the stages ``stage_with_sw`` selects. BN (``norm_cfg``) elsewhere.

    Example (in an mmdet, mmseg or mmpretrain config)::

        backbone=dict(type='SWResNet', depth=50,
                      sw_cfg=dict(type='SW', num_pergroup=16, sw_type=2),
                      norm_eval=False,
                      init_cfg=dict(type='Pretrained',
                                    checkpoint='checkpoints/resnet50_sw.pth'))
    """
    try:
        backbone = MODELS.build(dict(type='ResNet', **resnet_cfg))
    except KeyError as e:
        raise KeyError(
            'SWResNet builds the ResNet of the config\'s scope: set '
            'default_scope to mmdet, mmseg or mmpretrain') from e
    return apply_sw_layout(backbone, sw_cfg, stage_with_sw, sw_stem)
