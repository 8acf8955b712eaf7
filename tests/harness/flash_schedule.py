"""Flash checkpoints under the fault-schedule harness (`fault_schedule.Sequence`), with an oracle.

Besides the base sequence's events (asynchronous workers' steps op by op, worker kills, stale and
full settlements, PS kills rebuilt from parity, generation bumps), a `FlashSequence`:

* **captures** at any point between two ops, or (mostly) after the workers finished their steps
  and dead ones' were settled, as the trainers' gate and the stale-step settler leave it (`FlashSnapshots.capture`, the part of a round during
  which training is paused) and, when the capture is accepted, writes it to shared memory
  (`FlashSnapshots.write`), sometimes cut by a chief crash after any of its session calls;
* **loses more PS than the code covers** (r + 1 at once), and recovers (`RecoveryPlan.prepare`);
* keeps the **data's progress** as a job master does (`FakeMaster`): every step whose call returned
  OK acknowledges `BATCH` records, each accepted capture saves the progress beside it (the real
  `ShardCheckpointListener`, asked before the capture, written before the snapshot's files), and the chief's `OwedRollbackHook` pays the
  rollback a restore owes (`tf_ecrec.recovery.owed`) at its session creation.  The **chief dies
  after a restore and before its rollback reaches the master** (its hook never runs; the next
  chief's session creation restores nothing and pays what is owed), and the master is sometimes
  **unreachable** when a chief would pay (the debt stays owed; a later session creation pays it).

The oracle is a model of the steps, independent of the logs the capture reads: a step is *open*
from its first write that took effect until it commits or a settlement settles it (a step that
failed or whose worker died stays open until then).  A capture must be accepted exactly when no
step is open, and what it copies is then checked against the base oracle (each row a state real
updates produced).  After the r + 1 loss, the recovery must restore from memory, from the newest
snapshot whose write completed (or a newer complete one a cut write left), every row bit for bit
as captured, with parity exact; without a complete snapshot it must refuse.  Every acknowledged
record is in the model: whenever no rollback is owed, the master's progress is at most the model's
global step times `BATCH` (each step trains one batch; docs/flash.md, "Every record in the model").
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from typing import Any

import numpy as np

from tf_ecrec.base.retry import Retry
from tf_ecrec.errors import MasterUnavailable, RecoveryError
from tf_ecrec.flash.config import SLOTS, Tier
from tf_ecrec.hooks.shard_progress import ShardCheckpointListener
from tf_ecrec.hooks.shard_rollback import OwedRollbackHook
from tf_ecrec.recovery.owed import owed

from . import fault_schedule
from .fault_schedule import BATCH, InjectedCrash, Oracle, _CrashingSession

DATASET = "train"


class FakeMaster:
    """The two calls of a job master the chief's rollback makes, and the acknowledgements: the data's
    progress as one count of records (what the oracle compares with the model)."""

    def __init__(self) -> None:
        self.progress = 0
        self.reachable = True
        self.rollbacks: list[int] = []  # progress restored, per rollback
        self._lock = threading.Lock()

    def ack(self, records: int) -> None:
        with self._lock:
            self.progress += records

    def shard_checkpoint(self, dataset: str) -> bytes:
        with self._lock:
            if not self.reachable:
                raise MasterUnavailable("the fake master is down")
            return json.dumps({"progress": self.progress}).encode()

    def restore_shard_checkpoint(self, dataset: str, blob: bytes) -> None:
        with self._lock:
            if not self.reachable:
                raise MasterUnavailable("the fake master is down")
            self.progress = int(json.loads(blob)["progress"])
            self.rollbacks.append(self.progress)


@dataclasses.dataclass
class FlashStats:
    captures: int = 0
    captures_dropped: int = 0
    writes_cut: int = 0
    memory_restores: int = 0
    refused_without_snapshot: int = 0
    chief_deaths_before_rollback: int = 0
    master_outages: int = 0
    rollbacks_paid: int = 0
    record_checks: int = 0


class FlashSequence(fault_schedule.Sequence):
    """A `fault_schedule.Sequence` with flash checkpoint rounds and losses beyond r (module docstring)."""

    def __init__(self, target: str, seed: int, flash_dir: str, chief_deaths: float = 0.5, outages: float = 0.2,
                 **kwargs: Any) -> None:
        super().__init__(target, seed, flash_dir=flash_dir, **kwargs)
        self.flash = FlashStats()
        self.model_dir = self.rig.flash.model_dir
        os.makedirs(self.model_dir, exist_ok=True)
        self.rig.plan._model_dir = self.model_dir  # the Rig's plan has none: where restores owe their rollback
        self.master = FakeMaster()
        self.chief_deaths = chief_deaths  # how often the chief dies between a restore and its rollback
        self.outages = outages  # how often the master cannot be reached when a chief would pay
        self.data_rng = np.random.default_rng(seed + 1_000_003)  # its own draws: the base sequence's stay as they were
        self.listener = ShardCheckpointListener(self.master, DATASET, self.model_dir)  # type: ignore[arg-type]
        self.snapshots: dict[int, np.ndarray | Any] = {}  # epoch -> words captured
        self.complete: dict[int, int | None] = dict.fromkeys(range(SLOTS))  # slot -> epoch whose write completed
        self.slot = 0
        self.epoch = 0

    def _tick(self) -> bool:
        roll = self.rng.random()
        if roll < 0.02:
            self._capture(cut=self.rng.random() < 0.3)
            return True
        if roll < 0.024:
            return self._lose_beyond_r()
        return super()._tick()

    def _advance(self, worker: Any, flush: bool = False) -> None:
        ok = self.stats.steps_ok
        super()._advance(worker, flush=flush)
        if self.stats.steps_ok > ok:  # its call returned OK: the trainer acknowledges its batch
            self.master.ack(BATCH)

    def _full_settle(self, where: str) -> None:
        super()._full_settle(where)
        if where in ("chief restart", "end"):  # a chief's session creation: it pays what is owed
            self._chief_session(reachable=True if where == "end" else None)
        if where == "end" and owed(self.model_dir) is not None:
            self.stats.violations.append(f"seed {self.seed}: a data rollback is still owed at the end")

    def _chief_session(self, reachable: bool | None = None) -> None:
        """A chief's session creation as far as the data is concerned: its `OwedRollbackHook` pays what a
        restore owes (the master reachable or not), then the oracle compares progress and model."""
        self.master.reachable = bool(self.data_rng.random() >= self.outages) if reachable is None else reachable
        self.flash.master_outages += not self.master.reachable
        before = len(self.master.rollbacks)
        payer = OwedRollbackHook(self.master, DATASET, self.model_dir,  # type: ignore[arg-type]
                                 retry=Retry(max_tries=1, delay=0.0))  # no retry thread left running
        payer.after_create_session(None, None)
        payer.end(None)
        self.flash.rollbacks_paid += len(self.master.rollbacks) - before
        self.master.reachable = True
        self._check_records("chief session")

    def _check_records(self, where: str) -> None:
        """Every acknowledged record is in the model (unless a rollback is still owed: then it is not lost)."""
        if owed(self.model_dir) is not None or self.sess is None:
            return
        step = int(self.sess.run(self.rig.variables[self.rig.step_name]))
        self.flash.record_checks += 1
        if self.master.progress > step * BATCH:
            self.stats.violations.append(
                f"seed {self.seed}: {where}: {self.master.progress - step * BATCH} acknowledged records are in no "
                f"model (the master's progress {self.master.progress}, the model's global step {step} of {BATCH})")

    def _open(self) -> set[int]:
        return set(self.unsettled) | {w.step.sid for w in self.workers if w.step is not None and w.step.wrote}

    def _capture(self, cut: bool) -> None:
        snap = self.rig.flash
        if self.rng.random() < 0.7:  # as the gate does: trainers finish their steps, the dead ones' are settled
            self._drain()
            self._settle_dead()
        open_steps = self._open()
        self.listener.before_save(self.sess, 0)  # while the trainers are parked, before the capture
        step = snap.capture(self.sess)
        if step is None:
            self.flash.captures_dropped += 1
            if not open_steps:
                self.stats.violations.append(f"seed {self.seed}: a capture with no step open was dropped")
            return
        self.flash.captures += 1
        if open_steps:
            self.stats.violations.append(
                f"seed {self.seed}: a capture was accepted while steps {sorted(open_steps)[:3]} were open")
        words = self.rig.read_words(self.sess)
        self._check("capture")
        self.epoch += 1
        self.snapshots[self.epoch] = words
        self.listener.after_save(self.sess, step)  # as the chief's round does: captured, before the files
        after = int(self.rng.integers(0, 6))  # write's calls: per tier (own, peer) empty manifests, files, manifests
        sess: Any = _CrashingSession(self.sess, after) if cut else self.sess
        try:
            snap.write(sess, self.epoch, step, self.slot, [Tier.OWN, Tier.PEER])
        except InjectedCrash:
            self.flash.writes_cut += 1
            # Cut after the own tier's manifests: this epoch is complete in memory.  Cut before: the
            # slot's previous snapshot is still complete in the peer tier (its manifests untouched).
            # Either way the hook writes this slot again next time (the other one holds the newest).
            if after >= 3:
                self.complete[self.slot] = self.epoch
            return
        if isinstance(sess, _CrashingSession):
            sess.disarm()
        self.complete[self.slot] = self.epoch
        self.slot = (self.slot + 1) % SLOTS

    def _lose_beyond_r(self) -> bool:
        lost = [int(p) for p in self.rng.choice(self.rig.num_ps, size=self.rig.r + 1, replace=False)]
        known = [e for e in self.complete.values() if e is not None]
        for p in lost:
            self.sess.run(self.rig.destroy[p])
        self.stats.ps_kills += 1
        for w in self.workers:
            if w.step is not None:
                self.stats.steps_failed += 1
                self._abandon(w)
        try:
            result = self.rig.plan.prepare(self.sess, restore=None)
        except RecoveryError:
            self.flash.refused_without_snapshot += 1
            if known:
                self.stats.violations.append(f"seed {self.seed}: PS {lost} lost with snapshot {max(known)} complete, refused")
            return False  # the job is over, loudly
        self._settled_all()
        values = self.rig.read_words(self.sess)
        found = [e for e, words in self.snapshots.items()
                 if all(np.array_equal(words[tid], values[tid]) for tid in words)]
        if result.method != "memory" or not found:
            self.stats.violations.append(f"seed {self.seed}: lost PS {lost} recovered by {result.method}, "
                                         f"matching snapshots {found}")
            return False
        # The model must hold the newest complete snapshot.  Two captures with no step between them hold
        # the same words, so the model matches both: which one was read is not visible, nor does it matter
        # (seed 61 with settlement batched: snapshots 3 and 4 alike, 4 cut before its manifests).
        if max(known, default=None) not in found:
            self.stats.violations.append(f"seed {self.seed}: restored snapshot {max(found)}; complete were {known}")
        self.flash.memory_restores += 1
        self._check_parity("memory restore")
        # From here the model is the snapshot: the oracle restarts from it, earlier OK steps are rolled back.
        self.oracle = Oracle(values, atomic=self.atomic)
        self.ok.clear()
        self._restored(result)
        return True

    def _restored(self, result: Any) -> None:
        """After a restore's session creation: the chief's hooks pay the rollback owed, unless it dies first."""
        if self.data_rng.random() < self.chief_deaths:
            # The chief dies before its hooks run: the next chief's session finds every PS whole.
            self.flash.chief_deaths_before_rollback += 1
            self.rig.plan.prepare(self.sess, restore=None)
            self._settled_all()
        self._chief_session()


def run_flash_sequences(target: str, seeds: list[int], tmp_path: Any, enough: Any = None,
                        **kwargs: Any) -> tuple[fault_schedule.Stats, FlashStats]:
    """Runs the sequences of `seeds` in order, and stops early once `enough(stats, flash)` holds: the
    coverage a test needs, reached by whichever seeds give it (the draws move when the harness gains a
    failure kind), with every sequence run checked by the oracle."""
    total, flash = fault_schedule.Stats(), FlashStats()

    def summed(seq: FlashSequence, stats: fault_schedule.Stats) -> tuple[fault_schedule.Stats, FlashStats]:  # the coverage of the sequences before and of the running one
        both, both_flash = dataclasses.replace(total, violations=list(total.violations)), dataclasses.replace(flash)
        both.add(stats)
        for field in flash.__dataclass_fields__:
            setattr(both_flash, field, getattr(flash, field) + getattr(seq.flash, field))
        return both, both_flash

    for seed in seeds:
        seq = FlashSequence(target, seed, str(tmp_path / f"s{seed}"), **kwargs)
        # The sequence during which the coverage comes to hold stops its events there (then drains,
        # settles and is checked as any other).
        stats = seq.run(stop=None if enough is None else lambda current, seq=seq: enough(*summed(seq, current)))
        total, flash = summed(seq, stats)
        if enough is not None and enough(total, flash):
            break
    return total, flash
