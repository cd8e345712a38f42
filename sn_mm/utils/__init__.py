from .runner import build_runner, load_config, parse_tool_args

__all__ = ['build_runner', 'load_config', 'parse_tool_args']
