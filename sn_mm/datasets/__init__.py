from .toy_shapes import SHAPE_CLASSES, make_toy_coco

__all__ = ['SHAPE_CLASSES', 'make_toy_coco']
