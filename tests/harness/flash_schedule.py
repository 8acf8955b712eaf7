"""Flash checkpoints under the fault-schedule harness (`fault_schedule.Sequence`), with an oracle.

Besides the base sequence's events (asynchronous workers' steps op by op, worker kills, stale and
full settlements, PS kills rebuilt from parity, generation bumps), a `FlashSequence`:

* **captures** at any point between two ops, or (mostly) after the workers finished their steps
  and dead ones' were settled, as the trainers' gate and the stale-step settler leave it (`FlashSnapshots.capture`, the part of a round during
  which training is paused) and, when the capture is accepted, writes it to shared memory
  (`FlashSnapshots.write`), sometimes cut by a chief crash after any of its session calls;
* **loses more PS than the code covers** (r + 1 at once), and recovers (`RecoveryPlan.prepare`).

The oracle is a model of the steps, independent of the logs the capture reads: a step is *open*
from its first write that took effect until it commits or a settlement settles it (a step that
failed or whose worker died stays open until then).  A capture must be accepted exactly when no
step is open, and what it copies is then checked against the base oracle (each row a state real
updates produced).  After the r + 1 loss, the recovery must restore from memory, from the newest
snapshot whose write completed (or a newer complete one a cut write left), every row bit for bit
as captured, with parity exact; without a complete snapshot it must refuse.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from tf_ecrec.errors import RecoveryError
from tf_ecrec.flash.config import SLOTS, Tier

from . import fault_schedule
from .fault_schedule import InjectedCrash, Oracle, _CrashingSession


@dataclasses.dataclass
class FlashStats:
    captures: int = 0
    captures_dropped: int = 0
    writes_cut: int = 0
    memory_restores: int = 0
    refused_without_snapshot: int = 0


class FlashSequence(fault_schedule.Sequence):
    """A `fault_schedule.Sequence` with flash checkpoint rounds and losses beyond r (module docstring)."""

    def __init__(self, target: str, seed: int, flash_dir: str, **kwargs: Any) -> None:
        super().__init__(target, seed, flash_dir=flash_dir, **kwargs)
        self.flash = FlashStats()
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

    def _open(self) -> set[int]:
        return set(self.unsettled) | {w.step.sid for w in self.workers if w.step is not None and w.step.wrote}

    def _capture(self, cut: bool) -> None:
        snap = self.rig.flash
        if self.rng.random() < 0.7:  # as the gate does: trainers finish their steps, the dead ones' are settled
            self._drain()
            self._settle_dead()
        open_steps = self._open()
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
        epoch = max(found)
        if epoch != max(known, default=None):
            self.stats.violations.append(f"seed {self.seed}: restored snapshot {epoch}; complete were {known}")
        self.flash.memory_restores += 1
        self._check_parity("memory restore")
        # From here the model is the snapshot: the oracle restarts from it, earlier OK steps are rolled back.
        self.oracle = Oracle(values, atomic=self.atomic)
        self.ok.clear()
        return True
