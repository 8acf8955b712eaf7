"""Keras' ``BackupAndRestore`` under `tf_ecrec.pss.fit`: a backup at each epoch's end, a restarted job resumes.

Given to ``model.fit`` as it is, the callback cannot work with a fit that survives PS failures: the
callback deletes its backup at the end of every ``model.fit`` call (`fit` makes several: one per
recovery, one per epoch a failure cut), and at the start of the call after a recovery it would
restore its last backup, taking the job back to the end of the last whole epoch.  So `fit` takes the
user's ``BackupAndRestore`` callbacks out of the list it gives ``model.fit`` and does their work
itself, with Keras' own training state (``WorkerTrainingState``: the same checkpoint, in the same
directory, as the callback writes, so a stock script reads it too):

- at the start of `fit`, the latest backup is restored, as the callback does at the start of
  training; a coordinator restarted after it died goes on from its last backup (every variable
  of the model and its protection, the iteration count), and the delta logs' pending steps are
  discarded and the generation raised, as after a restore from a checkpoint (the steps the dead
  coordinator left in flight describe a state that is gone);
- at the end of every epoch the backup is written, from a callback of `fit`'s own that does only
  that: Keras calls ``on_epoch_end`` once the epoch's steps are joined (its data handler's ``sync``,
  the coordinator's ``join``), so no step is in flight and parity in the backup is the code of the
  data in it; ``model.fit`` still runs all its epochs in one call;
- after a recovery nothing is restored: the recovered state is newer than any backup; while its tables
  are rebuilt in the background (`tf_ecrec.pss.rebuild`) an epoch's backup is skipped, not waited for
  (rows not installed yet would be backed up as zeros, and waiting would stop training): a coordinator
  that dies meanwhile resumes from the backup before;
- at the end of training the backups are deleted unless the callback says otherwise
  (``delete_checkpoint=False``).

Only ``save_freq="epoch"`` is supported (under ParameterServerStrategy Keras backs up at epoch ends
only), without ``save_before_preemption``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from tf_ecrec.errors import ConfigError

if TYPE_CHECKING:
    from tf_ecrec.pss.recovery import PSSRecovery

_LOG = logging.getLogger(__name__)


class Backups:
    """The ``BackupAndRestore`` callbacks of one `fit` call (see the module doc); `others` are the rest."""

    def __init__(self, model: tf.keras.Model, callbacks: Sequence[Any]) -> None:
        self._model = model
        self.rebuilding: Any = lambda: False  # whether a background rebuild is under way (`fit` sets it)
        self.callbacks = [c for c in callbacks if isinstance(c, tf.keras.callbacks.BackupAndRestore)]
        self.others = [c for c in callbacks if not isinstance(c, tf.keras.callbacks.BackupAndRestore)]
        if self.callbacks:
            self.others.append(BackUpAtEpochEnd(self))
        for c in self.callbacks:
            if c.save_freq != "epoch" or c.save_before_preemption:
                raise ConfigError(
                    f"BackupAndRestore(save_freq={c.save_freq!r}, save_before_preemption={c.save_before_preemption}); "
                    "rule: tf_ecrec.pss.fit backs up at the end of each epoch, save_freq='epoch' without "
                    "save_before_preemption (Keras backs up at epoch ends only under ParameterServerStrategy); "
                    "source: the callbacks given to tf_ecrec.pss.fit")
        self._states = self._make_states()

    def _make_states(self) -> list[Any]:
        """Keras' training state per callback, over the model's variables of now (`after_recovery` makes them again
        when a recovery re-created Keras' step counter on a rebuilt PS: the old state's checkpoint names the dead
        one).  Made outside the strategy's scope: the saved epoch and batch and the checkpoint's save counter are the
        coordinator's own variables, where no PS failure can take them."""
        from keras.src.distribute.worker_training_state import WorkerTrainingState  # Keras' own backup files

        self._counter = getattr(self._model, "_train_counter", None)

        def make() -> list[Any]:
            states = [WorkerTrainingState(self._model, c.backup_dir, "epoch", False) for c in self.callbacks]
            for state in states:  # its save counter made now too: at the first save, inside fit's scope, on some PS
                state.write_checkpoint_manager.checkpoint.save_counter  # noqa: B018 (a property that creates it)
            return states

        # Made on a thread of its own, where no strategy's scope is entered (a scope is per thread): the variables
        # are the coordinator's even when `fit` is called in the strategy's scope.
        made: list[Any] = []
        thread = threading.Thread(target=lambda: made.append(make()), name="tf_ecrec-backup-state", daemon=True)
        thread.start()
        thread.join(60.0)
        if not made:
            raise ConfigError("Keras' training state for BackupAndRestore was not made within 60 s on its own thread; "
                              "source: tf_ecrec.pss.backup")
        return made[0]

    def after_recovery(self) -> None:
        """Between ``model.fit`` calls, after a recovery: Keras' training state made again if the recovery replaced
        the step counter, here rather than in the backup callback (inside ``model.fit``'s strategy scope its new
        variables would be placed on a PS)."""
        if self.callbacks and getattr(self._model, "_train_counter", None) is not self._counter:
            self._states = self._make_states()

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def restore(self, recovery: PSSRecovery) -> int | None:
        """Restores the latest backup of the first callback that has one; returns its step (None: none)."""
        from tf_ecrec.pss.checkpoint import adopt_restored_values

        for callback, state in zip(self.callbacks, self._states):
            manager = state.read_checkpoint_manager
            if manager.latest_checkpoint is None:
                continue
            manager.restore_or_initialize()
            discarded = adopt_restored_values(recovery)
            step = int(recovery.optimizer.iterations.numpy())
            _LOG.warning("restored the backup %s of BackupAndRestore(%s): step %d, epoch %d; %d pending steps discarded",
                         manager.latest_checkpoint, callback.backup_dir, step, int(state._ckpt_saved_epoch.numpy()),
                         discarded)
            return step
        return None

    def back_up(self, epoch: int) -> None:
        """Writes every callback's backup at the end of `epoch` (call it with no step in flight); none while a
        lost PS's tables are rebuilt (the module doc)."""
        if self.rebuilding():
            _LOG.warning("the backup of epoch %d is skipped: a lost PS's tables are still being rebuilt", epoch)
            return
        for state in self._states:
            state._ckpt_saved_epoch.assign(epoch)
            state.back_up(epoch)

    def finish(self) -> None:
        """At the end of training: the backups deleted, unless a callback keeps its own."""
        for callback, state in zip(self.callbacks, self._states):
            if callback.delete_checkpoint:
                state.delete_backup()


class BackUpAtEpochEnd(tf.keras.callbacks.Callback):
    """What `fit` gives ``model.fit`` in place of the user's ``BackupAndRestore``: a backup at each epoch's end."""

    def __init__(self, backups: Backups) -> None:
        super().__init__()
        self._backups = backups

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._backups.back_up(epoch)
