"""`fit`: ``model.fit`` under ParameterServerStrategy that survives a PS failure through parity.

    history = tf_ecrec.pss.fit(model, dataset_creator, epochs=3, steps_per_epoch=500)

It runs ``model.fit``; when a PS fails (`tf_ecrec.pss.recovery.is_ps_failure`:
``UnavailableError`` from the strategy's coordinator, or the ``AbortedError``
of a PS already restarted; or a ``CancelledError``, which the coordinator may
raise for a closure the failure cut) it waits for the PS to come back, recovers it
(`tf_ecrec.pss.recovery`) and calls ``model.fit`` again from the step the
job is at: the iteration count, rebuilt with everything else, says how many
steps are done (a step the failure cut and settlement undid is run again).
An epoch cut in the middle is finished by a call of its remaining steps.
A recovery rebuilds the lost tables while ``model.fit`` trains on (`tf_ecrec.pss.rebuild`); a save
waits for that rebuild (a row not installed yet would be saved as zeros): at an epoch's end where a
callback may save (``ModelCheckpoint``, or a callback `fit` does not know: the strategy refuses callbacks
at batch ends), before a checkpoint of ``checkpoint_dir`` and before `fit` returns; the backups of
``BackupAndRestore`` skip the epochs that end during a rebuild instead (`tf_ecrec.pss.backup`).
With ``checkpoint_dir`` a loss beyond the code falls back to the last
checkpoint (`tf_ecrec.pss.checkpoint`) instead of raising; with ``flash``, to the last flash
snapshot (`tf_ecrec.pss.flash`: every ``every_steps`` steps in memory), the newer of the two.
The input is the user's: a `DatasetCreator` makes each worker's dataset
again, so data is not replayed from a position (as after a worker failure
under the strategy).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tf_ecrec.errors import RecoveryError
from tf_ecrec.flash.config import FlashConfig
from tf_ecrec.pss.backup import BackUpAtEpochEnd, Backups
from tf_ecrec.pss.checkpoint import save
from tf_ecrec.pss.flash import FlashAtSteps, PSSFlash
from tf_ecrec.pss.keras_optimizer import protected_optimizer
from tf_ecrec.pss.recovery import PSSRecovery, PSSRecoveryResult, is_ps_failure

_LOG = logging.getLogger(__name__)


@dataclasses.dataclass
class FitResult:
    """What `fit` did: the histories of its ``model.fit`` calls and the recoveries between them."""

    histories: list[Any] = dataclasses.field(default_factory=list)
    recoveries: list[PSSRecoveryResult] = dataclasses.field(default_factory=list)
    retries: int = 0
    steps: int = 0
    stale_settled: list[dict[str, int]] = dataclasses.field(default_factory=list)
    settle_errors: list[str] = dataclasses.field(default_factory=list)  # a stale settlement that raised
    checkpoints: list[str] = dataclasses.field(default_factory=list)
    restored_step: int | None = None  # the step of the BackupAndRestore backup `fit` began from (None: none)
    flash_snapshots: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (epoch, step) written


def fit(
    model: tf.keras.Model,
    x: Any,
    *,
    epochs: int,
    steps_per_epoch: int,
    callbacks: Sequence[Any] = (),
    verbose: Any = 2,
    recovery: PSSRecovery | None = None,
    on_recovery: Callable[[PSSRecoveryResult], None] | None = None,
    on_failure: Callable[[BaseException], None] | None = None,
    on_resume: Callable[[], None] | None = None,
    on_restored: Callable[[int], None] | None = None,
    timeout_secs: float = 300.0,
    max_failures: int = 20,
    checkpoint_dir: str | None = None,
    checkpoint_epochs: int = 1,
    flash: FlashConfig | None = None,
    flash_dir: str | None = None,
    flash_listeners: Sequence[Callable[[int], None]] = (),
    **fit_kwargs: Any,
) -> FitResult:
    """Trains `epochs` x `steps_per_epoch` steps, recovering lost PS tasks from parity (see the module doc).

    Args:
      model: compiled in the scope of a strategy protected by `tf_ecrec.pss.protect`.
      x: what ``model.fit`` takes under the strategy (a `DatasetCreator`, a dataset).
      epochs, steps_per_epoch: the length of training; steps the model
        already counts (``optimizer.iterations``) are not run again.
      recovery: the `PSSRecovery` to use (default: one for `model`).
      on_recovery: called with each recovery's result.
      on_failure: called with the error when ``model.fit`` fails, before the recovery.
      on_resume: called after each recovery attempt, before ``model.fit`` runs again.
      on_restored: called with the step of the ``BackupAndRestore`` backup `fit` began from, if it did.
      timeout_secs: how long to wait for a failed PS to come back.
      max_failures: failures tolerated in one call before giving up.
      checkpoint_dir: where to write a checkpoint every `checkpoint_epochs`
        epochs (`tf_ecrec.pss.checkpoint`; ``model.fit`` then runs one epoch
        per call, and the checkpoint is written between calls, with no step in
        flight); a loss beyond the code restores the last one instead of
        raising (method "checkpoint", the steps since it rolled back).
      flash: a `tf_ecrec.flash.config.FlashConfig`: flash checkpoints of every PS's variables every
        ``every_steps`` steps (`tf_ecrec.pss.flash`); a loss beyond the code restores the newest (or the
        checkpoint, if newer).  Its files are under `flash_dir` (default: `checkpoint_dir`); `flash_listeners`
        are called with each captured step, training paused.
      callbacks: given to ``model.fit``, but Keras' ``BackupAndRestore``: `fit` backs up at each epoch's end
        and restores the latest backup when it begins (`tf_ecrec.pss.backup`).
      **fit_kwargs: more ``model.fit`` arguments (not ``initial_epoch``).

    Raises:
      RecoveryError: the loss is beyond the code, the PS did not come back,
        or more than `max_failures` failures.
    """
    from tf_ecrec.pss.protection import current_protection

    if recovery is None:
        with model.distribute_strategy.scope():
            protection = current_protection()
        if protection is None:
            raise RecoveryError("the model's strategy is not protected by tf_ecrec.pss.protect; source: tf_ecrec.pss.fit")
        recovery = PSSRecovery(protection, model)
    protected_optimizer(model, recovery.protection)  # a stock optimizer would train unprotected: refused first
    backups = Backups(model, callbacks)  # BackupAndRestore: run here, between model.fit calls (tf_ecrec.pss.backup)
    result = FitResult()
    if backups:
        result.restored_step = backups.restore(recovery)
        if result.restored_step is not None and on_restored is not None:
            on_restored(result.restored_step)
    total = int(epochs) * int(steps_per_epoch)
    gate = _RebuildGate(recovery, timeout_secs, backups.others)
    backups.rebuilding = gate.rebuilding
    mine = [gate]
    if flash is not None:
        recovery.flash = PSSFlash(recovery, flash, flash_dir or checkpoint_dir or "", flash_listeners)
        mine.append(FlashAtSteps(recovery.flash))
    while True:
        done = int(model.optimizer.iterations.numpy())
        if done >= total and recovery.wait_rebuilt(timeout_secs):
            result.steps = done
            backups.finish()
            if recovery.flash is not None:
                recovery.flash.join(timeout_secs)
                recovery.flash.save_stats()
                result.flash_snapshots = list(recovery.flash.snapshots)
            return result
        epoch, within = divmod(done, int(steps_per_epoch))
        settler = _StaleSettler(recovery, result, recovery.flash.lock if recovery.flash is not None else None)
        try:
            if done >= total:  # every step trained, the rebuild stopped: the failure that stopped it is recovered
                raise tf.errors.UnavailableError(None, None, "the background rebuild of a lost PS stopped")
            if within or checkpoint_dir:  # one epoch (finish the epoch a failure cut; checkpoint between epochs)
                result.histories.append(model.fit(
                    x, epochs=epoch + 1, initial_epoch=epoch, steps_per_epoch=int(steps_per_epoch) - within,
                    callbacks=[*mine, *backups.others], verbose=verbose, **fit_kwargs))
                if checkpoint_dir and (epoch + 1) % checkpoint_epochs == 0:
                    settler.stop()
                    gate.wait()
                    step = int(model.optimizer.iterations.numpy())
                    result.checkpoints.append(save(recovery, os.path.join(checkpoint_dir, f"ckpt-{step}")))
            else:
                result.histories.append(model.fit(
                    x, epochs=int(epochs), initial_epoch=epoch, steps_per_epoch=int(steps_per_epoch),
                    callbacks=[*mine, *backups.others], verbose=verbose, **fit_kwargs))
        except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError) as exc:
            if not _may_be_a_task_failure(exc):
                raise
            settler.stop()
            if on_failure is not None:
                on_failure(exc)
            result.retries += 1
            if result.retries > max_failures:
                raise RecoveryError(f"{result.retries} failures in one fit; the last: {exc}; source: tf_ecrec.pss.fit") from exc
            _LOG.warning("a task failed during fit (%s); recovering", str(exc).splitlines()[0][:200])
            recovered = recovery.recover(timeout_secs, checkpoint=result.checkpoints[-1] if result.checkpoints else None)
            if recovered.lost:
                result.recoveries.append(recovered)
                if on_recovery is not None:
                    on_recovery(recovered)
            else:
                time.sleep(1.0)  # nothing lost: a worker's channel to a restarted PS is still reconnecting
            backups.after_recovery()
            if on_resume is not None:
                on_resume()
        finally:
            settler.stop()


def _may_be_a_task_failure(exc: BaseException) -> bool:
    """`is_ps_failure`, or a ``CancelledError``: a loaded run raised, from ``model.fit``, the cancellation of
    a closure a PS failure cut (``RemoteExecuteNode::RunAsync``) instead of the failure itself.  The
    recovery tells which (nothing lost: ``model.fit`` runs again, at most `max_failures` times)."""
    return is_ps_failure(exc) or isinstance(exc, tf.errors.CancelledError)


# Keras callbacks that save no variable: no need to wait for a rebuild at an epoch's end for them.
_READ_NO_VARIABLE = (tf.keras.callbacks.History, tf.keras.callbacks.ProgbarLogger, tf.keras.callbacks.TensorBoard,
                     tf.keras.callbacks.EarlyStopping, tf.keras.callbacks.CSVLogger, tf.keras.callbacks.TerminateOnNaN,
                     tf.keras.callbacks.ReduceLROnPlateau, tf.keras.callbacks.LearningRateScheduler, BackUpAtEpochEnd)


class _RebuildGate(tf.keras.callbacks.Callback):
    """First of ``model.fit``'s callbacks: a save after it waits for a background rebuild (the module doc).

    Only where a callback may save variables at an epoch's end (``ModelCheckpoint``, or one `fit` does not
    know): the backups skip their epoch instead (`tf_ecrec.pss.backup`), and waiting would stop training
    for the rest of the rebuild.  A rebuild that stopped (a failure during it) raises ``UnavailableError``:
    ``model.fit`` ends, and `fit` recovers the failure instead of letting a callback save rows that were
    never installed."""

    def __init__(self, recovery: PSSRecovery, timeout_secs: float, callbacks: Sequence[Any] = ()) -> None:
        super().__init__()
        self._recovery = recovery
        self._timeout = timeout_secs
        self._may_save = any(not isinstance(c, _READ_NO_VARIABLE) for c in callbacks)

    def rebuilding(self) -> bool:
        """Whether a background rebuild is under way."""
        return self._recovery.rebuilding is not None and not self._recovery.rebuilding.finished

    def wait(self) -> None:
        if self.rebuilding() and not self._recovery.wait_rebuilt(self._timeout):
            raise tf.errors.UnavailableError(None, None, "the background rebuild of a lost PS did not finish before a "
                                             f"save ({self._timeout:.0f} s, or stopped by a failure)")

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self._may_save:
            self.wait()


class _StaleSettler:
    """While ``model.fit`` runs: settles, every second, the steps dead workers left (`PSSRecovery.settle_stale`)."""

    def __init__(self, recovery: PSSRecovery, result: FitResult, lock: Any = None, period_secs: float = 1.0) -> None:
        self._recovery = recovery
        self._lock = lock or contextlib.nullcontext()  # a flash capture's: no settlement write during it
        self._result = result
        self._period = period_secs
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ec-stale-settler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._period):
            try:
                with self._lock:
                    counts = self._recovery.settle_stale()
            except tf.errors.OpError as exc:  # a PS down: the failure surfaces in fit, recovery follows
                _LOG.info("stale-step settlement skipped: %s", str(exc).splitlines()[0][:200])
                continue
            except Exception as exc:  # pylint: disable=broad-except
                # Never the end of this thread: the strategy retries a step that waits behind an unsettled one
                # without end, so fit would wait forever. Logged, kept in the result, tried again.
                _LOG.exception("stale-step settlement failed; trying again")
                self._result.settle_errors.append(f"{type(exc).__name__}: {exc}")
                self._recovery.forget_stale()
                continue
            if counts:
                self._result.stale_settled.append(counts)
                _LOG.warning("settled steps a dead worker left: %s", counts)

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=60)  # an RPC to a dead PS fails within seconds (fast reconnect)
