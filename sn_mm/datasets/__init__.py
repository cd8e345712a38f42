from .toy_shapes import SHAPE_CLASSES, make_toy_coco, make_toy_seg

__all__ = ['SHAPE_CLASSES', 'make_toy_coco', 'make_toy_seg']
