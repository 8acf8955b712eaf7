"""Folds batched over steps (`tf_ecrec.step.batched_commit`), on an in-process PS cluster and a real master.

A step in batched mode is its applies and its count: between fold rounds the logs hold the
trainer's returned steps (at most its bound) and parity lags the data; a round folds every
trainer's unfolded applies and commits the counted steps folded through, after which parity is
exact again; two trainers' rounds overlap without a fold written twice; and a step's records
are acknowledged to the master only once it is durable.
"""

from __future__ import annotations

import threading
import time
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
from tf_ecrec.step.batched_commit import BatchedCommit
from tf_ecrec.step.carried_commit import CarriedCommitHook, carried_commits
from tf_ecrec.step.embedding import ECContext, set_context

cluster = tf_cluster(num_ps=3, num_workers=1)
BATCH = 16
ROWS = (300, 40)


def _model(ids: tf.Tensor, optimizer: tf.compat.v1.train.Optimizer) -> tuple[tf.Operation, tf_ecrec.ECOptimizer]:
    step = tf.compat.v1.train.get_or_create_global_step()
    set_context(ECContext(tf_ecrec.ECConfig(2, 1), 3))
    coll = tf_ecrec.EmbeddingCollection("emb", [("a", ROWS[0]), ("b", ROWS[1])], 8)
    emb = tf.reshape(coll.lookup_all(ids), [-1, 16])
    out = tf.keras.layers.Dense(1, kernel_initializer=tf.compat.v1.glorot_uniform_initializer())(emb)
    loss = tf.reduce_mean(tf.square(out - 1.0))
    opt = tf_ecrec.ECOptimizer(optimizer, commit="batched")
    return opt.minimize(loss, global_step=step), opt


def _graph(job: str) -> tuple[tf.Graph, dict]:
    with tf.Graph().as_default() as graph, tf.compat.v1.device(tf_ecrec.ECDeviceFn(num_ps=3, worker_device=f"/job:{job}")):
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
        train, opt = _model(ids, tf.compat.v1.train.AdagradOptimizer(0.1))
        (commit,) = carried_commits(graph)
        parts = {
            "ids": ids, "train": train, "opt": opt, "commit": commit,
            "pending": {p: ec_ops.delta_log_pending(log)[0] for p, log in opt.logs.items()},
            "init": tf.compat.v1.global_variables_initializer(),
            "variables": {v.op.name: v for v in tf.compat.v1.global_variables()},
        }
    return graph, parts


def _batch(rng: np.random.Generator) -> np.ndarray:
    return np.minimum(rng.zipf(1.3, (BATCH, 2)) - 1, [ROWS[0] - 1, ROWS[1] - 1])


def _in_logs(sess: tf.compat.v1.Session, parts: dict) -> set[int]:
    return {int(s) for v in sess.run(parts["pending"]).values() for s in v}


def test_steps_return_before_their_folds_and_a_round_every_few_steps_makes_them_durable(cluster) -> None:
    cluster.reset()
    rng = np.random.default_rng(3)
    graph, parts = _graph("chief")
    commit = parts["commit"]
    assert isinstance(commit, BatchedCommit)
    commit.every, commit.max_delay = 4, 3600.0  # rounds by count only: what this test asserts
    with tf.compat.v1.Session(cluster.target("chief"), graph=graph) as sess:
        sess.run(parts["init"])
        lagged = False
        for run in range(1, 15):
            commit.run(sess, parts["train"], {parts["ids"]: _batch(rng)})
            in_logs = _in_logs(sess, parts)
            assert in_logs == commit.pending_sids()  # every returned step not durable, and nothing else
            assert len(in_logs) == run % 4  # a round at every fourth run made all four durable
            if in_logs:  # the step returned with its folds still to come: parity lags the data
                lagged |= check_parity(parts["opt"].describe(), sess.run(parts["variables"]))["mismatches"] > 0
        assert lagged, "parity was exact with steps pending: the folds did not leave the step"
        assert commit.rounds == 3 and commit.durable == 12 and commit.resolved(12) == "durable"
        assert commit.resolved(13) == "pending"
        assert commit.flush(sess) and commit.resolved(14) == "durable" and not _in_logs(sess, parts)
        result = check_parity(parts["opt"].describe(), sess.run(parts["variables"]))
        assert result["mismatches"] == 0 and result["replica_mismatches"] == 0 and result["stripes_checked"] > 0
        assert int(sess.run(tf.compat.v1.train.get_global_step(graph))) == 14


def test_two_trainers_rounds_overlap_and_every_fold_is_written_once(cluster) -> None:
    """Two trainers step and fold concurrently (each round takes the other's unfolded applies too):
    parity ends exact, which a fold written twice (or lost) would break, and every step is durable."""
    cluster.reset()
    trainers = {job: _graph(job) for job in ("chief", "worker")}
    for _, parts in trainers.values():
        parts["commit"].every, parts["commit"].max_delay = 3, 3600.0
    errors: list[BaseException] = []
    sessions = {job: tf.compat.v1.Session(cluster.target(job), graph=graph) for job, (graph, _) in trainers.items()}
    try:
        sessions["chief"].run(trainers["chief"][1]["init"])
        start = threading.Barrier(2)

        def train(job: str, seed: int) -> None:
            _, parts = trainers[job]
            rng = np.random.default_rng(seed)
            try:
                start.wait(timeout=30)
                for _ in range(25):
                    parts["commit"].run(sessions[job], parts["train"], {parts["ids"]: _batch(rng)})
                assert parts["commit"].flush(sessions[job])
            except BaseException as exc:  # reported by the test thread
                errors.append(exc)

        threads = [threading.Thread(target=train, args=(job, i)) for i, job in enumerate(trainers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        assert not any(t.is_alive() for t in threads)
        sess, parts = sessions["chief"], trainers["chief"][1]
        assert not _in_logs(sess, parts)
        for _, p in trainers.values():
            assert p["commit"].durable == 25 and p["commit"].lost == 0
        result = check_parity(parts["opt"].describe(), sess.run(parts["variables"]))
        assert result["mismatches"] == 0 and result["replica_mismatches"] == 0
        assert int(sess.run(tf.compat.v1.train.get_global_step(trainers["chief"][0]))) == 50
    finally:
        for s in sessions.values():
            s.close()


@pytest.fixture
def master() -> Iterator[MasterHandle]:
    handle = start_master(heartbeat_timeout=30.0, fsync=False)
    yield handle
    handle.stop(grace=0)


def test_records_are_acknowledged_once_durable_and_never_for_a_step_given_up(cluster, master) -> None:
    cluster.reset()
    client = MasterClient(master.address, "chief", 0)
    client.register("127.0.0.1:2000")
    client.register_dataset("train", 40 * BATCH, 10 * BATCH)
    tracker = ShardTracker()

    def records() -> Iterator[list[int]]:
        for lease in track(client.iter_shards("train"), tracker):
            for start in range(lease.start, lease.end, BATCH):
                yield [start % ROWS[0], start % ROWS[1]]

    with tf.Graph().as_default() as graph, tf.compat.v1.device(tf_ecrec.ECDeviceFn(num_ps=3, worker_device="/job:chief")):
        batch = tf.compat.v1.data.make_one_shot_iterator(
            tf.data.Dataset.from_generator(records, output_signature=tf.TensorSpec([2], tf.int64)).map(
                lambda x: tf.tile(x[None], [BATCH, 1]))).get_next()
        train, _ = _model(batch, tf.compat.v1.train.AdagradOptimizer(0.1))
        (commit,) = carried_commits(graph)
        commit.every, commit.max_delay = 4, 3600.0
        progress = ShardProgressHook(client, tracker, records=BATCH, flush_timeout=10.0)
        creator = tf.compat.v1.train.ChiefSessionCreator(master=cluster.target("chief"))
        with tf.compat.v1.train.MonitoredSession(session_creator=creator,
                                                 hooks=[CarriedCommitHook(idle_flush_secs=0), progress]) as sess:
            for _ in range(6):
                sess.run(train)
            progress.sender.flush(10.0)
            # Six runs returned; a round at the fourth made four durable; five and six are not yet.
            assert client.data_state("train").records_trained == 4 * BATCH
            assert len(commit.pending_sids()) == 2
            commit.reset()  # as a new session does: the two returned steps are given up, never durable
            for _ in range(3):
                sess.run(train)
        # The end folded and committed the last three; the two given-up steps' records were never acknowledged.
    state = client.data_state("train")
    assert commit.lost == 2 and progress.records_dropped == 2 * BATCH
    assert state.records_trained == (4 + 3) * BATCH


def test_a_run_in_flight_longer_than_the_idle_bound_makes_the_returned_steps_durable_meanwhile(cluster) -> None:
    """A run that waits (a slow input, a hook) does not hold back its trainer's returned steps: the hook's
    watcher runs a fold round alone once the run is in flight past the idle bound."""
    cluster.reset()
    rng = np.random.default_rng(5)
    graph, parts = _graph("chief")
    commit = parts["commit"]
    commit.every, commit.max_delay = 8, 3600.0  # no round is due by count or age in this test
    with graph.as_default():
        slow = tf.numpy_function(lambda: np.int64(time.sleep(2.0) or 0), [], tf.int64)
        creator = tf.compat.v1.train.ChiefSessionCreator(master=cluster.target("chief"))
        session = tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=[CarriedCommitHook(idle_flush_secs=0.3)])
    with session as sess:
        for _ in range(2):
            sess.run(parts["train"], {parts["ids"]: _batch(rng)})
        assert commit.durable == 0 and len(commit.pending_sids()) == 2
        sess.run([parts["train"], slow], {parts["ids"]: _batch(rng)})
        # The watcher's round, during the slow run, made the two earlier steps durable; the slow run's own
        # step returned after it.
        assert commit.durable == 2 and commit.rounds == 1 and len(commit.pending_sids()) == 1
        sess.run(slow)  # a run through the same hooks without the step (its id is never counted), long
        assert commit.durable == 3 and len(commit.pending_sids()) == 1  # the watcher folded the third meanwhile
    # The end folded the last step and found the other run's id lost (not waited on for ever).
    assert commit.durable == 3 and commit.lost == 1 and not commit.pending_sids()
