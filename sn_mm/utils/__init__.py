"""Old home of the tools' command-line glue, now :mod:`sn_mm.cli`."""
import warnings

_MOVED = ('build_runner', 'end_distributed', 'load_config', 'parse_tool_args')


def __getattr__(name):
    if name in _MOVED:
        warnings.warn(f'sn_mm.utils.{name} moved to sn_mm.cli.{name}',
                      DeprecationWarning, stacklevel=2)
        from .. import cli
        return getattr(cli, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r} '
                         '(the tools\' glue is in sn_mm.cli)')
