"""Flash checkpoints against generated failure sequences (`tests/harness/flash_schedule.py`).

Captures land between any two ops of asynchronous workers' steps and must be accepted exactly
when no step is open (the harness's own model of the steps, not the logs the capture reads);
writes are cut by chief crashes; r + 1 PS are lost at once and must come back from the newest
complete snapshot in memory, bit for bit as captured, with parity exact.  The mutation test
breaks the capture's check and requires the oracle to notice.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness import flash_schedule
from integration.tf_cluster import tf_cluster

from tf_ecrec.flash.snapshots import FlashSnapshots

cluster = tf_cluster(num_ps=4)


def test_captures_and_losses_beyond_r_restore_exactly_from_memory(cluster, tmp_path):
    def enough(stats, flash):  # the sequences did what they are for
        return (flash.captures >= 4 and flash.captures_dropped >= 4 and flash.memory_restores >= 2
                and flash.writes_cut >= 1 and stats.steps_ok >= 20 and stats.parity_checks >= 4)

    stats, flash = flash_schedule.run_flash_sequences(cluster.target("chief"), [11, 14, 15, 16, 17, 18], tmp_path,
                                                      enough, k=2, r=1, num_ps=3, ticks=600)
    assert stats.violations == []
    assert enough(stats, flash), (stats, flash)


def test_two_plus_two_loses_three_and_restores_from_memory(cluster, tmp_path):
    stats, flash = flash_schedule.run_flash_sequences(cluster.target("chief"), [21], tmp_path, k=2, r=2, num_ps=4,
                                                      ticks=500)
    assert stats.violations == []
    assert flash.captures >= 2 and flash.memory_restores >= 1, flash


class _CaptureIgnoringLogs(FlashSnapshots):
    """Broken on purpose: copies without checking that no step is in flight."""

    def capture(self, sess):
        before = sess.run(self._before)
        sess.run(self._copy)
        return int(before.get("step", 0))


def _violations_with(broken: type, target: str, seeds, tmp_path) -> list[str]:
    """The violations of the first seed that finds any, with the Rig's `FlashSnapshots` of class `broken`."""

    class Broken(flash_schedule.FlashSequence):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.rig.flash.__class__ = broken

    for seed in seeds:
        seq = Broken(target, seed, str(tmp_path / f"b{seed}"), k=2, r=1, num_ps=3, ticks=600)
        # Its events stop at the first violation (then it drains, settles and is checked): one is the proof.
        found = seq.run(stop=lambda current: bool(current.violations)).violations
        if found:
            return found
    return []


def test_the_oracle_catches_a_capture_that_ignores_steps_in_flight(cluster, tmp_path):
    found = _violations_with(_CaptureIgnoringLogs, cluster.target("chief"), (31, 32, 33), tmp_path)
    assert any("was accepted while steps" in v for v in found), found[:3]


def test_with_shared_memory_gone_the_restore_reads_the_disk_tier(cluster, tmp_path):
    """A lost host takes its shared memory: the persisted copy in the model dir is read, and says "disk"."""
    import shutil

    import numpy as np

    from tf_ecrec.flash.config import Tier

    seq = flash_schedule.FlashSequence(cluster.target("chief"), 41, str(tmp_path / "d"), k=2, r=1, num_ps=3)
    with seq.start():
        for _ in range(40):
            seq._advance(seq.workers[int(seq.rng.integers(len(seq.workers)))])
        seq._drain()
        seq._settle_dead()
        snap = seq.rig.flash
        step = snap.capture(seq.sess)
        assert step is not None
        captured = seq.rig.read_words(seq.sess)
        snap.write(seq.sess, 1, step, 0, [Tier.OWN, Tier.PEER, Tier.DISK])
        for _ in range(20):  # training goes on past the snapshot
            seq._advance(seq.workers[0])
        shutil.rmtree(snap.root)
        for p in (0, 2):
            seq.sess.run(seq.rig.destroy[p])
        result = seq.rig.plan.prepare(seq.sess, restore=None)
        assert result.method == "disk" and result.global_step == step
        values = seq.rig.read_words(seq.sess)
        assert all(np.array_equal(values[t], captured[t]) for t in captured)
        seq._check_parity("disk restore")
        assert seq.stats.violations == []


class _OldestSnapshot(FlashSnapshots):
    """Broken on purpose: restores the oldest snapshot complete on every PS, not the newest."""

    def choose(self, sess):
        from tf_ecrec.flash.config import choose

        found = self.find(sess)
        for epoch in sorted({c.manifest.epoch for c in found}):
            picked = choose([c for c in found if c.manifest.epoch == epoch], self.num_ps, self.names)
            if picked is not None:
                return picked
        return None


def test_the_oracle_catches_a_restore_of_an_older_snapshot_than_the_newest_complete(cluster, tmp_path):
    found = _violations_with(_OldestSnapshot, cluster.target("chief"), range(40, 46), tmp_path)
    assert any("restored snapshot" in v for v in found), found[:3]
