"""Flash checkpoints of a TF2 job: every variable of every PS copied at one step into shared memory.

    result = tf_ecrec.pss.fit(model, data, epochs=3, steps_per_epoch=500,
                              flash=FlashConfig(every_steps=100), flash_dir="/ckpt/job")

The Estimator path's in-memory tier (docs/flash.md), driven from the coordinator.  Under
ParameterServerStrategy the coordinator is the only client: it schedules every step, so a round needs
no gate: `FlashAtSteps`, one of ``model.fit``'s callbacks, sees each scheduled step end and, when a
round is due (`FlashConfig.due`, started early by what the last writes took, as on the Estimator
path), joins the coordinator (no step in flight: TF2 steps commit inside themselves, so every delta
log is empty), and `PSSFlash.round` copies every variable into its shadow on its own PS (the
Estimator path's `tf_ecrec.flash.snapshots.FlashSnapshots`, run through a `FunctionSession`) with the
logs and the iteration count read before and after, under the lock the stale-step settler holds.
Training goes on while a thread writes the shadows to the tiers (own, peer, every `persist_every`-th
to ``<flash_dir>/flash``), PS to PS.

When more PS are lost than the code covers, `tf_ecrec.pss.checkpoint.fall_back` restores the newest
snapshot complete on every PS (or the newer checkpoint of ``checkpoint_dir``): the steps since it are
rolled back and trained again.  No round runs while a background rebuild installs rows (they would
read as zeros).  A recovery makes the snapshot ops again over the re-created variables.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from tf_ecrec.errors import ConfigError
from tf_ecrec.flash.config import SLOTS, Choice, FlashConfig, Tier, early_steps
from tf_ecrec.flash.hooks import STATS_FILE
from tf_ecrec.flash.snapshots import FlashSnapshots
from tf_ecrec.pss.function_session import FunctionSession
from tf_ecrec.pss.rebuild import delta_logs

if TYPE_CHECKING:
    from tf_ecrec.pss.recovery import PSSRecovery

_LOG = logging.getLogger(__name__)


class PSSFlash:
    """The flash checkpoints of one TF2 model (see the module doc).

    Args:
      recovery: the model's `PSSRecovery` (its variables, its optimizer, its background rebuild).
      config: when and where (`FlashConfig`; ``park_secs`` is unused: the coordinator has no one to wait for).
      directory: names the job's shared-memory directory and holds the disk tier (``<directory>/flash``).
      listeners: called with the step of each capture, training paused (a test reads the values there).
    """

    def __init__(self, recovery: PSSRecovery, config: FlashConfig, directory: str,
                 listeners: Sequence[Callable[[int], None]] = ()) -> None:
        if not directory:
            raise ConfigError("flash checkpoints need a directory; rule: flash_dir= or checkpoint_dir= names one; "
                              "source: tf_ecrec.pss.fit")
        self.recovery = recovery
        self.config = config
        self.directory = directory
        self.listeners = list(listeners)
        self.lock = threading.Lock()  # held by the capture and by the stale-step settler's writes
        self._session: FunctionSession | None = None
        self._key: tuple[int, ...] = ()
        self._writer: threading.Thread | None = None
        self._slot: int | None = None
        self._due_at: int | None = None
        self._lateness: collections.deque[int] = collections.deque(maxlen=4)  # steps from due to written
        self._warm = False  # whether the snapshot ops have written once (their functions traced)
        self.last_step = 0
        self.last_time = time.monotonic()
        self.rounds = self.skipped = 0
        self.bytes = 0  # of one snapshot (every PS's variables)
        self.pauses: list[float] = []  # seconds each round paused training (join, capture)
        self.write_seconds: list[float] = []
        self.snapshots: list[tuple[int, int]] = []  # (epoch, step) written to every tier of the round
        self.captured: list[int] = []  # the step of every capture (a write cut after its own tier is restorable)

    # ---- the snapshot ops, over the variables the model has now -----------------------------------

    def _snap(self) -> tuple[FlashSnapshots, FunctionSession]:
        from tf_ecrec.pss.checkpoint import named_variables

        named = named_variables(self.recovery)
        key = tuple(id(v) for v in named.values())
        if self._session is None or key != self._key:  # first use, or a recovery re-created variables
            protection, step = self.recovery.protection, self.recovery.optimizer.iterations
            self._session = FunctionSession(lambda: FlashSnapshots(
                self.config, self.directory, delta_logs(protection.num_ps), protection.num_ps, 1, named, step=step))
            self._key = key
            self._warm = False
            self.bytes = sum(self._session.built.bytes.values())
        return self._session.built, self._session

    # ---- a round ----------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """Whether a round is due at `step` (steps scheduled); never while the last one's files are written
        or a background rebuild installs rows."""
        if self.writing() or self.rebuilding():
            return False
        if self._due_at is not None:  # the last round's snapshot is complete (or failed)
            if self._warm:  # not the first write of new snapshot ops: that one traces its functions
                self._lateness.append(step - self._due_at)
            self._due_at = None
            self._warm = self._session is not None
        return self.config.due(step, self.last_step, time.monotonic(), self.last_time, early_steps(self._lateness))

    def writing(self) -> bool:
        return self._writer is not None and self._writer.is_alive()

    def rebuilding(self) -> bool:
        rebuild = self.recovery.rebuilding
        return rebuild is not None and not rebuild.finished

    def round(self) -> int | None:
        """A round now (call it with no step in flight); the captured step, or None when skipped."""
        if self.writing() or self.rebuilding():
            return None
        started = time.perf_counter()
        snap, sess = self._snap()
        if self._slot is None:
            self._slot = self._free_slot(snap, sess)
        with self.lock:
            step = snap.capture(sess)
        if step is not None:
            self.captured.append(step)
            for listener in self.listeners:
                listener(step)
        self.pauses.append(time.perf_counter() - started)
        self.rounds += 1
        self.last_time = time.monotonic()
        if step is None:
            self.skipped += 1
            _LOG.info("flash checkpoint round skipped: a step was in flight")
            return None
        self._due_at = self.last_step + max(1, self.config.every_steps - early_steps(self._lateness))
        self.last_step = step
        tiers = list(snap.tiers())
        if self.config.persist_every and (self.rounds - self.skipped) % self.config.persist_every == 0:
            tiers.append(Tier.DISK)
        epoch = max(int(time.time() * 1000), (self.snapshots[-1][0] + 1) if self.snapshots else 0)
        self._writer = threading.Thread(target=self._write, args=(snap, sess, epoch, step, self._slot, tiers),
                                        name="ec-flash-writer", daemon=True)
        self._writer.start()
        return step

    def _write(self, snap: FlashSnapshots, sess: FunctionSession, epoch: int, step: int, slot: int,
               tiers: list[Tier]) -> None:
        started = time.perf_counter()
        try:
            snap.write(sess, epoch, step, slot, tiers)
        except (tf.errors.OpError, RuntimeError) as exc:  # a PS lost mid-write: the other slot stays whole
            _LOG.warning("flash checkpoint of step %d not written: %s: %s", step, type(exc).__name__,
                         " ".join(str(exc).split())[:400])
            return
        self._slot = (slot + 1) % SLOTS  # after a cut write, this slot again (the other holds the newest)
        self.write_seconds.append(time.perf_counter() - started)
        self.snapshots.append((epoch, step))
        _LOG.info("flash checkpoint of step %d in %s (%.2f s)", step, "+".join(t.value for t in tiers),
                  time.perf_counter() - started)

    @staticmethod
    def _free_slot(snap: FlashSnapshots, sess: FunctionSession) -> int:
        """The slot that does not hold PS 0's newest own copy (a restarted coordinator keeps the newest)."""
        own = [c for c in snap.find(sess) if c.tier is Tier.OWN and c.ps == 0]
        return (max(own, key=lambda c: c.manifest.epoch).slot + 1) % SLOTS if own else 0

    def join(self, timeout_secs: float = 600.0) -> None:
        """Waits for the files of the last round (`fit` calls it before it returns)."""
        if self._writer is not None:
            self._writer.join(timeout=timeout_secs)

    def save_stats(self) -> None:
        """Writes what the rounds did and cost to ``<directory>/flash_stats.json`` (the launcher's tests and
        benchmarks read it; the Estimator path's file, `tf_ecrec.flash.hooks.STATS_FILE`)."""
        stats = {"rounds": self.rounds, "skipped": self.skipped, "pause_seconds": [round(x, 4) for x in self.pauses],
                 "write_seconds": [round(x, 4) for x in self.write_seconds], "snapshots": self.snapshots,
                 "captured": self.captured,
                 "bytes": self.bytes}
        path = os.path.join(self.directory, STATS_FILE)
        with tf.io.gfile.GFile(path + ".tmp", "w") as fh:
            fh.write(json.dumps(stats))
        tf.io.gfile.rename(path + ".tmp", path, overwrite=True)

    # ---- restore ----------------------------------------------------------------------------------

    def latest(self) -> Choice | None:
        """The newest snapshot complete on every PS, with the model's variables and PS count (or None)."""
        snap, sess = self._snap()
        return snap.choose(sess)

    def restore(self, choice: Choice) -> int:
        """Assigns every variable from `choice` on its own PS; the bytes restored.  After a recovery re-created
        the lost PS's variables: the ops are made over the current ones."""
        self.join(60.0)  # a write cut by the failure ends (fails) first: its ops hold the old variables
        self._slot = None
        snap, sess = self._snap()
        restored = snap.restore(sess, choice)
        self.last_step, self.last_time, self._due_at = choice.global_step, time.monotonic(), None
        return restored

    def resumed(self, step: int) -> None:
        """After a recovery: the next round is due `every_steps` after `step` (the step training goes on from)."""
        self.last_step, self._due_at = min(self.last_step, step), None


class FlashAtSteps(tf.keras.callbacks.Callback):
    """One of ``model.fit``'s callbacks: a flash round when one is due, between two scheduled steps.

    Keras lets a callback see batch ends under ParameterServerStrategy only if it takes the logs as
    remote values (``_supports_tf_logs``); this one reads none.  The steps are counted from the batch
    indices (no read of the iteration count per step); a due round joins the coordinator first.
    """

    def __init__(self, flash: PSSFlash) -> None:
        super().__init__()
        self._supports_tf_logs = True  # after the base's __init__, which sets it False
        self.flash = flash
        self._scheduled = 0
        self._batch = -1

    def on_train_begin(self, logs: Any = None) -> None:
        self._scheduled = int(self.model.optimizer.iterations.numpy())
        self.flash.resumed(self._scheduled)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._batch = -1

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._scheduled += max(1, int(batch) - self._batch)
        self._batch = int(batch)
        if self.flash.due(self._scheduled):
            self.model._cluster_coordinator.join()  # pylint: disable=protected-access; no step in flight now
            self.flash.round()
