"""Rows as int32 words, and parity encoded from them in the graph: the one place both are spelled out.

Parity and replicas protect a variable *together with its optimizer slots*:
row ``i`` of what they cover is row ``i`` of the variable followed by row
``i`` of each slot, as int32 words (`row_words` in the graph, `np_row_words`
in NumPy; `split_row_words` turns such words back into the variables'
values).  A parity chunk is the code (`tf_ecrec.erasure.codec`) of its stripe's data
chunks' words, and `encode_parity_chunk` builds it in the graph from the
data PS's words at the rows the layout (`tf_ecrec.layout.table_layout`) names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf

from tf_ecrec.erasure import gf16
from tf_ecrec.erasure.codec import Code
from tf_ecrec.layout.table_layout import ChunkSpec, TableLayout


def row_words(values: Sequence[tf.Tensor], rows: int) -> tf.Tensor:
    """``[rows, W]`` int32: each of ``values`` (a variable, then its slots) as words, side by side.

    Args:
        values: Tensors whose first dimension is ``rows`` and whose items are 4 or 8 bytes.
        rows: Their number of rows.
    """
    return tf.concat([tf.reshape(tf.bitcast(v, tf.int32), [rows, -1]) for v in values], axis=1)


def np_row_words(arrays: Sequence[np.ndarray], rows: int) -> np.ndarray:
    """`row_words` in NumPy: ``[rows, W]`` int32 words of ``arrays`` side by side."""
    return np.ascontiguousarray(np.concatenate([np.asarray(a).reshape(rows, -1) for a in arrays], axis=1)).view(np.int32)


def split_row_words(words: tf.Tensor, variables: Sequence[tf.Variable]) -> list[tf.Tensor]:
    """The inverse of `row_words`: each variable's value, with its shape and dtype, from ``[rows, W]`` words."""
    rows = int(variables[0].shape[0])
    out = []
    col = 0
    for v in variables:
        dtype = v.dtype.base_dtype
        per_row = int(np.prod(v.shape.as_list()[1:], dtype=np.int64)) * dtype.size // 4
        part = tf.reshape(words[:, col : col + per_row], [rows] + v.shape.as_list()[1:] + ([2] if dtype.size == 8 else []))
        out.append(tf.bitcast(part, dtype))
        col += per_row
    return out


def gf_mul_words(coef: int, words: tf.Tensor) -> tf.Tensor:
    """``coef`` times each 16-bit little-endian symbol of int32 ``words``, in GF(2^16) (`tf_ecrec.erasure.gf16`)."""
    if coef == 1:
        return words
    t = gf16.mul_tables(coef).astype(np.int64)
    lo_t, hi_t = tf.constant(t[0]), tf.constant(t[1])
    w = tf.bitwise.bitwise_and(tf.cast(words, tf.int64), 0xFFFFFFFF)

    def byte(shift: int) -> tf.Tensor:
        return tf.bitwise.bitwise_and(tf.bitwise.right_shift(w, shift), 0xFF)

    lo = tf.bitwise.bitwise_xor(tf.gather(lo_t, byte(0)), tf.gather(hi_t, byte(8)))
    hi = tf.bitwise.bitwise_xor(tf.gather(lo_t, byte(16)), tf.gather(hi_t, byte(24)))
    return tf.cast(tf.bitwise.bitwise_or(lo, tf.bitwise.left_shift(hi, 16)), tf.int32)


def encode_parity_chunk(layout: TableLayout, code: Code, parity: ChunkSpec, data_words: Mapping[int, tf.Tensor]) -> tf.Tensor:
    """The words of parity chunk ``parity``: the code of its stripe's data chunks, in the graph.

    Args:
        layout: The table's layout.
        code: The table's code.
        parity: A parity chunk of ``layout``.
        data_words: PS -> the ``row_words`` of that PS's data variable and slots
            (all of its local chunks; this takes each chunk's rows).

    Returns:
        ``[chunk_rows, W]`` int32.
    """
    acc = None
    for dc in layout.stripes[parity.stripe].data:
        lo, hi = layout.local_rows(dc)
        term = gf_mul_words(code.coef(parity.position, dc.position), data_words[dc.ps][lo:hi])
        acc = term if acc is None else tf.bitwise.bitwise_xor(acc, term)
    return acc
