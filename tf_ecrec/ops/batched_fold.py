"""The ops of a fold round: folds of many steps' applies taken, folded and committed as one batch.

A protected step in batched mode (`tf_ecrec.step.batched_commit`) is its applies
and its count; a *fold round*, run by the trainer every few steps, takes the
apply entries that are not folded yet from each data PS's log
(:func:`delta_log_take`), folds each data variable's batch into each of its
fold targets with one op (:func:`parity_fold_batch`, one fold entry per
source entry, skipping what the target holds already, so rounds may overlap
or repeat), marks on the data PS what every target holds
(:func:`delta_log_mark_folded`), and commits the counted steps that are
folded through (:func:`delta_log_ready`, :func:`delta_log_commit_each`).
The protocol and why it keeps the invariants: docs/settlement.md, "Folds
batched over steps".
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tf_ecrec.ops._inputs import VariableLike, int32_tensor, int64_tensor, resource_handle
from tf_ecrec.ops.delta_log_ops import call_log_op
from tf_ecrec.ops.loader import call_op

__all__ = [
    "delta_log_commit_each",
    "delta_log_counted",
    "delta_log_is_committed",
    "delta_log_mark_folded",
    "delta_log_ready",
    "delta_log_take",
    "parity_fold_batch",
]


def delta_log_take(log: tf.Tensor, target: int, width: int, name: str | None = None) -> tuple[tf.Tensor, ...]:
    """(rows, delta, entry, sids, seqs): the apply entries of `target` not folded yet, rows tagged by entry."""
    return tuple(call_log_op("ec_rec_delta_log_take", log, name, target=int(target), width=int(width)))


def parity_fold_batch(
    parity: VariableLike, rows: tf.Tensor, delta: tf.Tensor, entry: tf.Tensor, sids: tf.Tensor, seqs: tf.Tensor,
    coef: int, log: tf.Tensor, round_id: tf.Tensor | int, target: int, source: int, field_bits: int = 16,
    name: str | None = None,
) -> tf.Tensor:
    """Folds a taken batch into `parity` (a parity or a replica), one logged fold per entry; present per entry.
    `round_id` carries the round's generation: a log that admits only later ones refuses the round (Aborted)."""
    return call_op(
        "ec_rec_parity_fold_batch", parity=resource_handle(parity, "parity"), rows=int64_tensor(rows, "rows"),
        delta=delta, entry=int32_tensor(entry, "entry"), sids=int64_tensor(sids, "sids"),
        seqs=int64_tensor(seqs, "seqs"), coef=int32_tensor(coef, "coef"), log=resource_handle(log, "log"),
        round_id=int64_tensor(round_id, "round_id"), target=int(target), source=int(source),
        field_bits=int(field_bits), name=name,
    )


def delta_log_mark_folded(log: tf.Tensor, seqs: tf.Tensor, present: Sequence[tf.Tensor], name: str | None = None):
    """Marks folded the entries `seqs` that every fold target holds (`present`: a flag vector per target)."""
    return call_log_op("ec_rec_delta_log_mark_folded", log, name, seqs=int64_tensor(seqs, "seqs"), present=list(present))


def delta_log_ready(log: tf.Tensor, counted: Sequence[tf.Tensor], name: str | None = None) -> tf.Tensor:
    """The steps counted on every copy (`counted`) whose applies here are folded through."""
    return call_log_op("ec_rec_delta_log_ready", log, name, counted=list(counted))


def delta_log_commit_each(log: tf.Tensor, round_id: tf.Tensor | int, ready: Sequence[tf.Tensor],
                          name: str | None = None) -> tf.Tensor:
    """Round 2 of the steps ready on every data PS (`ready`) this log does not refuse; the sids committed here.
    A round (`round_id`) of an older generation than the log admits is refused (Aborted)."""
    return call_log_op("ec_rec_delta_log_commit_each", log, name, round_id=int64_tensor(round_id, "round_id"),
                       ready=list(ready))


def delta_log_counted(log: tf.Tensor, target: int, name: str | None = None) -> tf.Tensor:
    """The steps with a counter entry of `target` in the log."""
    return call_log_op("ec_rec_delta_log_counted", log, name, target=int(target))


def delta_log_is_committed(log: tf.Tensor, sids: tf.Tensor | Sequence[int], name: str | None = None) -> tf.Tensor:
    """Per sid of `sids`, whether the log committed it."""
    return call_log_op("ec_rec_delta_log_is_committed", log, name, sids=int64_tensor(sids, "sids"))
