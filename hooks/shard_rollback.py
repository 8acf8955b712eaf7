"""Rolling the master's shard progress back with the model when the chief restores it.

Two hooks.  `OwedRollbackHook` pays the rollback that a restore of tf_ecrec's recovery (a flash
snapshot or a checkpoint, `tf_ecrec.recovery.owed`) recorded in the model dir before it wrote any PS:
the record survives the chief that restored.  `ShardRollbackHook` saves the shard progress with every
checkpoint and, for a job whose restores are the stock ``ChiefSessionCreator``'s (restored whenever a
checkpoint exists), rolls it back at each session creation; with tf_ecrec's recovery its
``restored`` says False and the owed record does the rollback.

The shard progress saved beside a checkpoint (`ShardCheckpointListener`)
says which records that checkpoint's variables have seen.  When the chief's
session is created from a checkpoint (a restarted chief, or the session
re-created after a lost PS under checkpoint fault tolerance), the model goes
back to that checkpoint, and the master's progress must go back with it, or
the records acknowledged since would never be trained into the model.

`CheckpointSaverHook` saves in ``after_create_session`` before any other
hook runs, and other workers may already train on the new session, so the
step of that save says nothing about what was restored.  What does: the
session.  The saver passes the raw session to its listeners, the same
object the hooks get in ``after_create_session`` and every later save, and a
new object per (re-)created session.  Call order on the chief::

    listener.before_save(s, G)   s is not the session the hook knows: a save
                                 during session creation.  Note the latest
                                 checkpoint before it (what a restore read);
                                 with the stock restore, roll the shard state
                                 back to it now (below); defer the shard state of G
    listener.after_save(s, G)    (deferred)
    after_create_session(s)      if the session was restored from a checkpoint
                                 C (``restored`` says so): restore the newest
                                 shard state at or before C to the master; then
                                 save the shard state of G, taken after that restore
    listener.before_save / after_save of the same session: delegated to
                                 `ShardCheckpointListener` (periodic, final)

Other trainers may train on the restored model before the rollback (their ready op passes once the
variables are restored): the records of those steps are rolled back with the rest and trained
again, never skipped.  The rollback is paid at the first moment the chief's code runs after the
restore, before the creation save writes (which took 1.4 s on a loaded machine), and logged with the
global step the model had then, the evidence of how many such steps there were.

"Restored from a checkpoint" is, by default, what the stock
``ChiefSessionCreator`` does: restore the latest checkpoint whenever there is
one.  A Scaffold that decides otherwise (`tf_ecrec.recovery` rebuilds from
parity without reading the checkpoint) passes ``restored``, a function that
says what the last session creation did.

If the restored checkpoint has no shard state file (saved while the master
was away), the newest older one is used: more records are trained twice,
none is skipped.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import threading
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_ecrec.base.retry import Retry
from tf_ecrec.errors import ConfigError, MasterError, MasterUnavailable
from tf_ecrec.master.client import MasterClient
from tf_ecrec.recovery.owed import clear, owe, owed
from tf_ecrec.step import failpoints

from . import shard_progress

_LOG = logging.getLogger(__name__)


def _latest_checkpoint_step(checkpoint_dir: str) -> int | None:
    path = tf.train.latest_checkpoint(checkpoint_dir)
    match = re.search(r"-(\d+)$", path or "")
    return int(match.group(1)) if match else None


def newest_shard_state(checkpoint_dir: str, dataset: str, step: int) -> tuple[int, str] | None:
    """``(step, path)`` of the newest shard state file of ``dataset`` at or before ``step``."""
    # The names shard_checkpoint_path gives: shard_state-<dataset>-<step>.json
    pattern = re.compile(rf"^shard_state-{re.escape(dataset)}-(\d+)\.json$")
    best: tuple[int, str] | None = None
    for path in glob.glob(os.path.join(checkpoint_dir, f"shard_state-{glob.escape(dataset)}-*.json")):
        match = pattern.match(os.path.basename(path))
        if match and int(match.group(1)) <= step and (best is None or int(match.group(1)) > best[0]):
            best = (int(match.group(1)), path)
    return best


class _ShardStateListener(tf.compat.v1.train.CheckpointSaverListener):
    """Saves shard progress with checkpoints; defers the save made while a session is created."""

    def __init__(self, hook: ShardRollbackHook, inner: shard_progress.ShardCheckpointListener) -> None:
        self._hook = hook
        self.inner = inner
        self._deferred = False

    def before_save(self, session: Any, global_step_value: int) -> None:
        self._deferred = session is not self._hook.session
        if self._deferred:
            self._hook.creation_save(global_step_value, _latest_checkpoint_step(self._hook.checkpoint_dir), session)
        else:
            self.inner.before_save(session, global_step_value)

    def after_save(self, session: Any, global_step_value: int) -> None:
        if not self._deferred:
            self.inner.after_save(session, global_step_value)


class ShardRollbackHook(tf.compat.v1.train.SessionRunHook):
    """The chief's hook that keeps the master's shard progress at the model's checkpoint.

    Pass :attr:`listener` to ``estimator.train(saving_listeners=...)``; it
    replaces a plain `ShardCheckpointListener`.

    Args:
      client: A :class:`MasterClient` (an observer client is enough).
      dataset: The dataset name.
      checkpoint_dir: The Estimator's ``model_dir``.
      restored: Called once per session creation, after it: whether the
        session restored the checkpoint.  Default: whenever one existed.
      payer: the `OwedRollbackHook` that pays a rollback (a restore owes it in the model dir
        first, so a chief that dies, or a master that cannot be reached, does not drop it); pass
        the one in the hook list, whose thread retries.  Default: one of its own.
    """

    def __init__(self, client: MasterClient, dataset: str, checkpoint_dir: str,
                 restored: Callable[[], bool] | None = None, payer: OwedRollbackHook | None = None) -> None:
        if not dataset or not checkpoint_dir:
            raise ConfigError(f"ShardRollbackHook dataset={dataset!r}, checkpoint_dir={checkpoint_dir!r}; "
                              "rule: both non-empty")
        self._client = client
        self._dataset = dataset
        self.checkpoint_dir = checkpoint_dir
        self._restored = restored
        self.listener = _ShardStateListener(self, shard_progress.ShardCheckpointListener(client, dataset, checkpoint_dir))
        self.session: Any = None
        self._pending: tuple[int, int | None] | None = None
        self._payer = payer or OwedRollbackHook(client, dataset, checkpoint_dir)
        self._global_step: Any = None

    @property
    def rollbacks(self) -> list[tuple[int, int | None]]:
        """(restored step, shard state step) per rollback paid."""
        return self._payer.rollbacks

    def begin(self) -> None:
        self._global_step = tf.compat.v1.train.get_global_step()

    def creation_save(self, step: int, latest_before: int | None, session: Any = None) -> None:
        """Called by the listener for the save made while a session is created.

        With the stock restore (no `restored` given), a checkpoint there means the session restored it:
        the rollback is paid here, before the save writes, the earliest moment the chief's code runs
        after the restore (other trainers may train on the restored model from then on)."""
        self._pending = (step, latest_before)
        if self._restored is None and latest_before is not None:
            self._pay(latest_before, session)

    def _pay(self, restored_step: int, session: Any) -> None:
        owe(self.checkpoint_dir, restored_step, "checkpoint")
        self._payer.pay_or_retry()  # if the master is away it stays owed, retried on a thread
        if session is not None and self._global_step is not None and owed(self.checkpoint_dir) is None:
            # The evidence of what the rollback took back beyond the lost steps: the steps other
            # trainers ran on the restored model before it (their records are trained again).
            _LOG.info("shard progress rolled back with the model at global step %d (restored: step %d)",
                      int(session.run(self._global_step)), restored_step)

    def after_create_session(self, session: Any, coord: Any) -> None:
        self.session = session
        pending, self._pending = self._pending, None
        restored = self._restored() if self._restored is not None else None
        if pending is None:
            return  # no save at creation (no checkpoint interval): nothing to roll back to either
        step, latest_before = pending
        if latest_before is not None and restored:  # a stock restore's rollback was paid at the creation save
            self._pay(latest_before, session)
        # The checkpoint written at creation gets the progress as it now stands (none while owed).
        self.listener.inner.before_save(session, step)
        self.listener.inner.after_save(session, step)


def roll_back_shards(client: MasterClient, dataset: str, checkpoint_dir: str, step: int, what: str) -> int | None:
    """Restores to the master the newest shard state saved at or before `step` (the model was
    restored from `what` of that step) and removes the states saved after it (they count records
    of steps the restore threw away); returns the state's step, None if there was none."""
    found = newest_shard_state(checkpoint_dir, dataset, step)
    if found is None:
        _LOG.error("The model was restored from the %s of step %d, but no shard progress was saved at "
                   "or before it; the records acknowledged since will not be trained again", what, step)
        return None
    state_step, path = found
    with tf.io.gfile.GFile(path, "rb") as handle:
        blob = handle.read()
    client.restore_shard_checkpoint(dataset, blob)
    for newer in glob.glob(os.path.join(checkpoint_dir, f"shard_state-{glob.escape(dataset)}-*.json")):
        match = re.search(r"-(\d+)\.json$", newer)
        if match and int(match.group(1)) > step:
            tf.io.gfile.remove(newer)
    log = _LOG.info if state_step == step else _LOG.warning
    log("Model restored from the %s of step %d: shard progress of %r rolled back to the state saved "
        "at step %d", what, step, dataset, state_step)
    return state_step


class OwedRollbackHook(tf.compat.v1.train.SessionRunHook):
    """The chief's hook that pays the data rollback a restore owes (`tf_ecrec.recovery.owed`).

    A restore (flash snapshot or checkpoint) records "rollback owed to step G" in the model dir
    before it writes any PS; this hook rolls the master's shard progress back to the newest state
    saved at or before G and only then clears the record.  The record, not this object, holds the
    debt: a chief that dies between the restore and the master's acknowledgement leaves it to the
    next chief, which pays it at its session creation though it restores nothing.  Lifecycle::

        after_create_session   pay (one bounded attempt); if the master cannot be reached, a thread
                               retries with backoff (`retry`) while training goes on
        end                    stop the thread; one last bounded attempt; else it stays owed

    Args:
      client: A :class:`MasterClient` (its calls are bounded by its own retry policy).
      dataset: The dataset name.
      checkpoint_dir: The Estimator's ``model_dir`` (the record and the saved shard states).
      retry: Backoff between attempts of the background thread (`max_tries` bounds it).
      task: this task's name, for the failpoint after a restore (`tf_ecrec.step.failpoints`).
    """

    def __init__(self, client: MasterClient, dataset: str, checkpoint_dir: str, retry: Retry | None = None,
                 task: str | None = None) -> None:
        if not dataset or not checkpoint_dir:
            raise ConfigError(f"OwedRollbackHook dataset={dataset!r}, checkpoint_dir={checkpoint_dir!r}; "
                              "rule: both non-empty")
        self._client = client
        self._dataset = dataset
        self._dir = checkpoint_dir
        self._retry = retry or _PAY_RETRY
        self._task = task
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.rollbacks: list[tuple[int, int | None]] = []  # (restored step, shard state step) per payment

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._stop_thread()
        debt = owed(self._dir)
        if debt is None:
            return
        failpoints.fire_in_python(failpoints.FailPoint.CHIEF_AFTER_RESTORE, self._task, debt.step)
        self.pay_or_retry()

    def pay_or_retry(self) -> None:
        """Pays the debt now (one bounded attempt); if the master did not take it, retries on a thread."""
        if self.pay() or (self._thread is not None and self._thread.is_alive()):
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pay_in_background, args=(self._stop,),
                                        name="ec-owed-rollback", daemon=True)
        self._thread.start()

    def end(self, session: Any) -> None:
        self._stop_thread()
        if not self.pay():
            debt = owed(self._dir)
            _LOG.error("training ended with the data rollback to step %s still owed (the master could not be "
                       "reached); the next chief start pays it", debt.step if debt else "?")

    def pay(self) -> bool:
        """Pays the debt recorded, if any (rolls the progress back, then clears it); whether none is left."""
        with self._lock:
            debt = owed(self._dir)
            if debt is None:
                return True
            try:
                state_step = roll_back_shards(self._client, self._dataset, self._dir, debt.step, debt.what)
            except MasterError as exc:
                _LOG.warning("the data rollback to step %d is owed and the master did not take it: %s", debt.step, exc)
                return False
            clear(self._dir, debt)  # a restore since the read owes its own: it stays
            self.rollbacks.append((debt.step, state_step))
            return owed(self._dir) is None

    def _pay_in_background(self, stop: threading.Event) -> None:
        def attempt() -> None:
            if stop.is_set():
                return
            if not self.pay():
                raise MasterUnavailable("the owed data rollback was not taken")

        try:
            self._retry.replace(sleep_func=stop.wait)(attempt)
        except MasterUnavailable:
            if not stop.is_set():
                _LOG.error("the data rollback is still owed after %d attempts; the next session creation retries",
                           self._retry.max_tries)

    def _stop_thread(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=30.0)
            self._thread = None


_PAY_RETRY = Retry(max_tries=200, delay=0.5, backoff=2.0, max_delay=15.0, deadline=None,
                   retry_if=lambda exc: isinstance(exc, MasterUnavailable))
