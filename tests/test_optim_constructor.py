"""SNOptimWrapperConstructor's parameter groups."""
import pytest
import torch.nn as nn
from mmengine.optim import DefaultOptimWrapperConstructor
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS

from sn_mm import (SwitchableNorm, SwitchableWhitening, SyncSwitchableNorm,
                   SyncSwitchableWhitening)
from sn_mm.engine import SNOptimWrapperConstructor

BASE_LR, BASE_WD = 0.02, 1e-4


class Net(nn.Module):

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.sn = SwitchableNorm(4)
        self.head = nn.Sequential(nn.Conv2d(4, 4, 1), SyncSwitchableNorm(4))
        self.bn = nn.BatchNorm2d(4)
        self.sw = SwitchableWhitening(4, num_pergroup=2, sw_type=5)
        self.sync_sw = SyncSwitchableWhitening(4, num_pergroup=2)


def groups(paramwise_cfg, constructor=SNOptimWrapperConstructor):
    model = Net()
    wrapper = constructor(
        dict(
            optimizer=dict(
                type='SGD', lr=BASE_LR, momentum=0.9, weight_decay=BASE_WD)),
        paramwise_cfg)(
            model)
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        names[id(g['params'][0])]: (g['lr'], g['weight_decay'])
        for g in wrapper.optimizer.param_groups
    }


def test_registered():
    assert OPTIM_WRAPPER_CONSTRUCTORS.get(
        'SNOptimWrapperConstructor') is SNOptimWrapperConstructor


def test_default_constructor_misses_sn():
    # The reason the constructor exists: mmengine decays SN like a conv.
    g = groups(dict(norm_decay_mult=0.), DefaultOptimWrapperConstructor)
    assert g['bn.weight'][1] == 0
    assert g['sn.weight'][1] == BASE_WD


def test_sn_affine_is_norm_and_ratios_take_their_multipliers():
    g = groups(
        dict(
            norm_decay_mult=0.,
            bias_lr_mult=2.,
            bias_decay_mult=0.5,
            ratio_lr_mult=10.,
            ratio_decay_mult=0.))
    for prefix in ('sn', 'head.1', 'bn', 'sw', 'sync_sw'):
        assert g[f'{prefix}.weight'] == (BASE_LR, 0.)
        # bias_lr_mult leaves norm biases alone, as mmengine does for BN.
        assert g[f'{prefix}.bias'] == (BASE_LR, 0.)
    for prefix in ('sn', 'head.1'):
        for name in ('mean_weight', 'var_weight'):
            assert g[f'{prefix}.{name}'] == (BASE_LR * 10, 0.)
    for prefix in ('sw', 'sync_sw'):  # Switchable Whitening's
        for name in ('sw_mean_weight', 'sw_var_weight'):
            assert g[f'{prefix}.{name}'] == (BASE_LR * 10, 0.)
    # Everything else keeps mmengine's rules.
    assert g['conv.weight'] == (BASE_LR, BASE_WD)
    assert g['conv.bias'] == (BASE_LR * 2, BASE_WD * 0.5)


def test_ratios_follow_norm_rule_without_their_own():
    g = groups(dict(norm_decay_mult=0.5))
    assert g['sn.mean_weight'] == (BASE_LR, BASE_WD * 0.5)
    assert g['sn.weight'] == (BASE_LR, BASE_WD * 0.5)


def test_custom_keys_override_sn_rules():
    g = groups(
        dict(
            norm_decay_mult=0.,
            ratio_decay_mult=0.,
            custom_keys={'head': dict(lr_mult=0.1, decay_mult=3.)}))
    assert g['head.1.weight'] == pytest.approx((BASE_LR * 0.1, BASE_WD * 3))
    assert g['head.1.var_weight'] == pytest.approx(
        (BASE_LR * 0.1, BASE_WD * 3))
    assert g['sn.var_weight'] == (BASE_LR, 0.)


def test_ratio_decay_needs_weight_decay():
    with pytest.raises(ValueError, match='ratio_decay_mult'):
        SNOptimWrapperConstructor(
            dict(optimizer=dict(type='SGD', lr=0.1)),
            dict(ratio_decay_mult=0.))
