"""What a recovery does, decided from what was found on the PS tasks: a pure function of plain values.

`RecoveryPlan.prepare` inspects the session (which variables are initialised,
whether the job's started marker exists, whether a checkpoint is offered),
asks `decide` and then carries the `Action` out:

============================  ==========================  =================================================
state found                   `Action`                    what prepare does
============================  ==========================  =================================================
everything initialised        ``SETTLE``                  settle the steps a dead task left in the logs
                                                          (`tf_ecrec.step.steplog`); a chief restart keeps the
                                                          live state
nothing initialised, a        ``RESTORE``                 restore the checkpoint, re-encode parity and
checkpoint                                                replicas
nothing initialised, no       ``REFUSE_LOST_JOB``         raise `RecoveryError` (a lost job is not a fresh
checkpoint, the model dir's                               one)
`STARTED_MARKER` exists
nothing initialised and no    ``INITIALISE``              initialise (bounded batches, parity and replicas
marker; or some initialised,                              encoded from the data in slices) and write the
no marker, no checkpoint                                  marker
the variables of <= r PS of   ``REBUILD``                 settle the steps the failure cut, then rebuild
every stripe missing                                      the lost variables: data chunks and slots decoded
                                                          from parity, parity re-encoded, dense variables,
                                                          their slots and the global step copied from a
                                                          replica, replicas copied from primaries
more missing than the code    ``FALLBACK``                restore the checkpoint (``method:
covers, a checkpoint                                      "checkpoint"``), re-encode
more missing than the code    ``REFUSE_UNRECOVERABLE``    raise `RecoveryError`
covers, no checkpoint
============================  ==========================  =================================================

`unrecoverable_reason` says, from the layouts and the replicas, whether a
loss is more than the code covers.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence

from tf_ecrec.layout.placement import Layout


class Action(str, enum.Enum):
    """What `RecoveryPlan.prepare` does (see the module docstring's table)."""

    SETTLE = "settle"
    RESTORE = "restore"
    REFUSE_LOST_JOB = "refuse_lost_job"
    INITIALISE = "initialise"
    REBUILD = "rebuild"
    FALLBACK = "fallback"
    REFUSE_UNRECOVERABLE = "refuse_unrecoverable"

    def __str__(self) -> str:
        return self.value


def decide(*, missing: bool, everything: bool, job_started: bool | None, checkpoint: bool,
           unrecoverable: str | None) -> Action:
    """The action for what a session's creation found.

    Args:
      missing: some variable (or some PS's whole marker) is missing.
      everything: every model variable is missing.
      job_started: whether the model dir's started marker exists; None without a model dir.
      checkpoint: a checkpoint is offered (the Saver's restore called this session's creation).
      unrecoverable: why the loss is more than the code covers (`unrecoverable_reason`), or None.
    """
    if not missing:
        return Action.SETTLE
    fresh = job_started is False
    if everything or (fresh and not checkpoint):
        if checkpoint:
            return Action.RESTORE
        if job_started:
            return Action.REFUSE_LOST_JOB
        return Action.INITIALISE
    if unrecoverable is None:
        return Action.REBUILD
    if not checkpoint:
        return Action.REFUSE_UNRECOVERABLE
    return Action.FALLBACK


def unrecoverable_reason(missing: Sequence[str], protected: set[str], lost: Iterable[int],
                         layouts: Mapping[str, Layout], copies: Mapping[str, Sequence[int]]) -> str | None:
    """Why losing the PS in `lost` is more than parity and replicas rebuild, or None if they do.

    Args:
      missing: names of the missing variables.
      protected: names of every variable parity or a replica covers (and of those parity and replicas).
      lost: the lost PS tasks.
      layouts: collection name -> its layout.
      copies: replicated variable name -> the PS tasks of its primary and each of its replicas.
    """
    unprotected = [name for name in missing if name not in protected]
    if unprotected:
        return f"these lost variables have no parity or replica: {unprotected[:5]}"
    lost_set = set(lost)
    for name, layout in layouts.items():
        for stripe in layout.unrecoverable_stripes(lost_set):
            gone = sum(p in lost_set for p in stripe.ps)
            return f"stripe {stripe.index} of {name!r} lost {gone} chunks and the code {layout.k}+{layout.r} rebuilds {layout.r}"
    for name, tasks in copies.items():
        if all(t in lost_set for t in tasks):
            return f"{name} and all {len(tasks) - 1} of its replicas were lost"
    return None
