"""Names that moved keep working, with a warning that names the new place."""
import pytest

import sn_mm.cli
import sn_mm.testing


def test_old_tool_glue_path():
    import sn_mm.utils
    with pytest.warns(DeprecationWarning, match='moved to sn_mm.cli'):
        assert sn_mm.utils.load_config is sn_mm.cli.load_config
    with pytest.raises(AttributeError, match='moved to sn_mm.cli'):
        sn_mm.utils.nothing_here


def test_old_toy_data_path():
    import sn_mm.datasets
    with pytest.warns(DeprecationWarning, match='moved to sn_mm.testing'):
        assert sn_mm.datasets.make_toy_coco is sn_mm.testing.make_toy_coco
