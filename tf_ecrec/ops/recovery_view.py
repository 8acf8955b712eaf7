"""Rebuilding lost rows while training goes on (``ops/cc/kernels/recovery_view.h``).

Call order on a PS whose group is being rebuilt: :func:`rebuild_begin_pending`
marks the group's rows pending (lookups of them wait, updates are refused);
the rebuild asks which rows waiting lookups want (:func:`wait_wanted`,
:func:`wanted_rows`), installs rebuilt words (:func:`install_row_words`),
and lookups continue once their rows are installed
(:func:`await_rebuilt_rows`). :func:`preserve_ranges` makes the first logged
write of a row save its words first, so a rebuild can read them as they were
(:func:`read_preserved_row_words`) until :func:`preserve_end`.
All state lives beside the PS's delta log (:mod:`tf_ecrec.ops.delta_log_ops`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_ecrec.ops._inputs import IntLike, VariableLike, int32_tensor, int64_tensor, resource_handle, resource_handles
from tf_ecrec.ops.delta_log_ops import call_log_op

__all__ = [
    "await_rebuilt_rows",
    "install_row_words",
    "preserve_end",
    "preserve_ranges",
    "read_preserved_row_words",
    "rebuild_begin_pending",
    "rebuild_forget_pending",
    "recovery_view_stats",
    "wait_wanted",
    "wanted_rows",
]


def rebuild_begin_pending(
    log: tf.Tensor, variable: VariableLike, rows: IntLike, name: str | None = None
) -> tf.Operation | None:
    """Marks rows ``[0, rows)`` of ``variable``'s group pending on its PS: lookups wait, updates are refused."""
    return _group_op("ec_rec_rebuild_begin_pending", log, variable, name, rows=int64_tensor(rows, "rows"))


def rebuild_forget_pending(log: tf.Tensor, name: str | None = None) -> tf.Operation | None:
    """Forgets every pending row of the log's PS (a new T0 supersedes an unfinished rebuild's); waiters fail."""
    return call_log_op("ec_rec_rebuild_forget_pending", log, name)


def recovery_view_stats(log: tf.Tensor, name: str | None = None) -> tf.Tensor:
    """int64 [3]: rows pending on the log's PS, rows preserved (saved T0 words) there, variable groups
    with preserved ranges there (a rebuild under way, or one whose end never ran)."""
    return call_log_op("ec_rec_recovery_view_stats", log, name)


def await_rebuilt_rows(
    log: tf.Tensor, variable: VariableLike, rows: tf.Tensor, name: str | None = None
) -> tf.Operation | None:
    """Finishes once none of ``rows`` of ``variable``'s group is pending (asks the rebuild for them)."""
    rows = tf.convert_to_tensor(rows)
    if rows.dtype not in (tf.int32, tf.int64):
        rows = tf.cast(rows, tf.int64)
    return _group_op("ec_rec_await_rebuilt_rows", log, variable, name, rows=rows)


def wanted_rows(log: tf.Tensor, variable: VariableLike, lo: IntLike, hi: IntLike, name: str | None = None) -> tf.Tensor:
    """The pending rows of ``variable``'s group in ``[lo, hi)`` that waiting lookups ask for (int64, ascending)."""
    return _group_op("ec_rec_wanted_rows", log, variable, name, lo=int64_tensor(lo, "lo"), hi=int64_tensor(hi, "hi"))


def wait_wanted(log: tf.Tensor, timeout_ms: IntLike, name: str | None = None) -> tf.Operation | None:
    """Finishes once a lookup waits for a pending row on the log's PS, or after ``timeout_ms``."""
    return call_log_op("ec_rec_wait_wanted", log, name, timeout_ms=int64_tensor(timeout_ms, "timeout_ms"))


def install_row_words(
    variables: VariableLike | Sequence[VariableLike],
    log: tf.Tensor,
    rows: tf.Tensor,
    words: tf.Tensor,
    add: bool = False,
    name: str | None = None,
) -> tf.Tensor:
    """Writes (``add``: XORs) ``words`` into each of ``rows`` still pending and marks it installed; int64 count."""
    return call_log_op(
        "ec_rec_install_row_words",
        log,
        name,
        vars=resource_handles(variables),
        rows=int64_tensor(rows, "rows"),
        words=int32_tensor(words, "words"),
        add=bool(add),
    )


def preserve_ranges(
    log: tf.Tensor, variable: VariableLike, ranges: Any, name: str | None = None
) -> tf.Operation | None:
    """From now on the first logged write of a row in ``ranges`` ([m, 2] of [lo, hi)) saves its words first."""
    ranges = tf.reshape(int64_tensor(ranges, "ranges"), [-1, 2])
    return _group_op("ec_rec_preserve_ranges", log, variable, name, ranges=ranges)


def preserve_end(log: tf.Tensor, name: str | None = None) -> tf.Operation | None:
    """Forgets every preserved range and saved row of the log's PS."""
    return call_log_op("ec_rec_preserve_end", log, name)


def read_preserved_row_words(
    variables: VariableLike | Sequence[VariableLike], log: tf.Tensor, rows: tf.Tensor, name: str | None = None
) -> tf.Tensor:
    """Rows of the variables as words side by side, each as it was when its range was preserved."""
    return call_log_op(
        "ec_rec_read_preserved_row_words", log, name, vars=resource_handles(variables), rows=int64_tensor(rows, "rows")
    )


def _group_op(op: str, log: tf.Tensor, variable: VariableLike, name: str | None, **inputs: object) -> object:
    """Builds the op ``op`` on ``log`` and the variable group named by ``variable``, with its other ``inputs``."""
    return call_log_op(op, log, name, var=resource_handle(variable, "variable"), **inputs)
