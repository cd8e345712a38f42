from .runner import build_runner, end_distributed, load_config, parse_tool_args

__all__ = ['build_runner', 'end_distributed', 'load_config', 'parse_tool_args']
