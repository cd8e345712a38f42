from .runner import add_common_args, build_runner, load_config

__all__ = ['add_common_args', 'build_runner', 'load_config']
