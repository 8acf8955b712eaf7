"""Generated failure sequences against the settlement protocol, checked by a replaying oracle.

`tests/harness/fault_schedule.py` drives three asynchronous workers' steps op
by op on an in-process cluster and injects worker, chief and PS failures
(one or two PS at once, crashes and second failures during recovery,
generation changes) between any two ops; after every settlement and recovery
it checks invariants (i)-(iii) and (vi) of docs/settlement.md.  A fixed list
of seeds runs here; `benchmarks/settlement_soak.py` runs many more.

With ``background=True`` the lost rows are rebuilt while the workers go on
(docs/rebuild.md), the harness interleaving the rebuild's slices and the rows
lookups ask for with the workers' ops and the failures.

The mutation tests at the end run the same harness against deliberately
broken protocols and require it to find violations: the oracle is not
vacuous.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf
from harness import fault_schedule
from integration.tf_cluster import tf_cluster

from tf_ecrec.rebuild.rebuilder import Rebuilder
from tf_ecrec.rebuild.stripes import CollectionRebuild
from tf_ecrec.step import steplog

cluster = tf_cluster(num_ps=4)

SEEDS = list(range(4))


def _steps_covered(s: fault_schedule.Stats) -> bool:
    """Steps ran to their end, and some of them became durable.  Under the carried commit most steps
    that return are given up by the next failure before their commit runs (a sequence of 800 ticks
    makes about 3 durable): asking for 20 durable steps ran seven sequences where three cover the
    failure kinds."""
    return s.steps_returned >= 20 and s.steps_ok >= 6


@pytest.mark.parametrize("k,r,num_ps", [(2, 1, 3), (2, 2, 4)])
def test_generated_failure_sequences_keep_every_invariant(cluster, k, r, num_ps):
    def enough(s):  # the sequences did what they are for: steps completed and failures of every kind happened
        return (_steps_covered(s) and s.ps_kills >= 3 and s.worker_kills >= 3 and s.parity_checks >= 6
                and s.stale_settlements >= 1)

    stats = fault_schedule.run_sequences(cluster.target("chief"), [s + 100 * r for s in SEEDS], k=k, r=r,
                                         num_ps=num_ps, enough=enough, carried=True)
    assert stats.violations == []
    assert enough(stats), stats


def test_generated_sequences_with_sgd_and_adam(cluster):
    # The commit in the step's own run (ECOptimizer commit="in_step", as TF2 ParameterServerStrategy steps do).
    for optimizer, seed in (("sgd", 7), ("adam", 8)):
        def enough(s):  # steps of this optimizer's kernels completed, and a PS was lost and rebuilt after some
            return s.steps_ok >= 10 and s.ps_kills >= 1 and s.parity_checks >= 2

        stats = fault_schedule.run_sequences(cluster.target("chief"), [seed], k=2, r=2, num_ps=4, optimizer=optimizer,
                                             enough=enough)
        assert stats.violations == [], optimizer
        assert enough(stats), (optimizer, stats)


@pytest.mark.parametrize("k,r,num_ps", [(2, 1, 3), (2, 2, 4)])
def test_generated_sequences_with_the_rebuild_in_the_background_keep_every_invariant(cluster, k, r, num_ps):
    # Rebuilds ran in the background, steps of the workers completed while they did (lookups asked
    # for pending rows), and failures landed in the middle of them; steps folded by fold rounds (the
    # Estimator jobs' default), which fold into rows a rebuild has not installed yet.
    def enough(s):
        return (s.background_rebuilds >= 2 and s.slices_installed >= 5 and s.rows_asked_by_lookups > 0
                and s.steps_returned >= 20 and s.steps_ok >= 6 and s.fold_rounds >= 5 and s.parity_checks >= 6)

    stats = fault_schedule.run_sequences(cluster.target("chief"), [300 * r, 300 * r + 1, 300 * r + 2], k=k, r=r,
                                         num_ps=num_ps, background=True, enough=enough, batched=True)
    assert stats.violations == []
    assert enough(stats), stats


class _NoRollback(steplog.Reconciler):
    """The old protocol's gap: a lost variable's parity keeps folds beyond the committed prefix."""

    def _roll_back_lost_sources(self, *args, **kwargs):
        return 0, {}


def undo_folds_of_lost_sources(reconciler, sess, snaps, sources, undo) -> int:
    """Undoes every logged fold of the lost data variables `sources` that `undo(entry, snaps)` picks."""
    picked = [e for s in snaps.values() for e in s.entries if e.kind == 1 and e.source in sources and undo(e, snaps)]
    for e in picked:
        sess.run(reconciler._undo[e.target], {reconciler._seq_of[e.target]: [e.seq]})
    return len(picked)


class _UndoUncountedFoldsOfLostSources(steplog.Reconciler):
    """The earlier rule for a lost data PS (case 5): undo the folds of steps not yet counted, keep the others."""

    def _roll_back_lost_sources(self, sess, snaps, lost_sources, pending, round2):
        counted = {e.sid for s in snaps.values() for e in s.entries if e.kind == 2}
        return undo_folds_of_lost_sources(self, sess, snaps, lost_sources, lambda e, snaps: e.sid not in counted), {}


@pytest.mark.parametrize("broken", [_NoRollback, _UndoUncountedFoldsOfLostSources])
def test_the_oracle_catches_a_broken_protocol(cluster, broken):
    stats = fault_schedule.run_sequences(
        cluster.target("chief"), list(range(200, 204)), k=2, r=2, num_ps=4, reconciler_cls=broken, until_violation=True
    )
    assert stats.violations, "the harness found nothing wrong with a protocol that corrupts"


class _DecodeFromCurrentWords(CollectionRebuild):
    """A rebuild that ignores the survivors' preservation: it decodes from their words as they are now, which
    includes the updates of steps whose folds have not reached parity yet."""

    @staticmethod
    def _t0_words(variables, log, rows, name):
        parts = [tf.reshape(tf.bitcast(tf.gather(v, rows), tf.int32), [tf.size(rows), -1]) for v in variables]
        return tf.concat(parts, axis=1, name=name)


class _NoPreserveRebuilder(Rebuilder):
    collection_rebuild = _DecodeFromCurrentWords


def test_the_oracle_catches_a_background_rebuild_that_decodes_from_current_words(cluster):
    stats = fault_schedule.run_sequences(cluster.target("chief"), [400, 401, 402, 403], k=2, r=1, num_ps=3,
                                         background=True, rebuilder_cls=_NoPreserveRebuilder, until_violation=True)
    assert stats.background_rebuilds >= 1
    assert stats.violations, "the harness found nothing wrong with a rebuild that decodes from moving words"


@pytest.mark.parametrize("k,r,num_ps", [(2, 1, 3), (2, 2, 4)])
def test_with_one_writer_every_cut_step_is_undone_or_kept_whole(cluster, k, r, num_ps):
    # One worker, never killed: nothing overtakes a step, so every step cut by a failure (a PS lost
    # anywhere in it, the chief restarting) must end wholly undone or wholly kept.
    def enough(s):  # steps ran and became durable, and failures cut them
        return _steps_covered(s) and s.ps_kills >= 2

    stats = fault_schedule.run_sequences(cluster.target("chief"), [500 + 10 * r + s for s in range(3)], k=k, r=r,
                                         num_ps=num_ps, workers=1, atomic=True, carried=True, enough=enough)
    assert stats.violations == []
    assert enough(stats), stats


class _FinishCountedSteps(steplog.Reconciler):
    """The earlier rule: a counted step is finished even when a lost data PS's part of it was rolled back."""

    @staticmethod
    def _keeps(mine, tops):
        return steplog.Reconciler._keeps(mine, tops) or any(e.kind == 2 for _, e in mine)


def test_the_atomic_oracle_catches_a_step_kept_on_the_survivors_only(cluster):
    stats = fault_schedule.run_sequences(cluster.target("chief"), list(range(600, 610)), k=2, r=1, num_ps=3, workers=1,
                                         atomic=True, reconciler_cls=_FinishCountedSteps, until_violation=True)
    assert stats.violations, "the harness found nothing wrong with a protocol that keeps part of a step"


class _AcknowledgedOnReturn(fault_schedule.Sequence):
    """A trainer that acknowledges a step when its run returns, before the commit its next run carries."""

    def _end_run(self, worker):
        step = worker.step
        done = step is not None and not step.actions and (step.commit or self.batched)
        super()._end_run(worker)
        if done:
            self.ok.add(step.sid)


@pytest.mark.parametrize("mode", ["carried", "batched"])
def test_the_oracle_catches_a_step_acknowledged_before_it_is_durable(cluster, mode):
    # The durability rule is what makes returning before the commit safe: a returned step that a PS
    # failure undoes must not have been acknowledged.
    stats = fault_schedule.Stats()
    for seed in range(700, 712):
        stats.add(_AcknowledgedOnReturn(cluster.target("chief"), seed, k=2, r=1, num_ps=3, **{mode: True}).run(
            stop=lambda s: bool(s.violations)))
        if stats.violations:
            break
    assert stats.violations, "the harness found nothing wrong with acknowledging steps on return"


class _OldestFirst(steplog.Reconciler):
    """Settlement that settles pending steps in one pass, in id order: a trainer's later step, still in its
    logs, can keep its earlier step (whose commit it carried) from being undone whole."""

    undo_newest_first = False


def test_the_atomic_oracle_catches_settlement_that_undoes_the_older_step_first(cluster):
    stats = fault_schedule.run_sequences(cluster.target("chief"), list(range(800, 812)), k=2, r=1, num_ps=3, workers=1,
                                         atomic=True, carried=True, reconciler_cls=_OldestFirst, until_violation=True)
    assert stats.violations, "the harness found nothing wrong with settling a trainer's older step first"


@pytest.mark.parametrize("k,r,num_ps", [(2, 1, 3), (2, 2, 4)])
def test_generated_sequences_with_folds_batched_over_steps_keep_every_invariant(cluster, k, r, num_ps):
    """Steps of applies and a count, folded and committed by the workers' fold rounds (cut anywhere,
    interleaved with other workers' steps and rounds): the oracle's OK steps are the ones a round found
    durable, and a failure may undo only returned steps that were not."""
    def enough(s):
        return (s.steps_ok >= 10 and s.fold_rounds >= 8 and s.returned_not_durable >= 3 and s.ps_kills >= 2
                and s.worker_kills >= 1 and s.parity_checks >= 4)

    stats = fault_schedule.run_sequences(cluster.target("chief"), [900 + 10 * r + s for s in range(3)], k=k, r=r,
                                         num_ps=num_ps, enough=enough, batched=True)
    assert stats.violations == []
    assert enough(stats), stats


class _ReadyWithoutFolds(fault_schedule.Sequence):
    """Fold rounds that commit every counted step, whether its applies are folded on every target or not."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.check_ready = False


def test_the_oracle_catches_a_batched_step_committed_before_its_folds(cluster):
    stats = fault_schedule.Stats()
    for seed in range(950, 962):
        stats.add(_ReadyWithoutFolds(cluster.target("chief"), seed, k=2, r=1, num_ps=3, batched=True).run(
            stop=lambda s: bool(s.violations)))
        if stats.violations:
            break
    assert stats.violations, "the harness found nothing wrong with committing steps whose folds are missing"


def test_a_kept_rig_begins_each_sequence_as_built_and_on_servers_that_hold_nothing_of_the_last(cluster):
    # The sequences of a configuration share one graph and one session (fault_schedule.rig_for, Rig.session):
    # each must begin as a fresh graph on reset servers would, or its oracle's claims hold for a state
    # no fresh start has.
    first = fault_schedule.Sequence(cluster.target("chief"), 41, k=2, r=1, num_ps=3, ticks=400, background=True)
    first.run()
    assert first.stats.steps_ok > 0 and first.stats.background_rebuilds > 0, first.stats
    snapshot = fault_schedule.snapshot_of(first.rig)
    assert snapshot.differences(), "the sequence changed no Python state: this test would show nothing"
    kept = first.rig._session[1]
    second = fault_schedule.Sequence(cluster.target("chief"), 42, k=2, r=1, num_ps=3, ticks=0, background=True)
    assert second.rig is first.rig
    assert snapshot.differences() == []
    with second.start() as sess:
        assert sess is kept
        assert all(sess.run(second.rig.plan._initialized))
        logs = second.rig.plan.reconciler._snapshots(sess, [0, 1, 2])
        for p, log in logs.items():
            assert not log.entries and not len(log.committed) and not len(log.fenced), (p, log)
            assert not log.settled and not len(log.data_committed) and log.generation == 0, (p, log)
        assert second.finish_step(0)
