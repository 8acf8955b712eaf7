"""The trainers' side of flash checkpoints: the chief's round driver and the other trainers' gate.

`FlashCheckpointHook` (chief) starts a round when one is due (`FlashConfig.due`), right after one
of its own steps: it raises the gate, waits for the other trainers present to park (at most
``park_secs``; a trainer's gate hook marks its slot present when its session is created and absent
when it ends, so slots never started or left are not waited for), captures under the reconciler's lock (no settlement writes meanwhile), releases
the gate and leaves the writing to a thread.  A round is skipped, and tried again at the next
step, while a background rebuild runs (rows not yet rebuilt read as zeros), while the previous
round's files are still being written, or when the capture saw a step in flight.

`FlashGateHook` (every other trainer) fetches the gate with each step (one more read in the same
call, no extra round trip); when a round was requested it records itself parked after its step
and waits for the release, at most ``wait_secs`` (then it goes on: the capture's own check keeps
a late trainer from spoiling a snapshot, it only gets the round skipped).

Jobs without delta logs (``--fault-tolerance flash``) run strict rounds (``strict=True``): the
capture cannot see a step in flight there, so it starts only once every trainer with a session is
parked, and it counts only if no trainer wrote its slot meanwhile (docs/flash.md, "Without erasure
coding").
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tf_ecrec.flash.config import SLOTS, Tier, early_steps
from tf_ecrec.flash.snapshots import FlashSnapshots
from tf_ecrec.step.carried_commit import carried_commits

_LOG = logging.getLogger(__name__)
POLL_SECS = 0.002
ABSENT, PRESENT = 0, 1
"""A trainer's slot of the gate's parking vector before any round: not running, or running (rounds' epochs
are millisecond times, far above both)."""
STATS_FILE = "flash_stats.json"


def trainer_index(config: Any) -> tuple[int, int]:
    """(this task's index among the trainers, how many there are) from a RunConfig: the chief is 0,
    worker i is 1 + i (a cluster whose worker 0 is the chief counts it once)."""
    cluster = config.cluster_spec.as_dict() if config.cluster_spec else {}
    workers = len(cluster.get("worker", []))
    has_chief = bool(cluster.get("chief"))
    total = workers + (1 if has_chief else 0)
    if config.task_type == "chief" or (not has_chief and config.is_chief):
        return 0, max(total, 1)
    return int(config.task_id) + (1 if has_chief else 0), max(total, 1)


class FlashGateHook(tf.compat.v1.train.SessionRunHook):
    """A non-chief trainer's part of a round: park at a step boundary while the chief captures.

    Every write to its slot is counted (`FlashSnapshots.slots`), and the hook writes before any step
    it takes outside a round's pause: PRESENT when its session is created (then, if a round is open,
    it parks before its first step), PRESENT again when it stops waiting for a release that did not
    come within ``wait_secs``, ABSENT when its session ends.
    """

    def __init__(self, snapshots: FlashSnapshots, trainer: int, wait_secs: float = 10.0) -> None:
        self._snap = snapshots
        self._trainer = int(trainer)
        self._wait = float(wait_secs)
        self._carried: list[Any] = []  # the graph's carried commits (begin)
        self._parked_at = 0
        self.parks = 0
        self.timeouts = 0

    def after_create_session(self, session: Any, coord: Any) -> None:
        # Present: the chief waits for this trainer to park (a slot never started, or left, is not waited for).
        self._snap.park(session, self._trainer, PRESENT)
        requested, released = self._snap.gate(session)
        if requested > released:  # a round began before this session: park before the first step
            self._park_for(session, requested)

    def end(self, session: Any) -> None:
        try:
            self._snap.park(session, self._trainer, ABSENT)  # leaving (data done, --remove-worker, scaled down)
        except (tf.errors.OpError, RuntimeError):
            pass

    def begin(self) -> None:
        self._carried = carried_commits()

    def before_run(self, run_context: Any) -> Any:
        return tf.compat.v1.train.SessionRunArgs(self._snap.gate_value)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        requested, released = (int(x) for x in run_values.results)
        if requested > released and requested > self._parked_at:
            self._park_for(run_context.session, requested)

    def _park_for(self, sess: Any, requested: int) -> None:
        self._parked_at = requested
        for commit in self._carried:  # parked with its last step committed: nothing pending
            commit.flush(sess)
        self._snap.park(sess, self._trainer, requested)
        self.parks += 1
        deadline = time.monotonic() + self._wait
        while self._snap.gate(sess)[1] < requested:
            if time.monotonic() >= deadline:
                # Counted: a capture still running when this trainer steps again is dropped, not spoiled.
                self._snap.park(sess, self._trainer, PRESENT)
                self.timeouts += 1
                _LOG.warning("flash checkpoint round %d not released within %.1f s: training on", requested, self._wait)
                return
            time.sleep(POLL_SECS)


class FlashCheckpointHook(tf.compat.v1.train.SessionRunHook):
    """The chief's flash checkpoint rounds (see the module docstring).

    Args:
      snapshots: the graph's `FlashSnapshots`.
      lock: a context manager factory held around the capture (the reconciler's `exclusive`).
      busy: whether a background rebuild is under way (no round then).
      trainer: the chief's trainer index (0).
      listeners: `CheckpointSaverListener`s: ``before_save`` runs while the trainers are parked,
        before the capture (what it records, e.g. the data's progress, is then never ahead of
        the snapshot), ``after_save`` with the snapshot's global step once it is captured, before its
        files are written (a snapshot restorable after a cut write has it too; one never complete
        leaves a record older than any later snapshot's).
      strict: for jobs without delta logs (`tf_ecrec.flash.stock`), whose capture cannot see a
        step in flight: a round captures only once every other trainer's slot is parked for it or
        absent, and the capture counts only if no slot was written meanwhile (`FlashSnapshots.slots`).
    """

    def __init__(self, snapshots: FlashSnapshots, lock: Callable[[], Any], busy: Callable[[], bool],
                 trainer: int = 0, listeners: Sequence[Any] = (), strict: bool = False) -> None:
        self._snap = snapshots
        self._strict = bool(strict)
        self._config = snapshots.config
        self._lock = lock
        self._busy = busy
        self._trainer = trainer
        self._listeners = list(listeners)
        self._step = tf.compat.v1.train.get_global_step()
        self._writer: threading.Thread | None = None
        self._slot: int | None = None
        self._last_step = 0
        self._last_time = time.monotonic()
        self._due_at: int | None = None  # the step the round being written became due at
        self._lateness: collections.deque[int] = collections.deque(maxlen=4)  # steps from due to written
        self._epoch = 0
        self.rounds = 0
        self.skipped = 0
        self.pauses: list[float] = []  # seconds each round paused training (request to release)
        self.captures: list[float] = []  # of which the capture (listeners, logs read, copies, logs read)
        self.snapshots: list[tuple[int, int]] = []  # (epoch, global step) complete in memory
        self.write_seconds: list[float] = []

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._join_writer()
        requested, released = self._snap.gate(session)
        if requested > released:  # a round a previous chief left open: let the parked trainers go
            self._snap.release(session, requested)
        self._epoch = max(self._epoch, requested)
        self._last_step = int(session.run(self._step))
        self._last_time = time.monotonic()
        self._due_at = None
        self._slot = None

    def before_run(self, run_context: Any) -> Any:
        return tf.compat.v1.train.SessionRunArgs(self._step)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        step = int(run_values.results)
        writing = self._writer is not None and self._writer.is_alive()
        if self._due_at is not None and not writing:  # the last round's snapshot is complete (or failed)
            self._lateness.append(step - self._due_at)
            self._due_at = None
        early = early_steps(self._lateness)
        if not self._config.due(step, self._last_step, time.monotonic(), self._last_time, early):
            return
        if writing or self._busy():
            return
        due_at = self._last_step + max(1, self._config.every_steps - early)
        if self.round(run_context.session) is not None and self._config.every_steps:
            self._due_at = due_at

    def end(self, session: Any) -> None:
        self._join_writer()
        self.save_stats()

    def save_stats(self) -> None:
        """Writes what the rounds cost to ``<model_dir>/flash_stats.json`` (benchmarks read it)."""
        stats = {"rounds": self.rounds, "skipped": self.skipped, "pause_seconds": [round(x, 4) for x in self.pauses],
                 "capture_seconds": [round(x, 4) for x in self.captures],
                 "write_seconds": [round(x, 4) for x in self.write_seconds], "snapshots": self.snapshots,
                 "bytes": sum(self._snap.bytes.values())}
        path = os.path.join(self._snap.model_dir, STATS_FILE)
        with tf.io.gfile.GFile(path + ".tmp", "w") as fh:
            fh.write(json.dumps(stats))
        tf.io.gfile.rename(path + ".tmp", path, overwrite=True)

    def _join_writer(self) -> None:
        if self._writer is not None:
            self._writer.join(timeout=600.0)
            self._writer = None

    def round(self, sess: Any) -> int | None:
        """One round now; returns the captured global step, or None if the capture was dropped."""
        self._epoch = max(int(time.time() * 1000), self._epoch + 1)
        epoch = self._epoch
        if self._slot is None:
            self._slot = self._free_slot(sess)
        started = time.perf_counter()
        for commit in carried_commits(sess.graph):  # the chief's own last step, committed before the capture
            commit.flush(sess)
        self._snap.request(sess, epoch)
        step = None
        try:  # released whatever happens once requested: parked trainers must not wait out their deadline
            activity = self._park_all(sess, epoch)
            parked_at = time.perf_counter()
            if activity is not None:
                for listener in self._listeners:
                    listener.before_save(sess, self._last_step)
                with self._lock():
                    step = self._snap.capture(sess)
                if step is not None and not self._quiet(sess, activity):
                    step = None  # a trainer started, left or stopped waiting during the capture
                self.captures.append(time.perf_counter() - parked_at)
        finally:
            self._snap.release(sess, epoch)
        self.pauses.append(time.perf_counter() - started)
        self.rounds += 1
        self._last_time = time.monotonic()
        if step is None:
            self.skipped += 1
            _LOG.info("flash checkpoint round %d skipped: %s", epoch,
                      "a step was in flight" if activity is not None else "a trainer did not park")
            return None
        self._last_step = step
        # Before the files: a snapshot restorable once its write is done, or cut after its own tier, has it.
        for listener in self._listeners:
            listener.after_save(sess, step)
        slot = self._slot
        tiers = list(self._snap.tiers())
        persist = self._config.persist_every
        if persist and (self.rounds - self.skipped) % persist == 0:
            tiers.append(Tier.DISK)
        self._writer = threading.Thread(target=self._write, args=(sess, epoch, step, slot, tiers),
                                        name="ec-flash-writer", daemon=True)
        self._writer.start()
        return step

    def _park_all(self, sess: Any, epoch: int) -> int | None:
        """Waits (at most ``park_secs``) for the other trainers to park for `epoch`; returns the slots'
        write count then, or None when a strict round must not capture (one did not park)."""
        slots, activity = self._snap.slots(sess)
        others = [i for i in range(self._snap.num_trainers) if i != self._trainer and slots[i] >= PRESENT]
        deadline = time.monotonic() + self._config.park_secs
        while True:
            # Strict: every slot, also one that became present meanwhile (it parks before its first step).
            waited = [i for i in range(self._snap.num_trainers) if i != self._trainer and slots[i] != ABSENT] \
                if self._strict else others
            if all(slots[i] >= epoch for i in waited):
                return activity
            if time.monotonic() >= deadline:
                return None if self._strict else activity
            time.sleep(POLL_SECS)
            slots, activity = self._snap.slots(sess)

    def _quiet(self, sess: Any, activity: int) -> bool:
        """Strict rounds: no trainer wrote its slot since `activity` was read (always True otherwise)."""
        return not self._strict or self._snap.slots(sess)[1] == activity

    def _write(self, sess: Any, epoch: int, step: int, slot: int, tiers: list[Tier]) -> None:
        started = time.perf_counter()
        try:
            self._snap.write(sess, epoch, step, slot, tiers)
        except (tf.errors.OpError, RuntimeError) as exc:  # a PS lost or the session closed mid-write
            _LOG.warning("flash checkpoint of step %d not written: %s: %s", step, type(exc).__name__,
                         " ".join(str(exc).split())[:600])
            return
        # The next round writes the other slot; after a cut write, this one again (the other holds the newest).
        self._slot = (slot + 1) % SLOTS
        self.write_seconds.append(time.perf_counter() - started)
        self.snapshots.append((epoch, step))
        _LOG.info("flash checkpoint of step %d in %s (%.2f s)", step, "+".join(t.value for t in tiers),
                  time.perf_counter() - started)

    def _free_slot(self, sess: Any) -> int:
        """The slot that does not hold PS 0's newest own copy (a restarted chief keeps the newest)."""
        own = [c for c in self._snap.find(sess) if c.tier is Tier.OWN and c.ps == 0]
        if not own:
            return 0
        newest = max(own, key=lambda c: c.manifest.epoch)
        return (newest.slot + 1) % SLOTS
