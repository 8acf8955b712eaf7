"""Unit tests of the sparse-apply-with-delta ops and the op library loader.

Every apply op is run beside its stock TensorFlow twin on the same variables
and inputs, in graph mode (as under Estimator), and the results are compared
bit for bit (``.view(np.int32)``); the delta is checked against a NumPy
oracle (``old ^ new``) and by folding it back into the old values.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence

import numpy as np
import pytest
import tensorflow as tf

from tf_ecrec import ops as ec_ops
from tf_ecrec.errors import OpLibraryError

V1 = tf.compat.v1
F32 = np.float32
ROWS = 11


def _bits(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=F32).view(np.int32)


def _session(graph: tf.Graph) -> V1.Session:
    # One intra-op thread: TensorFlow's sparse Adagrad kernel shards the index
    # list across threads, which races on duplicate ids; with one thread it
    # applies them in order, which is what our ops do on any pool.
    config = V1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    return V1.Session(graph=graph, config=config)


# --- the optimizers and their stock twins ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """An apply op with delta and the stock computation it must reproduce."""

    name: str
    slot_init: Callable[[np.random.Generator, tuple[int, int]], list[np.ndarray]]
    ours: Callable[[Sequence[tf.Variable], tf.Tensor, tf.Tensor], tf.Tensor]
    stock: Callable[[Sequence[tf.Variable], tf.Tensor, tf.Tensor], tf.Operation]
    stock_allows_duplicates: bool = True


def _positive(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return rng.uniform(0.05, 2.0, size=shape).astype(F32)


def _stock_lazy_adam(v: Sequence[tf.Variable], g: tf.Tensor, i: tf.Tensor) -> tf.Operation:
    """Lazy Adam from stock ops, as tf.contrib's LazyAdamOptimizer wrote it."""
    lr, beta1, beta2, eps = (tf.constant(x) for x in ADAM_HYPER)
    m_new = beta1 * tf.gather(v[1], i) + (1 - beta1) * g
    v_new = beta2 * tf.gather(v[2], i) + (1 - beta2) * tf.square(g)
    update = lr * m_new / (tf.sqrt(v_new) + eps)
    with tf.control_dependencies([update]):  # every gather before any scatter
        return tf.group(
            v[1].scatter_update(tf.IndexedSlices(m_new, i)),
            v[2].scatter_update(tf.IndexedSlices(v_new, i)),
            v[0].scatter_sub(tf.IndexedSlices(update, i)),
        )


SGD_LR = F32(0.1)
ADAGRAD_LR = F32(0.05)
ADAM_HYPER = (F32(0.01), F32(0.9), F32(0.999), F32(1e-7))
FTRL = {"lr": F32(0.05), "l1": F32(0.01), "l2": F32(0.02)}
MOMENTUM = {"lr": F32(0.05), "momentum": F32(0.9)}
RMSPROP = {"lr": F32(0.01), "rho": F32(0.9), "momentum": F32(0.5), "epsilon": F32(1e-7)}
RMSPROP_NO_MOMENTUM = {**RMSPROP, "momentum": F32(0.0), "epsilon": F32(1e-10)}


def _momentum(use_nesterov: bool) -> Optimizer:
    return Optimizer(
        "momentum_nesterov" if use_nesterov else "momentum",
        lambda rng, shape: [rng.normal(size=shape).astype(F32)],
        lambda v, g, i: ec_ops.sparse_apply_momentum_with_delta(v[0], v[1], g, i, **MOMENTUM, use_nesterov=use_nesterov),
        lambda v, g, i: tf.raw_ops.ResourceSparseApplyMomentum(
            var=v[0].handle, accum=v[1].handle, grad=g, indices=i, use_nesterov=use_nesterov, **MOMENTUM
        ),
    )


def _rmsprop(name: str, hyper: dict[str, np.float32]) -> Optimizer:
    return Optimizer(
        name,
        lambda rng, shape: [_positive(rng, shape), rng.normal(size=shape).astype(F32)],
        lambda v, g, i: ec_ops.sparse_apply_rms_prop_with_delta(v[0], v[1], v[2], g, i, **hyper),
        lambda v, g, i: tf.raw_ops.ResourceSparseApplyRMSProp(
            var=v[0].handle, ms=v[1].handle, mom=v[2].handle, grad=g, indices=i, **hyper
        ),
    )


def _centered_rmsprop(name: str, hyper: dict[str, np.float32]) -> Optimizer:
    # mg^2 <= ms at the start keeps ms - mg^2 (and the rsqrt) positive: both moments decay alike.
    return Optimizer(
        name,
        lambda rng, shape: [
            (rng.normal(size=shape) * 0.1).astype(F32), _positive(rng, shape), rng.normal(size=shape).astype(F32)
        ],
        lambda v, g, i: ec_ops.sparse_apply_centered_rms_prop_with_delta(v[0], v[1], v[2], v[3], g, i, **hyper),
        lambda v, g, i: tf.raw_ops.ResourceSparseApplyCenteredRMSProp(
            var=v[0].handle, mg=v[1].handle, ms=v[2].handle, mom=v[3].handle, grad=g, indices=i, **hyper
        ),
    )


OPTIMIZERS = {
    "sgd": Optimizer(
        "sgd",
        lambda rng, shape: [],
        lambda v, g, i: ec_ops.sparse_apply_sgd_with_delta(v[0], g, i, SGD_LR),
        # GradientDescentOptimizer._resource_apply_sparse_duplicate_indices:
        lambda v, g, i: tf.raw_ops.ResourceScatterAdd(resource=v[0].handle, indices=i, updates=-g * SGD_LR),
    ),
    "adagrad": Optimizer(
        "adagrad",
        lambda rng, shape: [_positive(rng, shape)],
        lambda v, g, i: ec_ops.sparse_apply_adagrad_with_delta(v[0], v[1], g, i, ADAGRAD_LR),
        lambda v, g, i: tf.raw_ops.ResourceSparseApplyAdagrad(
            var=v[0].handle, accum=v[1].handle, lr=ADAGRAD_LR, grad=g, indices=i
        ),
    ),
    "adam": Optimizer(
        "adam",
        lambda rng, shape: [(rng.normal(size=shape) * 0.1).astype(F32), rng.uniform(0, 1, shape).astype(F32)],
        lambda v, g, i: ec_ops.sparse_apply_adam_with_delta(v[0], v[1], v[2], g, i, *ADAM_HYPER),
        _stock_lazy_adam,
        # gather/scatter_update keeps the last duplicate, it does not replay them.
        stock_allows_duplicates=False,
    ),
    "ftrl": Optimizer(
        "ftrl",
        lambda rng, shape: [_positive(rng, shape), rng.normal(size=shape).astype(F32)],
        lambda v, g, i: ec_ops.sparse_apply_ftrl_with_delta(v[0], v[1], v[2], g, i, lr_power=-0.5, **FTRL),
        lambda v, g, i: tf.raw_ops.ResourceSparseApplyFtrl(
            var=v[0].handle, accum=v[1].handle, linear=v[2].handle, grad=g, indices=i, lr_power=F32(-0.5), **FTRL
        ),
    ),
    "ftrl_v2": Optimizer(
        "ftrl_v2",
        lambda rng, shape: [_positive(rng, shape), rng.normal(size=shape).astype(F32)],
        lambda v, g, i: ec_ops.sparse_apply_ftrl_with_delta(
            v[0], v[1], v[2], g, i, lr_power=-0.5, l2_shrinkage=0.03, **FTRL
        ),
        lambda v, g, i: tf.raw_ops.ResourceSparseApplyFtrlV2(
            var=v[0].handle, accum=v[1].handle, linear=v[2].handle, grad=g, indices=i,
            l2_shrinkage=F32(0.03), lr_power=F32(-0.5), **FTRL,
        ),
    ),
    "ftrl_pow_mul": Optimizer(
        "ftrl_pow_mul",
        lambda rng, shape: [_positive(rng, shape), rng.normal(size=shape).astype(F32)],
        lambda v, g, i: ec_ops.sparse_apply_ftrl_with_delta(
            v[0], v[1], v[2], g, i, lr_power=-0.3, multiply_linear_by_lr=True, **FTRL
        ),
        lambda v, g, i: tf.raw_ops.ResourceSparseApplyFtrl(
            var=v[0].handle, accum=v[1].handle, linear=v[2].handle, grad=g, indices=i,
            lr_power=F32(-0.3), multiply_linear_by_lr=True, **FTRL,
        ),
    ),
    "momentum": _momentum(use_nesterov=False),
    "momentum_nesterov": _momentum(use_nesterov=True),
    "rmsprop": _rmsprop("rmsprop", RMSPROP),
    "rmsprop_no_momentum": _rmsprop("rmsprop_no_momentum", RMSPROP_NO_MOMENTUM),
    "centered_rmsprop": _centered_rmsprop("centered_rmsprop", RMSPROP),
    "centered_rmsprop_no_momentum": _centered_rmsprop("centered_rmsprop_no_momentum", RMSPROP_NO_MOMENTUM),
}

# Widths around Eigen's 8-float AVX packets (the stock kernels vectorize rows,
# with a scalar tail), 1 (the stock scalar path of Adagrad and FTRL; the
# Momentum and RMSProp kernels have none, Eigen's own tail does it) and a few
# large ones. Momentum's arithmetic rounds alike in packets and scalars, but
# its operation order still matters: it runs on the rounding widths too.
ROUNDING = (
    "adagrad", "ftrl", "ftrl_v2", "ftrl_pow_mul", "momentum", "momentum_nesterov",
    "rmsprop", "rmsprop_no_momentum", "centered_rmsprop", "centered_rmsprop_no_momentum",
)
ROUNDING_DIMS = [1, 2, 4, 5, 7, 8, 12, 16, 21, 64, 130, 1027]
EXACT_DIMS = [1, 16, 64, 130]
CASES = [(name, dim) for name in ROUNDING for dim in ROUNDING_DIMS] + [
    (name, dim) for name in ("sgd", "adam") for dim in EXACT_DIMS
]
# Variables of other ranks, which the stock kernels view as [rows, prod(rest)].
ROW_SHAPES = [(), (3, 5), (2, 2, 3)]


def _random_step(
    rng: np.random.Generator, row_shape: tuple[int, ...], duplicates: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Ids touching both edge rows (with repeats if asked), and gradients over 7 decades."""
    if duplicates:
        n = int(rng.integers(2, 2 * ROWS))
        ids = rng.integers(0, ROWS, size=n)
        ids[rng.integers(0, n)] = 0
        ids[rng.integers(0, n)] = ROWS - 1
    else:
        middle = rng.permutation(np.arange(1, ROWS - 1))[: int(rng.integers(0, ROWS - 1))]
        ids = rng.permutation(np.concatenate([[0, ROWS - 1], middle]))
    scale = 10.0 ** rng.uniform(-3, 4)
    grad = (rng.normal(size=(ids.size, *row_shape)) * scale).astype(F32)
    grad[rng.random(grad.shape) < 0.05] = 0.0
    return ids.astype(np.int64), grad


def _row_bits(tables: Sequence[np.ndarray]) -> np.ndarray:
    """[rows, tables * dim] int32: each row's tables side by side, as in a delta."""
    return np.concatenate([_bits(t).reshape(t.shape[0], -1) for t in tables], axis=1)


def _expected_delta(old: Sequence[np.ndarray], new: Sequence[np.ndarray], ids: np.ndarray) -> np.ndarray:
    old_bits = _row_bits(old)
    new_bits = _row_bits(new)
    expected = np.zeros((ids.size, old_bits.shape[1]), dtype=np.int32)
    seen: set[int] = set()
    for position, row in enumerate(ids):
        if int(row) not in seen:
            seen.add(int(row))
            expected[position] = old_bits[row] ^ new_bits[row]
    return expected


def _assert_delta(old: Sequence[np.ndarray], new: Sequence[np.ndarray], ids: np.ndarray, delta: np.ndarray) -> None:
    np.testing.assert_array_equal(delta, _expected_delta(old, new, ids))
    folded = _row_bits(old)
    np.bitwise_xor.at(folded, ids, delta)
    np.testing.assert_array_equal(folded, _row_bits(new))


def _run_twins(
    optimizer: Optimizer, row_shape: tuple[int, ...], seed: int, steps: int, index_dtype: tf.DType = tf.int64
) -> None:
    rng = np.random.default_rng(seed)
    shape = (ROWS, *row_shape)
    init = [rng.normal(size=shape).astype(F32)] + optimizer.slot_init(rng, shape)
    graph = tf.Graph()
    with graph.as_default():
        stock_vars = [tf.Variable(value) for value in init]
        our_vars = [tf.Variable(value) for value in init]
        grad = V1.placeholder(tf.float32, [None, *row_shape])
        ids = V1.placeholder(index_dtype, [None])
        stock_step = optimizer.stock(stock_vars, grad, ids)
        delta = optimizer.ours(our_vars, grad, ids)
        assert delta.shape.as_list() == [None, len(init) * int(np.prod(row_shape))]
        read_stock = [v.read_value() for v in stock_vars]
        read_ours = [v.read_value() for v in our_vars]
        init_op = V1.global_variables_initializer()
    with _session(graph) as sess:
        sess.run(init_op)
        for _ in range(steps):
            step_ids, step_grad = _random_step(rng, row_shape, optimizer.stock_allows_duplicates)
            feed = {grad: step_grad, ids: step_ids.astype(index_dtype.as_numpy_dtype)}
            old = sess.run(read_ours)
            sess.run(stock_step, feed)
            step_delta = sess.run(delta, feed)
            new, expected = sess.run([read_ours, read_stock])
            for table, ours, stock in zip(range(len(init)), new, expected):
                np.testing.assert_array_equal(
                    _bits(ours), _bits(stock), err_msg=f"{optimizer.name} rows {row_shape} table {table}"
                )
            _assert_delta(old, new, step_ids, step_delta)


@pytest.mark.parametrize("name,dim", CASES)
def test_apply_matches_stock_bit_for_bit_and_delta_is_old_xor_new(name: str, dim: int) -> None:
    _run_twins(OPTIMIZERS[name], (dim,), seed=dim * 1009 + len(name), steps=12)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("row_shape", ROW_SHAPES)
def test_variables_of_any_rank(name: str, row_shape: tuple[int, ...]) -> None:
    _run_twins(OPTIMIZERS[name], row_shape, seed=len(row_shape), steps=4)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_int32_indices(name: str) -> None:
    _run_twins(OPTIMIZERS[name], (9,), seed=7, steps=3, index_dtype=tf.int32)


def test_lazy_adam_replays_duplicate_ids_in_order() -> None:
    rng = np.random.default_rng(3)
    lr, beta1, beta2, eps = ADAM_HYPER
    var, m, v = rng.normal(size=(3, 4, 10)).astype(F32)
    v = np.abs(v)
    ids = np.array([2, 0, 2, 3, 2], dtype=np.int64)
    grad = rng.normal(size=(5, 10)).astype(F32)
    variables = [tf.Variable(var), tf.Variable(m), tf.Variable(v)]
    delta = ec_ops.sparse_apply_adam_with_delta(*variables, grad, ids, lr, beta1, beta2, eps).numpy()
    old = [var.copy(), m.copy(), v.copy()]
    with np.errstate(all="raise"):
        for position, row in enumerate(ids):  # float32 NumPy: every operation correctly rounded
            g = grad[position]
            m[row] = beta1 * m[row] + (F32(1) - beta1) * g
            v[row] = beta2 * v[row] + (F32(1) - beta2) * np.square(g)
            var[row] = var[row] - lr * m[row] / (np.sqrt(v[row]) + eps)
    new = [t.numpy() for t in variables]
    for ours, expected in zip(new, [var, m, v]):
        np.testing.assert_array_equal(_bits(ours), _bits(expected))
    _assert_delta(old, new, ids, delta)
    assert not delta[2].any() and not delta[4].any()


# Large steps, beyond the 11-row tables above: (table rows, ids per step, row width, repeats).
# The op finds repeats with a bitmap of the table's rows when it is small next
# to the ids, else with a hash set; and splits steps worth more than one
# thread into shards of rows.
LARGE_STEPS = {
    "bitmap_repeats_sharded": (64, 6000, 16, True),
    "bitmap_distinct_sharded": (20_000, 5000, 16, False),
    "hash_repeats": (200_000, 1000, 4, True),
    "hash_distinct": (200_000, 1000, 4, False),
}


def check_large_steps() -> None:
    """Every LARGE_STEPS case and optimizer: ours on two intra-op threads, stock on one.

    The stock ops race on repeated ids when they have more than one thread.
    Run by the fresh_process fixture, which gives each session its own pool.
    """
    config = V1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=1)
    for case, (rows, n, dim, repeats) in sorted(LARGE_STEPS.items()):
        for name in ("sgd", "adagrad", "ftrl_v2", "centered_rmsprop"):
            optimizer = OPTIMIZERS[name]
            rng = np.random.default_rng(n + dim)
            init = [rng.normal(size=(rows, dim)).astype(F32)] + optimizer.slot_init(rng, (rows, dim))
            graph = tf.Graph()
            with graph.as_default():
                variables = [tf.Variable(value) for value in init]
                grad = V1.placeholder(tf.float32, [None, dim])
                ids = V1.placeholder(tf.int64, [None])
                stock_step = optimizer.stock(variables, grad, ids)
                delta = optimizer.ours(variables, grad, ids)
                read = [v.read_value() for v in variables]
                init_op = V1.global_variables_initializer()
            # Each session has its own copy of the variables.
            with _session(graph) as stock, V1.Session(graph=graph, config=config) as ours:
                stock.run(init_op)
                ours.run(init_op)
                for _ in range(2):
                    if repeats:  # a few hundred hot rows, each repeated many times
                        step_ids = rng.choice(rng.choice(rows, size=min(rows, 300), replace=False), size=n)
                    else:
                        step_ids = rng.choice(rows, size=n, replace=False)
                    feed = {grad: rng.normal(size=(n, dim)).astype(F32), ids: step_ids}
                    old = ours.run(read)
                    stock.run(stock_step, feed)
                    step_delta = ours.run(delta, feed)
                    new, expected = ours.run(read), stock.run(read)
                    for table, (ours_value, stock_value) in enumerate(zip(new, expected)):
                        np.testing.assert_array_equal(
                            _bits(ours_value), _bits(stock_value), err_msg=f"{case} {name} table {table}"
                        )
                    _assert_delta(old, new, step_ids, step_delta)


def test_large_steps_on_two_threads_match_stock_on_one(fresh_process) -> None:
    fresh_process("unit.test_ops:check_large_steps")


# --- against the v1 optimizers themselves --------------------------------------------------


V1_OPTIMIZERS = {
    "sgd": (lambda: V1.train.GradientDescentOptimizer(0.1), [], lambda v, g, i: ec_ops.sparse_apply_sgd_with_delta(
        v[0], g, i, 0.1)),
    "adagrad": (lambda: V1.train.AdagradOptimizer(0.05), ["accumulator"],
                lambda v, g, i: ec_ops.sparse_apply_adagrad_with_delta(v[0], v[1], g, i, 0.05)),
    "ftrl": (lambda: V1.train.FtrlOptimizer(0.05, l1_regularization_strength=0.01, l2_regularization_strength=0.02),
             ["accum", "linear"],
             lambda v, g, i: ec_ops.sparse_apply_ftrl_with_delta(v[0], v[1], v[2], g, i, 0.05, 0.01, 0.02, -0.5)),
    "ftrl_shrinkage": (
        lambda: V1.train.FtrlOptimizer(0.05, l1_regularization_strength=0.01, l2_regularization_strength=0.02,
                                       l2_shrinkage_regularization_strength=0.03),
        ["accum", "linear"],
        lambda v, g, i: ec_ops.sparse_apply_ftrl_with_delta(
            v[0], v[1], v[2], g, i, 0.05, 0.01, 0.02, -0.5, l2_shrinkage=0.03)),
    "momentum": (lambda: V1.train.MomentumOptimizer(0.05, 0.9), ["momentum"],
                 lambda v, g, i: ec_ops.sparse_apply_momentum_with_delta(v[0], v[1], g, i, 0.05, 0.9)),
    "momentum_nesterov": (
        lambda: V1.train.MomentumOptimizer(0.05, 0.9, use_nesterov=True), ["momentum"],
        lambda v, g, i: ec_ops.sparse_apply_momentum_with_delta(v[0], v[1], g, i, 0.05, 0.9, use_nesterov=True)),
    # The optimizer's defaults: decay 0.9, momentum 0, epsilon 1e-10; its "rms" slot starts at ones.
    "rmsprop": (lambda: V1.train.RMSPropOptimizer(0.01), ["rms", "momentum"],
                lambda v, g, i: ec_ops.sparse_apply_rms_prop_with_delta(v[0], v[1], v[2], g, i, 0.01)),
    "rmsprop_momentum": (
        lambda: V1.train.RMSPropOptimizer(0.01, decay=0.8, momentum=0.5, epsilon=1e-6), ["rms", "momentum"],
        lambda v, g, i: ec_ops.sparse_apply_rms_prop_with_delta(v[0], v[1], v[2], g, i, 0.01, 0.8, 0.5, 1e-6)),
    "rmsprop_centered": (
        lambda: V1.train.RMSPropOptimizer(0.01, momentum=0.5, centered=True), ["mg", "rms", "momentum"],
        lambda v, g, i: ec_ops.sparse_apply_centered_rms_prop_with_delta(
            v[0], v[1], v[2], v[3], g, i, 0.01, momentum=0.5)),
    "rmsprop_centered_no_momentum": (
        lambda: V1.train.RMSPropOptimizer(0.01, centered=True), ["mg", "rms", "momentum"],
        lambda v, g, i: ec_ops.sparse_apply_centered_rms_prop_with_delta(v[0], v[1], v[2], v[3], g, i, 0.01)),
}


@pytest.mark.parametrize("name", sorted(V1_OPTIMIZERS))
@pytest.mark.parametrize("dim", [1, 13])
def test_apply_matches_v1_optimizer(name: str, dim: int) -> None:
    make_optimizer, slot_names, ours = V1_OPTIMIZERS[name]
    rng = np.random.default_rng(dim)
    init = rng.normal(size=(ROWS, dim)).astype(F32)
    graph = tf.Graph()
    with graph.as_default():
        stock_var = tf.Variable(init)
        grad = V1.placeholder(tf.float32, [None, dim])
        ids = V1.placeholder(tf.int64, [None])
        optimizer = make_optimizer()
        train = optimizer.apply_gradients([(tf.IndexedSlices(grad, ids, tf.constant([ROWS, dim], tf.int64)), stock_var)])
        stock = [stock_var] + [optimizer.get_slot(stock_var, slot) for slot in slot_names]
        # Our variables start from the optimizer's own initial slot values.
        our_vars = [tf.Variable(v.initial_value) for v in stock]
        delta = ours(our_vars, grad, ids)
        init_op = V1.global_variables_initializer()
    with _session(graph) as sess:
        sess.run(init_op)
        for _ in range(8):
            step_ids, step_grad = _random_step(rng, (dim,), duplicates=False)
            step_grad[step_grad == 0] = 1.0  # the optimizers' dedup turns -0.0 into +0.0
            sess.run(train, {grad: step_grad, ids: step_ids})
            sess.run(delta, {grad: step_grad, ids: step_ids})
            for ours_value, stock_value in zip(sess.run(our_vars), sess.run(stock)):
                np.testing.assert_array_equal(_bits(ours_value), _bits(stock_value))


# --- shapes, errors and a process that survives them ----------------------------------------


def test_shape_inference() -> None:
    graph = tf.Graph()
    with graph.as_default():
        var, accum = tf.Variable(tf.zeros([5, 3])), tf.Variable(tf.ones([5, 3]))
        delta = ec_ops.sparse_apply_adagrad_with_delta(var, accum, tf.zeros([4, 3]), tf.constant([0, 1, 2, 3]), 0.1)
        assert delta.shape.as_list() == [4, 6]
        assert delta.dtype == tf.int32
        with pytest.raises(ValueError):  # grad rank 1
            ec_ops.sparse_apply_adagrad_with_delta(var, accum, tf.zeros([3]), tf.constant([0]), 0.1)
        with pytest.raises(ValueError):  # grad width 4 against a [5, 3] variable
            ec_ops.sparse_apply_adagrad_with_delta(var, accum, tf.zeros([1, 4]), tf.constant([0]), 0.1)
        with pytest.raises(ValueError):  # 2 gradient rows, 3 ids
            ec_ops.sparse_apply_sgd_with_delta(var, tf.zeros([2, 3]), tf.constant([0, 1, 2]), 0.1)
        with pytest.raises(TypeError):
            ec_ops.sparse_apply_sgd_with_delta(tf.zeros([5, 3]), tf.zeros([1, 3]), [0], 0.1)


def test_runtime_errors_leave_variables_untouched_and_the_process_alive() -> None:
    graph = tf.Graph()
    with graph.as_default():
        init = np.arange(12, dtype=F32).reshape(4, 3)
        var, accum = tf.Variable(init), tf.Variable(np.ones((4, 3), F32))
        tall_accum = tf.Variable(np.ones((5, 3), F32))
        linear = tf.Variable(np.zeros((4, 3), F32))
        doubles = tf.Variable(np.ones((4, 3)))
        uninitialized = tf.Variable(np.ones((4, 3), F32))
        grad = V1.placeholder(tf.float32, None)
        ids = V1.placeholder(tf.int64, None)
        lr = V1.placeholder(tf.float32, None)
        adagrad = ec_ops.sparse_apply_adagrad_with_delta(var, accum, grad, ids, lr)
        bad_slot_shape = ec_ops.sparse_apply_adagrad_with_delta(var, tall_accum, grad, ids, 0.1)
        wrong_dtype = ec_ops.sparse_apply_adagrad_with_delta(var, doubles, grad, ids, 0.1)
        aliased = ec_ops.sparse_apply_adagrad_with_delta(var, var, grad, ids, 0.1)
        not_ready = ec_ops.sparse_apply_sgd_with_delta(uninitialized, grad, ids, 0.1)
        ftrl = ec_ops.sparse_apply_ftrl_with_delta(var, accum, linear, grad, ids, lr)
        init_op = V1.variables_initializer([var, accum, tall_accum, linear, doubles])
    good = {grad: np.ones((2, 3), F32), ids: [0, 3], lr: 0.1}
    bad_feeds = [
        ({ids: [0, 4]}, "out of range"),
        ({ids: [-1, 0]}, "out of range"),
        ({grad: np.ones((2, 4), F32)}, "rows have shape"),
        ({grad: np.ones((2, 3, 1), F32)}, "rows have shape"),
        ({grad: np.ones((3, 3), F32)}, "one row per id"),
        ({grad: np.ones(3, F32)}, "one row per id"),
        ({grad: np.float32(1)}, "one row per id"),
        ({ids: [[0, 1]]}, "vector"),
        ({lr: [0.1, 0.2]}, "scalar"),
    ]
    with _session(graph) as sess:
        sess.run(init_op)
        for override, message in bad_feeds:
            with pytest.raises(tf.errors.InvalidArgumentError, match=message):
                sess.run(adagrad, {**good, **override})
        for fetch, message in [(bad_slot_shape, "shape"), (wrong_dtype, "float"), (aliased, "same variable")]:
            with pytest.raises(tf.errors.InvalidArgumentError, match=message):
                sess.run(fetch, good)
        with pytest.raises(tf.errors.FailedPreconditionError):
            sess.run(not_ready, good)
        with pytest.raises(tf.errors.InvalidArgumentError, match="lr"):
            sess.run(ftrl, {**good, lr: -1.0})
        np.testing.assert_array_equal(sess.run(var), init)
        np.testing.assert_array_equal(sess.run(accum), np.ones((4, 3), F32))
        # The session and the variables still work.
        delta = sess.run(adagrad, good)
        assert delta.shape == (2, 6) and delta.any()


def test_empty_update_is_a_no_op() -> None:
    var, accum = tf.Variable(tf.ones([3, 2])), tf.Variable(tf.ones([3, 2]))
    delta = ec_ops.sparse_apply_adagrad_with_delta(var, accum, tf.zeros([0, 2]), tf.zeros([0], tf.int64), 0.1)
    assert delta.shape == (0, 4)
    np.testing.assert_array_equal(var.numpy(), np.ones((3, 2)))


# --- loader ------------------------------------------------------------------------------------


def test_build_info_of_the_built_library_matches_installed_tensorflow() -> None:
    info = ec_ops.read_build_info(os.path.join(ec_ops.LIBRARY_DIR, ec_ops.BUILD_INFO_NAME))
    assert info.tf_version == tf.__version__
    assert len(info.source_hash) == 64
    ec_ops.check_build_info(info)


def test_mismatching_build_info_raises_with_the_fix() -> None:
    fake = ec_ops.BuildInfo(tf_version="2.14.0", source_hash="0" * 64, path="fake/_build_info.py")
    with pytest.raises(OpLibraryError, match=r"built for TensorFlow 2\.14\.0.*2\.15\.1.*python ops/build\.py"):
        ec_ops.check_build_info(fake, installed_tf_version="2.15.1")
    with pytest.raises(ImportError):  # OpLibraryError is an ImportError too
        ec_ops.check_build_info(fake, installed_tf_version="2.15.1")
    ec_ops.check_build_info(fake, installed_tf_version="2.14.0")


def test_loader_rejects_missing_stale_and_broken_libraries(tmp_path) -> None:
    with pytest.raises(OpLibraryError, match=r"missing.*python ops/build.py"):
        ec_ops.load_library(str(tmp_path))
    (tmp_path / ec_ops.LIBRARY_NAME).write_bytes(b"not an ELF file")
    with pytest.raises(OpLibraryError, match="build info"):
        ec_ops.load_library(str(tmp_path))
    info = tmp_path / ec_ops.BUILD_INFO_NAME
    info.write_text('TF_VERSION = "1.15.0"\nSOURCE_HASH = "abc"\n')
    with pytest.raises(OpLibraryError, match=r"built for TensorFlow 1.15.0"):
        ec_ops.load_library(str(tmp_path))
    info.write_text(f'TF_VERSION = "{tf.__version__}"\nSOURCE_HASH = "abc"\n')
    with pytest.raises(OpLibraryError, match="could not load"):
        ec_ops.load_library(str(tmp_path))


def test_library_is_loaded_once() -> None:
    assert ec_ops.load_library() is ec_ops.load_library()
