from .convert import convert_sn, convert_sync_sn, revert_sn, revert_sync_sn
from .fuse import SelectedNorm, SNAffine, fuse_conv_sn
from .hard_ratios import hard_choices, harden_sn, harden_state_dict
from .preact_resnet import PreActResNet
from .shared_heads import keep_level_statistics
from .sw_resnet import SWResNet, apply_sw_layout
from .switchable_norm import SwitchableNorm
from .switchable_whitening import SwitchableWhitening, SyncSwitchableWhitening
from .sync_switchable_norm import SyncSwitchableNorm

__all__ = [
    'convert_sn', 'SelectedNorm', 'SNAffine', 'fuse_conv_sn', 'hard_choices',
    'harden_sn', 'harden_state_dict', 'keep_level_statistics', 'PreActResNet',
    'SwitchableNorm', 'SwitchableWhitening', 'SWResNet', 'apply_sw_layout',
    'SyncSwitchableNorm', 'SyncSwitchableWhitening', 'convert_sync_sn',
    'revert_sn', 'revert_sync_sn'
]
