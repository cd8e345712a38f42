"""Old home of the toy-data generator, now :mod:`sn_mm.testing`."""
from .._moved import moved_names

__getattr__ = moved_names(__name__, 'sn_mm.testing',
                          ('SHAPE_CLASSES', 'make_toy_coco', 'make_toy_seg'))
