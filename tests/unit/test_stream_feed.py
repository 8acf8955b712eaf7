"""The launcher's view of a stream (`tf_ecrec.launcher.stream_feed.StreamFeed`): the records it says can
be leased are exactly those the master's state hands out (real `MasterState`, real stream directory).

Why it matters: the launcher counts a trainer without records as waiting, not hung (`--hang-secs`),
only while nothing is left to lease.  An open stream leases whole shards only, so a partial shard at
its end is not leasable: counting it made a chief waiting for data look hung, and it was killed.
"""

from __future__ import annotations

from types import SimpleNamespace

from tf_ecrec.data.stream import append_file, close_stream
from tf_ecrec.launcher.stream_feed import StreamFeed
from tf_ecrec.master.sharding import DatasetSpec, ShardStatus
from tf_ecrec.master.state.master_state import MasterState

SHARD = 64
CAPACITY = 1 << 40


class _Watch:
    """What the feed calls on the launcher's master connection, on an in-process `MasterState`."""

    def __init__(self, state: MasterState) -> None:
        self.state = state

    def extend(self, available: int, closed: bool) -> None:
        self.state.extend_dataset("train", available, closed)


def _lease_all(state: MasterState, generation: int) -> tuple[int, ShardStatus]:
    """Leases and acknowledges shards until the master has none: the records handed out, its last answer."""
    leased, request = 0, 0
    while True:
        request += 1
        status, lease = state.get_shard("worker:0", generation, "train", request)
        if status is not ShardStatus.SHARD:
            return leased, status
        leased += lease.end - lease.start
        state.report_progress("worker:0", generation, "train", lease.shard_id, lease.attempt, lease.end - lease.start)


def test_leasable_records_are_the_ones_the_master_hands_out_open_and_closed(tmp_path):
    state = MasterState()
    record, _ = state.register("worker", 0, "127.0.0.1:1", "w0")
    state.register_dataset(DatasetSpec("train", CAPACITY, SHARD, 1, stream=True))
    feed = StreamFeed(str(tmp_path), _Watch(state), SHARD)

    trained = 0
    for index, records in enumerate((100, 28, 130)):  # 100 = 1 shard + 36; 128 = 2 shards; 258 = 4 + 2
        append_file(str(tmp_path), index, records)
        feed.drive(now=10.0 * (index + 1))
        data = state.data_stats("train")
        leased, status = _lease_all(state, record.generation)
        trained += leased
        assert status is ShardStatus.WAIT
        assert feed.leasable(data) == trained, (index, data.records_total)  # not more: the partial shard waits
        after = state.data_stats("train")
        assert feed.idle(after)  # waiting for data, not stalled, even with a partial shard left
        assert after.records_total - after.records_trained == after.records_total % SHARD
    assert trained == 4 * SHARD

    close_stream(str(tmp_path))
    feed.drive(now=100.0)
    data = state.data_stats("train")
    assert feed.leasable(data) == data.records_total == 258  # closed: the last partial shard too
    assert not feed.idle(data)
    leased, status = _lease_all(state, record.generation)
    assert trained + leased == 258 and status is ShardStatus.END


def test_the_feed_counts_a_close_only_once_the_master_was_told(tmp_path):
    class _Away:
        def extend(self, available: int, closed: bool) -> None:
            from tf_ecrec.errors import MasterUnavailable

            raise MasterUnavailable("the master is restarting")

    append_file(str(tmp_path), 0, 100)
    close_stream(str(tmp_path))
    feed = StreamFeed(str(tmp_path), _Away(), SHARD)
    feed.drive(now=1.0)
    # the master still leases whole shards only: the partial one is not leasable yet
    assert feed.leasable(SimpleNamespace(records_total=100, records_trained=64)) == 64


def test_the_master_says_who_holds_leases_and_the_wire_keeps_it(tmp_path):
    from tf_ecrec.master.replies import data_stats_from_pb
    from tf_ecrec.master.servicer import data_state_pb

    state = MasterState()
    worker, _ = state.register("worker", 0, "127.0.0.1:1", "w0")
    state.register("chief", 0, "127.0.0.1:2", "c0")
    state.register_dataset(DatasetSpec("train", CAPACITY, SHARD, 1, stream=True))
    state.extend_dataset("train", 3 * SHARD, False)
    status, lease = state.get_shard("worker:0", worker.generation, "train", 1)
    assert status is ShardStatus.SHARD
    stats = state.data_stats("train")
    assert stats.lease_holders == ("worker:0",)
    assert data_stats_from_pb(data_state_pb(stats)) == stats
    state.report_progress("worker:0", worker.generation, "train", lease.shard_id, lease.attempt, SHARD)
    assert state.data_stats("train").lease_holders == ()
