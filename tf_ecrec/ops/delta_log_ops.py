"""The delta log: which updates of an unfinished step are in effect (recovery of cut steps).

Passing ``log=``, ``sid=`` and ``target=`` to an apply wrapper
(:mod:`tf_ecrec.ops.apply`) or to :func:`~tf_ecrec.ops.parity.parity_update`
(and ``source=`` to the latter) selects the op's ``...Logged`` variant: it
does the same update and, in the same kernel while it still holds the
variables' locks, appends one entry to ``log``, a per-PS :func:`delta_log`
resource, recording exactly the words it XORed into each distinct row (rows
ascending). :func:`assign_add_logged` is the logged counterpart of
``assign_add`` (global step and its replicas). An entry exists if and only
if its update happened, so after a step is cut anywhere the logs of the
surviving PSs say which updates of each unfinished step are in effect.

Recovery (workers blocked) reads them (:func:`delta_log_read`, parsed by
:func:`tf_ecrec.ops.log_snapshot.parse_delta_log`); fences every step id
found and not committed anywhere on every surviving log
(:func:`delta_log_fence`: a dead worker's step may still have ops running on
the PSs; once fenced they fail without writing) and reads again; then, per
such step id, either undoes its entries (:func:`delta_log_undo`: XOR back and
remove, atomically and idempotently; reverse ``seq`` order for an
optimizer's var and slots) or finishes the step (runs the missing logged
folds with the same ``sid`` and ``source`` and ``bypass_fence=True``), and
finally commits the step id on every log (:func:`delta_log_commit`). A step
that completes normally commits its id on every log it touched, after all
its updates (control dependencies); a logged op of a committed step id fails
with ``tf.errors.AbortedError``.

Ids are the caller's: ``sid`` is unique per step (e.g. worker id in the high
bits, a per-worker counter below), ``target`` (>= 0) names a variable group
(a data variable with its slots, a parity or replica variable, a counter),
``source`` the target a folded delta came from (-1 for none).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_ecrec.ops._inputs import (
    IntLike,
    VariableLike,
    int32_tensor,
    int64_tensor,
    log_inputs,
    resource_handle,
    resource_handles,
)
from tf_ecrec.ops.loader import call_op

__all__ = [
    "DEFAULT_DELTA_LOG_NAME",
    "DELTA_LOG_COMMITTED_CAPACITY",
    "assign_add_logged",
    "delta_log",
    "delta_log_commit",
    "delta_log_commit_in_order",
    "delta_log_drop",
    "delta_log_fence",
    "delta_log_pending",
    "delta_log_read",
    "delta_log_seq_of",
    "delta_log_set_generation",
    "delta_log_undo",
]

DEFAULT_DELTA_LOG_NAME = "ec_rec_delta_log"
"""``shared_name`` of the per-process log that :func:`delta_log` names by default."""

DELTA_LOG_COMMITTED_CAPACITY = 65536
"""How many committed step ids a log remembers (the most recent ones)."""


def delta_log(shared_name: str = DEFAULT_DELTA_LOG_NAME, container: str = "", name: str | None = None) -> tf.Tensor:
    """A handle to the delta log ``shared_name`` of the current device.

    Place it like a variable (``with tf.device(ps_device(p))``): the log is a
    resource of that device's ResourceMgr, created empty by the first op that
    uses it, and every handle with the same ``container`` and
    ``shared_name`` on that device, in any graph or session of the process,
    names the same log. Logged ops consuming it are colocated with it, so it
    must live on the device of the variables they update.

    Args:
        shared_name: Name of the log; non-empty.
        container: ResourceMgr container ("" is the device's default one, which
            outlives sessions on a ``tf.distribute.Server``).
        name: Op name.

    Returns:
        A scalar ``tf.resource`` tensor.
    """
    if not shared_name:
        raise ValueError("the delta log needs a non-empty shared_name")
    return call_op("ec_rec_delta_log_handle", container=container, shared_name=shared_name, name=name)


def call_log_op(op: str, log: tf.Tensor, name: str | None, **inputs: Any) -> Any:
    """Builds the op ``op`` on the delta log ``log`` (its first input) with its other ``inputs``."""
    return call_op(op, log=resource_handle(log, "log"), name=name, **inputs)


def assign_add_logged(
    var: VariableLike,
    value: tf.Tensor | object,
    log: tf.Tensor,
    sid: IntLike,
    target: IntLike,
    source: IntLike = -1,
    name: str | None = None,
    bypass_fence: bool = False,
    dedupe: bool = False,
) -> tf.Operation | None:
    """``var += value`` (integers wrap), logging ``bits(old) ^ bits(new)``.

    The variable is seen as a matrix of int32 words (see
    :func:`~tf_ecrec.ops.log_snapshot.as_words`; an int64 scalar such as the
    global step is one row of two words); the entry covers all its rows.
    Works on float32, float64, int32 and int64 variables.

    Args:
        var: Resource variable, on the log's device.
        value: Tensor of ``var``'s shape (converted to its dtype).
        log: A :func:`delta_log` handle.
        sid: int64 step id.
        target: int32 id (>= 0) of ``var``.
        source: int32 id of the variable this one replicates, or -1.
        name: Op name.
        bypass_fence: Add even if ``sid`` is fenced or committed in the log;
            otherwise that fails with ``tf.errors.AbortedError``.
        dedupe: Add nothing if the log holds an entry of ``(sid, target)``
            or ``sid`` was committed here (recovery finishing a step).

    Returns:
        The op in graph mode; ``None`` when executing eagerly.
    """
    handle = resource_handle(var, "var")
    dtype = getattr(var, "dtype", None)
    if dtype is None:
        raise TypeError("`var` must be a resource variable (its dtype is needed)")
    dtype = tf.as_dtype(dtype).base_dtype
    value_tensor = tf.convert_to_tensor(value, dtype=dtype, name="value")
    logged = log_inputs(log, sid, target, bypass_fence, source=source)
    assert logged is not None  # `log` is a handle, never None here
    return call_op(
        "ec_rec_assign_add_logged",
        var=handle,
        value=value_tensor,
        **logged,
        dedupe=bool(dedupe),
        name=name,
    )


def delta_log_commit(
    log: tf.Tensor, sid: IntLike | Sequence[int], name: str | None = None, bypass_fence: bool = False
) -> tf.Operation | None:
    """Marks step(s) complete (round 2): drops their entries, remembers them as committed.

    Run it on every log a step touched, after round 1
    (:func:`delta_log_commit_in_order` on the data PS tasks). The log
    remembers the last :data:`DELTA_LOG_COMMITTED_CAPACITY` committed ids.
    A fenced step, or one of an older generation than the log admits, is
    refused with ``tf.errors.AbortedError`` (nothing changes) unless
    ``bypass_fence`` (recovery's own commits).

    Args:
        log: A :func:`delta_log` handle.
        sid: int64 step id, or a vector of them.
        name: Op name.
        bypass_fence: Commit even fenced steps.
    """
    return call_log_op("ec_rec_delta_log_commit", log, name, sid=int64_tensor(sid, "sid"), bypass_fence=bypass_fence)


def delta_log_commit_in_order(
    log: tf.Tensor,
    sid: IntLike | Sequence[int],
    timeout_ms: int = 60000,
    bypass_fence: bool = False,
    name: str | None = None,
) -> tf.Operation | None:
    """Round 1 of a step's commit, on a data PS: waits for earlier steps, then commits the applies.

    Waits (asynchronously, holding no thread) until no apply entry of
    another step precedes one of ``sid`` on the same variable, then drops
    ``sid``'s apply entries and remembers ``sid`` as data-committed. Fails
    with ``tf.errors.AbortedError`` if ``sid`` is or gets fenced, or is of
    an older generation (unless ``bypass_fence``), or after ``timeout_ms``
    (0: at once, instead of waiting).
    """
    return call_log_op(
        "ec_rec_delta_log_commit_in_order",
        log,
        name,
        sid=int64_tensor(sid, "sid"),
        timeout_ms=int(timeout_ms),
        bypass_fence=bypass_fence,
    )


def delta_log_set_generation(log: tf.Tensor, generation: IntLike, name: str | None = None) -> tf.Operation | None:
    """Raises the log's minimum generation: older steps' writes and commits then fail (Aborted)."""
    return call_log_op("ec_rec_delta_log_set_generation", log, name, generation=int64_tensor(generation, "generation"))


def delta_log_seq_of(log: tf.Tensor, sid: IntLike, target: IntLike, name: str | None = None) -> tf.Tensor:
    """The seq of the log's entry of ``(sid, target)``, -1 if none (int64 scalar)."""
    return call_log_op(
        "ec_rec_delta_log_seq_of", log, name, sid=int64_tensor(sid, "sid"), target=int32_tensor(target, "target")
    )


def delta_log_pending(log: tf.Tensor, name: str | None = None) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The steps with entries in the log: ``sids`` (int64), ``age_secs`` (float32, of the
    first entry) and ``waiting`` (bool: a round-1 commit of it is waiting)."""
    return call_log_op("ec_rec_delta_log_pending", log, name)


def delta_log_fence(log: tf.Tensor, sids: IntLike | Sequence[int], name: str | None = None) -> tf.Operation | None:
    """Fences step(s): later logged updates of ``sids`` on this log fail.

    They raise ``tf.errors.AbortedError`` and change nothing (unless run with
    ``bypass_fence=True``). The op returns once no logged update of ``sids``
    is still being written, so the log's entries of ``sids`` are then final:
    recovery fences the steps it is about to undo or finish, on every
    surviving log, before it reads the logs it acts on. Committing a step id
    lifts its fence (a committed id is refused anyway).
    """
    return call_log_op("ec_rec_delta_log_fence", log, name, sids=int64_tensor(sids, "sids"))


def delta_log_drop(log: tf.Tensor, sids: IntLike | Sequence[int], name: str | None = None) -> tf.Operation | None:
    """Drops the entries of ``sids`` without marking them committed.

    Their updates stay in effect. Prefer :func:`delta_log_commit` to close a
    step after recovery: a committed mark on any log tells a recovery that
    is itself cut and rerun that the step is settled everywhere.
    """
    return call_log_op("ec_rec_delta_log_drop", log, name, sids=int64_tensor(sids, "sids"))


def delta_log_read(log: tf.Tensor, name: str | None = None) -> Any:
    """A consistent snapshot of the log, as tensors; see :func:`~tf_ecrec.ops.log_snapshot.parse_delta_log`.

    Returns:
        A namedtuple of 18 outputs: ``seq``, ``sid`` (int64 [m]), ``target``,
        ``source`` (int32 [m]), ``row_splits`` (int64 [m + 1]), ``rows``
        (int64), ``widths`` (int64 [m], words per row), ``deltas`` (int32,
        every entry's [n_i, widths[i]] delta flattened row-major, one after
        another), ``committed`` (int64, oldest first), ``settled_targets``
        (int32) and ``settled_seq`` (int64): per target, the highest seq of an
        entry removed by commit or drop while its update stayed in effect;
        ``fenced`` (int64): fenced step ids not committed since, ascending;
        ``source_seq`` (int64 [m]), ``kinds`` (int32 [m]),
        ``settled_sources``/``settled_source_seq`` (per source, the highest
        source_seq of its folds committed or dropped here),
        ``data_committed`` (int64, round-1 commits) and ``generation``
        (int64 scalar).
    """
    return call_log_op("ec_rec_delta_log_read", log, name)


def delta_log_undo(
    log: tf.Tensor,
    variables: VariableLike | Sequence[VariableLike],
    seq: IntLike,
    target: IntLike,
    ordered: bool = True,
    name: str | None = None,
) -> tf.Tensor:
    """Undoes log entry ``seq`` (XORs its delta back) and removes it, atomically.

    Under the variables' exclusive locks and the log's mutex. If the log no
    longer holds the entry (already undone, committed or dropped) nothing
    happens and the result is ``False``, so undoing twice is harmless.

    Args:
        log: A :func:`delta_log` handle on the variables' device.
        variables: The variables of the entry's target, in the order of its
            delta: ``[var, *slots]`` for an apply entry, ``[parity]``,
            ``[replica]`` or ``[counter]`` for the others. A row of the delta
            is split across them as in :func:`~tf_ecrec.ops.row_words.xor_rows`.
        seq: The entry's seq; or a vector of entries of ``target``, undone
            one after the other in its order (newest first for an ordered
            target), the result then a vector of flags: an undo that fails
            raises, the ones before it done.
        target: Its target id; a mismatch is an InvalidArgumentError.
        ordered: Refuse (FailedPreconditionError, nothing changes) while the
            log holds a later entry of ``target`` or a later one was
            committed or dropped. Keep it for an optimizer's var and slots
            (undo in reverse seq order); pass ``False`` for parity and
            replicas, whose XOR folds commute.
        name: Op name.

    Returns:
        bool, of `seq`'s shape: whether the entry was there and has been undone.
    """
    return call_log_op(
        "ec_rec_delta_log_undo",
        log,
        name,
        vars=resource_handles(variables),
        seq=int64_tensor(seq, "seq"),
        target=int32_tensor(target, "target"),
        ordered=ordered,
    )
