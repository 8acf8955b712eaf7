"""No large tensor of the initialisation or of a rebuild can be folded into a graph constant (`tf_ecrec.base.unfolded`).

Each PS optimizes its partition of a graph when a session first runs it,
and constant folding evaluates every subgraph whose inputs are constants,
then keeps the result in the registered graph.  Measured on a 4 GB job, the
spare's first call of a recovery (allocating the lost PS's 2 GB as zeros)
spent 9.8 s of its 9.9 s in that evaluation, the ops themselves 0.06 s; a
fill of a static shape was the cause.  The folded result never shows in the
partition graphs a session reports (the PS folds after the master
partitions), so these tests check the graph against the folding rule
itself: a node folds when it is not stateful, not a `Placeholder`, and every
input folds.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import tf_ecrec
from tf_ecrec.recovery.plan import RecoveryPlan
from tf_ecrec.step.embedding import ECContext, set_context

LIMIT = 1 << 20  # bytes: anything larger must be made when its op runs


def _folds(op: tf.Operation, memo: dict) -> bool:
    if op not in memo:
        memo[op] = False  # cycles (none in these graphs) count as not foldable
        memo[op] = (
            not op.op_def.is_stateful
            and op.type != "Placeholder"
            and all(_folds(t.op, memo) for t in op.inputs)
        )
    return memo[op]


def _large_foldable(fetches) -> list[str]:
    """Foldable tensors over LIMIT bytes among the ancestors of `fetches`."""
    memo: dict = {}
    seen, stack, out = set(), [f if isinstance(f, tf.Operation) else f.op for f in fetches], []
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
        if not _folds(op, memo):
            continue
        for t in op.outputs:
            shape = _shape(t)
            if shape is not None and t.dtype.size * int(np.prod(shape)) > LIMIT:
                out.append(f"{op.name} ({op.type}, {shape})")
    return out


def _shape(t: tf.Tensor) -> list[int] | None:
    """The static shape, or for a foldable `Fill` the shape its (foldable) dims evaluate to."""
    if t.shape.is_fully_defined():
        return t.shape.as_list()
    if t.op.type == "Fill":
        dims = _value(t.op.inputs[0])
        return None if dims is None else [int(d) for d in dims]
    return None


def _value(t: tf.Tensor):
    """What a foldable shape computation evaluates to (the few ops one is built of), or None."""
    op = t.op
    if op.type == "Const":
        return tf.make_ndarray(op.get_attr("value"))
    if op.type in ("PlaceholderWithDefault", "Identity", "Cast"):
        return _value(op.inputs[0])
    if op.type == "Shape" and op.inputs[0].shape.is_fully_defined():
        return np.asarray(op.inputs[0].shape.as_list())
    return None


def _job(rows: int = 100_000, dim: int = 16):
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device(tf_ecrec.ECDeviceFn(num_ps=3, worker_device="/job:chief")):
        step = tf.compat.v1.train.get_or_create_global_step()
        set_context(ECContext(tf_ecrec.ECConfig(2, 1), 3))
        coll = tf_ecrec.EmbeddingCollection("t", [("a", rows), ("b", rows)], dim)
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
        out = tf.keras.layers.Dense(1)(tf.reshape(coll.lookup_all(ids), [-1, 2 * dim]))
        opt = tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
        opt.minimize(tf.reduce_mean(tf.square(out)), global_step=step)
        plan = RecoveryPlan(opt)
    return graph, coll, opt, plan


def test_the_rule_finds_a_fill_of_a_static_shape():
    # The checker itself: what the fix removed is what it reports.
    with tf.Graph().as_default():
        with tf.device("/job:ps/task:0"):
            big = tf.fill([1000, 1000], 0.5)
            made = tf.raw_ops.Empty(shape=tf.constant([1000, 1000], tf.int32), dtype=tf.float32, init=True) + 0.5
            fed = tf.fill(tf.compat.v1.placeholder(tf.int32, [2]), 0.5)
            defaulted = tf.fill(tf.compat.v1.placeholder_with_default(tf.constant([1000, 1000]), [2]), 0.5)
        assert _large_foldable([big]) and _large_foldable([defaulted])
        assert not _large_foldable([made]) and not _large_foldable([fed])


def test_a_fresh_start_and_a_rebuild_make_their_large_tensors_when_they_run():
    graph, coll, opt, plan = _job()
    with graph.as_default():
        data = list(coll.data.values())
        assert data and int(data[0].shape[0]) * 16 * 4 > LIMIT  # each table variable is over the limit
        fetches = [op for op, _ in plan._init_batches]
        fetches += [v.initializer for v in data]
        fetches += [s.initializer for v in data for s in opt.slots_of(v)]
        fetches += list(plan.rebuilder._alloc.values())
        assert _large_foldable(fetches) == []
