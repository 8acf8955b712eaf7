"""A stream's shard queue (`ShardQueue` of a `DatasetSpec(stream=True)`): only records that exist are
handed out, full shards while the stream is open, the last partial one once it is closed."""

from __future__ import annotations

import pytest

from tf_ecrec.errors import InvalidRequestError
from tf_ecrec.master.shard_queue import ShardQueue
from tf_ecrec.master.sharding import DatasetSpec

CAPACITY = 1 << 40


def stream(shard=10):
    return ShardQueue(DatasetSpec("s", CAPACITY, shard, stream=True))


def drain(q, owner="w"):
    got = []
    while (lease := q.lease(owner, 0)) is not None:
        got.append((lease.start, lease.end))
        q.acknowledge(lease.shard_id, lease.attempt, owner, lease.end - lease.start)
    return got


def test_only_records_that_arrived_are_handed_out_and_the_tail_waits_for_the_close():
    q = stream()
    assert q.lease("w", 0) is None and not q.finished and q.stats().records_total == 0
    q.extend(25, closed=False)
    assert drain(q) == [(0, 10), (10, 20)]  # [20, 25) waits: a full shard or the end of the stream
    assert not q.finished
    q.extend(37, closed=False)
    assert drain(q) == [(20, 30)]
    q.extend(37, closed=True)
    assert drain(q) == [(30, 37)]
    assert q.finished and q.stats().records_total == 37 and q.stats().records_trained == 37


def test_a_restored_checkpoint_rolls_progress_back_but_not_the_records_that_arrived():
    q = stream()
    q.extend(40, closed=False)
    drain(q)
    saved = q.checkpoint()  # 40 records trained
    q.extend(60, closed=False)
    assert drain(q) == [(40, 50), (50, 60)]
    q.restore(saved)
    assert q.available == 60
    assert drain(q) == [(40, 50), (50, 60)]  # trained again after the rollback: nothing skipped
    assert q.stats().records_retrained == 20


def test_a_lost_lease_comes_back_first_and_the_state_survives_the_master():
    q = stream()
    q.extend(30, closed=False)
    lease = q.lease("a", 0)
    q.acknowledge(lease.shard_id, lease.attempt, "a", 4)
    assert q.release_owner("a", failed=False) == 6
    again = q.lease("b", 0)
    assert (again.start, again.end) == (4, 10)
    copy = ShardQueue.from_dict(q.to_dict())
    assert copy.available == 30 and drain(copy, "b") == [(10, 20), (20, 30)]


@pytest.mark.parametrize("calls", [[(10, False), (5, False)], [(10, True), (12, True)], [(10, True), (10, False)],
                                   [(CAPACITY + 1, False)]])
def test_records_only_arrive_and_a_closed_stream_stays_closed(calls):
    q = stream()
    with pytest.raises(InvalidRequestError):
        for available, closed in calls:
            q.extend(available, closed)


def test_a_dataset_that_is_not_a_stream_is_neither_extended_nor_read_twice_as_one():
    with pytest.raises(InvalidRequestError):
        ShardQueue(DatasetSpec("d", 100, 10)).extend(100, True)
    with pytest.raises(InvalidRequestError):
        DatasetSpec("s", CAPACITY, 10, num_epochs=2, stream=True)
