"""The authors' SW ResNet-50 (``XingangPan/Switchable-Whitening``,
``models/backbones/resnet.py``), written from its published layout: SW at
the stem and at the second norm of blocks 1, 3, ... of the stages with SW,
BN elsewhere, norm layers named ``bn<k>``/``sw<k>``, the classifier ``fc``.
Its SW layers are sn_mm's, which tests/test_switchable_whitening.py holds to
the released formulation.

Used to make checkpoints in the released key layout and to compute the
outputs that a converted OpenMMLab backbone must reproduce.
"""
import torch.nn as nn

from sn_mm.models.switchable_whitening import SwitchableWhitening


def norm(planes, sw_cfg, index):
    """(name, layer): SW where sw_cfg is given, else BN."""
    if sw_cfg is not None:
        return f'sw{index}', SwitchableWhitening(planes, **sw_cfg)
    return f'bn{index}', nn.BatchNorm2d(planes)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self,
                 inplanes,
                 planes,
                 stride=1,
                 downsample=None,
                 sw_cfg=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.names = []
        norms = ((planes, None), (planes, sw_cfg), (planes * 4, None))
        for index, (channels, cfg) in enumerate(norms, 1):
            name, layer = norm(channels, cfg, index)
            self.add_module(name, layer)
            self.names.append(name)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        n1, n2, n3 = (getattr(self, n) for n in self.names)
        out = self.relu(n1(self.conv1(x)))
        out = self.relu(n2(self.conv2(out)))
        out = n3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ReleasedSWResNet50(nn.Module):
    """ResNet-50 with SW where the authors put it (stage_with_sw: the first
    three stages by default)."""

    def __init__(self,
                 sw_cfg=dict(num_pergroup=16, sw_type=2, T=5),
                 stage_with_sw=(True, True, True, False),
                 num_classes=1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.stem_name, stem = norm(64, sw_cfg, 1)
        self.add_module(self.stem_name, stem)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))
        for i, (planes, blocks, stride) in enumerate(stages):
            self.add_module(
                f'layer{i + 1}',
                self._make_layer(planes, blocks, stride,
                                 sw_cfg if stage_with_sw[i] else None))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2048, num_classes)

    def _make_layer(self, planes, blocks, stride, sw_cfg):
        downsample = None
        if stride != 1 or self.inplanes != planes * 4:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * 4, 1, stride, bias=False),
                nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * 4
        for i in range(1, blocks):
            layers.append(
                Bottleneck(
                    self.inplanes,
                    planes,
                    sw_cfg=sw_cfg if i % 2 == 1 else None))
        return nn.Sequential(*layers)

    def features(self, x):
        """The four stages' outputs (what an OpenMMLab ResNet returns)."""
        x = self.maxpool(
            self.relu(getattr(self, self.stem_name)(self.conv1(x))))
        outs = []
        for i in range(1, 5):
            x = getattr(self, f'layer{i}')(x)
            outs.append(x)
        return outs

    def forward(self, x):
        return self.fc(self.avgpool(self.features(x)[-1]).flatten(1))
