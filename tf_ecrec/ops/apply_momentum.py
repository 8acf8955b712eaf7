"""Momentum and RMSProp updates that return the bitwise change they made.

The apply ops of the rules that keep a momentum slot, with the contract of
:mod:`tf_ecrec.ops.apply` (its module docstring describes the delta and the
arguments every wrapper takes: ``grad``, ``indices``, ``name``, ``log``,
``sid``, ``target``, ``bypass_fence``). Each takes its variables and
hyperparameters in the order of its stock twin and writes the same bits
(``ops/cc/kernels/momentum_rules.h``):

    sparse_apply_momentum_with_delta              ResourceSparseApplyMomentum
    sparse_apply_rms_prop_with_delta              ResourceSparseApplyRMSProp
    sparse_apply_centered_rms_prop_with_delta     ResourceSparseApplyCenteredRMSProp

the sparse paths of ``tf.compat.v1.train.MomentumOptimizer`` and
``RMSPropOptimizer`` (``centered`` False and True).
"""

from __future__ import annotations

import tensorflow as tf

from tf_ecrec.ops._inputs import FloatLike, IntLike, VariableLike, log_inputs
from tf_ecrec.ops.apply import apply_op

__all__ = [
    "sparse_apply_centered_rms_prop_with_delta",
    "sparse_apply_momentum_with_delta",
    "sparse_apply_rms_prop_with_delta",
]


def sparse_apply_momentum_with_delta(
    var: VariableLike,
    accum: VariableLike,
    grad: tf.Tensor,
    indices: tf.Tensor,
    lr: FloatLike,
    momentum: FloatLike,
    use_nesterov: bool = False,
    name: str | None = None,
    *,
    log: tf.Tensor | None = None,
    sid: IntLike | None = None,
    target: IntLike | None = None,
    bypass_fence: bool = False,
) -> tf.Tensor:
    """Momentum on the rows ``indices``; returns the bitwise delta of var and accum.

    Per occurrence: ``accum = accum * momentum + grad``, then
    ``var -= lr * accum`` (or, with ``use_nesterov``,
    ``var -= lr * grad + lr * momentum * accum``), the same bits as
    ``ResourceSparseApplyMomentum``.

    Args:
        var: float32 resource variable ``[rows, ...]``, e.g. a table ``[rows, dim]``.
        accum: Its momentum slot, shaped like ``var``.
        lr: Learning rate, float32 scalar.
        momentum: float32 scalar.
        use_nesterov: The stock kernel's attribute of that name.
        grad, indices, name, log, sid, target, bypass_fence: See
            :mod:`tf_ecrec.ops.apply`.

    Returns:
        int32 ``[n, 2 * dim]``: ``[var | accum]`` old ^ new bits at the first
        occurrence of each id, zeros at later occurrences.
    """
    return apply_op(
        "ec_rec_sparse_apply_momentum_with_delta",
        log_inputs(log, sid, target, bypass_fence),
        {"var": var, "accum": accum},
        {"lr": lr, "momentum": momentum},
        grad,
        indices,
        name,
        use_nesterov=bool(use_nesterov),
    )


def sparse_apply_rms_prop_with_delta(
    var: VariableLike,
    ms: VariableLike,
    mom: VariableLike,
    grad: tf.Tensor,
    indices: tf.Tensor,
    lr: FloatLike,
    rho: FloatLike = 0.9,
    momentum: FloatLike = 0.0,
    epsilon: FloatLike = 1e-10,
    name: str | None = None,
    *,
    log: tf.Tensor | None = None,
    sid: IntLike | None = None,
    target: IntLike | None = None,
    bypass_fence: bool = False,
) -> tf.Tensor:
    """RMSProp on the rows ``indices``; returns the bitwise delta of var, ms and mom.

    Per occurrence::

        ms = ms * rho + grad**2 * (1 - rho)
        mom = mom * momentum + rsqrt(ms + epsilon) * lr * grad
        var -= mom

    the same bits as ``ResourceSparseApplyRMSProp``. The defaults are those of
    ``tf.compat.v1.train.RMSPropOptimizer`` (``rho`` is its ``decay``).

    Args:
        var: float32 resource variable ``[rows, ...]``, e.g. a table ``[rows, dim]``.
        ms: Mean-square slot, shaped like ``var`` (the optimizer starts it at ones).
        mom: Momentum slot, shaped like ``var``.
        lr: Learning rate, float32 scalar.
        rho: Decay of ``ms``, float32 scalar.
        momentum: float32 scalar.
        epsilon: float32 scalar.
        grad, indices, name, log, sid, target, bypass_fence: See
            :mod:`tf_ecrec.ops.apply`.

    Returns:
        int32 ``[n, 3 * dim]``: ``[var | ms | mom]`` old ^ new bits at the
        first occurrence of each id, zeros at later occurrences.
    """
    return apply_op(
        "ec_rec_sparse_apply_rms_prop_with_delta",
        log_inputs(log, sid, target, bypass_fence),
        {"var": var, "ms": ms, "mom": mom},
        {"lr": lr, "rho": rho, "momentum": momentum, "epsilon": epsilon},
        grad,
        indices,
        name,
    )


def sparse_apply_centered_rms_prop_with_delta(
    var: VariableLike,
    mg: VariableLike,
    ms: VariableLike,
    mom: VariableLike,
    grad: tf.Tensor,
    indices: tf.Tensor,
    lr: FloatLike,
    rho: FloatLike = 0.9,
    momentum: FloatLike = 0.0,
    epsilon: FloatLike = 1e-10,
    name: str | None = None,
    *,
    log: tf.Tensor | None = None,
    sid: IntLike | None = None,
    target: IntLike | None = None,
    bypass_fence: bool = False,
) -> tf.Tensor:
    """Centered RMSProp on the rows ``indices``; returns the bitwise delta of var, mg, ms and mom.

    Per occurrence::

        ms = ms * rho + grad**2 * (1 - rho)
        mg = mg * rho + grad * (1 - rho)
        mom = mom * momentum + rsqrt(ms + epsilon - mg**2) * lr * grad
        var -= mom

    the same bits as ``ResourceSparseApplyCenteredRMSProp``.

    Args:
        var: float32 resource variable ``[rows, ...]``, e.g. a table ``[rows, dim]``.
        mg: Mean-gradient slot, shaped like ``var``.
        ms, mom, lr, rho, momentum, epsilon: As
            :func:`sparse_apply_rms_prop_with_delta`.
        grad, indices, name, log, sid, target, bypass_fence: See
            :mod:`tf_ecrec.ops.apply`.

    Returns:
        int32 ``[n, 4 * dim]``: ``[var | mg | ms | mom]`` old ^ new bits at
        the first occurrence of each id, zeros at later occurrences.
    """
    return apply_op(
        "ec_rec_sparse_apply_centered_rms_prop_with_delta",
        log_inputs(log, sid, target, bypass_fence),
        {"var": var, "mg": mg, "ms": ms, "mom": mom},
        {"lr": lr, "rho": rho, "momentum": momentum, "epsilon": epsilon},
        grad,
        indices,
        name,
    )
