"""Folding deltas into parity, and routing one apply's deltas to their parity chunks.

:func:`parity_update` XORs ``coef * delta`` into parity rows (GF(2^16) or
GF(2^8) products, the fields of :mod:`tf_ecrec.erasure.codec`); with ``log=`` it runs
``ParityUpdateLogged``, which also appends the folded words to a delta log
(:mod:`tf_ecrec.ops.delta_log_ops`). :func:`route_deltas` splits the delta of one
apply (:mod:`tf_ecrec.ops.apply`) by the parity route each of its rows folds
into, in one op.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_ecrec.ops._inputs import (
    IntLike,
    VariableLike,
    index_tensor,
    int32_tensor,
    int64_tensor,
    log_inputs,
    resource_handle,
)
from tf_ecrec.ops.loader import call_op

__all__ = ["parity_update", "route_deltas"]


def parity_update(
    parity: VariableLike,
    rows: tf.Tensor,
    delta: tf.Tensor,
    coef: IntLike = 1,
    field_bits: int = 16,
    name: str | None = None,
    *,
    log: tf.Tensor | None = None,
    sid: IntLike | None = None,
    target: IntLike | None = None,
    source: IntLike = -1,
    source_seq: IntLike = -1,
    bypass_fence: bool = False,
    dedupe: bool = False,
) -> tf.Operation | None:
    """Folds deltas into parity: ``parity[rows[i]] ^= coef * delta[i]``.

    Products are taken in GF(2^16) (polynomial 0x1100B, pyeclib's
    ``liberasurecode_rs_vand`` and :mod:`tf_ecrec.erasure.codec`) on the two
    little-endian 16-bit symbols of each int32 word, or with
    ``field_bits=8`` in GF(2^8) (polynomial 0x11D, ``isa_l_rs_vand``) on its
    four bytes. ``coef=1`` is a plain XOR in either field. The parity
    variable is locked for the whole update, so concurrent folds into the
    same rows do not lose updates.

    Args:
        parity: int32 resource variable ``[parity_rows, width]``.
        rows: int32 or int64 ``[n]`` parity row ids; may repeat.
        delta: int32 ``[n, width]``, e.g. from a ``sparse_apply_*_with_delta``.
        coef: Non-zero field element, ``1 <= coef < 2**field_bits``.
        field_bits: 16 or 8.
        name: Op name.
        log: A delta log handle on ``parity``'s device
            (:func:`~tf_ecrec.ops.delta_log_ops.delta_log`): run
            ``ParityUpdateLogged``, which also appends, per distinct parity
            row (ascending), the XOR of every ``coef * delta`` folded into it.
        sid: int64 step id of the logged fold (with ``log``).
        target: int32 id (>= 0) of ``parity`` (with ``log``).
        source: int32 id of the variable the delta came from, -1 for none
            (with ``log``).
        source_seq: int64 seq of the source's apply entry in its own log
            (:func:`~tf_ecrec.ops.delta_log_ops.delta_log_seq_of`), -1 for
            none (with ``log``).
        bypass_fence: Fold even if ``sid`` is fenced or committed in the log
            (recovery finishing a step); otherwise such a fold fails with
            ``tf.errors.AbortedError`` and changes nothing.
        dedupe: Fold only the rows the log does not hold yet for
            ``(sid, target, source)``, and nothing of a committed ``sid``
            (recovery finishing a step: running it twice folds once).

    Returns:
        The op in graph mode; ``None`` when executing eagerly.
    """
    if field_bits not in (8, 16):
        raise ValueError(f"field_bits must be 8 or 16, got {field_bits!r}")
    logged = log_inputs(log, sid, target, bypass_fence, source=source, source_seq=source_seq)
    if logged is not None:
        logged["dedupe"] = bool(dedupe)
    elif dedupe:
        raise ValueError("`dedupe` is only meaningful with `log`")
    return call_op(
        "ec_rec_parity_update",
        logged,
        parity=resource_handle(parity, "parity"),
        rows=index_tensor(rows, "rows"),
        delta=int32_tensor(delta, "delta"),
        coef=int32_tensor(coef, "coef"),
        field_bits=field_bits,
        name=name,
    )


def route_deltas(
    indices: tf.Tensor,
    delta: tf.Tensor,
    bases: np.ndarray | tf.Tensor,
    chunk_rows: int,
    name: str | None = None,
) -> list[tuple[tf.Tensor, tf.Tensor]]:
    """One apply's deltas split by the parity route each row folds into (one op for all routes).

    Local chunk ``c`` of the data variable holds rows ``[c * chunk_rows, (c + 1) * chunk_rows)``;
    ``bases[j, c]`` is the first row of chunk ``c``'s parity on route ``j``, or -1 when the chunk does
    not fold there.

    Args:
        indices: int32 or int64 ``[n]`` local rows of the data variable.
        delta: int32 ``[n, W]``, from a ``sparse_apply_*_with_delta``.
        bases: int64 ``[routes, chunks]``.
        chunk_rows: Rows per local chunk.
        name: Op name.

    Returns:
        For each route ``j``: (parity rows ``bases[j, c] + row % chunk_rows``, the delta rows), in input order.
    """
    bases = int64_tensor(bases, "bases")
    num_routes = int(bases.shape[0])
    rows, deltas = call_op(
        "ec_rec_route_deltas",
        indices=index_tensor(indices, "indices"),
        delta=int32_tensor(delta, "delta"),
        bases=bases,
        chunk_rows=int(chunk_rows),
        num_routes=num_routes,
        name=name,
    )
    return list(zip(rows, deltas))
