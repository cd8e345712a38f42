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
                 timeout: float = 300.,
                 start_timeout: float = 300.) -> List[Any]:
    """``fn(rank, *args)`` on ``world_size`` spawned processes that form
    one ``backend`` process group; returns each rank's return value (which
    must pickle with ``torch.save``), by rank. ``fn`` must be importable
    (a module-level function). Raises :class:`RanksFailed` naming every
    rank that raised, died, had not joined the group ``start_timeout``
    seconds after the start, or ran past ``timeout`` seconds after every
    rank had joined. The two limits are apart because starting an
    interpreter and importing torch take seconds more on a loaded machine,
    which a function's own limit should not have to allow for."""
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
        hung, why = _wait(procs, folder, timeout, start_timeout)
        joined = [
            os.path.exists(_path(folder, rank, 'joined'))
            for rank in range(world_size)
        ]
        outcomes = [_outcome(folder, rank) for rank in range(world_size)]
    problems = []
    for rank, (p, outcome) in enumerate(zip(procs, outcomes)):
        if rank in hung:
            if outcome is not None and outcome[0] == 'ok':
                where = 'after returning its result, so in teardown or exit'
            elif joined[rank]:
                where = 'in the function or teardown'
            else:
                where = ('before joining the group: starting, importing or '
                         'in init_process_group')
            problems.append(f'rank {rank}: still running {why}, {where}; '
                            'killed. Its threads\' stacks:\n'
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


def _wait(procs, folder, timeout, start_timeout):
    """Join the processes: every rank must join the group within
    ``start_timeout`` of the start and finish within ``timeout`` of the
    last one joining; after the first failure the others get ``_GRACE_S``.
    Returns the ranks killed, each with its threads' stacks as it printed
    them on SIGUSR1, and why they were killed."""
    start = time.monotonic()
    all_joined_at = None
    failed_at = None
    why = None
    while any(p.is_alive() for p in procs):
        now = time.monotonic()
        if all_joined_at is None and all(
                os.path.exists(_path(folder, rank, 'joined'))
                for rank in range(len(procs))):
            all_joined_at = now
        if failed_at is None and any((not p.is_alive() and p.exitcode != 0)
                                     or _reported_error(folder, rank)
                                     for rank, p in enumerate(procs)):
            failed_at = now
        if failed_at is not None and now >= failed_at + _GRACE_S:
            why = f'{_GRACE_S:g} s after another rank failed'
            break
        if all_joined_at is None and now >= start + start_timeout:
            why = f'{start_timeout:g} s after the start'
            break
        if all_joined_at is not None and now >= all_joined_at + timeout:
            why = f'{timeout:g} s after every rank joined the group'
            break
        time.sleep(0.05)
    hung = {}
    for rank, p in enumerate(procs):
        if p.is_alive():
            hung[rank] = _stacks(p, _path(folder, rank, 'stacks'))
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()
    return hung, why


def _stacks(p, path, wait_s=10.) -> str:
    """A live rank's threads' stacks: SIGUSR1 makes faulthandler write them
    to ``path``, read once it stops growing (a loaded machine may take
    seconds to schedule the rank). ``path`` exists only once the handler
    is in place: before that SIGUSR1 would just end the rank."""
    if not os.path.exists(path):
        return ('(none: it had not reached run_on_ranks\' code yet, so it '
                'was starting the interpreter or importing)')
    os.kill(p.pid, signal.SIGUSR1)
    deadline = time.monotonic() + wait_s
    size = -1
    while time.monotonic() < deadline:
        now = os.path.getsize(path)
        if now and now == size:
            break
        size = now
        time.sleep(0.1)
    if not os.path.getsize(path):
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
    stacks = _path(folder, rank, 'stacks')
    stacks_file = open(stacks + '.opening', 'w')
    faulthandler.register(signal.SIGUSR1, file=stacks_file, all_threads=True)
    # Named only now, so that run_on_ranks signals only a rank that prints.
    os.replace(stacks + '.opening', stacks)
    try:
        dist.init_process_group(
            backend,
            init_method='file://' + os.path.join(folder, 'store'),
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout))
        open(_path(folder, rank, 'joined'), 'w').close()
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
