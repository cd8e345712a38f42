"""The OpenMMLab versions sn_mm checks (sn_mm/dependencies.py): the
installed ones pass; one outside the range is refused with the installed
and supported versions and the command that installs a supported one."""
import importlib

import pytest

from sn_mm.dependencies import (SUPPORTED, check_scope, check_version, release,
                                supported_range)


@pytest.mark.parametrize('module', sorted(SUPPORTED))
def test_the_installed_versions_are_supported(module):
    installed = importlib.import_module(module).__version__
    assert check_version(module) == installed


@pytest.mark.parametrize('module,version,fix', [
    ('mmcv', '2.2.0', 'mim install "mmcv>=2.1.0,<2.2.0"'),
    ('mmcv', '2.0.1', 'mim install "mmcv>=2.1.0,<2.2.0"'),
    ('mmengine', '0.9.1', 'mim install "mmengine>=0.10.0,<0.11.0"'),
    ('mmdet', '3.2.0', 'pip install "mmdet>=3.3.0,<3.4.0"'),
    ('mmseg', '1.1.2', 'pip install "mmsegmentation>=1.2.0,<1.3.0"'),
])
def test_a_version_outside_the_range_names_itself_and_the_fix(
        module, version, fix):
    with pytest.raises(ImportError) as error:
        check_version(module, version)
    message = str(error.value)
    pip_name = SUPPORTED[module][0]
    assert f'{pip_name}=={version} is installed' in message
    assert f'supports {supported_range(module)}' in message
    assert message.endswith(fix)


def test_versions_compare_by_release():
    assert release('2.1.0rc1+cu121') == (2, 1, 0)
    assert release('0.10') == (0, 10, 0)
    assert check_version('mmcv', '2.1.2') == '2.1.2'
    with pytest.raises(ValueError, match="not a version: 'dev'"):
        release('dev')


def test_a_config_scope_is_checked_where_sn_mm_supports_it():
    check_scope('mmdet')
    check_scope(None)
    check_scope('mmocr')  # not one of sn_mm's: left to its own checks
