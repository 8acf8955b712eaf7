"""Issue 30, case 3 and the rebuild's failures: a chief cut inside a rebuild call, a loop's op error,
a chief that dies before the rebuild's finish (docs/rebuild.md, "Failures during the rebuild").

Each case is scripted on the fault-schedule harness (`tests/harness/fault_schedule.py`) and checked by
its oracle; the generated sequences at the end cut rebuild calls at random, and the mutation test runs
case 3 against a rebuild whose rebuilt PS do not keep their T0 words, which the oracle must catch.
"""

from __future__ import annotations

import os
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness import fault_schedule
from harness.fault_schedule import Sequence
from integration.tf_cluster import tf_cluster

from tf_ecrec.base.retry import Retry
from tf_ecrec.layout.device import ps_index
from tf_ecrec.rebuild.rebuilder import Rebuilder

cluster = tf_cluster(num_ps=4)


def _train(seq: Sequence, steps: int) -> None:
    for _ in range(steps):
        for w in range(len(seq.workers)):
            seq.finish_step(w)


def _views(seq: Sequence) -> dict[int, list[int]]:
    """PS -> [rows pending, rows saved]."""
    stats = seq.rig.plan.rebuilder.view_stats(seq.sess, range(seq.rig.num_ps))
    return {p: [int(x) for x in v] for p, v in stats.items()}


def _case3(seq: Sequence) -> None:
    """2+2 on 4 PS, PS 0 and 1 lost together; the walk's last slice is cut after PS 0's installs."""
    _train(seq, 2)
    assert seq._kill_ps([0, 1], scripted=True)
    job = seq._job()
    assert job.lost == [0, 1]
    while len(job._slices) - job._next > 1:  # every slice but the last, training in between
        seq._install_slice()
        _train(seq, 1)  # lookups ask for pending rows; installed rows of PS 0 change with training
    seq.cut_rebuild_call(lambda ops: [op for op in ops if ps_index(op.device) == 0])
    resumed = seq._job()
    assert resumed is not None and resumed.lost == [1], "the cut did not leave PS 1 alone unfinished"
    _train(seq, 2)
    seq._full_settle("after the resumed rebuild")


def test_a_rebuild_resumed_after_a_cut_inside_its_last_slice_decodes_from_t0_words(cluster):
    # Case 3: the resumed rebuild of PS 1 decodes from PS 0, whose rows were rebuilt in the same
    # rebuild and trained since; it must read their T0 words, not the trained ones.
    seq = Sequence(cluster.target("chief"), 3030, k=2, r=2, num_ps=4, background=True)
    with seq.start():
        _case3(seq)
    assert seq.stats.violations == []
    assert seq.stats.rebuild_cuts == 1 and seq.stats.parity_checks >= 1


class _RebuiltPSForgetsT0(Rebuilder):
    """Case 3's bug put back: at T0 only the survivors keep their T0 words, not the PS being rebuilt."""

    def _t0_ranges(self, g, lost):
        return [] if g.ps in lost else super()._t0_ranges(g, lost)


def test_the_oracle_catches_case_3_when_the_rebuilt_ps_do_not_keep_t0(cluster):
    seq = Sequence(cluster.target("chief"), 3030, k=2, r=2, num_ps=4, background=True,
                   rebuilder_cls=_RebuiltPSForgetsT0)
    with seq.start():
        _case3(seq)
    assert any("holds a value no sequence of its updates produced" in v for v in seq.stats.violations) or any(
        "parity check" in v for v in seq.stats.violations), seq.stats.violations


def test_a_chief_that_dies_between_the_last_install_and_the_finish_leaves_no_preservation(cluster):
    # Every row installed, the finish (which ends the survivors' preservation) never ran: the next
    # session must end it, or every distinct row written from then on is saved on the survivors.
    seq = Sequence(cluster.target("chief"), 3131, k=2, r=1, num_ps=3, background=True)
    with seq.start():
        _train(seq, 2)
        assert seq._kill_ps([0], scripted=True)
        job = seq._job()
        while job.install_next_slice(seq.sess):
            pass
        assert _views(seq)[0][0] == 0  # nothing pending: only the finish is missing
        seq.rig.plan.prepare(seq.sess, restore=None)  # the chief's next session
        seq._settled_all()
        _train(seq, 4)
        assert {p: v for p, v in _views(seq).items() if any(v)} == {}
        seq._full_settle("end")
    assert seq.stats.violations == []


class _FailingOnce:
    """A session whose first `fail` calls of rebuild ops raise UnavailableError (a PS's transient error)."""

    def __init__(self, sess: tf.compat.v1.Session, fail: int) -> None:
        self._sess, self._fail, self._lock = sess, fail, threading.Lock()
        self.failed = 0

    def run(self, fetches, feed_dict=None, **kwargs):
        with self._lock:
            failing = self._fail > 0 and fault_schedule.rebuild_call(fetches)
            if failing:
                self._fail -= 1
                self.failed += 1
        if failing:
            raise tf.errors.UnavailableError(None, None, "injected: the PS did not answer")
        return self._sess.run(fetches, feed_dict, **kwargs)


def test_a_background_rebuild_retries_a_transient_op_error_instead_of_stopping(cluster):
    # Before: the loop that met the error stopped the rebuild until the next session re-creation;
    # lookups of pending rows waited up to the operation timeout and a checkpoint save raised.
    seq = Sequence(cluster.target("chief"), 3232, k=2, r=1, num_ps=3, background=True)
    with seq.start():
        _train(seq, 2)
        assert seq._kill_ps([1], scripted=True)
        job = seq._job()
        job.retry = job.retry.replace(delay=0.01, max_delay=0.05, deadline=60.0)
        flaky = _FailingOnce(seq.sess, fail=3)
        done = threading.Event()
        job.start(flaky, on_done=lambda _: done.set())
        assert job.wait(timeout=120), f"the rebuild stopped: {job.error!r}"
        assert flaky.failed == 3 and done.is_set() and job.error is None
        assert {p: v for p, v in _views(seq).items() if any(v)} == {}
        seq._check("after the rebuild")
        seq._full_settle("end")
    assert seq.stats.violations == []


def test_a_background_rebuild_gives_up_after_its_retries_and_names_the_error(cluster):
    seq = Sequence(cluster.target("chief"), 3233, k=2, r=1, num_ps=3, background=True)
    with seq.start():
        assert seq._kill_ps([1], scripted=True)
        job = seq._job()
        job.retry = Retry(max_tries=2, delay=0.0, deadline=None)
        job.start(_FailingOnce(seq.sess, fail=10**6))
        assert not job.wait(timeout=60)
        assert isinstance(job.error, tf.errors.UnavailableError)
        assert np.any([v[0] for v in _views(seq).values()])  # rows still pending: the next session resumes


@pytest.mark.parametrize("k,r,num_ps", [(2, 1, 3), (2, 2, 4)])
def test_generated_sequences_with_rebuild_calls_cut_inside_keep_every_invariant(cluster, k, r, num_ps):
    def enough(s):
        return s.background_rebuilds >= 2 and s.rebuild_cuts >= 2 and s.steps_ok >= 20 and s.parity_checks >= 4

    # A cut in one of every four rebuild events (not one in eleven): the cuts this test is for come in
    # the first sequences whatever the timing.
    stats = fault_schedule.run_sequences(cluster.target("chief"), [3300 + 10 * r + i for i in range(3)], k=k, r=r,
                                         num_ps=num_ps, background=True, enough=enough, rebuild_cut_weight=7)
    assert stats.violations == []
    assert enough(stats), stats
