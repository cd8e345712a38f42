"""SN in mmaction2's video networks: the I3D ResNet started from a 2D
ResNet checkpoint with BN, GN or SN layers.

``custom_imports=dict(imports=['sn_mm', 'sn_mm.video'])`` in a config
registers ``InflatedResNet3d``. Importing this module first lets mmaction2
1.2.0 import at all: its wheel lacks ``mmaction/models/localizers/drn``,
which ``mmaction.models`` imports (open-mmlab/mmaction2#2714); a stand-in
takes its place, and building a DRN localizer then says so.
"""
import importlib.util
import os.path as osp
import sys
import types
from typing import Dict, Optional

import torch
from mmengine.logging import print_log

from .dependencies import check_version
from .engine.pretrained import SNPretrainedInit, sn_state_from


def _stand_in_for_missing_drn() -> None:
    spec = importlib.util.find_spec('mmaction')
    if spec is None or spec.origin is None:
        return
    drn = osp.join(osp.dirname(spec.origin), 'models', 'localizers', 'drn')
    if osp.isdir(drn) or 'mmaction.models.localizers.drn' in sys.modules:
        return

    class DRN:
        """Stands in for mmaction2's DRN localizer, which its 1.2.0 wheel
        does not ship."""

        def __init__(self, *args, **kwargs):
            raise ImportError(
                'mmaction2 1.2.0 as installed from its wheel lacks '
                'mmaction/models/localizers/drn (open-mmlab/mmaction2#2714); '
                'install mmaction2 from its source repository for DRN')

    package = types.ModuleType('mmaction.models.localizers.drn')
    package.__path__ = []
    module = types.ModuleType('mmaction.models.localizers.drn.drn')
    module.DRN = DRN
    package.drn = module
    sys.modules[package.__name__] = package
    sys.modules[module.__name__] = module


_stand_in_for_missing_drn()
check_version('mmaction')

from mmaction.models.backbones.resnet3d import ResNet3d  # noqa: E402
from mmaction.registry import MODELS  # noqa: E402
from mmcv.cnn import ConvModule  # noqa: E402


def inflated_state(model: torch.nn.Module,
                   state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A 2D ResNet's state dict under ``model``'s (a ResNet3d's) names and
    shapes. Each 2D conv kernel is repeated over the 3D kernel's time axis
    and divided by its length, as mmaction2 inflates it (a clip constant in
    time then gives the 2D response); each norm layer's entries (BN's,
    GN's or SN's: affine parameters, running statistics, ratio logits) move
    to the norm layer of the same ConvModule, whatever its type."""
    out = {}
    for name, module in model.named_modules():
        if not isinstance(module, ConvModule):
            continue
        downsample = 'downsample' in name
        conv_2d = name + '.0' if downsample else name
        weight = state.get(conv_2d + '.weight')
        if weight is not None and weight.dim() + 1 == module.conv.weight.dim():
            kernel_t = module.conv.weight.shape[2]
            out[name + '.conv.weight'] = (
                weight.unsqueeze(2).expand(-1, -1, kernel_t, -1, -1) /
                kernel_t)
        if not module.with_norm:
            continue
        # A 2D ResNet names the norm after its conv: conv1 -> bn1, gn1, sn1.
        sources = [name + '.1'] if downsample else [
            name.replace('conv', abbr) for abbr in ('sn', 'bn', 'gn')
        ]
        source = next((s for s in sources if s + '.weight' in state), None)
        if source is None:
            continue
        for key, value in state.items():
            if key.startswith(source + '.'):
                out[f'{name}.{module.norm_name}.{key[len(source) + 1:]}'] = (
                    value)
    return out


@MODELS.register_module()
class InflatedResNet3d(ResNet3d):
    """mmaction2's ``ResNet3d`` (I3D) for any norm layer, started from a 2D
    ResNet checkpoint with BN, GN or SN layers.

    With ``pretrained2d=True`` and ``pretrained`` (a file, or a name
    mmengine resolves, e.g. ``torchvision://resnet50``), the convolutions
    are inflated as mmaction2's own ``ResNet3d`` inflates them, and every
    norm layer starts from the 2D norm layer of its ConvModule as
    ``SNPretrained`` starts a 2D network (:func:`sn_state_from`): an SN
    layer takes an SN source's ratio logits, affine parameters and running
    statistics, a BN source's affine parameters and running statistics, a
    GN source's affine parameters; BN and GN layers take their like. On a
    clip constant in time, IN, LN and BN statistics over (T, H, W) equal
    those over (H, W), so an inflated network with 1-frame kernels computes
    its 2D start's features frame by frame. mmaction2's own inflation
    handles BN layers only (it looks for ``ConvModule.bn``).

    Args:
        ratios (str): For SN layers, as ``SNPretrained``'s: ``'source'``
            (default) carries an SN source's logits (and starts them near
            BN from a BN source); ``'uniform'`` starts every layer's logits
            equal, the paper's initialisation.
        prefix (str, optional): Only the checkpoint's entries under this
            prefix (``'backbone.'`` of a classifier).
        **kwargs: ``ResNet3d``'s arguments.
    """

    def __init__(self,
                 *args,
                 ratios: str = 'source',
                 prefix: Optional[str] = None,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ratios = ratios
        self.prefix = prefix

    def inflate_weights(self, logger) -> None:
        state = SNPretrainedInit(
            self.pretrained, prefix=self.prefix,
            ratios=self.ratios)._state_dict()
        new, report = sn_state_from(self, inflated_state(self, state),
                                    self.ratios)
        self.load_state_dict(new)
        left = report['uninitialised']
        print_log(
            f'InflatedResNet3d from {self.pretrained}: '
            f'{len(report["sn_layers"])} SN layers from the 2D norm layers; '
            f'{len(left)} entries left as initialised' +
            (f': {", ".join(left)}' if left else ''),
            logger='current')
