"""Old home of the toy-data generator, now :mod:`sn_mm.testing`."""
import warnings

_MOVED = ('SHAPE_CLASSES', 'make_toy_coco', 'make_toy_seg')


def __getattr__(name):
    if name in _MOVED:
        warnings.warn(f'sn_mm.datasets.{name} moved to sn_mm.testing.{name}',
                      DeprecationWarning, stacklevel=2)
        from .. import testing
        return getattr(testing, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r} '
                         '(the toy-data generator is in sn_mm.testing)')
