"""A rollback of the job's data progress owed by a restore: a record in the model dir that outlives the chief.

When a restore (a flash snapshot or a checkpoint) brings the model back to global step G, the records
acknowledged since G are in no model: whoever keeps the data's progress (the job master) must be
rolled back to G too.  The chief that restored may die before it tells the master, and the chief
that follows finds every PS whole and restores nothing: the rollback must not live in its memory.

So a restore *owes* the rollback before it overwrites any PS (`owe`): ``<model_dir>/rollback_owed.json``
says "the model was restored to step G".  Whoever keeps the progress pays it (`owed`, then rolls
the progress back to the newest state saved at or before G) and only then clears it (`clear`);
until then every chief start, and a retry while training, pays it again.  A second restore before
the first is paid keeps the lower step: the progress saved in between may count records of the
step the first restore threw away.  Paying twice only trains records twice, never skips one.

Call order::

    owe(model_dir, G, what)     the restore, before its first write to a PS
    ...                         the restore; the chief may die anywhere from here
    owed(model_dir)             a chief's session creation (and retries): the debt, if any
    clear(model_dir, debt)      once the master acknowledged the rollback (a newer debt stays)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import uuid

import tensorflow as tf

from tf_ecrec.errors import RecoveryError

_LOG = logging.getLogger(__name__)

OWED_FILE = "rollback_owed.json"
_LOCK = threading.Lock()  # owe and clear of one process (the chief: its restore and its payer thread)


@dataclasses.dataclass(frozen=True)
class OwedRollback:
    """The data progress must go back to the model's step `step` (restored from `what`).

    Attributes:
      step: the global step the model was restored to (the lowest of the restores not yet paid).
      what: what the model was restored from ("flash checkpoint", "checkpoint").
      token: tells one write from another (`clear` leaves a debt written after it was read).
    """

    step: int
    what: str
    token: str


def owed_path(model_dir: str) -> str:
    return os.path.join(model_dir, OWED_FILE)


def owed(model_dir: str | None) -> OwedRollback | None:
    """The rollback owed in `model_dir`, or None.

    Raises:
      RecoveryError: the record exists and cannot be read (it is never silently dropped).
    """
    if not model_dir:
        return None
    path = owed_path(model_dir)
    try:
        if not tf.io.gfile.exists(path):
            return None
        with tf.io.gfile.GFile(path, "r") as fh:
            value = json.loads(fh.read())
        return OwedRollback(int(value["step"]), str(value["what"]), str(value["token"]))
    except tf.errors.NotFoundError:
        return None  # removed between the check and the read: paid (it is removed only then)
    except (OSError, ValueError, KeyError, TypeError, tf.errors.OpError) as exc:
        raise RecoveryError(f"the owed data rollback {path} cannot be read ({exc}); rule: written whole by owe(), "
                            "removed only once paid; delete it only after rolling the job's data progress back "
                            "by hand") from exc


def owe(model_dir: str | None, step: int, what: str) -> OwedRollback | None:
    """Records, durably (a write then a rename), that the data progress must go back to `step`; call
    it before the restore writes to any PS.  Keeps the lower step of a debt already owed.  No-op
    (None) without a model dir."""
    if not model_dir:
        return None
    with _LOCK:
        before = owed(model_dir)
        if before is not None and before.step <= step:
            step, what = before.step, before.what
        debt = OwedRollback(int(step), what, uuid.uuid4().hex)
        path = owed_path(model_dir)
        tf.io.gfile.makedirs(model_dir)
        with tf.io.gfile.GFile(path + ".tmp", "w") as fh:
            fh.write(json.dumps(dataclasses.asdict(debt)))
        tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
    _LOG.info("data rollback to step %d owed (the model is being restored from a %s)", debt.step, what)
    return debt


def clear(model_dir: str, debt: OwedRollback) -> bool:
    """Removes the record if it still holds `debt` (a restore since then owes its own); whether it did."""
    with _LOCK:
        current = owed(model_dir)
        if current is None or current.token != debt.token:
            return False
        tf.io.gfile.remove(owed_path(model_dir))
        return True
