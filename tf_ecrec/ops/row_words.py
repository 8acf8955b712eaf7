"""Rows of variables as int32 words: XOR in, read out, combine, write back.

Each variable (float32, int32, float64 or int64) is seen as a matrix of int32
words ``[rows, W_v]`` (:func:`tf_ecrec.ops.log_snapshot.as_words`); a list of
variables of equal row counts is seen side by side, ``[W_0 | W_1 | ...]``.
Undo and recovery XOR deltas back with :func:`xor_rows`; a rebuild reads the
surviving chunks (:func:`read_row_words`), combines them with the code's
coefficients (:func:`combine_rows`) and writes the lost rows
(:func:`write_row_words`).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tf_ecrec.ops._inputs import IntLike, VariableLike, index_tensor, int32_tensor, int64_tensor, resource_handles
from tf_ecrec.ops.loader import call_op

__all__ = ["combine_rows", "read_row_words", "write_row_words", "xor_rows"]


def xor_rows(
    variables: VariableLike | Sequence[VariableLike],
    rows: tf.Tensor,
    delta: tf.Tensor,
    name: str | None = None,
) -> tf.Operation | None:
    """``variables[*][rows[i]] ^= delta[i]`` on the variables' 32-bit words.

    Each variable (float32, int32, float64 or int64) is seen as a matrix of
    int32 words ``[rows, W_v]`` (see :func:`as_words`); the variables must
    have equal row counts and a row of ``delta`` is split across them in
    order: ``[W_0 words of variables[0] | W_1 of variables[1] | ...]``. All of
    them are locked exclusively for the whole op; everything is checked
    before the first write.

    Args:
        variables: One resource variable or a list of distinct ones.
        rows: int32 or int64 ``[n]`` row ids; may repeat.
        delta: int32 ``[n, sum W_v]``.
        name: Op name.
    """
    return call_op(
        "ec_rec_xor_rows",
        vars=resource_handles(variables),
        rows=index_tensor(rows, "rows"),
        delta=int32_tensor(delta, "delta"),
        name=name,
    )


def read_row_words(
    variables: VariableLike | Sequence[VariableLike],
    start: IntLike,
    count: IntLike,
    name: str | None = None,
) -> tf.Tensor:
    """Rows ``[start, start + count)`` of the variables as int32 words, side by side.

    The variables are seen as in :func:`xor_rows`. ``count == 0`` returns a
    ``[0, 0]`` tensor without looking the variables up, so the read of a
    chunk that is not wanted (lost, uninitialised) costs nothing and fails
    nothing.

    Args:
        variables: One resource variable or a list of distinct ones, of equal row counts.
        start: int64 scalar, first row.
        count: int64 scalar, number of rows.
        name: Op name.
    """
    return _row_slice_op("ec_rec_read_row_words", variables, start, name, count=int64_tensor(count, "count"))


def combine_rows(coefs: tf.Tensor, parts: Sequence[tf.Tensor], bits: int = 16, name: str | None = None) -> tf.Tensor:
    """``XOR_j coefs[j] * parts[j]`` in GF(2^bits), symbol by symbol (the codec's linear combination).

    Parts whose coefficient is 0 are ignored whatever their shape; the
    others must share one shape ``[n, W]``.

    Args:
        coefs: int32 ``[len(parts)]``.
        parts: int32 matrices.
        bits: 16 (`tf_ecrec.erasure.codec`'s field) or 8.
        name: Op name.
    """
    return call_op(
        "ec_rec_combine_rows",
        coefs=int32_tensor(coefs, "coefs"),
        parts=[tf.convert_to_tensor(p, dtype=tf.int32) for p in parts],
        bits=bits,
        name=name,
    )


def write_row_words(
    variables: VariableLike | Sequence[VariableLike],
    start: IntLike,
    words: tf.Tensor,
    name: str | None = None,
) -> tf.Operation | None:
    """Writes rows ``[start, start + n)`` of the variables from int32 words (split as in :func:`xor_rows`).

    Args:
        variables: One initialised resource variable or a list of distinct ones, of equal row counts.
        start: int64 scalar, first row.
        words: int32 ``[n, sum W_v]``; empty writes nothing.
        name: Op name.
    """
    return _row_slice_op("ec_rec_write_row_words", variables, start, name, words=int32_tensor(words, "words"))


def _row_slice_op(
    op: str, variables: VariableLike | Sequence[VariableLike], start: IntLike, name: str | None, **inputs: tf.Tensor
) -> tf.Tensor | tf.Operation | None:
    """Builds ``op`` on the slice of rows of ``variables`` from row ``start``, with its other ``inputs``."""
    return call_op(op, vars=resource_handles(variables), start=int64_tensor(start, "start"), name=name, **inputs)
