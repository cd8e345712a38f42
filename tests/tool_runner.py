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


def run_python_together(arg_lists,
                        cwd,
                        ok=True,
                        env=None,
                        timeout=900,
                        envs=None):
    """Independent ``python ARGS`` runs in ``cwd``, started together (the
    suite's time: most of each is importing), as :func:`run_python` runs
    one; ``envs``: one more update of the environment per run. Their
    results, in order."""
    processes = [
        subprocess.Popen([sys.executable, *map(str, args)],
                         stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE,
                         text=True,
                         cwd=cwd,
                         env=dict(os.environ, **(env or {}), **own))
        for args, own in zip(arg_lists, envs or [{}] * len(arg_lists))
    ]
    try:
        results = []
        for p in processes:
            out, err = p.communicate(timeout=timeout)
            if ok:
                assert p.returncode == 0, out[-3000:] + err[-3000:]
            results.append(
                subprocess.CompletedProcess(p.args, p.returncode, out, err))
        return results
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.communicate()


def tool(*parts):
    return osp.join(ROOT, 'tools', *parts)
