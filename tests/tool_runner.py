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
    return run_python_together([args],
                               cwd,
                               ok,
                               env,
                               timeout,
                               base_env=base_env)[0]


def run_python_together(arg_lists,
                        cwd,
                        ok=True,
                        env=None,
                        timeout=900,
                        envs=None,
                        base_env=None):
    """Independent ``python ARGS`` runs in ``cwd``, started together (the
    suite's time: most of each is importing), as :func:`run_python` runs
    one; ``envs``: one more update of the environment per run. Their
    results, in order."""
    base = os.environ if base_env is None else base_env
    processes = [
        subprocess.Popen([sys.executable, *map(str, args)],
                         stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE,
                         text=True,
                         cwd=cwd,
                         env=dict(base, **(env or {}), **own))
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


def train_toy(cwd, model, steps, *options):
    """configs/toy/``model``.py trained ``steps`` steps by tools/train.py in
    ``cwd`` (seeded, so that a failure reproduces on the same CPU), once:
    its checkpoint ``cwd/model/iter_<steps>.pth``."""
    checkpoint = osp.join(cwd, model, f'iter_{steps}.pth')
    if not osp.exists(checkpoint):
        run_python([
            tool('train.py'),
            osp.join(ROOT, 'configs', 'toy',
                     f'{model}.py'), '--work-dir', model, '--cfg-options',
            f'train_cfg.max_iters={steps}', f'train_cfg.val_interval={steps}',
            f'default_hooks.checkpoint.interval={steps}', 'randomness.seed=0',
            *options
        ], cwd)
    return checkpoint
