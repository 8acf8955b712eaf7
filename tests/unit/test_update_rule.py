"""`UpdateRule.of` reads a v1 optimizer as the optimizer itself applies it.

For each supported optimizer with a sparse kernel (Adam is applied lazily, so it has no stock twin
here), the rule's slots carry the names and initial values of the optimizer's own slots, and
`UpdateRule.apply` on variables started from the rule writes the same bits as the optimizer's own
sparse step (``apply_gradients`` with ``IndexedSlices``), in graph mode as under Estimator.
Hyperparameters the rule cannot hold as constants (tensors, callables) are refused with a
`ConfigError` naming the value, the rule and the source.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import tensorflow as tf

from tf_ecrec.errors import ConfigError
from tf_ecrec.step.update_rule import RuleKind, UpdateRule

V1 = tf.compat.v1
F32 = np.float32
ROWS, DIM = 11, 9

OPTIMIZERS: dict[str, tuple[RuleKind, Callable[[], V1.train.Optimizer]]] = {
    "sgd": (RuleKind.SGD, lambda: V1.train.GradientDescentOptimizer(0.1)),
    "adagrad": (RuleKind.ADAGRAD, lambda: V1.train.AdagradOptimizer(0.05, initial_accumulator_value=0.3)),
    "ftrl": (RuleKind.FTRL, lambda: V1.train.FtrlOptimizer(
        0.05, l1_regularization_strength=0.01, l2_regularization_strength=0.02,
        l2_shrinkage_regularization_strength=0.03)),
    "momentum": (RuleKind.MOMENTUM, lambda: V1.train.MomentumOptimizer(0.05, 0.9)),
    "nesterov": (RuleKind.MOMENTUM, lambda: V1.train.MomentumOptimizer(0.05, 0.9, use_nesterov=True, name="Nag")),
    "rmsprop": (RuleKind.RMSPROP, lambda: V1.train.RMSPropOptimizer(0.01)),
    "rmsprop_momentum": (RuleKind.RMSPROP, lambda: V1.train.RMSPropOptimizer(
        np.float64(0.01), decay=0.8, momentum=0.5, epsilon=1e-6)),
    "rmsprop_centered": (RuleKind.RMSPROP, lambda: V1.train.RMSPropOptimizer(
        0.01, momentum=0.5, centered=True, name="Centered")),
    "rmsprop_centered_no_momentum": (RuleKind.RMSPROP, lambda: V1.train.RMSPropOptimizer(0.01, centered=True)),
}


def _bits(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=F32).view(np.int32)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_rule_has_the_optimizers_slots_and_writes_its_bits(name: str) -> None:
    kind, make_optimizer = OPTIMIZERS[name]
    rng = np.random.default_rng(len(name))
    init = rng.normal(size=(ROWS, DIM)).astype(F32)
    graph = tf.Graph()
    with graph.as_default():
        stock_var = tf.Variable(init, name="table")
        grad = V1.placeholder(tf.float32, [None, DIM])
        ids = V1.placeholder(tf.int64, [None])
        optimizer = make_optimizer()
        train = optimizer.apply_gradients([(tf.IndexedSlices(grad, ids, tf.constant([ROWS, DIM], tf.int64)), stock_var)])
        rule = UpdateRule.of(optimizer)
        assert rule.kind == kind
        own = {slot.op.name: slot for slot in (optimizer.get_slot(stock_var, s) for s in optimizer.get_slot_names())}
        assert sorted(own) == sorted(f"table/{slot}" for slot, _ in rule.slots)
        stock = [stock_var] + [own[f"table/{slot}"] for slot, _ in rule.slots]  # in the rule's (op) order
        ours = [tf.Variable(init, name="ours")] + [
            tf.Variable(tf.fill([ROWS, DIM], F32(value)), name=f"ours/{slot}") for slot, value in rule.slots
        ]
        delta = rule.apply(ours[0], ours[1:], grad, ids, step=None, logged={})
        init_op = V1.global_variables_initializer()
    config = V1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    with V1.Session(graph=graph, config=config) as sess:
        sess.run(init_op)
        for step in range(6):
            for table, (ours_value, stock_value) in enumerate(zip(sess.run(ours), sess.run(stock))):
                np.testing.assert_array_equal(_bits(ours_value), _bits(stock_value), err_msg=f"step {step} table {table}")
            step_ids = rng.permutation(ROWS)[: int(rng.integers(1, ROWS))]
            # No zeros: the optimizer's deduplication turns -0.0 into +0.0.
            step_grad = (rng.normal(size=(step_ids.size, DIM)) * 10.0 ** rng.uniform(-2, 2) + 1e-3).astype(F32)
            sess.run(train, {grad: step_grad, ids: step_ids})
            sess.run(delta, {grad: step_grad, ids: step_ids})
        assert not np.array_equal(sess.run(ours[0]), init)


def test_hyperparameters_that_are_not_numbers_are_refused_by_name() -> None:
    with tf.Graph().as_default():
        with pytest.raises(ConfigError, match=r"learning_rate=<tf\.Tensor.*MomentumOptimizer.*momentum rule.*source"):
            UpdateRule.of(V1.train.MomentumOptimizer(tf.constant(0.1), 0.9))
        with pytest.raises(ConfigError, match=r"momentum=<function.*RMSPropOptimizer.*rmsprop rule"):
            UpdateRule.of(V1.train.RMSPropOptimizer(0.1, momentum=lambda: 0.5))
        with pytest.raises(ConfigError, match=r"decay=<tf\.Variable"):
            UpdateRule.of(V1.train.RMSPropOptimizer(0.1, decay=tf.Variable(0.9)))
        with pytest.raises(ConfigError, match=r"learning_rate=.*AdagradOptimizer.*adagrad rule"):
            UpdateRule.of(V1.train.AdagradOptimizer(V1.train.exponential_decay(0.1, tf.constant(0), 10, 0.9)))
    rule = UpdateRule.of(V1.train.MomentumOptimizer(np.array(0.1), 0.9))  # a 0-d array is a number
    assert rule.learning_rate == 0.1 and rule.hyper == {"momentum": 0.9, "use_nesterov": False}


def test_unsupported_optimizers_are_named_with_the_supported_ones() -> None:
    with pytest.raises(ConfigError, match=r"cannot apply AdadeltaOptimizer.*MomentumOptimizer, RMSPropOptimizer"):
        UpdateRule.of(V1.train.AdadeltaOptimizer(0.1))

    class Custom(V1.train.MomentumOptimizer):
        pass

    with pytest.raises(ConfigError, match=r"cannot apply Custom"):  # a subclass may change the update
        UpdateRule.of(Custom(0.1, 0.9))
