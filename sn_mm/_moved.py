"""Old module paths that still work, with a warning naming the new one."""
import importlib
import warnings


def moved_names(old: str, new: str, names):
    """A module ``__getattr__`` for ``old``: each of ``names`` is looked up
    in ``new``, with a DeprecationWarning; anything else is an
    AttributeError that says where the names went."""

    def __getattr__(name):
        if name in names:
            warnings.warn(f'{old}.{name} moved to {new}.{name}',
                          DeprecationWarning, stacklevel=2)
            return getattr(importlib.import_module(new), name)
        raise AttributeError(f'module {old!r} has no attribute {name!r} '
                             f'(its names moved to {new})')

    return __getattr__
