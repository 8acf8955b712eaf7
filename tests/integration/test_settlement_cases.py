"""The exactness issue's cases 1-6, each scripted on the fault-schedule harness and checked by its oracle.

Each case that corrupted the model under the earlier protocol (1, 2, 5) also
runs against a reconciler with that protocol's gap put back (`_NoRollback`:
parity keeps folds beyond the committed prefix of a lost variable) and must
then report a violation: the script does reach the failure it names.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.fault_schedule import InjectedCrash, Sequence, _CrashingSession
from integration.test_fault_schedule import _NoRollback, _UndoUncountedFoldsOfLostSources
from integration.tf_cluster import tf_cluster

from tf_ecrec.step.step_program import TargetKind

cluster = tf_cluster(num_ps=4)

_RANK = {"apply": 0, "fold": 1, "count": 2, "round1": 3, "round2": 4}


def _phased(seq: Sequence, worker: int) -> None:
    """Gives `worker` a new step whose applies all come before its folds."""
    w = seq.workers[worker]
    w.step = seq._new_step(w)
    w.step.actions.sort(key=lambda a: _RANK[a[0]])


def _folds_into(seq: Sequence, worker: int, parity_ps: int) -> None:
    """Runs `worker`'s folds whose op lives on `parity_ps` (its other folds stay undone)."""
    w = seq.workers[worker]
    p = seq.rig.program
    for kind, arg in list(w.step.actions):
        if kind == "fold" and p.folds[arg[0]][arg[1]].device.endswith(f"task:{parity_ps}/device:CPU:0"):
            w.step.actions = [(kind, arg)] + [a for a in w.step.actions if a != (kind, arg)]
            seq._advance(w)


def _case1(seq: Sequence) -> None:
    for _ in range(3):
        assert seq.finish_step(0) and seq.finish_step(1)
    _phased(seq, 0)
    seq.run_until(0, "fold")  # worker 0 dies after its applies, before any fold
    for _ in range(2):
        assert not seq.finish_step(1)  # worker 1 trains the same rows; its commit waits behind 0's step
    seq._kill_ps([0], scripted=True)  # the data PS worker 0 updated dies before anything settled


def _case2(seq: Sequence) -> None:
    for _ in range(3):
        assert seq.finish_step(0) and seq.finish_step(1)
    _phased(seq, 0)
    seq.run_until(0, "fold")
    _folds_into(seq, 0, parity_ps=2)  # folded into the parity on ps 2 only, then died
    assert not seq.finish_step(1)  # overtaken on the same rows
    seq._kill_ps([0], scripted=True)


def _case5(seq: Sequence) -> None:
    for _ in range(3):
        assert seq.finish_step(0) and seq.finish_step(1)
    _phased(seq, 0)
    seq.run_until(0, "fold")  # S applies on D
    _phased(seq, 1)
    seq.run_until(1, "round1")  # C applies the same rows of D, folds, counts: it waits to commit
    seq.run_until(0, "count")  # S folds into parity
    seq._kill_ps([1], scripted=True)  # then D dies


# name -> (script, r, the earlier protocol's rule that corrupts it)
CASES = {
    "1-dead-worker-then-data-ps": (_case1, 1, _NoRollback),
    "2-one-parity-reached": (_case2, 2, _NoRollback),
    "5-undo-after-evidence-died": (_case5, 2, _UndoUncountedFoldsOfLostSources),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_rebuilds_only_states_whole_updates_produced(cluster, name):
    script, r, _ = CASES[name]
    seq = Sequence(cluster.target("chief"), 17, k=2, r=r, num_ps=2 + r, workers=2, ticks=0)
    with seq.start():
        script(seq)
        seq._drain()
        seq._full_settle("end")
    assert seq.stats.violations == []
    assert seq.stats.parity_checks >= 2


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_is_caught_when_the_protocol_has_the_old_gap(cluster, name):
    script, r, broken = CASES[name]
    found = []
    for seed in (17, 18, 19):
        seq = Sequence(cluster.target("chief"), seed, k=2, r=r, num_ps=2 + r, workers=2, ticks=0, reconciler_cls=broken)
        with seq.start():
            try:
                script(seq)
            except AssertionError:
                continue
        found.extend(seq.stats.violations)
        if found:
            break
    assert found, f"case {name} did not show the corruption of {broken.__name__}"


def test_case3_a_step_fenced_by_settlement_fails_at_commit_and_is_not_acknowledged(cluster):
    seq = Sequence(cluster.target("chief"), 23, k=2, r=1, num_ps=3, workers=2, ticks=0)
    with seq.start():
        assert seq.finish_step(0)
        seq.run_until(1, "round2")  # worker 1 is about to finish its commit when the chief (re)starts
        sid = seq.workers[1].step.sid
        seq._full_settle("chief restart")  # fences and settles worker 1's step
        seq.finish_step(1)
        assert sid not in seq.ok  # its session.run failed: its records are not acknowledged
        seq._full_settle("end")
    assert seq.stats.violations == []


@pytest.mark.parametrize("crash_after", [0, 4, 8, 10])  # of its 11 calls (a call fewer: the test fails)
def test_case4_settlement_cut_anywhere_and_run_again_gives_the_same_result(cluster, crash_after):
    seq = Sequence(cluster.target("chief"), 29, k=2, r=2, num_ps=4, workers=2, ticks=0)
    with seq.start():
        for _ in range(2):
            assert seq.finish_step(0) and seq.finish_step(1)
        _phased(seq, 0)
        seq.run_until(0, "round1")  # counted, then died before committing: it must be finished
        seq.workers[0].step = None
        with pytest.raises(InjectedCrash):
            seq.rig.plan.prepare(_CrashingSession(seq.sess, crash_after), restore=None)
        seq.rig.plan.prepare(seq.sess, restore=None)
        seq.rig.plan.prepare(seq.sess, restore=None)
        seq._check("after reruns")
        seq._check_parity("after reruns")
        step = seq.sess.run(seq.rig.variables[seq.rig.step_name])
    assert seq.stats.violations == []
    assert step == 5  # four committed steps and the finished one, each counted once


class _DiesBeforeFoldUndo(_CrashingSession):
    """Passes calls through until the first that undoes a fold (an undo on a parity or replica), and dies
    instead of running it."""

    def __init__(self, sess: tf.compat.v1.Session, fold_undos: set) -> None:
        super().__init__(sess, after=1 << 30)
        self._fold_undos = fold_undos

    def run(self, fetches, feed_dict=None, **kwargs):
        if any(f in self._fold_undos for f in tf.nest.flatten(fetches)):
            raise InjectedCrash()
        return super().run(fetches, feed_dict, **kwargs)


def test_a_step_undone_in_batched_calls_keeps_its_folds_until_its_applies_are_undone_too(cluster):
    """Settlement undoes a cut step's entries many to a session call (`Reconciler._undo_together`): its folds
    first, then its applies.  A chief that dies just before its first fold undo leaves a rerun that undoes the
    step whole; the other order would leave folds of applies no log holds any more, which the rerun commits
    into parity (the mutation check: swap the two calls and this test fails)."""
    seq = Sequence(cluster.target("chief"), 43, k=2, r=1, num_ps=3, workers=2, ticks=0)
    with seq.start():
        assert seq.finish_step(0) and seq.finish_step(1)
        _phased(seq, 0)
        seq.run_until(0, "count")  # applied and folded everywhere, not counted: settlement undoes it
        seq.workers[0].step = None
        rec = seq.rig.plan.reconciler
        fold_undos = {rec._undo[t] for t, target in rec.targets.items() if target.kind in (TargetKind.PARITY, TargetKind.REPLICA)}
        with pytest.raises(InjectedCrash):
            seq.rig.plan.prepare(_DiesBeforeFoldUndo(seq.sess, fold_undos), restore=None)
        report = seq.rig.plan.settle(seq.sess)
        seq._check("after the rerun")
        seq._check_parity("after the rerun")
        step = seq.sess.run(seq.rig.variables[seq.rig.step_name])
    assert report.undone == 1, report
    assert seq.stats.violations == []
    assert step == 2  # the two committed steps; the cut one undone


def test_case6_a_trainer_of_an_older_generation_changes_nothing(cluster):
    seq = Sequence(cluster.target("chief"), 31, k=2, r=1, num_ps=3, workers=2, ticks=0)
    with seq.start():
        assert seq.finish_step(0) and seq.finish_step(1)
        before = seq.sess.run(seq.rig.variables)
        seq.rig.plan.reconciler.set_generation(seq.sess, range(3), 1)  # a PS moved: generation 1
        seq.workers[0].zombie = True  # worker 0 still trains against the old cluster view
        assert not seq.finish_step(0)
        after = seq.sess.run(seq.rig.variables)
        seq.workers[1].generation = 1
        assert seq.finish_step(1)  # a trainer that followed the move trains on
    assert seq.stats.zombie_writes_refused == 1 and seq.stats.violations == []
    for name, value in before.items():
        assert after[name].tobytes() == value.tobytes(), name


def test_a_rebuilt_ps_refuses_old_generations_too(cluster):
    seq = Sequence(cluster.target("chief"), 37, k=2, r=1, num_ps=3, workers=2, ticks=0)
    with seq.start():
        assert seq.finish_step(0)
        seq.rig.plan.reconciler.set_generation(seq.sess, range(3), 2)
        seq._kill_ps([1], scripted=True)
        snaps = seq.rig.plan.reconciler._snapshots(seq.sess, [0, 1, 2])
    assert [snaps[p].generation for p in range(3)] == [2, 2, 2]


class _CountingSession:
    def __init__(self, sess):
        self.sess, self.calls = sess, 0

    def run(self, *args, **kwargs):
        self.calls += 1
        return self.sess.run(*args, **kwargs)


def test_a_rebuild_cut_at_any_call_leaves_the_ps_lost_and_the_workers_waiting_until_a_whole_rebuild(cluster):
    """The rebuild allocates the lost variables before it writes them: cut after any of its session calls, the PS
    must still count as lost (its whole-state marker is written last) and no worker may step on it."""
    seq = Sequence(cluster.target("chief"), 31, k=2, r=1, num_ps=3, workers=2, ticks=0)
    with seq.start():
        for _ in range(3):
            assert seq.finish_step(0) and seq.finish_step(1)
        seq.sess.run(seq.rig.destroy[1])
        counting = _CountingSession(seq.sess)
        assert seq.rig.plan.prepare(counting, restore=None).method == "parity"
        seq._check("a whole rebuild")
        # Every call but the last (the report's read of the global step, after the marker is written).
        for crash_after in range(1, counting.calls - 1):
            assert seq.finish_step(0)
            seq.sess.run(seq.rig.destroy[1])
            with pytest.raises(InjectedCrash):
                seq.rig.plan.prepare(_CrashingSession(seq.sess, crash_after), restore=None)
            with pytest.raises(tf.errors.AbortedError):
                seq.sess.run(seq.rig.ready)  # a worker's session keeps waiting
                pytest.fail(f"the workers' ready op passed after a rebuild cut after {crash_after} calls")
            result = seq.rig.plan.prepare(seq.sess, restore=None)
            assert result.method == "parity" and result.lost_ps == [1], (crash_after, result)
            seq.sess.run(seq.rig.ready)
            seq._check(f"rebuild cut after {crash_after} calls, then whole")
            seq._check_parity(f"rebuild cut after {crash_after} calls, then whole")
    assert counting.calls >= 5
    assert seq.stats.violations == []


def _live_and_dead(seq: Sequence) -> int:
    """Worker 1 mid-step (applied, folded, counted), worker 0 dead after applying after it; 1's sid."""
    for _ in range(2):
        assert seq.finish_step(0) and seq.finish_step(1)
    _phased(seq, 1)
    seq.run_until(1, "round1")
    live = seq.workers[1].step.sid
    _phased(seq, 0)
    seq.run_until(0, "fold")
    return live


def test_a_trainer_ending_settles_a_dead_step_and_leaves_a_live_one_to_commit(cluster):
    # The chief's end (SettleAtEndHook) looks at the logs while another worker is mid-step and
    # one died mid-step: the live step must commit, the dead one be settled.
    seq = Sequence(cluster.target("chief"), 29, k=2, r=1, num_ps=3, workers=2, ticks=0)
    with seq.start():
        live = _live_and_dead(seq)
        looked = threading.Event()
        box: dict[str, object] = {}

        def sleep(secs: float) -> None:
            looked.set()  # the end has read the logs once: both steps are pending and watched
            time.sleep(secs)

        def end_of_training() -> None:
            box["report"] = seq.rig.plan.reconciler.settle_left_behind(
                seq.sess, range(3), stale_secs=3.0, poll_secs=0.02, sleep=sleep
            )

        ending = threading.Thread(target=end_of_training)
        ending.start()
        assert looked.wait(30)
        assert seq.finish_step(1)  # not fenced: it commits while the end watches it
        ending.join(60)
        assert not ending.is_alive()
        assert live in seq.ok
        report = box["report"]
        assert report.undone + report.finished == 1  # the dead step, and only it
        seq.workers[0].step = None
        seq._full_settle("end")
    assert seq.stats.violations == []


def test_settling_everything_at_the_end_would_fail_the_live_step(cluster):
    # What SettleAtEndHook did before: every pending step settled, the live one fenced.
    seq = Sequence(cluster.target("chief"), 31, k=2, r=1, num_ps=3, workers=2, ticks=0)
    with seq.start():
        live = _live_and_dead(seq)
        seq.rig.plan.reconciler.settle(seq.sess, range(3))
        assert not seq.finish_step(1)
        assert live not in seq.ok
        seq.workers[0].step = None
        seq._full_settle("end")
    assert seq.stats.violations == []
