"""Pre-activation (v2) ResNet, the layout of the released ResNet50v2+SN and
ResNet101v2+SN models, as an mmdet/mmseg backbone (``'PreActResNet'``)."""
from typing import Optional, Sequence

import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmengine.model import BaseModule
from mmengine.registry import MODELS
from torch.nn.modules.batchnorm import _BatchNorm

from .switchable_norm import SwitchableNorm


def build_norm_layer(cfg, channels, postfix):
    """mmcv's ``build_norm_layer``: (name, layer) for ``cfg``."""
    # mmcv's, imported when a backbone is built: `import sn_mm` (and SN
    # itself) must not need mmcv, which GPU machines may lack.
    from mmcv.cnn import build_norm_layer as build
    return build(cfg, channels, postfix=postfix)


class _PreActBlock(BaseModule):
    """What both v2 blocks share: ``norm1 -> ReLU`` gives ``preact``; the
    shortcut is ``x``, or ``downsample(preact)`` (a bare strided 1x1 conv) in
    a stage's first block; the sum is not followed by a ReLU."""

    expansion = 1

    def _norm(self, norm_cfg, channels, index):
        name, layer = build_norm_layer(norm_cfg, channels, postfix=index)
        self.add_module(name, layer)
        return name

    def _shortcut(self, inplanes, planes, stride):
        out = planes * self.expansion
        if stride == 1 and inplanes == out:
            return None
        return nn.Conv2d(inplanes, out, 1, stride, bias=False)

    def forward(self, x):

        def inner(x):
            preact = F.relu(getattr(self, self.norm_names[0])(x))
            shortcut = (
                self.downsample(preact) if self.downsample is not None else x)
            return self._residual(preact) + shortcut

        if self.with_cp and x.requires_grad:
            return cp.checkpoint(inner, x, use_reentrant=False)
        return inner(x)


class PreActBottleneck(_PreActBlock):
    """``sn1 -> ReLU -> conv1 (1x1) -> sn2 -> ReLU -> conv2 (3x3, stride,
    dilation) -> sn3 -> ReLU -> conv3 (1x1, 4x planes)``."""

    expansion = 4

    def __init__(self,
                 inplanes,
                 planes,
                 stride=1,
                 dilation=1,
                 norm_cfg=dict(type='SN'),
                 with_cp=False,
                 init_cfg=None):
        super().__init__(init_cfg)
        self.with_cp = with_cp
        self.norm_names = [self._norm(norm_cfg, inplanes, 1)]
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.norm_names.append(self._norm(norm_cfg, planes, 2))
        self.conv2 = nn.Conv2d(
            planes, planes, 3, stride, dilation, dilation, bias=False)
        self.norm_names.append(self._norm(norm_cfg, planes, 3))
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.downsample = self._shortcut(inplanes, planes, stride)

    def _residual(self, preact):
        out = self.conv1(preact)
        out = self.conv2(F.relu(getattr(self, self.norm_names[1])(out)))
        return self.conv3(F.relu(getattr(self, self.norm_names[2])(out)))


class PreActBasicBlock(_PreActBlock):
    """``sn1 -> ReLU -> conv1 (3x3, stride, dilation) -> sn2 -> ReLU ->
    conv2 (3x3, dilation)``."""

    def __init__(self,
                 inplanes,
                 planes,
                 stride=1,
                 dilation=1,
                 norm_cfg=dict(type='SN'),
                 with_cp=False,
                 init_cfg=None):
        super().__init__(init_cfg)
        self.with_cp = with_cp
        self.norm_names = [self._norm(norm_cfg, inplanes, 1)]
        self.conv1 = nn.Conv2d(
            inplanes, planes, 3, stride, dilation, dilation, bias=False)
        self.norm_names.append(self._norm(norm_cfg, planes, 2))
        self.conv2 = nn.Conv2d(
            planes, planes, 3, 1, dilation, dilation, bias=False)
        self.downsample = self._shortcut(inplanes, planes, stride)

    def _residual(self, preact):
        out = self.conv1(preact)
        return self.conv2(F.relu(getattr(self, self.norm_names[1])(out)))


@MODELS.register_module()
class PreActResNet(BaseModule):
    """Pre-activation ResNet (He et al., "Identity Mappings in Deep Residual
    Networks") with the released SN v2 models' layout and parameter names
    (``conv1``, ``sn1``, ``layer{i}.{j}.sn1``/``conv1``/..., ``layer{i}.0.
    downsample``, ``sn_out``; ``bn``/``gn`` in place of ``sn`` for other
    norm layers), so their converted checkpoints load with ``strict=True``.

    Stem: 7x7 conv, stride 2 -> norm -> ReLU -> 3x3 max-pool, stride 2.

    Outputs: the residual stream after each stage in ``out_indices``; the
    last stage's output goes through ``sn_out`` and ReLU first, as the
    released classifier sees it (and as timm's pre-activation ResNets expose
    features). The earlier stages' outputs are not normalised: in a v2
    network every block normalises its own input, and so does whatever
    consumes them (an FPN's lateral convs learn the scale).

    Args:
        depth (int): 18, 34, 50, 101 or 152.
        in_channels (int): Input channels. Default: 3.
        strides (Sequence[int]): Stride of each stage's first block (on its
            3x3 conv and its shortcut). Default: (1, 2, 2, 2).
        dilations (Sequence[int]): Dilation of each stage's 3x3 convs (e.g.
            (1, 1, 2, 4) with strides (1, 2, 1, 1) for output stride 8).
            Default: (1, 1, 1, 1).
        out_indices (Sequence[int]): Stages whose outputs are returned.
            Default: (0, 1, 2, 3).
        frozen_stages (int): Stages (and the stem, from 0 on) whose
            parameters are frozen and whose norm layers stay in eval mode;
            -1 freezes nothing. Default: -1.
        norm_cfg (dict): Norm layer config. Default: ``dict(type='SN')``.
        norm_eval (bool): Keep every norm layer with running statistics (BN,
            SyncBN, SN, SyncSN) in eval mode during training. Default: False.
        with_cp (bool): Gradient checkpointing of each block (saves memory;
            the blocks' norm layers then see each batch twice, so their
            running statistics move twice per step, as mmdet's BN ResNets'
            do). Default: False.
        init_cfg (dict or list[dict], optional): Initialisation; e.g.
            ``dict(type='Pretrained', checkpoint=...)`` for a converted
            checkpoint. Default: Kaiming for convs, constant 1 for norms.
    """

    arch_settings = {
        18: (PreActBasicBlock, (2, 2, 2, 2)),
        34: (PreActBasicBlock, (3, 4, 6, 3)),
        50: (PreActBottleneck, (3, 4, 6, 3)),
        101: (PreActBottleneck, (3, 4, 23, 3)),
        152: (PreActBottleneck, (3, 8, 36, 3)),
    }

    def __init__(self,
                 depth: int,
                 in_channels: int = 3,
                 strides: Sequence[int] = (1, 2, 2, 2),
                 dilations: Sequence[int] = (1, 1, 1, 1),
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1,
                 norm_cfg: dict = dict(type='SN'),
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 init_cfg: Optional[dict] = None) -> None:
        if depth not in self.arch_settings:
            raise KeyError(f'invalid depth {depth} for PreActResNet: '
                           f'expected one of {sorted(self.arch_settings)}')
        if len(strides) != 4 or len(dilations) != 4:
            raise ValueError(f'strides and dilations need 4 entries, got '
                             f'{tuple(strides)} and {tuple(dilations)}')
        if not set(out_indices) <= {0, 1, 2, 3}:
            raise ValueError(f'out_indices must be in 0-3, got '
                             f'{tuple(out_indices)}')
        if init_cfg is None:
            init_cfg = [
                dict(type='Kaiming', layer='Conv2d'),
                dict(
                    type='Constant', val=1, layer=['_BatchNorm', 'GroupNorm'])
            ]
        super().__init__(init_cfg)
        # Configs that take a norm_cfg from an mmdet::/mmseg:: base carry
        # mmengine's '_scope_' key, which no norm layer accepts.
        norm_cfg = {k: v for k, v in norm_cfg.items() if k != '_scope_'}
        block, stage_blocks = self.arch_settings[depth]
        self.depth = depth
        self.out_indices = tuple(out_indices)
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval

        self.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
        self.stem_norm_name, stem_norm = build_norm_layer(
            norm_cfg, 64, postfix=1)
        self.add_module(self.stem_norm_name, stem_norm)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes = 64
        self.res_layers = []
        for i, num_blocks in enumerate(stage_blocks):
            planes = 64 * 2**i
            blocks = [
                block(inplanes, planes, strides[i], dilations[i], norm_cfg,
                      with_cp)
            ]
            inplanes = planes * block.expansion
            blocks += [
                block(inplanes, planes, 1, dilations[i], norm_cfg, with_cp)
                for _ in range(1, num_blocks)
            ]
            name = f'layer{i + 1}'
            self.add_module(name, nn.Sequential(*blocks))
            self.res_layers.append(name)
        self.out_norm_name, out_norm = build_norm_layer(
            norm_cfg, inplanes, postfix='_out')
        self.add_module(self.out_norm_name, out_norm)
        self.feat_dim = inplanes
        self._freeze_stages()

    def _freeze_stages(self) -> None:
        if self.frozen_stages < 0:
            return
        frozen = [self.conv1, getattr(self, self.stem_norm_name)] + [
            getattr(self, f'layer{i}')
            for i in range(1, self.frozen_stages + 1)
        ]
        for module in frozen:
            module.eval()
            for param in module.parameters():
                param.requires_grad = False

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(getattr(self, self.stem_norm_name)(x))
        x = self.maxpool(x)
        outs = []
        for i, name in enumerate(self.res_layers):
            x = getattr(self, name)(x)
            if i == len(self.res_layers) - 1:
                x = F.relu(getattr(self, self.out_norm_name)(x))
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, (_BatchNorm, SwitchableNorm)):
                    m.eval()
        return self
