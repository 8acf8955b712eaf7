"""Parity stays exact under asynchronous training, on an in-process PS cluster.

One module-wide cluster of in-process TensorFlow servers (5 PS, 3 workers);
each test builds a small model with an erasure-coded embedding collection and
dense variables, trains it from 3 worker threads at once (each with its own
session on its own worker server, Zipf-skewed ids so they collide on the same
hot rows), then reads every variable and checks every stripe and replica bit
for bit (`tf_ecrec.check.verify.check_parity`).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf

import tf_ecrec
from tf_ecrec.check.verify import check_parity
from tf_ecrec.errors import ConfigError
from tf_ecrec.step.embedding import ECContext, set_context

NUM_PS, NUM_WORKERS = 5, 3


def _ports(n):
    from harness.ports import free_ports

    return free_ports(n)


@pytest.fixture(scope="module")
def cluster():
    ports = _ports(NUM_PS + NUM_WORKERS)
    spec = {
        "ps": [f"127.0.0.1:{p}" for p in ports[:NUM_PS]],
        "worker": [f"127.0.0.1:{p}" for p in ports[NUM_PS:]],
    }
    servers = [tf.distribute.Server(spec, job_name="ps", task_index=i) for i in range(NUM_PS)]
    workers = [tf.distribute.Server(spec, job_name="worker", task_index=i) for i in range(NUM_WORKERS)]
    return {"spec": spec, "servers": servers + workers, "targets": [w.target for w in workers]}


OPTIMIZERS = {
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.01),
    "ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(0.1, l2_shrinkage_regularization_strength=0.01),
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.05, 0.9),
    "nesterov": lambda: tf.compat.v1.train.MomentumOptimizer(0.05, 0.9, use_nesterov=True),
    "rmsprop": lambda: tf.compat.v1.train.RMSPropOptimizer(0.01, momentum=0.5),
    "rmsprop_centered": lambda: tf.compat.v1.train.RMSPropOptimizer(0.01, centered=True),
}


def _build(cluster, ec, num_ps, optimizer):
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device(
        tf_ecrec.ECDeviceFn(num_ps=num_ps, worker_device="/job:worker")
    ):
        tf.compat.v1.set_random_seed(7)
        step = tf.compat.v1.train.get_or_create_global_step()
        set_context(ECContext(ec, num_ps))
        coll = tf_ecrec.EmbeddingCollection("emb", [("a", 1000), ("b", 37)], 8)
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
        emb = tf.reshape(coll.lookup_all(ids), [-1, 16])
        hidden = tf.keras.layers.Dense(4, kernel_initializer=tf.compat.v1.glorot_uniform_initializer())(emb)
        loss = tf.reduce_mean(tf.square(tf.reduce_sum(hidden, axis=1) - 1.0))
        opt = tf_ecrec.ECOptimizer(OPTIMIZERS[optimizer]())
        train = opt.minimize(loss, global_step=step)
        init = tf.compat.v1.global_variables_initializer()
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
    graph.finalize()
    return graph, ids, train, init, variables, opt


def _train_async(cluster, graph, ids, train, steps, seed):
    errors = []

    def worker(i):
        rng = np.random.default_rng([seed, i])
        try:
            with tf.compat.v1.Session(cluster["targets"][i], graph=graph) as sess:
                for _ in range(steps):
                    hot = np.minimum(rng.zipf(1.3, 64) - 1, 999)
                    sess.run(train, {ids: np.stack([hot, rng.integers(0, 37, 64)], axis=1)})
        except Exception as exc:  # surfaced below
            errors.append(f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"[:400])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(NUM_WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)


# Every optimizer with r = 1 (XOR) and r = 2 (Reed-Solomon); 3+2 on 5 PS for two of them.
CASES = [(o, 2, 1, 3) for o in sorted(OPTIMIZERS)] + [(o, 2, 2, 4) for o in sorted(OPTIMIZERS)]
CASES += [("adagrad", 3, 2, 5), ("adam", 3, 2, 5)]


@pytest.mark.parametrize("optimizer, k, r, num_ps", CASES)
def test_parity_is_exact_after_asynchronous_training_on_hot_rows(cluster, optimizer, k, r, num_ps):
    graph, ids, train, init, variables, opt = _build(cluster, tf_ecrec.ECConfig(k, r), num_ps, optimizer)
    with tf.compat.v1.Session(cluster["targets"][0], graph=graph) as sess:
        sess.run(init)
        before = sess.run(variables)
        meta = opt.describe()
        assert check_parity(meta, before)["mismatches"] == 0  # initial parity is the code of the initial data
    _train_async(cluster, graph, ids, train, steps=40, seed=k * 10 + r)
    with tf.compat.v1.Session(cluster["targets"][0], graph=graph) as sess:
        after = sess.run(variables)
    result = check_parity(meta, after)
    assert result["stripes_checked"] == num_ps and result["replicas_checked"] == 3 * r  # kernel, bias, step
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0, result["mismatched"]
    assert after["global_step"] == NUM_WORKERS * 40
    # Training did change the protected rows, so the check above was not vacuous.
    changed = [n for n in meta["collections"][0]["data"].values() if not np.array_equal(before[n], after[n])]
    assert changed
    # A flipped bit in one data row is caught.
    name = meta["collections"][0]["data"]["0"]
    after[name] = after[name].copy()
    after[name].view(np.int32)[0, 0] ^= 1
    assert check_parity(meta, after)["mismatches"] >= 1


def test_a_code_the_cluster_cannot_place_is_a_config_error(cluster):
    with tf.Graph().as_default():
        with pytest.raises(ConfigError, match=r"code 3\+1 needs k \+ r = 4 distinct PS tasks per stripe, but the job has 3"):
            tf_ecrec.EmbeddingCollection("x", [("a", 100)], 4, ec=tf_ecrec.ECConfig(3, 1), num_ps=3)


def test_unsupported_optimizer_is_named():
    with pytest.raises(ConfigError, match=r"cannot apply AdadeltaOptimizer"):
        tf_ecrec.ECOptimizer(tf.compat.v1.train.AdadeltaOptimizer(0.1))


def test_lookup_returns_the_rows_of_each_table(cluster):
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device(tf_ecrec.ECDeviceFn(num_ps=3, worker_device="/job:worker")):
        coll = tf_ecrec.EmbeddingCollection(
            "look", [("a", 50), ("b", 7)], 3, ec=tf_ecrec.ECConfig(2, 1), num_ps=3,
            initializer=lambda shape, dtype=tf.float32: tf.reshape(
                tf.cast(tf.range(shape[0] * shape[1]), tf.float32), shape
            ),
        )
        ids = tf.constant([[0, 0], [49, 6], [17, 3]], tf.int64)
        rows = coll.lookup_all(ids)
        single = coll.lookup("b", tf.constant([6, 0]))
        fed = tf.compat.v1.placeholder(tf.int64, [None])
        bad = coll.lookup("b", fed)
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(cluster["targets"][0], graph=graph) as sess:
        sess.run(init)
        got, got_single = sess.run([rows, single])
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"ids out of range for table b"):
            sess.run(bad, {fed: [7]})
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"ids out of range for table b"):
            sess.run(bad, {fed: [-1]})
    # Each logical row holds distinct values; rows of table b follow those of table a.
    flat = got.reshape(-1, 3)
    assert len({tuple(r) for r in flat[[0, 2, 4]]}) == 3 and len({tuple(r) for r in flat[[1, 3, 5]]}) == 3
    np.testing.assert_array_equal(got_single[0], got[1, 1])
    np.testing.assert_array_equal(got_single[1], got[0, 1])


def test_an_unprotected_collection_is_the_same_storage_trained_by_a_stock_optimizer(cluster):
    """The like-for-like baseline: the variables, layout and lookups of a protected collection, no protection."""
    from tf_ecrec.layout.device import layout_placement, ps_index
    from tf_ecrec.step.embedding import collections

    def values(shape, dtype=tf.float32):
        return tf.reshape(tf.cast(tf.range(shape[0] * shape[1]), tf.float32), shape)

    graph = tf.Graph()
    with graph.as_default():
        with tf.compat.v1.device(layout_placement):
            coll = tf_ecrec.EmbeddingCollection(
                "plain", [("a", 50), ("b", 7)], 3, ec=tf_ecrec.ECConfig(2, 1), num_ps=3, initializer=values,
                protected=False,
            )
        with tf.compat.v1.device("/job:worker/task:0"):
            ids = tf.constant([[0, 0], [49, 6], [17, 3]], tf.int64)
            rows = coll.lookup_all(ids)
            step = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(tf.reduce_sum(rows))
        init = tf.compat.v1.global_variables_initializer()
        ops = {op.type for op in graph.get_operations()}
    assert collections(graph) == []  # nothing for ECOptimizer, recovery or verification to protect
    assert not any(t.startswith("EcRec>") for t in ops)  # no delta log, no wait for rebuilt rows
    with tf.Graph().as_default():
        with tf.compat.v1.device(tf_ecrec.ECDeviceFn(num_ps=3, worker_device="/job:worker")):
            twin = tf_ecrec.EmbeddingCollection("twin", [("a", 50), ("b", 7)], 3, ec=tf_ecrec.ECConfig(2, 1), num_ps=3)
        assert {p: (ps_index(v.device), v.shape.as_list()) for p, v in twin.data.items()} == {
            p: (ps_index(v.device), v.shape.as_list()) for p, v in coll.data.items()
        }
    with tf.compat.v1.Session(cluster["targets"][0], graph=graph) as sess:
        sess.run(init)
        before = sess.run(rows)
        sess.run(step)
        after = sess.run(rows)
    assert before[0, 0].tolist() != before[1, 0].tolist()
    assert np.all(after < before)  # every looked-up row went down the gradient of their sum
