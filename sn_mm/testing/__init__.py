"""What the tests, the GPU check and the demos share: small data made on
the spot (no downloads), SN layers with non-trivial state, and a float64
implementation of SN written from the paper's formulas, independent of
:mod:`sn_mm.ops`."""
from .float64_reference import reference_sn
from .kernel_agreement import make_layer
from .toy_data import (MOTION_CLASSES, SHAPE_CLASSES, make_toy_cls,
                       make_toy_coco, make_toy_seg, make_toy_video)

__all__ = [
    'MOTION_CLASSES', 'SHAPE_CLASSES', 'make_layer', 'make_toy_cls',
    'make_toy_coco', 'make_toy_seg', 'make_toy_video', 'reference_sn'
]
