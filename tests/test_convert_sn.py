"""sn_mm.convert_sn on torchvision models: every BN/GN layer becomes SN
carrying its weights; one training step runs and trains the ratios; with
the source's ratios fixed, SN computes what the source computes in eval."""
import pytest
import torch
import torch.nn as nn
import torchvision

from sn_mm import SwitchableNorm, SyncSwitchableNorm, convert_sn
from sn_mm.models.convert import SOURCE_RATIO


def norms(model, types):
    return [m for m in model.modules() if isinstance(m, types)]


def trained_bn_stats(model):
    """Non-trivial BN running statistics and affine parameters."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in norms(model, (nn.BatchNorm2d, nn.GroupNorm)):
            m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
            m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(
                    torch.randn(m.running_mean.shape, generator=gen) * 0.1)
                m.running_var.copy_(
                    torch.rand(m.running_var.shape, generator=gen) + 0.5)
    return model


def step(model, size=64):
    """One SGD training step; the loss."""
    model.train()
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(
        2, 3, size, size, generator=torch.Generator().manual_seed(1))
    loss = model(x).logsumexp(1).mean()
    optim.zero_grad()
    loss.backward()
    optim.step()
    return loss


@pytest.mark.parametrize(
    'build', [
        lambda: torchvision.models.resnet18(num_classes=10),
        lambda: torchvision.models.mobilenet_v3_small(num_classes=10),
    ],
    ids=['resnet18', 'mobilenet_v3_small'])
def test_bn_models_become_sn_and_equal_in_eval_with_fixed_ratios(build):
    torch.manual_seed(0)
    source = trained_bn_stats(build()).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        want = source(x)
    count = len(norms(source, nn.BatchNorm2d))
    model = convert_sn(source, ratios='fixed')
    layers = norms(model, SwitchableNorm)
    assert len(layers) == count and not norms(model, nn.BatchNorm2d)
    with torch.no_grad():
        got = model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # mobilenet's BN has its own eps and momentum: carried
    bn_eps = {m.eps for m in layers}
    assert bn_eps == ({1e-3}
                      if 'MobileNet' in type(model).__name__ else {1e-5})


def test_resnet50_trains_a_step_with_source_ratios():
    torch.manual_seed(0)
    model = convert_sn(
        torchvision.models.resnet50(num_classes=10), ratios='source')
    layers = norms(model, SwitchableNorm)
    assert len(layers) == 53
    ratios = torch.softmax(layers[0].mean_weight, -1)
    assert float(ratios[2].detach()) == pytest.approx(SOURCE_RATIO, abs=1e-6)
    before = layers[0].mean_weight.detach().clone()
    loss = step(model)
    assert torch.isfinite(loss)
    assert layers[0].mean_weight.grad is not None
    assert not torch.equal(layers[0].mean_weight.detach(), before)


def test_group_norm_models():
    torch.manual_seed(0)
    gn = torchvision.models.resnet18(
        num_classes=10, norm_layer=lambda c: nn.GroupNorm(32, c))
    model = convert_sn(trained_bn_stats(gn), ratios='source', ratio_groups=2)
    layers = norms(model, SwitchableNorm)
    assert len(layers) == 20 and not norms(model, nn.GroupNorm)
    assert layers[0].mean_weight.shape == (2, 3)
    ratios = torch.softmax(layers[0].mean_weight[0], -1)
    assert float(ratios[0].detach()) == pytest.approx(
        SOURCE_RATIO / 2, abs=1e-6)
    assert torch.isfinite(step(model))
    # GroupNorm with one group is LN over (C, H, W): equal with LN fixed
    ln = trained_bn_stats(
        torchvision.models.resnet18(
            num_classes=10, norm_layer=lambda c: nn.GroupNorm(1, c))).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        want = ln(x)
        got = convert_sn(ln, ratios='fixed')(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match='32 groups of 64 channels'):
        convert_sn(
            gn.__class__(
                torchvision.models.resnet.BasicBlock, [1, 1, 1, 1],
                norm_layer=lambda c: nn.GroupNorm(32, c)),
            ratios='fixed')


def test_sync_double_and_bad_options():
    model = convert_sn(
        nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)), sync=True)
    assert isinstance(model[1], SyncSwitchableNorm)
    layer = convert_sn(nn.BatchNorm2d(8, momentum=None).double())
    assert isinstance(layer, SwitchableNorm) and layer.momentum is None
    assert layer.weight.dtype == torch.float64
    with pytest.raises(ValueError, match="ratios='best'"):
        convert_sn(nn.BatchNorm2d(8), ratios='best')


def test_fixed_bn_ratios_normalise_as_bn_in_training():
    torch.manual_seed(0)
    x = torch.randn(4, 8, 5, 5) * 2 + 1
    bn = nn.BatchNorm2d(8)
    sn = convert_sn(nn.BatchNorm2d(8), ratios='fixed')
    torch.testing.assert_close(sn(x), bn(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sn.running_mean, bn.running_mean)


def test_hardened_layers_revert_to_plain_norms():
    from sn_mm import revert_sn
    torch.manual_seed(0)
    source = trained_bn_stats(torchvision.models.resnet18(num_classes=10))
    source.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        want = source(x)
    model = revert_sn(convert_sn(source, ratios='fixed'))
    assert not norms(model, SwitchableNorm)
    assert len(norms(model, nn.BatchNorm2d)) == 20
    with torch.no_grad():
        torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)
    # LN's term, variances over the count: GroupNorm(1, C), in training too
    sn = convert_sn(nn.GroupNorm(1, 8), ratios='fixed')
    x = torch.randn(4, 8, 5, 5) * 3 + 1
    gn = revert_sn(sn)
    assert isinstance(gn, nn.GroupNorm) and gn.num_groups == 1
    torch.testing.assert_close(gn(x), sn(x), rtol=1e-5, atol=1e-5)
    # ratios that are not one term, or unbiased IN/LN, stay SN
    assert isinstance(revert_sn(SwitchableNorm(8)), SwitchableNorm)
    unbiased = SwitchableNorm(8)
    unbiased.fix_ratios(mean=[0, 1, 0], var=[0, 1, 0])
    assert revert_sn(unbiased) is unbiased
