"""The OpenMMLab versions sn_mm is tested with, checked where sn_mm's parts
for each package load (as mmdet checks mmcv's): mmengine and mmcv at
``import sn_mm``, mmdet, mmseg and mmpretrain when a config's scope or an SW
ResNet uses them, mmaction2 in :mod:`sn_mm.video`. Imports nothing that
sn_mm's own import needs, so that it runs first."""
import importlib
import re
from typing import Optional

from .version import __version__

# import name: (pip name, oldest supported, first unsupported). The ranges
# are the minor versions sn_mm's CI runs (docs/get_started.md#supported-
# versions); mmcv and mmengine are also the `mim` extra
# (requirements/mminstall.txt).
SUPPORTED = {
    'mmengine': ('mmengine', '0.10.0', '0.11.0'),
    'mmcv': ('mmcv', '2.1.0', '2.2.0'),
    'mmdet': ('mmdet', '3.3.0', '3.4.0'),
    'mmseg': ('mmsegmentation', '1.2.0', '1.3.0'),
    'mmpretrain': ('mmpretrain', '1.2.0', '1.3.0'),
    'mmaction': ('mmaction2', '1.2.0', '1.3.0'),
}


def release(version: str) -> tuple:
    """The numeric release of a version string ('2.1.0rc1+cu121' ->
    (2, 1, 0)), three parts."""
    match = re.match(r'\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?', version)
    if match is None:
        raise ValueError(f'not a version: {version!r}')
    return tuple(int(part or 0) for part in match.groups())


def supported_range(module: str) -> str:
    """``'mmcv>=2.1.0,<2.2.0'``: the pip requirement for ``module``."""
    pip_name, oldest, below = SUPPORTED[module]
    return f'{pip_name}>={oldest},<{below}'


def check_version(module: str, version: Optional[str] = None) -> str:
    """The installed ``module``'s version (or ``version``), or an
    ImportError naming it, the supported range and the command that
    installs a supported one."""
    pip_name, oldest, below = SUPPORTED[module]
    requirement = supported_range(module)
    installer = 'mim install' if module in ('mmcv', 'mmengine') else \
        'pip install'
    fix = f'{installer} "{requirement}"'
    if version is None:
        try:
            version = importlib.import_module(module).__version__
        except ImportError as err:
            raise ImportError(
                f'sn_mm {__version__} needs {requirement}, which is not '
                f'installed ({err}); install it: {fix}') from err
    if not release(oldest) <= release(version) < release(below):
        raise ImportError(
            f'{pip_name}=={version} is installed, but sn_mm {__version__} '
            f'supports {requirement}; install a supported one: {fix}')
    return version


def check_scope(scope: Optional[str]) -> None:
    """Check the package of a config's ``default_scope`` ('mmdet', 'mmseg',
    'mmpretrain', 'mmaction'), where it is one sn_mm supports."""
    if scope in SUPPORTED:
        check_version(scope)
