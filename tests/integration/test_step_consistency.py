"""A step cut between any two of its phases is undone or finished exactly (invariants 1, 2, 4).

In-process PS cluster: a step is "cut" by running only some of its phases
(apply, fold, count) in one session.run, which leaves exactly the log
entries a process dying at that point leaves; then the chief's reconciler
settles the logs and every stripe and replica is checked bit for bit.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.training.saving import saveable_object
from test_ec_training import cluster  # noqa: F401  (the module-wide in-process cluster fixture)

import tf_ecrec
from tf_ecrec.check.verify import check_parity
from tf_ecrec.errors import RecoveryError
from tf_ecrec.recovery.deadline_session import LongDeadlineSaver
from tf_ecrec.recovery.plan import RecoveryPlan
from tf_ecrec.recovery.scaffold import ECSaver
from tf_ecrec.step.embedding import ECContext, set_context


def _build(cluster, optimizer="adagrad", k=2, r=1, num_ps=3):  # noqa: F811
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device(
        tf_ecrec.ECDeviceFn(num_ps=num_ps, worker_device="/job:worker")
    ):
        tf.compat.v1.set_random_seed(3)
        step = tf.compat.v1.train.get_or_create_global_step()
        set_context(ECContext(tf_ecrec.ECConfig(k, r), num_ps))
        coll = tf_ecrec.EmbeddingCollection("cut", [("a", 300)], 4)
        ids = tf.compat.v1.placeholder(tf.int64, [None, 1])
        emb = tf.reshape(coll.lookup_all(ids), [-1, 4])
        dense = tf.keras.layers.Dense(1, kernel_initializer=tf.compat.v1.glorot_uniform_initializer())(emb)
        loss = tf.reduce_mean(tf.square(dense - 1.0))
        base = {"adagrad": tf.compat.v1.train.AdagradOptimizer(0.1), "sgd": tf.compat.v1.train.GradientDescentOptimizer(0.1)}[optimizer]
        opt = tf_ecrec.ECOptimizer(base)
        train = opt.minimize(loss, global_step=step)
        plan = RecoveryPlan(opt, background=False)
        init = tf.compat.v1.global_variables_initializer()
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
    return graph, ids, train, opt, plan, init, variables


def _feed(ids, seed):
    rng = np.random.default_rng(seed)
    return {ids: np.minimum(rng.zipf(1.4, (32, 1)) - 1, 299)}


@pytest.mark.parametrize("cut_after", ["apply", "fold"])
def test_a_step_cut_alone_is_undone_to_the_exact_previous_bytes(cluster, cut_after):  # noqa: F811
    graph, ids, train, opt, plan, init, variables = _build(cluster)
    with tf.compat.v1.Session(cluster["targets"][0], graph=graph) as sess:
        sess.run(init)
        for i in range(5):
            sess.run(train, _feed(ids, i))
        before = sess.run(variables)
        sess.run(opt.phases[cut_after], _feed(ids, 99))  # the step dies after this phase
        changed = sess.run(variables)
        assert any(not np.array_equal(before[n], changed[n]) for n in before)
        counts = plan.reconciler.reconcile(sess, plan.reconciler_ps())
        after = sess.run(variables)
    assert counts == {"undone": 1, "finished": 0, "committed": 0}
    for name in before:
        assert np.asarray(after[name]).tobytes() == np.asarray(before[name]).tobytes(), name


def test_a_step_cut_after_its_count_is_finished_with_every_update_kept(cluster):  # noqa: F811
    """Counted means every apply and fold ran: the step is kept whole (the global step says so)."""
    graph, ids, train, opt, plan, init, variables = _build(cluster)
    with tf.compat.v1.Session(cluster["targets"][0], graph=graph) as sess:
        sess.run(init)
        for i in range(5):
            sess.run(train, _feed(ids, i))
        sess.run(opt.phases["count"], _feed(ids, 99))
        changed = sess.run(variables)
        counts = plan.reconciler.reconcile(sess, plan.reconciler_ps())
        after = sess.run(variables)
    assert counts == {"undone": 0, "finished": 1, "committed": 0}
    assert after["global_step"] == 6
    for name in changed:
        assert np.asarray(after[name]).tobytes() == np.asarray(changed[name]).tobytes(), name
    result = check_parity(opt.describe(), after)
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0


def test_a_cut_step_overtaken_by_a_later_one_is_finished_and_parity_stays_exact(cluster):  # noqa: F811
    """B's round-1 commit waits behind A's dead step until the stale-step settlement finishes A."""
    graph, ids, train, opt, plan, init, variables = _build(cluster)
    with tf.compat.v1.Session(cluster["targets"][0], graph=graph) as sess:
        sess.run(init)
        sess.run(opt.phases["apply"], _feed(ids, 1))  # worker A dies after its data applies
        worker_b = threading.Thread(target=sess.run, args=(train, _feed(ids, 2)))
        worker_b.start()  # worker B's step on the same variables: applied, folded, then waits
        time.sleep(1.0)
        assert worker_b.is_alive()
        report = plan.reconciler.settle_stale(sess, plan.reconciler_ps(), stale_secs=0.5)
        worker_b.join(timeout=30)
        assert not worker_b.is_alive()
        values = sess.run(variables)
    assert report is not None and report.counts()["finished"] == 1
    result = check_parity(opt.describe(), values)
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0, result["mismatched"]
    # A never reached its increment, so finishing it adds nothing: only B counted.
    assert values["global_step"] == 1


def test_reconcile_with_nothing_pending_changes_nothing(cluster):  # noqa: F811
    graph, ids, train, _opt, plan, init, variables = _build(cluster, optimizer="sgd")
    with tf.compat.v1.Session(cluster["targets"][0], graph=graph) as sess:
        sess.run(init)
        sess.run(train, _feed(ids, 0))
        before = sess.run(variables)
        assert plan.reconciler.reconcile(sess, plan.reconciler_ps()) == {"undone": 0, "finished": 0, "committed": 0}
        after = sess.run(variables)
    assert all(np.array_equal(before[n], after[n]) for n in before)


def test_a_fresh_start_cut_mid_initialisation_is_initialised_again_not_taken_for_lost_ps(cluster, tmp_path):  # noqa: F811
    graph, ids, train, opt, plan, _init, variables = _build(cluster)
    with graph.as_default():
        plan = RecoveryPlan(opt, model_dir=str(tmp_path), background=False)
        some = tf.group(*[v.initializer for v in list(variables.values())[::2]])
        reset = tf.group(*[tf.raw_ops.DestroyResourceOp(resource=v.handle, ignore_lookup_error=True) for v in variables.values()])
    with tf.compat.v1.Session(cluster["targets"][0], graph=graph) as sess:
        sess.run(reset)
        sess.run(some)  # the first initialisation was cut (a timeout): half the variables exist
        assert plan.prepare(sess, restore=None).method == "init"
        assert (tmp_path / "tf_ecrec_started").exists()
        values = sess.run(variables)
        result = check_parity(opt.describe(), values)
        assert result["mismatches"] == 0 and result["replica_mismatches"] == 0
        sess.run(train, _feed(ids, 0))
        # Every PS lost after the job started, and no checkpoint: a loud error, not a silent restart at step 0.
        sess.run(reset)
        with pytest.raises(RecoveryError, match="the job had started"):
            plan.prepare(sess, restore=None)


def test_a_fresh_start_initialises_in_bounded_batches_and_encodes_parity_from_the_data(cluster, tmp_path, monkeypatch):  # noqa: F811
    """No session call initialises more than INIT_BATCH_BYTES (plus one variable); parity and replicas come
    from the sliced re-encode, bit-exact, and padding rows are exact zeros."""
    import tf_ecrec.recovery.graph as recovery_graph

    monkeypatch.setattr(recovery_graph, "INIT_BATCH_BYTES", 2048)
    graph, _ids, _train, opt, _, _init, variables = _build(cluster)
    with graph.as_default():
        plan = RecoveryPlan(opt, model_dir=str(tmp_path), background=False)
        reset = tf.group(*[tf.raw_ops.DestroyResourceOp(resource=v.handle, ignore_lookup_error=True) for v in variables.values()])
    derived = {v.op.name for par in opt.parity.values() for v in par.values()}
    derived |= {r.op.name for reps in opt.replicas.values() for r in reps}
    assert derived and len(plan._init_batches) > 2
    sizes = {n: int(np.prod(v.shape.as_list())) * v.dtype.base_dtype.size for n, v in variables.items()}
    initialised = set()
    for _, batch in plan._init_batches:
        names = set(batch)
        assert not names & derived, "a parity or replica is initialised, not encoded"
        assert sum(sizes[n] for n in names) <= max(2048, max(sizes[n] for n in names))
        initialised |= names
    with tf.compat.v1.Session(cluster["targets"][0], graph=graph) as sess:
        sess.run(reset)
        assert plan.prepare(sess, restore=None).method == "init"
        values = sess.run(variables)
    assert initialised | derived >= {n for n in variables if not n.startswith("ec_recovery/")}
    result = check_parity(opt.describe(), values)
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0
    data = np.concatenate([values[f"ec/cut/ps{p}/data"] for p in range(3)])
    assert 0 < np.abs(data).max() <= 0.05


class _GatedSaveable(saveable_object.SaveableObject):
    """A saveable whose tensor is a dequeue: the save takes exactly as long as the test holds the gate."""

    def __init__(self, queue: tf.queue.FIFOQueue) -> None:
        tensor = queue.dequeue()
        super().__init__(tensor, [saveable_object.SaveSpec(tensor, "", "gated")], "gated")

    def restore(self, restored_tensors, restored_shapes):
        return tf.no_op()


@pytest.mark.parametrize("saver", ["ECSaver", "LongDeadlineSaver"])
def test_a_checkpoint_save_is_not_cut_by_the_session_operation_timeout(cluster, tmp_path, saver):  # noqa: F811
    """The session's operation timeout ends waits on dead tasks; ECSaver (ecrec) and LongDeadlineSaver (the
    unprotected modes' Scaffold) save a slow (large) model under the long deadline."""
    graph, _ids, _train, _opt, plan, init, _variables = _build(cluster, optimizer="sgd")
    with graph.as_default():
        with tf.compat.v1.device("/job:ps/task:0"):
            gate = tf.queue.FIFOQueue(4, tf.float32, shapes=[[]], shared_name="save_gate")
            release = gate.enqueue(1.0)
        stock = tf.compat.v1.train.Saver(var_list=[_GatedSaveable(gate)], sharded=True)
        if saver == "ECSaver":
            ours = ECSaver(plan, var_list=[_GatedSaveable(gate)], sharded=True)
        else:
            ours = LongDeadlineSaver(var_list=[_GatedSaveable(gate)], sharded=True)
    config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=2000)
    (tmp_path / "stock").mkdir()
    (tmp_path / "ours").mkdir()
    with tf.compat.v1.Session(cluster["targets"][0], graph=graph, config=config) as sess:
        sess.run(init)
        # The setup would catch the bug: the stock save, slower than the operation timeout, is cut.
        with pytest.raises(tf.errors.DeadlineExceededError):
            stock.save(sess, str(tmp_path / "stock" / "model"), global_step=1)
        opener = threading.Timer(4.0, lambda: sess.run(release))
        opener.start()
        started = time.monotonic()
        path = ours.save(sess, str(tmp_path / "ours" / "model"), global_step=1)
        opener.join()
    assert time.monotonic() - started >= 3.5  # it waited for the gate, past the 2 s timeout
    assert path.endswith("model-1")
    assert "gated" in tf.train.load_checkpoint(path).get_variable_to_shape_map()
