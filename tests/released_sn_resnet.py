"""The released ResNet50v1+SN network, written from its published layout.

Used to make checkpoints in the released format (names, (1, C, 1, 1)
shapes, optional ``module.`` prefix) and to compute the outputs the converted
mmdet/mmseg backbones must reproduce.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ReleasedSwitchNorm2d(nn.Module):
    """The authors' SwitchNorm2d: 4D input, Bessel-corrected IN variance,
    logits ordered (IN, LN, BN), momentum 0.9 on the old value."""

    def __init__(self, c, using_bn=True, momentum=0.9, eps=1e-5):
        super().__init__()
        self.using_bn, self.momentum, self.eps = using_bn, momentum, eps
        self.weight = nn.Parameter(torch.ones(1, c, 1, 1))
        self.bias = nn.Parameter(torch.zeros(1, c, 1, 1))
        k = 3 if using_bn else 2
        self.mean_weight = nn.Parameter(torch.ones(k))
        self.var_weight = nn.Parameter(torch.ones(k))
        if using_bn:
            self.register_buffer('running_mean', torch.zeros(1, c, 1))
            self.register_buffer('running_var', torch.zeros(1, c, 1))

    def forward(self, x):
        n, c, h, w = x.size()
        x = x.view(n, c, -1)
        mean_in = x.mean(-1, keepdim=True)
        var_in = x.var(-1, keepdim=True)
        mean_ln = mean_in.mean(1, keepdim=True)
        temp = var_in + mean_in**2
        var_ln = temp.mean(1, keepdim=True) - mean_ln**2
        if self.using_bn:
            if self.training:
                mean_bn = mean_in.mean(0, keepdim=True)
                var_bn = temp.mean(0, keepdim=True) - mean_bn**2
                self.running_mean.mul_(self.momentum).add_(
                    (1 - self.momentum) * mean_bn.data)
                self.running_var.mul_(self.momentum).add_(
                    (1 - self.momentum) * var_bn.data)
            else:
                mean_bn, var_bn = self.running_mean, self.running_var
        mw, vw = self.ratios()
        if self.using_bn:
            mean = mw[0] * mean_in + mw[1] * mean_ln + mw[2] * mean_bn
            var = vw[0] * var_in + vw[1] * var_ln + vw[2] * var_bn
        else:
            mean = mw[0] * mean_in + mw[1] * mean_ln
            var = vw[0] * var_in + vw[1] * var_ln
        x = (x - mean) / (var + self.eps).sqrt()
        return x.view(n, c, h, w) * self.weight + self.bias

    def ratios(self):
        return F.softmax(self.mean_weight, 0), F.softmax(self.var_weight, 0)


class Bottleneck(nn.Module):

    def __init__(self,
                 inplanes,
                 planes,
                 stride,
                 downsample,
                 using_bn,
                 norm=None):
        super().__init__()
        norm = norm or ReleasedSwitchNorm2d
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.sn1 = norm(planes, using_bn)
        # v1: the stride sits on the 3x3 convolution.
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.sn2 = norm(planes, using_bn)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.sn3 = norm(planes * 4, using_bn)
        self.downsample = downsample

    def forward(self, x):
        out = F.relu(self.sn1(self.conv1(x)))
        out = F.relu(self.sn2(self.conv2(out)))
        out = self.sn3(self.conv3(out))
        identity = self.downsample(x) if self.downsample is not None else x
        return F.relu(out + identity)


class ReleasedResNetSN(nn.Module):
    """ResNet50v1+SN; with ``norm=ReleasedSSN2d`` (tests/ssn_reference.py),
    ResNet50v1+SSN, whose layout is the same."""

    def __init__(self,
                 layers=(3, 4, 6, 3),
                 using_bn=True,
                 num_classes=1000,
                 norm=None):
        super().__init__()
        norm = norm or ReleasedSwitchNorm2d
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.sn1 = norm(64, using_bn)
        inplanes = 64
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers)):
            stride = 1 if i == 0 else 2
            downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False),
                norm(planes * 4, using_bn))
            mods = [
                Bottleneck(inplanes, planes, stride, downsample, using_bn,
                           norm)
            ]
            inplanes = planes * 4
            mods += [
                Bottleneck(inplanes, planes, 1, None, using_bn, norm)
                for _ in range(1, blocks)
            ]
            setattr(self, f'layer{i + 1}', nn.Sequential(*mods))
        self.fc = nn.Linear(2048, num_classes)

    def stages(self, x):
        x = F.relu(self.sn1(self.conv1(x)))
        x = F.max_pool2d(x, 3, 2, 1)
        outs = []
        for i in range(1, 5):
            x = getattr(self, f'layer{i}')(x)
            outs.append(x)
        return outs


def randomise(model, seed=0):
    """Non-trivial weights and running statistics, as after training."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name.endswith('running_var'):
                t.copy_(torch.rand(t.shape, generator=gen) + 0.5)
            elif name.endswith(('mean_weight', 'var_weight')):
                t.copy_(torch.randn(t.shape, generator=gen))
            elif name.endswith('running_mean') or name.endswith('bias'):
                t.copy_(torch.randn(t.shape, generator=gen) * 0.1)
            elif 'sn' in name or 'downsample.1' in name:
                t.copy_(torch.rand(t.shape, generator=gen) + 0.5)
            else:
                fan_in = t[0].numel() if t.dim() > 1 else 1
                t.copy_(
                    torch.randn(t.shape, generator=gen) * (2 / fan_in)**0.5)
    return model


class PreActBottleneck(nn.Module):
    """The released v2 block: sn1 -> ReLU gives preact; conv1 1x1; sn2 ->
    ReLU; conv2 3x3 with the stride; sn3 -> ReLU; conv3 1x1. The shortcut
    is x, or downsample(preact) (a bare strided 1x1 conv); no ReLU after
    the sum."""

    def __init__(self, inplanes, planes, stride, downsample):
        super().__init__()
        self.sn1 = ReleasedSwitchNorm2d(inplanes)
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.sn2 = ReleasedSwitchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.sn3 = ReleasedSwitchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.downsample = downsample

    def forward(self, x):
        preact = F.relu(self.sn1(x))
        shortcut = x if self.downsample is None else self.downsample(preact)
        out = self.conv1(preact)
        out = self.conv2(F.relu(self.sn2(out)))
        out = self.conv3(F.relu(self.sn3(out)))
        return out + shortcut


class ReleasedPreActResNetSN(nn.Module):
    """The released ResNet50v2+SN / ResNet101v2+SN network."""

    def __init__(self, layers=(3, 4, 6, 3), num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.sn1 = ReleasedSwitchNorm2d(64)
        inplanes = 64
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers)):
            stride = 1 if i == 0 else 2
            downsample = nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False)
            mods = [PreActBottleneck(inplanes, planes, stride, downsample)]
            inplanes = planes * 4
            mods += [
                PreActBottleneck(inplanes, planes, 1, None)
                for _ in range(1, blocks)
            ]
            setattr(self, f'layer{i + 1}', nn.Sequential(*mods))
        self.sn_out = ReleasedSwitchNorm2d(2048)
        self.dropout = nn.Dropout(0.3)
        self.fc = nn.Linear(2048, num_classes)

    def stages(self, x):
        """The residual stream after each stage; the last one after sn_out
        and ReLU."""
        x = F.relu(self.sn1(self.conv1(x)))
        x = F.max_pool2d(x, 3, 2, 1)
        outs = []
        for i in range(1, 5):
            x = getattr(self, f'layer{i}')(x)
            if i == 4:
                x = F.relu(self.sn_out(x))
            outs.append(x)
        return outs


def assert_reproduces(reference, backbone, x, tol):
    """In eval and then train mode (the running statistics move alike),
    ``backbone(x)`` equals ``reference.stages(x)`` to ``tol``."""
    for training in (False, True):
        reference.train(training)
        backbone.train(training)
        with torch.no_grad():
            expected = reference.stages(x)
            outs = backbone(x)
        assert len(outs) == len(expected)
        for e, o in zip(expected, outs):
            torch.testing.assert_close(o, e, rtol=tol, atol=tol)
