"""Dynamic sharding as pure logic: leases, acknowledgements, failures, rollback."""

from __future__ import annotations

import random

import pytest

from tf_ecrec.errors import InvalidRequestError, NotFoundError, StaleGenerationError
from tf_ecrec.master.shard_queue import ShardQueue
from tf_ecrec.master.sharding import DatasetSpec


def spec(**overrides) -> DatasetSpec:
    values = {"name": "train", "total_records": 1000, "shard_records": 300, "num_epochs": 1}
    values.update(overrides)
    return DatasetSpec(**values)


def drain(queue: ShardQueue, owner: str = "worker:0") -> list:
    leases = []
    while (lease := queue.lease(owner, 1)) is not None:
        leases.append(lease)
    return leases


@pytest.mark.parametrize("field,value", [("total_records", 0), ("shard_records", 0),
                                         ("num_epochs", 0), ("max_shard_failures", -1),
                                         ("name", "")])
def test_spec_rejects_values_that_break_their_rule(field, value) -> None:
    with pytest.raises(InvalidRequestError, match=field if field != "name" else "name"):
        spec(**{field: value})


def test_shards_cover_the_records_with_a_short_last_shard() -> None:
    s = spec(num_epochs=2)
    assert s.num_shards == 4
    assert s.records_total == 2000
    assert [s.shard_range(i) for i in range(4)] == [
        (0, 0, 300), (0, 300, 600), (0, 600, 900), (0, 900, 1000)]
    assert s.shard_range(5) == (1, 300, 600)
    with pytest.raises(NotFoundError, match="no shard 8"):
        s.shard_range(8)


def test_leases_follow_index_order_and_a_fast_worker_takes_more() -> None:
    queue = ShardQueue(spec())
    fast = [queue.lease("worker:0", 1) for _ in range(3)]
    slow = queue.lease("worker:1", 1)
    assert [(l.shard_id, l.start, l.end) for l in fast] == [(0, 0, 300), (1, 300, 600),
                                                            (2, 600, 900)]
    assert (slow.shard_id, slow.start, slow.end, slow.attempt) == (3, 900, 1000, 1)
    assert queue.lease("worker:1", 1) is None
    assert not queue.finished  # Nothing free, but shards in flight: WAIT, not END.


def test_shuffled_order_is_a_fixed_permutation_per_epoch() -> None:
    s = spec(total_records=2000, shard_records=100, num_epochs=2, shuffle_seed=7)
    first = [l.shard_id for l in drain(ShardQueue(s))]
    again = [l.shard_id for l in drain(ShardQueue(s))]
    assert first == again
    epoch0, epoch1 = first[:20], [i - 20 for i in first[20:]]
    assert sorted(epoch0) == sorted(epoch1) == list(range(20))
    assert epoch0 != list(range(20)) and epoch0 != epoch1


def test_partial_acknowledgement_then_failure_requeues_only_the_unacknowledged_suffix() -> None:
    queue = ShardQueue(spec())
    lease = queue.lease("worker:0", 1)
    assert queue.acknowledge(0, 1, "worker:0", 100) is False
    assert queue.release_owner("worker:0", failed=True) == 200
    again = queue.lease("worker:1", 1)
    assert (again.shard_id, again.attempt, again.start, again.end) == (0, 2, 100, 300)
    stats = queue.stats()
    assert (stats.records_trained, stats.records_requeued, stats.records_in_flight) == (
        100, 200, 200)
    assert lease.attempt == 1


def test_acknowledgements_are_cumulative_so_repeats_change_nothing() -> None:
    queue = ShardQueue(spec())
    queue.lease("worker:0", 1)
    for records in (50, 50, 30, 120):
        queue.acknowledge(0, 1, "worker:0", records)
    assert queue.stats().records_trained == 120
    assert queue.acknowledge(0, 1, "worker:0", 300) is True
    assert queue.acknowledge(0, 1, "worker:0", 300) is True  # A retried final report.
    assert queue.stats().records_trained == 300


def test_reports_on_a_lease_that_moved_on_are_refused_with_the_reason() -> None:
    queue = ShardQueue(spec())
    queue.lease("worker:0", 1)
    queue.release(0, failed=True)
    queue.lease("worker:1", 1)
    with pytest.raises(StaleGenerationError, match="now attempt 2 held by worker:1"):
        queue.acknowledge(0, 1, "worker:0", 10)
    with pytest.raises(InvalidRequestError, match=r"records=301; rule: 0 <= records <= 300"):
        queue.acknowledge(0, 2, "worker:1", 301)
    with pytest.raises(NotFoundError):
        queue.acknowledge(99, 1, "worker:1", 1)


def test_a_shard_failing_more_than_the_limit_is_given_up_and_counted() -> None:
    queue = ShardQueue(spec(total_records=300, max_shard_failures=2))
    for attempt in (1, 2, 3):
        lease = queue.lease("worker:0", 1)
        assert lease.attempt == attempt
        queue.acknowledge(0, attempt, "worker:0", 10 * attempt)
        queue.release(0, failed=True)
    assert queue.lease("worker:0", 1) is None
    stats = queue.stats()
    # Each lease acknowledged 10, 20, 30 of its own records: 60 trained, 240 given up.
    assert (stats.shards_failed, stats.failed_shard_ids, stats.records_failed) == (1, (0,), 240)
    assert stats.records_trained == 60
    assert stats.finished  # Given up counts as settled: END, not WAIT forever.


def test_a_graceful_release_does_not_count_as_a_failure() -> None:
    queue = ShardQueue(spec(total_records=300, max_shard_failures=0))
    queue.lease("worker:0", 1)
    queue.release_owner("worker:0", failed=False)
    assert queue.lease("worker:1", 1).attempt == 2
    assert queue.stats().shards_failed == 0


def test_restoring_a_checkpoint_rolls_back_and_counts_retrained_records() -> None:
    queue = ShardQueue(spec())
    queue.lease("worker:0", 1)
    queue.acknowledge(0, 1, "worker:0", 300)
    queue.lease("worker:0", 1)
    queue.acknowledge(1, 1, "worker:0", 50)
    blob = queue.checkpoint()                         # shard 0 done, shard 1 at 50.
    queue.acknowledge(1, 1, "worker:0", 300)          # +250 after the checkpoint.
    queue.lease("worker:1", 1)
    queue.acknowledge(2, 1, "worker:1", 100)          # +100 after the checkpoint.
    assert queue.restore(blob) == 350
    with pytest.raises(StaleGenerationError):
        queue.acknowledge(2, 1, "worker:1", 120)      # Leases were revoked.
    for lease in drain(queue):
        queue.acknowledge(lease.shard_id, lease.attempt, "worker:0", lease.end - lease.start)
    stats = queue.stats()
    assert stats.finished
    assert stats.records_retrained == 350
    assert stats.records_trained == 1000 + 350


def test_checkpoint_of_another_dataset_is_refused() -> None:
    blob = ShardQueue(spec(total_records=999)).checkpoint()
    with pytest.raises(InvalidRequestError, match="same dataset definition"):
        ShardQueue(spec()).restore(blob)


def test_state_round_trips_mid_flight() -> None:
    queue = ShardQueue(spec(num_epochs=2, shuffle_seed=3))
    a = queue.lease("worker:0", 1)
    queue.acknowledge(a.shard_id, 1, "worker:0", 40)
    queue.lease("worker:1", 2)
    queue.release_owner("worker:1", failed=True)
    restored = ShardQueue.from_dict(queue.to_dict())
    assert restored.to_dict() == queue.to_dict()
    assert restored.stats() == queue.stats()
    assert restored.acknowledge(a.shard_id, 1, "worker:0", 60) is False
    assert restored.stats().records_trained == 60


def test_random_failures_never_lose_a_record_and_never_count_one_twice() -> None:
    rng = random.Random(5)
    queue = ShardQueue(spec(total_records=5000, shard_records=128, num_epochs=2,
                            shuffle_seed=1, max_shard_failures=100))
    held: dict = {}
    owners = ["worker:0", "worker:1", "worker:2"]
    while not queue.finished:
        owner = rng.choice(owners)
        action = rng.random()
        if action < 0.5:
            lease = queue.lease(owner, 1)
            if lease is not None:
                held[(lease.shard_id, lease.attempt)] = (owner, lease, 0)
        elif action < 0.95 and held:
            key = rng.choice(sorted(held))
            who, lease, done = held[key]
            done = min(lease.end - lease.start, done + rng.randint(1, 200))
            if queue.acknowledge(lease.shard_id, lease.attempt, who, done):
                del held[key]
            else:
                held[key] = (who, lease, done)
        else:
            queue.release_owner(owner, failed=True)
            held = {k: v for k, v in held.items() if v[0] != owner}
    stats = queue.stats()
    assert stats.records_trained == stats.records_total == 10000
    assert stats.records_retrained == 0 and stats.records_failed == 0
    assert all(end - start == min(128, 5000 - start)
               for _, start, end in queue.acknowledged_prefixes())
