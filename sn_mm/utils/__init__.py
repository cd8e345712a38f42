"""Old home of the tools' command-line glue, now :mod:`sn_mm.cli`."""
from .._moved import moved_names

__getattr__ = moved_names(
    __name__, 'sn_mm.cli',
    ('build_runner', 'end_distributed', 'load_config', 'parse_tool_args'))
