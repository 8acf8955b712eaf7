"""Rolling the master's shard progress back with the model when the chief restores a checkpoint.

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
                                 checkpoint before it (what a restore read),
                                 defer the shard state of G
    listener.after_save(s, G)    (deferred)
    after_create_session(s)      if the session was restored from a checkpoint
                                 C: restore the newest shard state at or before
                                 C to the master; then save the shard state of
                                 G, taken after that restore
    listener.before_save / after_save of the same session: delegated to
                                 `ShardCheckpointListener` (periodic, final)

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
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_ecrec.errors import ConfigError
from tf_ecrec.master.client import MasterClient

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
            self._hook.creation_save(global_step_value, _latest_checkpoint_step(self._hook.checkpoint_dir))
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
    """

    def __init__(self, client: MasterClient, dataset: str, checkpoint_dir: str,
                 restored: Callable[[], bool] | None = None) -> None:
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
        self.rollbacks: list[tuple[int, int]] = []  # (checkpoint step, shard state step) per rollback

    def creation_save(self, step: int, latest_before: int | None) -> None:
        """Called by the listener for the save made while a session is created."""
        self._pending = (step, latest_before)

    def after_create_session(self, session: Any, coord: Any) -> None:
        self.session = session
        pending, self._pending = self._pending, None
        restored = self._restored() if self._restored is not None else None
        if pending is None:
            return  # no save at creation (no checkpoint interval): nothing to roll back to either
        step, latest_before = pending
        if latest_before is not None and (restored if restored is not None else True):
            self._roll_back(latest_before)
        # The checkpoint written at creation gets the progress as it now stands.
        self.listener.inner.before_save(session, step)
        self.listener.inner.after_save(session, step)

    def _roll_back(self, checkpoint_step: int) -> None:
        state_step = roll_back_shards(self._client, self._dataset, self.checkpoint_dir, checkpoint_step, "checkpoint")
        if state_step is not None:
            self.rollbacks.append((checkpoint_step, state_step))


def roll_back_shards(client: MasterClient, dataset: str, checkpoint_dir: str, step: int, what: str) -> int | None:
    """Restores to the master the newest shard state saved at or before `step` (the model was
    restored from `what` of that step); returns the state's step, None if there was none."""
    found = newest_shard_state(checkpoint_dir, dataset, step)
    if found is None:
        _LOG.error("The model was restored from the %s of step %d, but no shard progress was saved at "
                   "or before it; the records acknowledged since will not be trained again", what, step)
        return None
    state_step, path = found
    with tf.io.gfile.GFile(path, "rb") as handle:
        blob = handle.read()
    client.restore_shard_checkpoint(dataset, blob)
    log = _LOG.info if state_step == step else _LOG.warning
    log("Model restored from the %s of step %d: shard progress of %r rolled back to the state saved "
        "at step %d", what, step, dataset, state_step)
    return state_step


class FlashRollbackHook(tf.compat.v1.train.SessionRunHook):
    """The chief's hook that rolls the master's shard progress back with a flash checkpoint restore.

    The flash checkpoint's rounds save the shard progress (a `ShardCheckpointListener` called
    while the trainers are parked, before the capture, so it never counts a record the snapshot
    does not hold); when a session's creation restored a snapshot of step G (`restored_step`
    says so, once), the newest progress saved at or before G goes back to the master.
    """

    def __init__(self, client: MasterClient, dataset: str, checkpoint_dir: str,
                 restored_step: Callable[[], int | None]) -> None:
        self._client = client
        self._dataset = dataset
        self._dir = checkpoint_dir
        self._restored_step = restored_step
        self.rollbacks: list[tuple[int, int]] = []  # (snapshot step, shard state step)

    def after_create_session(self, session: Any, coord: Any) -> None:
        step = self._restored_step()
        if step is None:
            return
        state_step = roll_back_shards(self._client, self._dataset, self._dir, step, "flash checkpoint")
        if state_step is not None:
            self.rollbacks.append((step, state_step))
