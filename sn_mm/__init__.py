"""sn_mm: Switchable Normalization (SN) and SyncSN for OpenMMLab.

Importing the package registers ``'SN'``, ``'SyncSN'``, Switchable
Whitening's ``'SW'`` and ``'SyncSW'``, and the
``'PreActResNet'`` backbone in mmengine's root ``MODELS`` registry, so
``norm_cfg=dict(type='SN')`` works in mmcv, mmdet and mmseg alike (use
``custom_imports=dict(imports=['sn_mm'])`` in a config).
"""
from .dependencies import check_version

# mmdet's rule: an mmcv or mmengine outside the tested range stops the
# import, naming the versions and the fix, before anything uses them.
check_version('mmengine')
check_version('mmcv')

# isort: off
# The engine registers SNRunner, the hooks and the optimizer constructor.
from . import engine  # noqa: F401,E402
from .models import (  # noqa: E402
    PreActResNet, SwitchableNorm, SwitchableWhitening, SyncSwitchableNorm,
    SyncSwitchableWhitening, convert_sn, convert_sync_sn, fuse_conv_sn,
    harden_sn, revert_sn, revert_sync_sn)
from .version import __version__  # noqa: E402
# isort: on

__all__ = [
    'PreActResNet', 'SwitchableNorm', 'SwitchableWhitening',
    'SyncSwitchableNorm', 'SyncSwitchableWhitening', 'convert_sn',
    'convert_sync_sn', 'fuse_conv_sn', 'harden_sn', 'revert_sn',
    'revert_sync_sn', '__version__'
]
