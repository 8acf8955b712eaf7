"""Restores and the data's progress (issue 30, case 1), and restores against straggling writes.

The flash schedule (`tests/harness/flash_schedule.py`) keeps the data's progress as a job master does
and checks that every acknowledged record is in the model.  Case 1: r + 1 PS lost, the model restored
from a snapshot, and the chief dies before its rollback reaches the master; the next chief restores
nothing.  The rollback is owed in the model dir before the restore writes (`tf_ecrec.recovery.owed`)
and the next chief's `OwedRollbackHook` pays it.  The mutation keeps the rule where it was (in the
chief's memory, from the recovery's result) and the oracle must catch it.

The straggler tests write on a survivor while the restore runs (a step of the failed session whose
write arrives late): the write must not be kept with its log entry discarded (parity inexact).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness import fault_schedule, flash_schedule
from harness.flash_schedule import DATASET
from integration.tf_cluster import tf_cluster

from tf_ecrec.hooks.shard_rollback import roll_back_shards
from tf_ecrec.recovery.owed import owed

cluster = tf_cluster(num_ps=4)


def _trained_snapshot_then_more(seq: flash_schedule.FlashSequence, before: int = 6, after: int = 8) -> int:
    """OK steps, a complete snapshot (its progress saved beside it), more OK steps: the progress at the snapshot."""
    for _ in range(before):
        assert seq.finish_step(0)
    seq._drain()
    seq._settle_dead()
    seq._capture(cut=False)
    assert seq.flash.captures == 1, seq.flash
    at_snapshot = seq.master.progress
    for _ in range(after):
        assert seq.finish_step(0)
    assert seq.master.progress == at_snapshot + after * fault_schedule.BATCH  # acknowledged, not in the snapshot
    return at_snapshot


def test_a_chief_dead_after_a_flash_restore_leaves_the_rollback_owed_and_the_next_chief_pays_it(cluster, tmp_path):
    seq = flash_schedule.FlashSequence(cluster.target("chief"), 51, str(tmp_path), k=2, r=1, num_ps=3,
                                       chief_deaths=1.0, outages=1.0)  # the chief dies; the master is away
    with seq.start():
        at_snapshot = _trained_snapshot_then_more(seq)
        assert seq._lose_beyond_r()  # restored from memory; the chief died; its successor cannot reach the master
        assert seq.flash.memory_restores == 1 and seq.flash.chief_deaths_before_rollback == 1
        debt = owed(seq.model_dir)
        assert debt is not None and debt.what == "flash checkpoint"  # kept, not dropped
        assert seq.master.rollbacks == [] and seq.master.progress > at_snapshot
        seq.outages = 0.0
        seq._full_settle("chief restart")  # the next chief start reaches the master and pays
        assert owed(seq.model_dir) is None
        assert seq.master.rollbacks == [at_snapshot] and seq.flash.rollbacks_paid == 1
        step = int(seq.sess.run(seq.rig.variables[seq.rig.step_name]))
        assert debt.step == step and seq.master.progress <= step * fault_schedule.BATCH
        for _ in range(4):  # training goes on; the next snapshot saves the progress again
            assert seq.finish_step(0)
        seq._capture(cut=False)
        assert os.path.exists(os.path.join(seq.model_dir, f"shard_state-{DATASET}-{step + 4}.json"))
        seq._check_records("after training on")
    assert seq.stats.violations == [] and seq.flash.record_checks >= 2, (seq.stats.violations, seq.flash)


class _RollbackInChiefMemory(flash_schedule.FlashSequence):
    """The mutation: no rollback is persisted, and the chief that restored pays it from memory (the rule
    before the fix: `RecoveryResult.global_step` through the recovery listener, read by its hook)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rig.plan._model_dir = None  # restores owe nothing in the model dir

    def _restored(self, result):
        if self.data_rng.random() < self.chief_deaths:
            self.flash.chief_deaths_before_rollback += 1  # its memory dies with it
            self.rig.plan.prepare(self.sess, restore=None)
            self._settled_all()
        else:
            roll_back_shards(self.master, DATASET, self.model_dir, result.global_step, "flash checkpoint")
        self._check_records("chief session")


def test_the_oracle_catches_a_rollback_kept_in_the_chiefs_memory(cluster, tmp_path):
    seq = _RollbackInChiefMemory(cluster.target("chief"), 52, str(tmp_path), k=2, r=1, num_ps=3, chief_deaths=1.0)
    with seq.start():
        _trained_snapshot_then_more(seq)
        assert seq._lose_beyond_r()
    assert any("acknowledged records are in no model" in v for v in seq.stats.violations), seq.stats.violations


def test_generated_sequences_with_chief_deaths_and_master_outages_keep_every_record_in_the_model(cluster, tmp_path):
    def enough(stats, flash):  # the failures this test is for happened, and records were checked
        return (flash.memory_restores >= 2 and flash.chief_deaths_before_rollback >= 1 and flash.rollbacks_paid >= 2
                and flash.record_checks >= 4)

    stats, flash = flash_schedule.run_flash_sequences(cluster.target("chief"), [61, 62, 63], tmp_path, enough, k=2, r=1,
                                                      num_ps=3, ticks=500, chief_deaths=0.6, outages=0.3)
    assert stats.violations == [], stats.violations[:5]
    assert flash.memory_restores >= 2 and flash.chief_deaths_before_rollback >= 1 and flash.rollbacks_paid >= 2, flash
    assert flash.record_checks >= 4, flash


class _Straggling:
    """`FlashSnapshots` whose first restore is followed, before it returns, by one write of a straggler."""

    def __init__(self, inner, write):
        self._inner = inner
        self._write = write
        self.restores = 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def restore(self, *args, **kwargs):
        self.restores += 1
        out = self._inner.restore(*args, **kwargs)
        write, self._write = self._write, None
        if write is not None:
            write()
        return out


def _straggler_during_restore(cluster, tmp_path, seed, wrote_before):
    seq = flash_schedule.FlashSequence(cluster.target("chief"), seed, str(tmp_path), k=2, r=1, num_ps=3,
                                       chief_deaths=0.0, outages=0.0)
    late = fault_schedule._Worker(99, 0)  # a trainer of the failed session, not one the loss abandons
    outcome = {}
    with seq.start():
        _trained_snapshot_then_more(seq, before=4, after=3)
        late.step = seq._new_step(late)
        while wrote_before and late.step.actions[0][0] != "count":
            seq._advance(late)  # applied and folded everywhere: entries in every log, a known step

        def write():
            failed = seq.stats.steps_failed
            seq._advance(late)
            outcome["refused"] = seq.stats.steps_failed > failed

        seq.rig.plan.flash = straggling = _Straggling(seq.rig.flash, write)
        restored = seq._lose_beyond_r()
        outcome["restores"] = straggling.restores
    return seq, restored, outcome


def test_a_known_steps_write_during_a_restore_is_refused_or_overwritten_and_parity_stays_exact(cluster, tmp_path):
    for seed in (71, 73):
        seq, restored, outcome = _straggler_during_restore(cluster, tmp_path / str(seed), seed, wrote_before=True)
        # Fenced before the overwrite on the survivors: refused there; a write on a restored PS is found
        # after the overwrite, which runs again.
        assert restored and (outcome == {"refused": True, "restores": 1}
                             or outcome == {"refused": False, "restores": 2}), outcome
        assert seq.stats.violations == [], seq.stats.violations  # rows as captured, parity exact


def test_an_unseen_steps_write_during_a_restore_is_overwritten_and_parity_stays_exact(cluster, tmp_path):
    seq, restored, outcome = _straggler_during_restore(cluster, tmp_path, 72, wrote_before=False)
    assert restored and outcome == {"refused": False, "restores": 2}, outcome  # found after the overwrite: again
    assert seq.stats.violations == [], seq.stats.violations  # rows as captured, parity exact
