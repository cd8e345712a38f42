"""Timing for the benchmark tools and the GPU check: wall time of a call
including the GPU work it queued, medians, and several candidates timed in
turn (so that drift on the machine reaches each alike)."""
import os
import statistics
import sys
import time
from typing import Callable, Dict

import torch

# glibc's malloc returns large freed blocks to the OS and page-faults them
# back in on the next allocation; which layer pays for that depends on the
# order of its allocations, and it moved single timings by up to 2x here.
# A long training process keeps its memory; these settings do the same.
STEADY_MALLOC = {
    'MALLOC_MMAP_THRESHOLD_': str(2**32),
    'MALLOC_TRIM_THRESHOLD_': str(2**36)
}


def add_allocator_option(parser) -> None:
    """A benchmark tool's ``--allocator`` option, which
    :func:`run_with_steady_malloc` reads."""
    parser.add_argument(
        '--allocator',
        choices=['steady', 'system'],
        default='steady',
        help='steady (default): restart under glibc malloc settings that '
        'keep freed memory in the process, as a long training run does; '
        'system: the malloc settings as found')


def run_with_steady_malloc(allocator: str = 'steady') -> None:
    """Restart this process under :data:`STEADY_MALLOC` unless it already
    runs under it (glibc reads these once, at process start) or
    ``allocator`` (``--allocator``) is ``'system'``."""
    if allocator == 'steady' and any(
            os.environ.get(k) != v for k, v in STEADY_MALLOC.items()):
        os.execve(sys.executable, [sys.executable] + sys.argv, {
            **os.environ,
            **STEADY_MALLOC
        })


def sync() -> None:
    """Wait for the GPU's queued work, where there is a GPU."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def gradient_clearer(*tensors: torch.Tensor) -> Callable[[], None]:
    """A function that sets each tensor's ``.grad`` to None, as
    ``optimizer.zero_grad()`` does before a training step: a timed backward
    then stores its gradients instead of adding into earlier ones (how many
    it would add differs between layers: SN has four parameters, GN
    two)."""

    def clear() -> None:
        for t in tensors:
            t.grad = None

    return clear


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn()`` takes, including the GPU work it queued."""
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def calls_filling(seconds_per_call: float,
                  seconds: float = 1e-3,
                  most: int = 200) -> int:
    """How many calls of ``seconds_per_call`` fill ``seconds`` (at least 1,
    at most ``most``): a single 10-microsecond call's time is mostly the
    timer's and the caches' noise."""
    return max(1, min(most, int(seconds / max(seconds_per_call, 1e-7))))


def per_call(fn: Callable[[], object], calls: int) -> float:
    """Seconds per call of ``fn``, over ``calls`` calls in a row."""

    def run():
        for _ in range(calls):
            fn()

    return timed(run) / calls


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``fn``."""
    return statistics.median(timed(fn) for _ in range(repeats))


def median_times(fns: Dict[str, Callable[[], object]],
                 repeats: int,
                 warm: bool = False) -> Dict[str, float]:
    """Median seconds of each of ``fns``, every repeat timing all of them in
    turn, each repeat starting one further along (so that no candidate
    always runs right after the same other one, whose caches, allocator
    state or clocks it would inherit). ``warm``: an untimed call right
    before each timed one, so that a candidate is timed in the state its
    own previous call left, as in a training loop."""
    names = list(fns)
    times = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if warm:
                fns[name]()
            times[name].append(timed(fns[name]))
    return {name: statistics.median(times[name]) for name in names}
