"""Small data made on the spot, for the demos and the tests (no downloads)."""
from .toy_data import SHAPE_CLASSES, make_toy_coco, make_toy_seg

__all__ = ['SHAPE_CLASSES', 'make_toy_coco', 'make_toy_seg']
