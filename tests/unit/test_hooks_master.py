"""The master hooks on real TensorFlow sessions, against a real master on port 0."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest
import tensorflow as tf

from tf_ecrec.errors import ConfigError
from tf_ecrec.hooks import ps_migration, shard_progress
from tf_ecrec.master.client import MasterClient
from tf_ecrec.master.progress_reporter import ProgressSender, ProgressUpdate, ShardTracker, track
from tf_ecrec.master.replies import ShardLease
from tf_ecrec.master.server import MasterHandle, start_master
from tf_ecrec.membership.base import Member
from tf_ecrec.membership.fake import FakeMembership, FakeMembershipServer


@pytest.fixture
def master() -> Iterator[MasterHandle]:
    handle = start_master(heartbeat_timeout=30.0, fsync=False)
    yield handle
    handle.stop(grace=0)


def worker(master: MasterHandle, index: int = 0) -> MasterClient:
    client = MasterClient(master.address, "worker", index)
    client.register(f"127.0.0.1:{2000 + index}")
    return client


def lease_records(client: MasterClient, tracker: ShardTracker) -> Iterator[int]:
    """The input pipeline: record indices of leased shards, in order."""
    for lease in track(client.iter_shards("train"), tracker):
        yield from range(lease.start, lease.end)


def test_shard_progress_hook_acknowledges_every_record_a_session_trained(master) -> None:
    client = worker(master)
    client.register_dataset("train", 1000, 100)
    tracker = ShardTracker()
    seen: list[int] = []
    with tf.Graph().as_default():
        dataset = tf.data.Dataset.from_generator(
            lambda: lease_records(client, tracker),
            output_signature=tf.TensorSpec([], tf.int64)).batch(32)
        batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        records = tf.shape(batch)[0]
        hook = shard_progress.ShardProgressHook(client, tracker, records=lambda: records)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            while not session.should_stop():
                seen.extend(session.run(batch).tolist())
    state = client.data_state("train")
    assert sorted(seen) == list(range(1000))  # 31 batches of 32, then one of 8.
    assert (state.records_trained, state.records_in_flight, state.finished) == (1000, 0, True)
    assert hook.sender.dropped == 0


def test_shard_progress_hook_never_blocks_a_step_on_a_stuck_report(master) -> None:
    gate = threading.Event()

    def stuck(lease: ShardLease, records: int) -> bool:
        gate.wait(10)  # A master that accepted the call and never answers.
        return False

    client = worker(master)
    client.register_dataset("train", 1000, 100)
    tracker = ShardTracker()
    tracker.add(client.get_shard("train").lease)
    step_times = []
    hook = shard_progress.ShardProgressHook(client, tracker, records=10, flush_timeout=0.2,
                                            sender=ProgressSender(stuck, max_queue=4))
    try:
        with tf.Graph().as_default():
            step = tf.compat.v1.train.get_or_create_global_step()
            train = tf.compat.v1.assign_add(step, 1)
            with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
                for _ in range(10):
                    started = time.monotonic()
                    session.run(train)
                    step_times.append(time.monotonic() - started)
                closing = time.monotonic()
            closed_in = time.monotonic() - closing
    finally:
        gate.set()
    assert max(step_times) < 2.0  # A blocking report would hold a step for 10 s.
    assert closed_in < 0.2 + 1.0 + 2.0  # Flush deadline, sender join deadline, slack.
    assert [u.records for u in hook.sender.unsent] == [100]


def test_shard_progress_hook_warns_rate_limited_while_the_master_is_gone(master,
                                                                        caplog) -> None:
    client = worker(master)
    client.register_dataset("train", 1000, 100)
    tracker = ShardTracker()
    tracker.add(client.get_shard("train").lease)
    master.stop(grace=0)
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.assign_add(step, 1)
        hook = shard_progress.ShardProgressHook(client, tracker, records=10, flush_timeout=0.5,
                                                warn_every_secs=60)
        with caplog.at_level(logging.WARNING), tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            for _ in range(10):
                session.run(train)
                time.sleep(0.05)
    unreachable = [r for r in caplog.records if "master unreachable" in r.getMessage()]
    assert len(unreachable) == 1  # Rate limited.
    assert any("not delivered" in r.getMessage() for r in caplog.records)
    assert [u.records for u in hook.sender.unsent] == [100]  # Coalesced: the latest count.


def test_progress_sender_coalesces_when_its_queue_is_full() -> None:
    gate = threading.Event()
    delivered: list[int] = []

    def report(lease: ShardLease, records: int) -> bool:
        gate.wait(5)
        delivered.append(records)
        return False

    lease = ShardLease("train", 0, 1, 0, 0, 1000)
    sender = ProgressSender(report, max_queue=2)
    sender.start()
    started = time.monotonic()
    for records in range(1, 101):
        sender.submit(ProgressUpdate(lease, records))
    assert time.monotonic() - started < 0.1  # submit never waited on the stuck report.
    gate.set()
    assert sender.flush(5)
    sender.stop()
    assert delivered[-1] == 100 and len(delivered) <= 3


def test_progress_for_a_revoked_lease_is_dropped_not_retried_forever(master) -> None:
    client = worker(master)
    client.register_dataset("train", 100, 100)
    lease = client.get_shard("train").lease
    MasterClient(master.address, None).report_failure("worker:0", reason="test", generation=client.generation)
    sender = ProgressSender(lambda l, n: client.report_progress(l, n))
    sender.start()
    sender.submit(ProgressUpdate(lease, 10))
    assert sender.flush(5)
    sender.stop()
    assert (sender.dropped, sender.sent) == (1, 0)


def test_shard_checkpoint_listener_saves_progress_beside_each_checkpoint(master, tmp_path) -> None:
    client = worker(master)
    client.register_dataset("train", 1000, 100)
    lease = client.get_shard("train").lease
    client.report_progress(lease, 100)
    model_dir = str(tmp_path / "model")
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.assign_add(step, 1)
        listener = shard_progress.ShardCheckpointListener(client, "train", model_dir)
        saver = tf.compat.v1.train.CheckpointSaverHook(model_dir, save_steps=3,
                                                       listeners=[listener])
        with tf.compat.v1.train.MonitoredSession(hooks=[saver]) as session:
            for _ in range(3):
                session.run(train)
    latest = tf.train.latest_checkpoint(model_dir)
    blob = shard_progress.load_shard_checkpoint(latest, "train")
    assert blob is not None
    moved_on = client.get_shard("train").lease
    client.report_progress(moved_on, 100)
    state = client.restore_shard_checkpoint("train", blob)
    assert state.records_trained == 200
    again = client.get_shard("train").lease
    assert (again.start, again.end) == (moved_on.start, moved_on.end)
    assert shard_progress.load_shard_checkpoint(latest[:-1] + "9", "train") is None


def run_until_stopped(hook, change, steps_before_change: int = 3,
                      timeout: float = 10.0) -> int:
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.assign_add(step, 1)
        started = time.monotonic()
        steps = 0
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            while not session.should_stop():
                session.run(train)
                steps += 1
                if steps == steps_before_change:
                    change()
                assert time.monotonic() - started < timeout, "the session never stopped"
                time.sleep(0.01)
    return steps


def test_ps_migration_hook_stops_the_session_when_the_ps_version_changes(master) -> None:
    ps = MasterClient(master.address, "ps", 0)
    cluster = ps.register("127.0.0.1:3000")
    hook = ps_migration.PsMigrationHook(MasterClient(master.address, None),
                                        expected_version=cluster.ps_version, poll_secs=0.05)
    steps = run_until_stopped(hook, lambda: ps.update_address("127.0.0.1:3001"))
    assert steps > 3
    assert hook.migration == (1, 2)  # what the failover loop reads after train() returns


def test_ps_migration_hook_ignores_worker_changes(master) -> None:
    MasterClient(master.address, "ps", 0).register("127.0.0.1:3000")
    hook = ps_migration.PsMigrationHook(MasterClient(master.address, None), poll_secs=0.02)
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.assign_add(step, 1)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            for i in range(30):
                session.run(train)
                if i == 5:
                    worker(master, 3)  # version bumps, ps_version does not.
                time.sleep(0.01)
            assert not session.should_stop()
    assert hook.migration is None


def test_ps_migration_hook_follows_a_membership_watch() -> None:
    server = FakeMembershipServer()
    ps = FakeMembership(server)
    ps.join(Member("ps", 0, "127.0.0.1:3000"))
    hook = ps_migration.MembershipMigrationHook(FakeMembership(server))
    steps = run_until_stopped(hook, lambda: server.expire("ps:0"))  # Restarted PS: new incarnation.
    assert steps > 3 and hook.migration == (-1, -1)  # no versions in a membership view


@pytest.mark.parametrize("build", [
    lambda c: shard_progress.ShardProgressHook(c, ShardTracker(), records=0),
    lambda c: shard_progress.ShardProgressHook(c, ShardTracker(), records=True),
    lambda c: shard_progress.ShardProgressHook(c, ShardTracker(), records=8, flush_timeout=-1),
    lambda c: ps_migration.PsMigrationHook(None),
    lambda c: ps_migration.MembershipMigrationHook(None),
    lambda c: ps_migration.PsMigrationHook(c, poll_secs=0),
])
def test_hooks_validate_their_arguments_at_construction(build) -> None:
    with pytest.raises(ConfigError):
        build(MasterClient("127.0.0.1:1", None))


class _Commit:
    """A deferred commit as the hook sees one: runs numbered from 1 per graph, durable up to `through`."""

    def __init__(self) -> None:
        self.through = 0
        self.listeners: list = []

    def on_resolved(self, listener) -> None:
        self.listeners.append(listener)

    def resolved(self, run: int) -> str:
        return "durable" if run <= self.through else "pending"

    def make_durable(self, through: int) -> None:
        self.through = through
        for listener in self.listeners:
            listener()

    def flush(self, session) -> None:
        pass


def test_shard_progress_hook_numbers_the_runs_of_a_new_graph_as_its_commits_do(master) -> None:
    """The failover loop builds a new Estimator after a failed session, with the same hooks and no `end` in
    between: the new graph's commits number runs from 1, and the hook must ask them about those runs."""
    from tf_ecrec.step.carried_commit import register

    acknowledged: list[int] = []
    hook = shard_progress.ShardProgressHook(worker(master), ShardTracker(), records=10)
    hook._attribute = acknowledged.append  # what the hook would report to the master
    commits = []
    for runs, durable in ((5, 3), (2, 2)):  # the first graph's session fails with 2 runs not durable
        with tf.Graph().as_default() as graph:
            commit = _Commit()
            register(commit, graph)
            commits.append(commit)
            hook.begin()
            for _ in range(runs):
                hook.after_run(None, None)
            commit.make_durable(durable)
    assert acknowledged == [10] * 5  # 3 runs of the first graph, then both of the second
    assert hook.records_dropped == 20  # the first graph's 2 runs that never became durable are not claimed
    hook.sender.stop(timeout=1.0)
