"""Sparse optimizer updates that return the bitwise change they made.

A training step on a PS-held table, in graph mode::

    delta = sparse_apply_adagrad_with_delta(table, accum, grad, ids, lr)
    fold = parity_update(parity, parity_rows, delta, coef=code.coef(p, j))

``delta`` holds, per touched row, ``old ^ new`` of the table row and its
optimizer-slot rows as int32 words, taken under the variables' locks in the
same kernel that applies the update. Folding it into parity (times the code
coefficient of the chunk, :mod:`tf_ecrec.ops.parity`) keeps the parity equal
to the code of the data. The two ops are separate so that parity can live on
another PS; running the fold after the apply is the caller's job (e.g. a
control dependency). Both ops validate everything before they write: a
failing op changes nothing.

In the deltas, ``dim`` is the number of elements in a row of the variable
(``prod(var.shape[1:])``), and the row's tables follow each other: var, then
the slots in argument order.

Each apply op writes the same bits as the stock TensorFlow 2.15 kernel of its
optimizer (see ``ops/cc/kernels/optimizer_rules.h``); Adam is the "lazy"
variant, since TensorFlow has no sparse Adam kernel. Momentum and RMSProp,
whose rules keep a momentum slot, are in :mod:`tf_ecrec.ops.apply_momentum`. With ``log=``, ``sid=``
and ``target=`` a wrapper runs the op's ``...Logged`` variant, which also
appends the delta to a delta log (:mod:`tf_ecrec.ops.delta_log_ops`).

Arguments every apply wrapper takes:

    grad: float32 ``[n, ...]``, one row (shaped like ``var``'s) per id.
    indices: int32 or int64 ``[n]`` row ids in ``[0, rows)``; may repeat
        (occurrences apply one after another in input order).
    name: Op name.
    log: A delta log handle on ``var``'s device
        (:func:`~tf_ecrec.ops.delta_log_ops.delta_log`): run the logged
        variant, which also appends the delta of each distinct row to it.
    sid: int64 step id of the logged update (with ``log``).
    target: int32 id (>= 0) of ``var`` and its slots (with ``log``).
    bypass_fence: Apply even if ``sid`` is fenced or committed in the log
        (recovery finishing a step); otherwise such an update fails with
        ``tf.errors.AbortedError`` and changes nothing.

Every wrapper raises ``tf.errors.InvalidArgumentError`` at run time for
out-of-range ids or mismatched shapes (also at graph build time when shapes
are static), and ``ValueError`` for ``sid``, ``target`` or ``bypass_fence``
without ``log`` or ``log`` without ``sid`` and ``target``.
"""

from __future__ import annotations

import numbers
from typing import Any

import tensorflow as tf

from tf_ecrec.ops._inputs import (
    FloatLike,
    IntLike,
    VariableLike,
    float_tensor,
    index_tensor,
    log_inputs,
    resource_handle,
)
from tf_ecrec.ops.loader import call_op

__all__ = [
    "lazy_adam_learning_rate",
    "sparse_apply_adagrad_with_delta",
    "sparse_apply_adam_with_delta",
    "sparse_apply_ftrl_with_delta",
    "sparse_apply_sgd_with_delta",
]


def sparse_apply_sgd_with_delta(
    var: VariableLike,
    grad: tf.Tensor,
    indices: tf.Tensor,
    lr: FloatLike,
    name: str | None = None,
    *,
    log: tf.Tensor | None = None,
    sid: IntLike | None = None,
    target: IntLike | None = None,
    bypass_fence: bool = False,
) -> tf.Tensor:
    """SGD on the rows ``indices`` of ``var``; returns the bitwise delta.

    ``var[indices[i]] += (-grad[i]) * lr`` for each ``i`` in order, the same
    bits as ``tf.compat.v1.train.GradientDescentOptimizer`` on a resource
    variable (``ResourceScatterAdd``).

    Args:
        var: float32 resource variable ``[rows, ...]``, e.g. a table ``[rows, dim]``.
        lr: Learning rate, float32 scalar.
        grad, indices, name, log, sid, target, bypass_fence: See the module
            docstring.

    Returns:
        int32 ``[n, dim]``: ``bitcast(old) ^ bitcast(new)`` of each touched row
        at its first occurrence in ``indices``, zeros at later occurrences.
    """
    return apply_op(
        "ec_rec_sparse_apply_sgd_with_delta",
        log_inputs(log, sid, target, bypass_fence),
        {"var": var},
        {"lr": lr},
        grad,
        indices,
        name,
    )


def sparse_apply_adagrad_with_delta(
    var: VariableLike,
    accum: VariableLike,
    grad: tf.Tensor,
    indices: tf.Tensor,
    lr: FloatLike,
    name: str | None = None,
    *,
    log: tf.Tensor | None = None,
    sid: IntLike | None = None,
    target: IntLike | None = None,
    bypass_fence: bool = False,
) -> tf.Tensor:
    """Adagrad on the rows ``indices``; returns the bitwise delta of var and accum.

    Per occurrence: ``accum += grad**2; var -= lr * grad * rsqrt(accum)``, the
    same bits as ``ResourceSparseApplyAdagrad`` (``update_slots=True``, the
    kernel of ``tf.compat.v1.train.AdagradOptimizer``).

    Args:
        var: float32 resource variable ``[rows, ...]``, e.g. a table ``[rows, dim]``.
        accum: Its accumulator slot, shaped like ``var``.
        lr: Learning rate, float32 scalar.
        grad, indices, name, log, sid, target, bypass_fence: See the module
            docstring.

    Returns:
        int32 ``[n, 2 * dim]``: ``[var | accum]`` old ^ new bits at the first
        occurrence of each id, zeros at later occurrences.
    """
    return apply_op(
        "ec_rec_sparse_apply_adagrad_with_delta",
        log_inputs(log, sid, target, bypass_fence),
        {"var": var, "accum": accum},
        {"lr": lr},
        grad,
        indices,
        name,
    )


def lazy_adam_learning_rate(lr: FloatLike, beta1_power: FloatLike, beta2_power: FloatLike) -> tf.Tensor:
    """Bias-corrected rate ``lr * sqrt(1 - beta2^t) / (1 - beta1^t)``.

    Computed with the same float32 ops, in the same order, as
    ``tf.compat.v1.train.AdamOptimizer`` and ``LazyAdamOptimizer``.
    """
    lr = float_tensor(lr, "lr")
    beta1_power = float_tensor(beta1_power, "beta1_power")
    beta2_power = float_tensor(beta2_power, "beta2_power")
    return lr * tf.sqrt(1 - beta2_power) / (1 - beta1_power)


def sparse_apply_adam_with_delta(
    var: VariableLike,
    m: VariableLike,
    v: VariableLike,
    grad: tf.Tensor,
    indices: tf.Tensor,
    lr: FloatLike,
    beta1: FloatLike = 0.9,
    beta2: FloatLike = 0.999,
    epsilon: FloatLike = 1e-8,
    name: str | None = None,
    *,
    log: tf.Tensor | None = None,
    sid: IntLike | None = None,
    target: IntLike | None = None,
    bypass_fence: bool = False,
) -> tf.Tensor:
    """Lazy Adam on the rows ``indices``; returns the bitwise delta of var, m, v.

    TensorFlow has no sparse Adam kernel (v1 ``AdamOptimizer`` decays all rows
    of ``m`` and ``v`` every step). This is lazy Adam, as
    ``tf.contrib.opt.LazyAdamOptimizer`` and ``tfa.optimizers.LazyAdam``: per
    occurrence, on the touched rows only::

        m = beta1 * m + (1 - beta1) * grad
        v = beta2 * v + (1 - beta2) * grad**2
        var -= lr * m / (sqrt(v) + epsilon)

    bit-identical to that formula written with stock ops (gather, math,
    scatter). ``lr`` must already be bias-corrected; see
    :func:`lazy_adam_learning_rate`. The caller keeps ``beta1^t`` and
    ``beta2^t`` (for example as non-slot variables, advanced once per step).
    To match the optimizers, deduplicate ``indices`` first, summing gradients.

    Args:
        var: float32 resource variable ``[rows, ...]``, e.g. a table ``[rows, dim]``.
        m: First-moment slot, shaped like ``var``.
        v: Second-moment slot, shaped like ``var``.
        lr: Bias-corrected learning rate, float32 scalar.
        beta1: float32 scalar.
        beta2: float32 scalar.
        epsilon: float32 scalar.
        grad, indices, name, log, sid, target, bypass_fence: See the module
            docstring.

    Returns:
        int32 ``[n, 3 * dim]``: ``[var | m | v]`` old ^ new bits at the first
        occurrence of each id, zeros at later occurrences.
    """
    return apply_op(
        "ec_rec_sparse_apply_lazy_adam_with_delta",
        log_inputs(log, sid, target, bypass_fence),
        {"var": var, "m": m, "v": v},
        {"lr": lr, "beta1": beta1, "beta2": beta2, "epsilon": epsilon},
        grad,
        indices,
        name,
    )


def sparse_apply_ftrl_with_delta(
    var: VariableLike,
    accum: VariableLike,
    linear: VariableLike,
    grad: tf.Tensor,
    indices: tf.Tensor,
    lr: FloatLike,
    l1: FloatLike = 0.0,
    l2: FloatLike = 0.0,
    lr_power: FloatLike = -0.5,
    l2_shrinkage: FloatLike | None = None,
    multiply_linear_by_lr: bool = False,
    name: str | None = None,
    *,
    log: tf.Tensor | None = None,
    sid: IntLike | None = None,
    target: IntLike | None = None,
    bypass_fence: bool = False,
) -> tf.Tensor:
    """FTRL-Proximal on the rows ``indices``; returns the bitwise delta.

    The same bits as ``ResourceSparseApplyFtrl``, or ``ResourceSparseApplyFtrlV2``
    when ``l2_shrinkage`` is a tensor or a positive number; this is the choice
    ``tf.compat.v1.train.FtrlOptimizer`` makes for
    ``l2_shrinkage_regularization_strength``.

    Args:
        var: float32 resource variable ``[rows, ...]``, e.g. a table ``[rows, dim]``.
        accum: Accumulator slot, shaped like ``var``.
        linear: Linear slot, shaped like ``var``.
        lr: Positive learning rate.
        l1: Non-negative L1 regularization strength.
        l2: Non-negative L2 regularization strength.
        lr_power: Non-positive learning rate power.
        l2_shrinkage: Non-negative L2 shrinkage strength, or ``None``.
        multiply_linear_by_lr: The stock kernels' attribute of that name.
        grad, indices, name, log, sid, target, bypass_fence: See the module
            docstring.

    Returns:
        int32 ``[n, 3 * dim]``: ``[var | accum | linear]`` old ^ new bits at
        the first occurrence of each id, zeros at later occurrences.
    """
    hyper = {"lr": lr, "l1": l1, "l2": l2, "lr_power": lr_power}
    op = "ec_rec_sparse_apply_ftrl_with_delta"
    if l2_shrinkage is not None and not (isinstance(l2_shrinkage, numbers.Real) and l2_shrinkage <= 0):
        hyper["l2_shrinkage"] = l2_shrinkage
        op = "ec_rec_sparse_apply_ftrl_v2_with_delta"
    return apply_op(
        op,
        log_inputs(log, sid, target, bypass_fence),
        {"var": var, "accum": accum, "linear": linear},
        hyper,
        grad,
        indices,
        name,
        multiply_linear_by_lr=multiply_linear_by_lr,
    )


def apply_op(
    op: str,
    logged: dict[str, Any] | None,
    tables: dict[str, VariableLike],
    hyper: dict[str, FloatLike],
    grad: tf.Tensor,
    indices: tf.Tensor,
    name: str | None,
    **attrs: Any,
) -> tf.Tensor:
    """Builds apply op ``op`` (or, with ``logged``, its logged variant) from the wrappers' arguments.

    Shared by the wrappers of this module and of :mod:`tf_ecrec.ops.apply_momentum`.

    Args:
        op: The generated function of the unlogged op.
        logged: :func:`~tf_ecrec.ops._inputs.log_inputs` of the call.
        tables: ``var`` and its slots by input name.
        hyper: The float32 scalar hyperparameters by input name.
        grad: The gradient rows.
        indices: The row ids.
        name: Op name.
        **attrs: The op's own attrs.
    """
    return call_op(
        op,
        logged,
        **{key: resource_handle(table, key) for key, table in tables.items()},
        **{key: float_tensor(value, key) for key, value in hyper.items()},
        grad=tf.convert_to_tensor(grad, dtype=tf.float32, name="grad"),
        indices=index_tensor(indices, "indices"),
        name=name,
        **attrs,
    )
