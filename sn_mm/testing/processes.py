"""Running a function on several processes of one process group: the one
way the tests (and the GPU check) start ranks.

:func:`run_on_ranks` spawns the processes, starts the group in each (a
file store in a fresh folder: no port to race for), runs the function,
tears the group down on every rank together
(:func:`~sn_mm.models.sync_switchable_norm.end_process_group`: a barrier,
``destroy_process_group``, and a check that the group was freed, so that no
gloo thread runs into interpreter exit), and reports every rank that
failed: its exception with its traceback, its exit signal, or that it hung.
"""
import faulthandler
import os
import signal
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Any, Callable, List, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..models.sync_switchable_norm import end_process_group

# After one rank has failed, how long the others get to fail too (their
# collectives time out) before they are killed.
_GRACE_S = 10.


class RanksFailed(RuntimeError):
    """One or more ranks of :func:`run_on_ranks` failed; the message has
    each one's exception and traceback, exit signal or timeout."""


def run_on_ranks(fn: Callable,
                 world_size: int = 2,
                 args: Sequence = (),
                 backend: str = 'gloo',
                 timeout: float = 300.) -> List[Any]:
    """``fn(rank, *args)`` on ``world_size`` spawned processes that form
    one ``backend`` process group; returns each rank's return value (which
    must pickle with ``torch.save``), by rank. ``fn`` must be importable
    (a module-level function). Raises :class:`RanksFailed` naming every
    rank that raised, died or ran past ``timeout`` seconds."""
    context = mp.get_context('spawn')
    with tempfile.TemporaryDirectory(prefix='sn_mm_ranks_') as folder:
        procs = [
            context.Process(
                target=_rank_main,
                args=(fn, rank, world_size, backend, folder, tuple(args),
                      timeout),
                name=f'rank{rank}') for rank in range(world_size)
        ]
        for p in procs:
            p.start()
        hung = _wait(procs, folder, timeout)  # rank -> stacks
        outcomes = [_outcome(folder, rank) for rank in range(world_size)]
    problems = []
    for rank, (p, outcome) in enumerate(zip(procs, outcomes)):
        if rank in hung:
            where = ('after returning its result, so in teardown or exit'
                     if outcome is not None and outcome[0] == 'ok' else
                     'in the function or teardown')
            problems.append(f'rank {rank}: still running after {timeout:g} s, '
                            f'{where}; killed. Its threads\' stacks:\n'
                            f'{hung[rank]}')
        elif outcome is None:
            problems.append(f'rank {rank}: {_exit(p.exitcode)} without a '
                            'result')
        elif outcome[0] == 'error':
            problems.append(f'rank {rank} raised:\n{outcome[1]}')
        elif p.exitcode != 0:
            problems.append(f'rank {rank}: returned, then {_exit(p.exitcode)}')
    if problems:
        raise RanksFailed('\n'.join(problems))
    return [outcome[1] for outcome in outcomes]


def _wait(procs, folder, timeout):
    """Join the processes; after the first failure the others get
    ``_GRACE_S``, and all get ``timeout``. Returns the ranks killed, each
    with its threads' stacks as it printed them on SIGUSR1."""
    deadline = time.monotonic() + timeout
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        failed = any((not p.is_alive() and p.exitcode != 0)
                     or _reported_error(folder, rank)
                     for rank, p in enumerate(procs))
        if failed:
            deadline = min(deadline, time.monotonic() + _GRACE_S)
        time.sleep(0.05)
    hung = {}
    for rank, p in enumerate(procs):
        if p.is_alive():
            os.kill(p.pid, signal.SIGUSR1)
            hung[rank] = _read_stacks(_path(folder, rank, 'stacks'))
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()
    return hung


def _read_stacks(path, wait_s=10.) -> str:
    """What faulthandler wrote to ``path`` once it stops growing: a
    loaded machine may take seconds to schedule the rank."""
    deadline = time.monotonic() + wait_s
    size = -1
    while time.monotonic() < deadline:
        now = os.path.getsize(path) if os.path.exists(path) else 0
        if now and now == size:
            break
        size = now
        time.sleep(0.1)
    if not os.path.exists(path) or not os.path.getsize(path):
        return f'(none printed within {wait_s:g} s)'
    with open(path, errors='replace') as f:
        return f.read()


def _exit(code) -> str:
    if code is not None and code < 0:
        return f'died of {signal.Signals(-code).name}'
    return f'exited with status {code}'


def _path(folder, rank, what):
    return os.path.join(folder, f'rank{rank}.{what}')


def _reported_error(folder, rank) -> bool:
    return os.path.exists(_path(folder, rank, 'error'))


def _outcome(folder, rank):
    """('ok', value), ('error', traceback) or None (nothing written)."""
    if _reported_error(folder, rank):
        with open(_path(folder, rank, 'error')) as f:
            return 'error', f.read()
    if os.path.exists(_path(folder, rank, 'result')):
        return 'ok', torch.load(
            _path(folder, rank, 'result'), weights_only=False)
    return None


def _rank_main(fn, rank, world_size, backend, folder, args, timeout):
    # A fatal signal (an abort in C++) prints every thread's Python stack
    # to stderr; SIGUSR1, which run_on_ranks sends a rank that hangs,
    # prints them to a file that run_on_ranks puts in its message.
    faulthandler.enable(all_threads=True)
    stacks = open(_path(folder, rank, 'stacks'), 'w')
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    try:
        dist.init_process_group(
            backend,
            init_method='file://' + os.path.join(folder, 'store'),
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout))
        value = fn(rank, *args)
        if not end_process_group():
            raise RuntimeError(
                'the process group outlived destroy_process_group: '
                'something still holds it, and its gloo threads would run '
                'into interpreter exit')
    except BaseException:
        # Written first: the process may not exit cleanly after this.
        with open(_path(folder, rank, 'error'), 'w') as f:
            f.write(traceback.format_exc())
        raise SystemExit(1)
    partial = _path(folder, rank, 'partial')
    torch.save(value, partial)
    os.replace(partial, _path(folder, rank, 'result'))
