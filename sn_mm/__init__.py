"""sn_mm: Switchable Normalization (SN) and SyncSN for OpenMMLab.

Importing the package registers ``'SN'``, ``'SyncSN'``, Switchable
Whitening's ``'SW'`` and ``'SyncSW'``, and the
``'PreActResNet'`` backbone in mmengine's root ``MODELS`` registry, so
``norm_cfg=dict(type='SN')`` works in mmcv, mmdet and mmseg alike (use
``custom_imports=dict(imports=['sn_mm'])`` in a config).
"""
# The engine registers SNRunner, the hooks and the optimizer constructor.
from . import engine  # noqa: F401
from .models import (PreActResNet, SwitchableNorm, SwitchableWhitening,
                     SyncSwitchableNorm, SyncSwitchableWhitening, convert_sn,
                     convert_sync_sn, fuse_conv_sn, harden_sn, revert_sn,
                     revert_sync_sn)
from .version import __version__

__all__ = [
    'PreActResNet', 'SwitchableNorm', 'SwitchableWhitening',
    'SyncSwitchableNorm', 'SyncSwitchableWhitening', 'convert_sn',
    'convert_sync_sn', 'fuse_conv_sn', 'harden_sn', 'revert_sn',
    'revert_sync_sn', '__version__'
]
