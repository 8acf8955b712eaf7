"""A non-chief trainer's recovery plan: only what its ready op needs (`RecoveryPlan(chief=False)`).

A worker never recovers or settles (the chief does), so its graph leaves out the rebuild and
settlement ops, about a second of its start; it keeps the whole markers and the variable list its
ready op waits on, named as in the chief's graph.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

import tf_ecrec
from tf_ecrec.errors import ConfigError
from tf_ecrec.recovery.plan import RecoveryPlan
from tf_ecrec.step.embedding import ECContext, set_context


def _build(chief: bool):
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device(tf_ecrec.ECDeviceFn(num_ps=3, worker_device="/job:worker/task:0")):
        step = tf.compat.v1.train.get_or_create_global_step()
        set_context(ECContext(tf_ecrec.ECConfig(2, 1), 3))
        coll = tf_ecrec.EmbeddingCollection("t", [("a", 300), ("b", 200)], 8)
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
        out = tf.keras.layers.Dense(1)(tf.reshape(coll.lookup_all(ids), [-1, 16]))
        opt = tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
        opt.minimize(tf.reduce_mean(tf.square(out)), global_step=step)
        before = len(graph.get_operations())
        plan = RecoveryPlan(opt, chief=chief)
        return graph, plan, len(graph.get_operations()) - before


def test_a_workers_plan_builds_what_its_ready_op_needs_and_no_rebuild_or_settlement():
    chief_graph, chief_plan, chief_ops = _build(chief=True)
    worker_graph, worker_plan, worker_ops = _build(chief=False)
    names = lambda graph, scope: [op.name for op in graph.get_operations() if op.name.startswith(scope)]  # noqa: E731
    for scope in ("ec_rebuild", "ec_reconcile"):
        assert names(chief_graph, scope) and not names(worker_graph, scope), scope
    assert worker_ops < chief_ops / 2, (worker_ops, chief_ops)
    # The ready op's inputs: the same markers and variables, by name, as the chief initialises.
    assert sorted(worker_plan.whole_markers) == sorted(chief_plan.whole_markers) == [0, 1, 2]
    assert [v.op.name for v in worker_plan.variables] == [v.op.name for v in chief_plan.variables]


def test_using_a_part_a_worker_does_not_build_is_a_config_error_naming_it():
    _, plan, _ = _build(chief=False)
    with pytest.raises(ConfigError, match=r"RecoveryPlan.rebuilder.reencode: built on the chief only"):
        plan.rebuilder.reencode(None)
    with pytest.raises(ConfigError, match=r"RecoveryPlan.reconciler.settle_stale: built on the chief only"):
        plan.reconciler.settle_stale(None, [], {})
