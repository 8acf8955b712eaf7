"""Overwriting every variable with a saved state (a flash snapshot or a checkpoint), fenced.

A restore rewrites the PS tasks while steps of the failed session may still be in flight on the
survivors (a straggler: a write that reaches a PS after its trainer's call failed).  A write that
lands after a variable was restored and whose log entry is then discarded would be kept without
its folds: parity inexact.  So `fenced_restore`, in this order:

1. owes the data rollback to the restored step (`tf_ecrec.recovery.owed`), before any PS is written;
2. raises the survivors' minimum generation to the graph's (trainers of an older cluster are refused);
3. fences every step pending on the survivors: from here their writes fail;
4. overwrites (`write`), then reads every log again: a step not fenced yet on a survivor, or any step
   not fenced yet on a restored PS, that wrote meanwhile (its write may have landed before or after
   the overwrite of its variable) is fenced everywhere and the overwrite done again, until an
   overwrite ran with no such write (a few passes at most: no new step starts, the trainers wait for
   the whole markers);
5. discards the fenced steps only (their entries describe a state that is gone).  A write after the
   last read is on restored values and keeps its entry: settled like any step (docs/settlement.md).

Then every log, the restored PS tasks' fresh ones included, is raised to the highest generation
(`Reconciler.propagate_generation`); the caller writes the whole markers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import tensorflow as tf

from tf_ecrec.errors import RecoveryError
from tf_ecrec.recovery.owed import owe
from tf_ecrec.step.steplog import Reconciler

_LOG = logging.getLogger(__name__)

MAX_PASSES = 5


def fenced_restore(sess: tf.compat.v1.Session, reconciler: Reconciler, tasks: Sequence[int], lost: Sequence[int],
                   write: Callable[[], object], model_dir: str | None, step: int, what: str, generation: int = 0) -> int:
    """Steps 1-5 of the module docstring, then every log at the highest generation; returns the
    number of steps discarded.

    Args:
      reconciler: the graph's.
      tasks: every PS task with a log.
      lost: those lost (fresh logs); the others' pending steps are fenced and discarded.
      write: overwrites every variable (idempotent: it may run more than once).
      model_dir: where the owed rollback is recorded (None: nowhere).
      step: the global step `write` restores.
      what: what it restores from, for the record and the logs ("flash checkpoint", "checkpoint").
      generation: the graph's generation (0: not raised).

    Raises:
      RecoveryError: steps kept writing through `MAX_PASSES` overwrites.
    """
    alive = [p for p in tasks if p not in lost]
    owe(model_dir, step, what)
    if generation > 0:
        reconciler.set_generation(sess, alive, generation)
    fenced = reconciler.fence_pending(sess, alive)
    fenced_on_lost: set[int] = set()  # the restored PS tasks' logs are fresh: nothing fenced there yet
    lost = [p for p in tasks if p in lost]
    for _ in range(MAX_PASSES):
        write()
        # A write after the fence: a step new on a survivor, or any step on a restored PS (whose log
        # held nothing) that was not fenced there yet.  Each read also fences what it finds.
        on_alive = reconciler.fence_pending(sess, alive, fenced)
        on_lost = reconciler.fence_pending(sess, lost, fenced) if lost else set()
        late = (on_alive - fenced) | (on_lost - fenced_on_lost)
        fenced_on_lost = fenced | on_lost
        if not late:
            discarded = reconciler.discard(sess, tasks, fenced)
            reconciler.propagate_generation(sess, tasks, generation)
            return discarded
        _LOG.warning("steps %s wrote while the %s was restored: fenced, restoring again", sorted(late)[:5], what)
        fenced |= late
    raise RecoveryError(f"steps kept writing on PS {list(alive)} through {MAX_PASSES} restores of the {what} of "
                        f"step {step}; rule: a restore ends with no unfenced write; the next session creation retries")
