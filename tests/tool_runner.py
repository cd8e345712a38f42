"""Run the project's tools as users do: real processes."""
import os
import os.path as osp
import subprocess
import sys

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def run_python(args, cwd, ok=True, env=None, timeout=900, base_env=None):
    """``python ARGS`` in ``cwd``, its environment ``base_env`` (default:
    this process's) updated with ``env``; with ``ok``, fail the test
    (showing the output's tail) unless it exits 0."""
    base = os.environ if base_env is None else base_env
    result = subprocess.run([sys.executable, *map(str, args)],
                            capture_output=True,
                            text=True,
                            cwd=cwd,
                            env=dict(base, **(env or {})),
                            timeout=timeout)
    if ok:
        assert result.returncode == 0, (
            result.stdout[-3000:] + result.stderr[-3000:])
    return result


def tool(*parts):
    return osp.join(ROOT, 'tools', *parts)
