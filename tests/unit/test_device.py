"""Unit tests of tf_ecrec.layout.device: where ECDeviceFn puts every kind of op (graphs only, no servers)."""

from __future__ import annotations

import logging

import pytest
import tensorflow as tf

import tf_ecrec
import tf_ecrec.step.embedding
import tf_ecrec.step.optimizer
from tf_ecrec.cluster.tf_config import ClusterConfig, tf_config_env
from tf_ecrec.errors import ConfigError
from tf_ecrec.layout.device import ECDeviceFn, layout_placement, on_ps
from tf_ecrec.step.embedding import ECContext, set_context


def _model(num_ps: int, k: int = 2, r: int = 1) -> tuple[tf_ecrec.EmbeddingCollection, tf_ecrec.ECOptimizer, tf.Variable]:
    """A small protected model: one collection, one dense layer, the global step, Adagrad."""
    step = tf.compat.v1.train.get_or_create_global_step()
    set_context(ECContext(tf_ecrec.ECConfig(k, r), num_ps))
    coll = tf_ecrec.EmbeddingCollection("emb", [("a", 100), ("b", 9)], 4)
    ids = tf.constant([[1, 2], [3, 8]], tf.int64)
    dense = tf.compat.v1.get_variable("dense", [8, 1], use_resource=True)
    loss = tf.reduce_sum(tf.matmul(tf.reshape(coll.lookup_all(ids), [-1, 8]), dense))
    opt = tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
    opt.minimize(loss, global_step=step)
    return coll, opt, step


def _task(device: str) -> tuple[str | None, int | None]:
    spec = tf.DeviceSpec.from_string(device)
    return spec.job, spec.task


@pytest.mark.parametrize("num_ps,k,r", [(3, 2, 1), (4, 2, 2), (5, 4, 1)])
def test_storage_lands_where_the_layout_puts_it(num_ps, k, r):
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device(ECDeviceFn(num_ps=num_ps, worker_device="/job:worker/task:1")):
        coll, opt, step = _model(num_ps, k, r)
    layout = coll.table_layout
    assert {c.ps for c in layout.data_chunks} == set(coll.data)
    for p, var in coll.data.items():
        assert _task(var.device) == ("ps", p)
        assert int(var.shape[0]) == len([c for c in layout.data_chunks if c.ps == p]) * coll.chunk_rows
        for slot in opt.slots_of(var):
            assert _task(slot.device) == ("ps", p)
    parity_ps = {c.ps for c in layout.parity_chunks}
    assert {_task(v.device)[1] for v in opt.parity["emb"].values()} == parity_ps
    for q, var in opt.parity["emb"].items():
        assert _task(var.device) == ("ps", q)
    for ps, log in opt.logs.items():
        assert _task(log.device) == ("ps", ps)
    # The global step and the dense weights: round robin in creation order; replicas on the next r PS.
    assert _task(step.device) == ("ps", 0)
    dense = opt.protected["dense"]
    assert _task(dense.device) == ("ps", 1)
    for name in ("dense", step.op.name):
        primary = _task(opt.protected[name].device)[1]
        assert [_task(v.device)[1] for v in opt.replicas[name]] == [(primary + 1 + j) % num_ps for j in range(r)]
    # Updates run next to what they update; the model's arithmetic on the task's own device.
    ops = {op.name: op for op in graph.get_operations()}
    applies = [op for op in ops.values() if op.type.startswith("EcRec>SparseApply")]
    assert applies and all(_task(op.device)[0] == "ps" for op in applies)
    assert _task(ops["MatMul"].device) == ("worker", 1)


def test_compute_ops_run_on_the_worker_and_explicit_jobs_are_kept():
    fn = ECDeviceFn(num_ps=2, worker_device="/job:worker/task:3")
    with tf.Graph().as_default(), tf.compat.v1.device(fn):
        a = tf.constant(1.0, name="a")
        with tf.device("/job:ps/task:1"):
            pinned = tf.identity(a, name="pinned")
        with tf.device("/device:CPU:0"):
            typed = tf.identity(a, name="typed")
    assert a.op.device == "/job:worker/task:3"
    assert _task(pinned.op.device) == ("ps", 1)
    assert _task(typed.op.device) == ("worker", 3) and "CPU:0" in typed.op.device


def test_dense_variables_match_the_stock_setter_and_round_robin_restarts_per_graph():
    def variables(device_fn):
        with tf.Graph().as_default(), tf.compat.v1.device(device_fn):
            return [tf.compat.v1.get_variable(f"v{i}", [2], use_resource=True).device for i in range(5)]

    fn = ECDeviceFn(num_ps=3, worker_device="/job:worker/task:0")
    stock = tf.compat.v1.train.replica_device_setter(ps_tasks=3)
    assert [_task(d) for d in variables(fn)] == [_task(d) for d in variables(stock)]
    assert variables(fn) == variables(fn)  # a rebuilt graph places the same way


def test_the_layout_wins_over_a_users_device_scope():
    with tf.Graph().as_default(), tf.compat.v1.device(ECDeviceFn(num_ps=3, worker_device="/job:worker/task:0")):
        with tf.device("/job:ps/task:0"):
            coll, _, _ = _model(3)
    assert {p: _task(v.device) for p, v in coll.data.items()} == {p: ("ps", p) for p in coll.data}


def test_without_an_ec_device_function_the_table_refuses_to_be_misplaced():
    with tf.Graph().as_default(), tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(ps_tasks=3)):
        tf.compat.v1.train.get_or_create_global_step()  # round robin: the table's first variable goes to PS 1
        set_context(ECContext(tf_ecrec.ECConfig(2, 1), 3))
        with pytest.raises(ConfigError, match=r"landed on '/job:ps/task:1'.*layout puts it on /job:ps/task:0.*ECDeviceFn"):
            tf_ecrec.EmbeddingCollection("emb", [("a", 100)], 4)
    # The placement-only function ec_model_fn installs is enough under a stock setter.
    with tf.Graph().as_default(), tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(ps_tasks=3)), tf.compat.v1.device(layout_placement):
        set_context(ECContext(tf_ecrec.ECConfig(2, 1), 3))
        coll = tf_ecrec.EmbeddingCollection("emb", [("a", 100)], 4)
    assert {p: _task(v.device) for p, v in coll.data.items()} == {p: ("ps", p) for p in coll.data}


def test_a_task_outside_the_job_is_a_config_error():
    with tf.Graph().as_default(), tf.compat.v1.device(ECDeviceFn(num_ps=2, worker_device="/job:worker/task:0")):
        with on_ps(2), pytest.raises(ConfigError, match=r"on PS task 2, but the job has 2 PS tasks"):
            tf.constant(0, name="x")


def test_the_ps_count_and_device_come_from_tf_config():
    cfg = ClusterConfig(
        {"chief": ("127.0.0.1:2000",), "worker": ("127.0.0.1:2001",), "ps": ("127.0.0.1:3000", "127.0.0.1:3001")},
        "worker",
        0,
    )
    with tf_config_env(cfg):
        fn = ECDeviceFn()
        with tf.Graph().as_default(), tf.compat.v1.device(fn):
            v = tf.compat.v1.get_variable("v", [1], use_resource=True)
            w = tf.compat.v1.get_variable("w", [1], use_resource=True)
            c = tf.constant(0)
    assert fn.num_ps == 2
    assert [_task(v.device), _task(w.device)] == [("ps", 0), ("ps", 1)]
    assert c.op.device == "/job:worker/task:0"


def test_lookup_of_a_table_the_collection_lacks_names_it_and_the_tables_it_has():
    with tf.Graph().as_default(), tf.compat.v1.device(ECDeviceFn(num_ps=3, worker_device="/job:worker/task:1")):
        coll, _, _ = _model(3)
        ids = tf.constant([1], tf.int64)
        assert coll.lookup("b", ids).shape.as_list() == [1, 4]
        with pytest.raises(ConfigError, match=r"collection emb has no table 'c'; rule: a name of \['a', 'b'\]"):
            coll.lookup("c", ids)
        with pytest.raises(ConfigError, match=r"has no table 2; .*index below 2"):
            coll.lookup(2, ids)


def test_a_protected_graph_exports_its_meta_graph_without_serialization_warnings(caplog):
    # Checkpoints write the MetaGraph; Python objects in graph collections made TensorFlow warn
    # ("Issue encountered when serializing ...") at every save. They live beside the graph now.
    with tf.Graph().as_default(), tf.compat.v1.device(ECDeviceFn(num_ps=3, worker_device="/job:worker/task:1")):
        coll, opt, _ = _model(3)
        assert tf_ecrec.step.optimizer.protectors() == [opt]
        assert tf_ecrec.step.embedding.collections() == [coll]
        with caplog.at_level(logging.WARNING):
            tf.compat.v1.train.export_meta_graph()
    assert "Issue encountered when serializing" not in caplog.text
    assert tf_ecrec.step.optimizer.protectors(tf.Graph()) == []
