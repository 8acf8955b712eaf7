"""The commit carried by the next run (`tf_ecrec.step.carried_commit`), on an in-process PS cluster and a real master.

A protected step whose commit its trainer's next run carries leaves exactly one step in the logs
between runs; the last one commits when the trainer ends; parity is exact whenever nothing is in
flight; and the records of a step are acknowledged to the master only once it is durable, never
for a step whose session ended before its commit (those are handed out again).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tensorflow as tf
from integration.tf_cluster import tf_cluster

import tf_ecrec
from tf_ecrec import ops as ec_ops
from tf_ecrec.check.verify import check_parity
from tf_ecrec.hooks.shard_progress import ShardProgressHook
from tf_ecrec.master.client import MasterClient
from tf_ecrec.master.progress_reporter import ShardTracker, track
from tf_ecrec.master.server import MasterHandle, start_master
from tf_ecrec.step.carried_commit import CarriedCommitHook, carried_commits
from tf_ecrec.step.embedding import ECContext, set_context

cluster = tf_cluster(num_ps=3)
BATCH = 16


def _model(ids: tf.Tensor) -> tuple[tf.Operation, tf_ecrec.ECOptimizer]:
    step = tf.compat.v1.train.get_or_create_global_step()
    set_context(ECContext(tf_ecrec.ECConfig(2, 1), 3))
    coll = tf_ecrec.EmbeddingCollection("emb", [("a", 300), ("b", 40)], 8)
    emb = tf.reshape(coll.lookup_all(ids), [-1, 16])
    out = tf.keras.layers.Dense(1, kernel_initializer=tf.compat.v1.glorot_uniform_initializer())(emb)
    loss = tf.reduce_mean(tf.square(out - 1.0))
    opt = tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1), commit="carried")
    return opt.minimize(loss, global_step=step), opt


def _pending(sess: tf.compat.v1.Session, opt: tf_ecrec.ECOptimizer) -> set[int]:
    values = sess.run({p: ec_ops.delta_log_pending(log)[0] for p, log in opt.logs.items()})
    return {int(s) for v in values.values() for s in v}


def test_one_step_stays_uncommitted_between_runs_and_the_last_commits_at_the_end(cluster) -> None:
    cluster.reset()
    rng = np.random.default_rng(3)
    with tf.Graph().as_default() as graph, tf.compat.v1.device(tf_ecrec.ECDeviceFn(num_ps=3, worker_device="/job:chief")):
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
        train, opt = _model(ids)
        (commit,) = carried_commits(graph)
        pending_ops = {p: ec_ops.delta_log_pending(log)[0] for p, log in opt.logs.items()}
        init = tf.compat.v1.global_variables_initializer()
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
    with tf.compat.v1.Session(cluster.target("chief"), graph=graph) as sess:
        sess.run(init)
        sids = []
        for _ in range(12):
            commit.run(sess, train, {ids: np.minimum(rng.zipf(1.3, (BATCH, 2)) - 1, [299, 39])})
            sids.append(next(iter(commit.pending_sids())))
            pending = {int(s) for v in sess.run(pending_ops).values() for s in v}
            assert pending == {sids[-1]}  # the run's own step; the one it carried committed
        assert commit.durable == 11 and commit.returned_runs == 12 and commit.resolved(11) == "durable"
        assert commit.resolved(12) == "pending"
        # Returned, not committed, yet complete: its folds and count ran, so parity is exact already.
        assert check_parity(opt.describe(), sess.run(variables))["mismatches"] == 0
        assert commit.flush(sess) and commit.resolved(12) == "durable"
        assert not {int(s) for v in sess.run(pending_ops).values() for s in v}
        result = check_parity(opt.describe(), sess.run(variables))
        assert result["mismatches"] == 0 and result["replica_mismatches"] == 0 and result["stripes_checked"] > 0


class _RawSession(tf.compat.v1.train.SessionRunHook):
    def after_create_session(self, session, coord) -> None:
        self.session = session


@pytest.fixture
def master() -> Iterator[MasterHandle]:
    handle = start_master(heartbeat_timeout=30.0, fsync=False)
    yield handle
    handle.stop(grace=0)


def test_records_are_acknowledged_once_durable_and_never_for_a_step_whose_session_ended_first(cluster, master) -> None:
    cluster.reset()
    client = MasterClient(master.address, "chief", 0)
    client.register("127.0.0.1:2000")
    client.register_dataset("train", 40 * BATCH, 10 * BATCH)
    tracker = ShardTracker()

    def records() -> Iterator[list[int]]:
        for lease in track(client.iter_shards("train"), tracker):
            for start in range(lease.start, lease.end, BATCH):
                yield [start % 300, start % 40]

    with tf.Graph().as_default() as graph, tf.compat.v1.device(tf_ecrec.ECDeviceFn(num_ps=3, worker_device="/job:chief")):
        batch = tf.compat.v1.data.make_one_shot_iterator(
            tf.data.Dataset.from_generator(records, output_signature=tf.TensorSpec([2], tf.int64)).map(
                lambda x: tf.tile(x[None], [BATCH, 1]))).get_next()
        train, _ = _model(batch)
        (commit,) = carried_commits(graph)
        progress = ShardProgressHook(client, tracker, records=BATCH, flush_timeout=10.0)
        creator = tf.compat.v1.train.ChiefSessionCreator(master=cluster.target("chief"))
        raw = _RawSession()
        with tf.compat.v1.train.MonitoredSession(session_creator=creator,
                                                 hooks=[CarriedCommitHook(), progress, raw]) as sess:
            for _ in range(5):
                sess.run(train)
            progress.sender.flush(10.0)
            # Five runs returned; the first four are durable (the fifth's commit is not run yet).
            assert client.data_state("train").records_trained == 4 * BATCH
            sess.run(train)
            (given_up,) = commit.pending_sids()
            commit.reset()  # as a new session does: the step it carried is given up, never durable
            # The chief's settlement keeps it (it was counted) and commits it; its records stay unacknowledged.
            raw.session.run(commit.tail, {commit.carried: given_up})
            for _ in range(3):
                sess.run(train)
        # The end committed the last step; the given-up step's records were never acknowledged.
    state = client.data_state("train")
    assert commit.lost == 1 and progress.records_dropped == BATCH
    assert state.records_trained == (5 + 3) * BATCH
