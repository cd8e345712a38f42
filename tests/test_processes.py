"""run_on_ranks (sn_mm.testing.processes), the suite's one way to start
ranks: every rank's value comes back; a rank that raised (with its
traceback), died of a signal or hung is named; a group that outlives its
teardown is refused. And SyncSN's autograd graphs, which user code can keep
past a step, do not keep the process group (and gloo's threads) alive."""
import os
import time

import pytest
import torch
import torch.distributed as dist

from sn_mm.models.sync_switchable_norm import (SyncSwitchableNorm,
                                               end_process_group)
from sn_mm.testing.processes import RanksFailed, run_on_ranks

# What a rank keeps alive until its process exits.
_KEPT = []


def summed(rank, scale):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item() * scale


def test_every_ranks_value_comes_back():
    assert run_on_ranks(summed, 3, args=(2., )) == [12., 12., 12.]


def raises_on_rank_one(rank):
    if rank == 1:
        raise ValueError('rank one refuses')
    return rank


def aborts_on_rank_one(rank):
    if rank == 1:
        os.abort()
    return rank


def hangs_on_rank_one(rank):
    if rank == 1:
        time.sleep(120)
    return rank


def test_a_rank_that_raises_is_named_with_its_traceback():
    with pytest.raises(RanksFailed) as failed:
        run_on_ranks(raises_on_rank_one, 2)
    message = str(failed.value)
    assert 'rank 1 raised' in message
    assert 'ValueError: rank one refuses' in message
    assert 'in raises_on_rank_one' in message


def test_a_rank_that_dies_of_a_signal_is_named():
    with pytest.raises(RanksFailed, match='rank 1: died of SIGABRT'):
        run_on_ranks(aborts_on_rank_one, 2)


def test_a_rank_that_hangs_is_killed_and_named_with_its_stack():
    start = time.monotonic()
    with pytest.raises(
            RanksFailed,
            match=r'rank 1: still running 8 s after every rank joined the '
            'group, in the function') as failed:
        run_on_ranks(hangs_on_rank_one, 2, timeout=8.)
    # The 8 s count from the join, however long the start took on a
    # loaded machine (this bound allows for a start of 30 s).
    assert time.monotonic() - start < 60
    # Where it hung, as faulthandler printed it before the kill.
    assert 'in hangs_on_rank_one' in str(failed.value)


def test_a_rank_that_has_not_joined_in_time_is_named():
    # No interpreter starts and imports torch within 10 ms, so neither rank
    # has joined, and neither has its fault handler in place to print.
    with pytest.raises(RanksFailed) as failed:
        run_on_ranks(summed, 2, args=(1., ), start_timeout=0.01)
    message = str(failed.value)
    for rank in (0, 1):
        assert (f'rank {rank}: still running 0.01 s after the start, before '
                'joining the group') in message
    assert "had not reached run_on_ranks' code yet" in message


def keeps_the_group(rank):
    _KEPT.append(dist.group.WORLD)


def test_a_group_that_outlives_its_teardown_is_refused():
    with pytest.raises(RanksFailed, match='outlived destroy_process_group'):
        run_on_ranks(keeps_the_group, 2)


def keeps_a_syncsn_graph(rank):
    """A SyncSN forward whose graph (a loss) is kept past teardown: the
    group must still be freed, and a backward then names the problem."""
    torch.manual_seed(rank)
    layer = SyncSwitchableNorm(4)
    x = torch.randn(2, 4, 3, 3, requires_grad=True)
    loss = layer(x).square().sum()
    freed = end_process_group()
    try:
        loss.backward()
    except RuntimeError as err:
        return freed, str(err)
    return freed, None


def test_syncsn_graphs_do_not_keep_the_group_alive():
    results = run_on_ranks(keeps_a_syncsn_graph, 2)
    for rank, (freed, error) in enumerate(results):
        assert freed, rank
        assert error is not None and 'destroyed before its backward' in error
