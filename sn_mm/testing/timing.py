"""Timing for the benchmark tools and the GPU check: wall time of a call
including the GPU work it queued, medians, and several candidates timed in
turn (so that drift on the machine reaches each alike)."""
import statistics
import time
from typing import Callable, Dict

import torch


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn()`` takes, including the GPU work it queued."""
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def median_time(fn: Callable[[], object], repeats: int) -> float:
    return statistics.median(timed(fn) for _ in range(repeats))


def median_times(fns: Dict[str, Callable[[], object]],
                 repeats: int) -> Dict[str, float]:
    """Median seconds of each of ``fns``, every repeat timing all of them in
    turn."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn))
    return {name: statistics.median(t) for name, t in times.items()}
