from .preact_resnet import PreActResNet
from .switchable_norm import SwitchableNorm
from .sync_switchable_norm import (SyncSwitchableNorm, convert_sync_sn,
                                   revert_sync_sn)

__all__ = [
    'PreActResNet', 'SwitchableNorm', 'SyncSwitchableNorm', 'convert_sync_sn',
    'revert_sync_sn'
]
