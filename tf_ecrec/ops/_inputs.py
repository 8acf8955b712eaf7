"""Argument conversion shared by the op wrappers of :mod:`tf_ecrec.ops`.

Each helper turns one kind of wrapper argument into the tensor (or the
keyword arguments) the generated op function takes, and raises ``TypeError``
or ``ValueError`` naming the argument when it cannot. None of them loads the
op library.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import tensorflow as tf

VariableLike: TypeAlias = tf.Variable | tf.Tensor
"""A resource variable or its ``tf.resource`` handle."""
FloatLike: TypeAlias = float | tf.Tensor
IntLike: TypeAlias = int | tf.Tensor


def resource_handle(variable: VariableLike, what: str) -> tf.Tensor:
    """The resource handle of a resource variable (or a handle tensor)."""
    handle = getattr(variable, "handle", variable)
    if not isinstance(handle, tf.Tensor) or handle.dtype != tf.resource:
        raise TypeError(
            f"`{what}` must be a resource variable (tf.Variable created with resource semantics) "
            f"or its handle, got {type(variable).__name__}"
        )
    return handle


def resource_handles(variables: VariableLike | Sequence[VariableLike]) -> list[tf.Tensor]:
    """The handles of one variable or of a list of them, in order."""
    if not isinstance(variables, (list, tuple)):
        variables = [variables]
    return [resource_handle(v, "variables") for v in variables]


def index_tensor(indices: tf.Tensor | object, what: str) -> tf.Tensor:
    """Row ids as an int32 or int64 tensor (int64 unless already int32)."""
    tensor = tf.convert_to_tensor(indices, dtype_hint=tf.int64, name=what)
    if tensor.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"`{what}` must be int32 or int64, got {tensor.dtype.name}")
    return tensor


def float_tensor(value: FloatLike, what: str) -> tf.Tensor:
    """A float32 tensor (a hyperparameter)."""
    return tf.convert_to_tensor(value, dtype=tf.float32, name=what)


def int32_tensor(value: IntLike | object, what: str) -> tf.Tensor:
    """An int32 tensor (ids, coefficients, words)."""
    return tf.convert_to_tensor(value, dtype=tf.int32, name=what)


def int64_tensor(value: IntLike | object, what: str) -> tf.Tensor:
    """An int64 tensor (step ids, seqs, row numbers)."""
    return tf.convert_to_tensor(value, dtype=tf.int64, name=what)


def log_inputs(
    log: tf.Tensor | None,
    sid: IntLike | None,
    target: IntLike | None,
    bypass_fence: bool = False,
    **source: IntLike,
) -> dict[str, Any] | None:
    """The extra inputs (and attr) of a ``...Logged`` op, or ``None`` when ``log`` is ``None``.

    Args:
        log: A delta log handle, or ``None`` for the unlogged op.
        sid: int64 step id (required with ``log``).
        target: int32 target id (required with ``log``).
        bypass_fence: The logged op's attr of that name.
        **source: ``source`` (int32) and ``source_seq`` (int64) of a fold.

    Raises:
        ValueError: ``sid``/``target``/``bypass_fence`` without ``log``, or
            ``log`` without ``sid`` and ``target``.
    """
    if log is None:
        if sid is not None or target is not None or bypass_fence:
            raise ValueError("`sid`, `target` and `bypass_fence` are only meaningful with `log`")
        return None
    if sid is None or target is None:
        raise ValueError("a logged update needs `sid` (the step id) and `target` (the variable's id)")
    inputs: dict[str, Any] = {
        "log": resource_handle(log, "log"),
        "sid": int64_tensor(sid, "sid"),
        "target": int32_tensor(target, "target"),
        "bypass_fence": bool(bypass_fence),
    }
    for key, value in source.items():
        inputs[key] = (int64_tensor if key == "source_seq" else int32_tensor)(value, key)
    return inputs
