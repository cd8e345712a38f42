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


def test_sn_needs_no_mmcv_mmdet_or_mmseg(tmp_path):
    # As on a GPU machine with mmengine but none of these: `import sn_mm`
    # and the layers work.
    from tool_runner import ROOT, run_python
    script = tmp_path / 'no_mmcv.py'
    script.write_text(
        'import sys\n'
        'class Block:\n'
        '    def find_spec(self, name, path=None, target=None):\n'
        '        if name.split(".")[0] in ("mmcv", "mmdet", "mmseg"):\n'
        '            raise ImportError("blocked: " + name)\n'
        'sys.meta_path.insert(0, Block())\n'
        'import torch, sn_mm\n'
        'x = torch.randn(2, 4, 5, 5, requires_grad=True)\n'
        'sn_mm.SwitchableNorm(4)(x).sum().backward()\n'
        'sn_mm.SyncSwitchableNorm(4)(x)\n'
        'assert not any(m.split(".")[0] in ("mmcv", "mmdet", "mmseg")\n'
        '               for m in sys.modules)\n'
        'print("ok")\n')
    result = run_python([script], cwd=ROOT)
    assert result.stdout.strip().endswith('ok')
