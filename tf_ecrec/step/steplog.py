"""Steps that can be cut anywhere: delta logs, the two-round commit, and settlement.

The protocol, its invariants and the case-by-case argument are in ``docs/settlement.md``; the code follows it. A step
of `ECOptimizer` (one ``session.run``, one step id whose top bits carry the trainer's cluster generation) appends each
logged write to its PS's delta log atomically with the write: 1. apply on each data PS (entries of a variable in update
order, their ``seq``); 2. fold of each apply's delta into its parities and replicas (tagged with the apply's seq); 3.
count; 4. commit round 1 on the data PS tasks, in apply order per variable (`delta_log_commit_in_order`); 5. commit
round 2 everywhere, refused for a fenced step.

`Reconciler.settle` (on the chief, one at a time per process) brings the logs to a state with nothing in flight: A.
fence the pending steps; B. roll each lost variable's folds back to its committed prefix on every surviving parity; C.
finish or undo (whole) each pending step on the survivors; D. commit, round 1 then round 2. Every action is logged
under the step's sid or removes its entry, so a rerun after a crash anywhere gives the same result.
`Reconciler.settle_stale` does it, while training goes on, for steps a dead task left (pending longer than `STALE_SECS`
and not waiting behind another); `Reconciler.settle_left_behind` for those pending when a trainer ends.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_ecrec import ops as ec_ops
from tf_ecrec.step import stale_steps as plans
from tf_ecrec.step.stale_steps import STALE_SECS, SettleReport, StaleSteps, session_waves  # noqa: F401 (STALE_SECS re-exported)
from tf_ecrec.step.step_program import Target, TargetKind

_LOG = logging.getLogger(__name__)

ROUND1_TIMEOUT_MS = 60_000
"""How long a step's round-1 commit waits for an earlier step before failing (Aborted)."""


class FeedPairs(tuple[Any, ...]):
    """Feeds as (placeholder, value) pairs: what `feeds` gives where tensors cannot be dict keys."""


def feeds(*pairs: tuple[Any, Any]) -> Any:
    """A ``feed_dict`` for ``sess.run``: a dict for a v1 session's graph, `FeedPairs` for a function graph.

    A tensor of a function graph is not hashable (TF2); settlement over TF2
    variables runs in one, through `tf_ecrec.pss.function_session`, which takes the pairs.
    """
    if any(getattr(getattr(key, "graph", None), "building_function", False) for key, _ in pairs):
        return FeedPairs(pairs)
    return dict(pairs)


ExpectedFolds = Callable[[int, np.ndarray, np.ndarray], list[tuple[int, np.ndarray, np.ndarray, int]]]
_FOLD_FEEDS: tuple[tuple[str, Any, list[None]], ...] = (  # a settlement fold's feeds: name, dtype, shape
    ("rows", tf.int64, [None]), ("delta", tf.int32, [None, None]), ("coef", tf.int32, []), ("source", tf.int32, []),
    ("source_seq", tf.int64, []))


class Reconciler(StaleSteps):
    """Graph ops (built before finalize) and the procedure that settle pending steps.

    Args:
      targets: every logged target, by id.
      logs: PS task -> delta log handle.
      expected_folds: function (data target id, rows, delta) -> list of
        (parity/replica target id, rows, delta, coef) the data update folds into.
      commit_timeout_ms: how long settlement's round-1 commit waits behind an
        earlier live step; if it runs out, round 2 is left for the next
        settlement (the steps stay fenced and settled).
    """

    def __init__(
        self, targets: dict[int, Target], logs: dict[int, tf.Tensor], expected_folds: ExpectedFolds,
        commit_timeout_ms: int = ROUND1_TIMEOUT_MS,
    ) -> None:
        self.targets = dict(targets)  # a copy: the caller's may grow (a step program traced later)
        self._expected = expected_folds
        self._lock = threading.Lock()
        with tf.name_scope("ec_reconcile"):
            self._sids = tf.compat.v1.placeholder(tf.int64, [None], name="sids")
            self._sid = tf.compat.v1.placeholder(tf.int64, [], name="sid")
            self._generation = tf.compat.v1.placeholder(tf.int64, [], name="generation")
            self._read, self._pending, self._fence, self._round1, self._round2, self._setgen = {}, {}, {}, {}, {}, {}
            for p, log in sorted(logs.items()):
                with tf.device(log.device):
                    self._read[p] = ec_ops.delta_log_read(log)
                    self._pending[p] = ec_ops.delta_log_pending(log)
                    self._fence[p] = ec_ops.delta_log_fence(log, self._sids)
                    self._round1[p] = ec_ops.delta_log_commit_in_order(log, self._sids, timeout_ms=commit_timeout_ms, bypass_fence=True)
                    self._round2[p] = ec_ops.delta_log_commit(log, self._sids, bypass_fence=True)
                    self._setgen[p] = ec_ops.delta_log_set_generation(log, self._generation)
            self._undo, self._fold, self._add = {}, {}, {}
            # Each target's undo and fold have feeds of their own, so that one session call acts on many.
            self._seq_of: dict[int, Any] = {}
            self._fold_feeds: dict[int, tuple[Any, ...]] = {}  # rows, delta, coef, source, source_seq
            for tid, t in sorted(self.targets.items()):
                log = logs[t.ps]
                with tf.device(log.device):
                    self._seq_of[tid] = tf.compat.v1.placeholder(tf.int64, [None], name=f"seq_{tid}")
                    self._undo[tid] = ec_ops.delta_log_undo(log, t.variables, self._seq_of[tid], tid, ordered=t.ordered)
                    if t.kind in (TargetKind.PARITY, TargetKind.REPLICA):
                        rows, delta, coef, source, source_seq = self._fold_feeds[tid] = tuple(
                            tf.compat.v1.placeholder(dtype, shape, name=f"{name}_{tid}") for name, dtype, shape in _FOLD_FEEDS)
                        self._fold[tid] = ec_ops.parity_update(
                            t.variables[0], rows, delta, coef=coef, log=log, sid=self._sid, target=tid,
                            source=source, source_seq=source_seq, bypass_fence=True, dedupe=True,
                        )
                    if t.kind == TargetKind.COUNTER:
                        var = t.variables[0]
                        self._add[tid] = ec_ops.assign_add_logged(
                            var, tf.constant(1, var.dtype.base_dtype), log, self._sid, tid, source=t.source,
                            bypass_fence=True, dedupe=True,
                        )

    # ---- entry points ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Holds off every settlement of this process meanwhile (a flash checkpoint's capture)."""
        with self._lock:
            yield

    def reconcile(self, sess: tf.compat.v1.Session, alive: Iterable[int], lost: Iterable[int] = ()) -> dict[str, int]:
        """Settles every pending step on the surviving PS tasks; returns counts by action."""
        return self.settle(sess, alive, lost).counts()

    def settle(self, sess: tf.compat.v1.Session, alive: Iterable[int], lost: Iterable[int] = (),
               only: Sequence[int] | None = None) -> SettleReport:
        """Steps A-D of the module docstring on the `alive` PS tasks; `lost` PS tasks' variables
        are about to be rebuilt from parity.  `only` restricts it to those steps (no lost PS)."""
        with self._lock:
            return self._settle(sess, sorted(p for p in alive if p in self._read), set(lost), only)

    def set_generation(self, sess: tf.compat.v1.Session, alive: Iterable[int], generation: int) -> None:
        """Raises the minimum generation on the alive logs (older trainers' writes then fail)."""
        ops = [self._setgen[p] for p in sorted(alive) if p in self._setgen]
        if ops:
            sess.run(ops, feeds((self._generation, generation)))

    def propagate_generation(self, sess: tf.compat.v1.Session, alive: Iterable[int], floor: int = 0) -> int:
        """Raises every alive log to the highest generation any of them admits (at least
        `floor`): a rebuilt PS starts with an empty log, and must refuse old trainers too."""
        alive = sorted(p for p in alive if p in self._read)
        top = max([floor] + [s.generation for s in self._snapshots(sess, alive).values()])
        if top > 0:
            self.set_generation(sess, alive, top)
        return top

    def fence_pending(self, sess: tf.compat.v1.Session, alive: Iterable[int], also: Iterable[int] = ()) -> set[int]:
        """Fences every step pending on the `alive` logs, and the steps `also`; returns the pending ones
        (from here their writes fail: a restore fences before it overwrites, tf_ecrec.recovery.restore)."""
        with self._lock:
            alive = sorted(p for p in alive if p in self._read)
            pending = {e.sid for s in self._snapshots(sess, alive).values() for e in s.entries}
            if pending | set(also):
                self._on_every(sess, self._fence, alive, sorted(pending | set(also)))
            return pending

    def discard(self, sess: tf.compat.v1.Session, alive: Iterable[int], sids: Iterable[int] | None = None) -> int:
        """Fences and commits the steps `sids` (default: every pending step) without acting on them (after a
        restore rewrote every variable, their logged deltas describe a state that is gone)."""
        with self._lock:
            alive = sorted(p for p in alive if p in self._read)
            pending = sorted({e.sid for s in self._snapshots(sess, alive).values() for e in s.entries}
                             if sids is None else set(sids))
            if pending:
                self._on_every(sess, self._fence, alive, pending)
                self._on_every(sess, self._round2, alive, pending)
            return len(pending)

    # ---- the procedure ---------------------------------------------------------------------------

    def _settle(self, sess: tf.compat.v1.Session, alive: list[int], lost: set[int], only: Sequence[int] | None) -> SettleReport:
        report = SettleReport()
        snaps = self._snapshots(sess, alive)
        pending = sorted({e.sid for s in snaps.values() for e in s.entries})
        if only is not None:
            pending = sorted(set(pending) & set(only))
        if not pending:
            return report
        # A. fence: from here on the logs hold these steps' entries for good.
        self._on_every(sess, self._fence, alive, pending)
        snaps = self._snapshots(sess, alive)
        pending_set = set(pending)
        round2 = {int(c) for s in snaps.values() for c in s.committed}
        # Done: committed by round 2 somewhere alive, or by round 1 somewhere alive when no data PS was lost (its folds
        # and count are then complete).  With a data PS lost, a step round-1 committed only on some PS tasks is not
        # done: B rolls its lost part back, and C undoes the rest whole (round 1 leaves its applies in the logs until
        # round 2 for that).
        lost_sources = {tid for tid, t in self.targets.items() if t.kind == TargetKind.DATA and t.ps in lost}
        done = {
            sid for sid in pending
            if sid in round2 or (not lost_sources and any(s.is_data_committed(sid) for s in snaps.values()))
        }
        # B. folds of lost variables above the committed prefix are rolled back.
        tops: dict[int, int] = {}
        if lost_sources:
            report.rolled_back, tops = self._roll_back_lost_sources(sess, snaps, lost_sources, pending_set, round2)
            snaps = self._snapshots(sess, alive)
        # C. settle each step on the survivors: first, while any can be, the steps to undo whose every apply is the
        # newest of its variable, one at a time (a trainer's step may have applied a variable after its previous step,
        # whose commit it carries: undoing the later one makes the earlier one newest, so that it is undone whole too);
        # then the others, finished (or undone where each apply is newest).
        entries = [(p, e) for p, s in snaps.items() for e in s.entries if e.sid in pending_set]
        mine = {sid: [(p, e) for p, e in entries if e.sid == sid] for sid in pending}
        keeps = {sid: self._keeps(mine[sid], tops) for sid in pending}
        report.committed += len(done)
        left, fresh, batch = [sid for sid in pending if sid not in done], True, True  # fresh: the logs as just read
        while self.undo_newest_first:
            plan, view = plans.undo_plan(snaps, [s for s in left if not keeps[s]]) if batch else ([], snaps)
            if len(plan) > 1:  # steps undone whole together, in two calls (the recovery's settle phase)
                if batch := self._undo_steps(sess, snaps, plan):
                    snaps, fresh, gone = view, False, set(plan)
                else:  # refused: settle the rest one at a time
                    snaps, fresh = self._snapshots(sess, alive), True
                    gone = {sid for sid in plan if not any(e.sid == sid for v in snaps.values() for e in v.entries)}
                left, report.undone = [sid for sid in left if sid not in gone], report.undone + len(gone)
                continue
            ready = [sid for sid in left if not keeps[sid] and plans.step_undoable(snaps, sid)]
            if not ready and not fresh:
                snaps, fresh = self._snapshots(sess, alive), True  # the view says none: read the logs to be sure
                continue
            if not ready:
                break
            sid = ready[0]
            left.remove(sid)
            now = [(p, e) for p, s in snaps.items() for e in s.entries if e.sid == sid]
            undone = self._settle_step(sess, snaps, sid, now, alive, False)
            report.undone, report.finished = report.undone + undone, report.finished + (not undone)
            # An earlier step may be newest now. Undone, its entries leave the view (a live trainer's later entry only
            # makes an undo fail) rather than a call reading every log; finished, it added some: read the logs.
            snaps, fresh = (plans.without(snaps, sid), False) if undone else (self._snapshots(sess, alive), True)
        for sid in left:
            now = [(p, e) for p, s in snaps.items() for e in s.entries if e.sid == sid]
            undone = self._settle_step(sess, snaps, sid, now, alive, keeps[sid])
            report.undone, report.finished = report.undone + undone, report.finished + (not undone)
        # D. commit, round 1 then round 2 (never round 2 before round 1 is complete).
        blocked = False
        try:
            self._on_every(sess, self._round1, alive, pending)
        except tf.errors.AbortedError as exc:
            if "earlier step" not in exc.message:
                raise
            # Behind a live step's apply on some log: the next settlement commits (round 1 again
            # everywhere: a log that committed here has nothing of these steps left to drop).
            blocked = True
        if blocked:
            _LOG.info("settled %d steps; their commit waits behind a live step", len(pending))
            return report
        self._on_every(sess, self._round2, alive, pending)
        _LOG.warning("settled %d steps in flight: %s, %d folds of lost variables rolled back", len(pending),
                     report.counts(), report.rolled_back)
        return report

    # Settlement undoes the steps it can, newest first, before finishing the others (False: in id order,
    # one pass; the mutation test shows the harness's oracle catches the partial steps that leaves).
    undo_newest_first = True

    @staticmethod
    def _keeps(mine: list[tuple[int, ec_ops.DeltaLogEntry]], tops: dict[int, int]) -> bool:
        """Whether an uncommitted step is finished (kept) rather than undone where it can be: kept if a
        fold of a lost variable at or below the top B kept survives, or if it was counted and no data PS
        was lost (its missing folds can be made from its applies).  Otherwise B rolled its lost part
        back and the rest is undone where newest, whole (`tops` is empty when no data PS was lost)."""
        kept = any(e.kind == ec_ops.EntryKind.FOLD and e.source in tops and e.source_seq <= tops[e.source] for _, e in mine)
        counted = any(e.kind == ec_ops.EntryKind.COUNTER for _, e in mine)
        return kept or (counted and not tops)

    def _roll_back_lost_sources(
        self, sess: tf.compat.v1.Session, snaps: dict[int, ec_ops.DeltaLogSnapshot], lost_sources: set[int],
        pending: set[int], round2: set[int],
    ) -> tuple[int, dict[int, int]]:
        """Rolls the folds of every lost data variable (`lost_sources`: target ids) back to its committed
        prefix; returns the count of fold entries undone and, per lost data variable, the top seq kept."""
        undone = 0
        tops: dict[int, int] = {}
        for source in sorted(lost_sources):
            folds = [
                (p, e) for p, s in snaps.items() for e in s.entries
                if e.kind == ec_ops.EntryKind.FOLD and e.source == source and e.sid in pending
            ]
            top = max([s.settled_source.get(source, -1) for s in snaps.values()] or [-1])
            for _, e in folds:
                if e.sid in round2:
                    top = max(top, e.source_seq)
            tops[source] = top
            above = [(e.target, e.seq) for _p, e in sorted(folds, key=lambda pe: -pe[1].seq) if e.source_seq > top]
            self._undo_all(sess, above)
            undone += len(above)
        return undone, tops

    def _settle_step(
        self, sess: tf.compat.v1.Session, snaps: dict[int, ec_ops.DeltaLogSnapshot], sid: int,
        mine: list[tuple[int, ec_ops.DeltaLogEntry]], alive: list[int], keep: bool,
    ) -> bool:
        """Finishes (`keep`) or undoes one uncommitted step on the survivors, an update that is not the newest of its
        variable being finished in any case; True if it was wholly undone."""
        applies = sorted(((p, e) for p, e in mine if e.kind == ec_ops.EntryKind.APPLY), key=lambda pe: -pe[1].seq)
        # Whole: undone only if every apply of it is the newest of its variable (else finished), so a
        # step that another overtook on one variable is not undone on the others.
        keep = keep or not all(plans.undoable(snaps[p], e) for p, e in applies)
        all_undone = not keep
        folds_of = {e.target: [(q, f) for q, f in mine if f.kind == ec_ops.EntryKind.FOLD and f.source == e.target]
                    for _p, e in applies}
        counts = [(p, e) for p, e in mine if e.kind == ec_ops.EntryKind.COUNTER]
        # Its count undone in the call of its applies when it can be (a call fewer per step undone): an apply that
        # cannot be undone fails that call, and the count is then made again below (its adds are deduplicated).
        with_count = [(e.target, e.seq) for _, e in counts] if all(plans.undoable(snaps[p], e) for p, e in counts) else []
        if not keep and self._undo_together(sess, [(f.target, f.seq) for _p, e in applies for _q, f in folds_of[e.target]],
                                            [(e.target, e.seq) for _p, e in applies] + with_count):
            if with_count or not counts:
                return True
            applies = []  # every apply undone, each after its folds
        adds = [self._add[tid] for tid, t in sorted(self.targets.items()) if t.kind == TargetKind.COUNTER and t.ps in alive]
        if keep and applies:
            # Finished whole: its count's missing increments ride the last call of its folds (one session call
            # fewer per step; counted before folded is a state every step is in until its fold round).
            self._fold_all(sess, sid, [f for _p, e in applies for f in self._folds_to_finish(e, alive)],
                           also=adds if counts else [])
            return False
        for _p, e in applies:  # one at a time: each undone where it still can be, else finished
            if not keep and self._undo_apply(sess, e, folds_of[e.target]):
                continue
            all_undone = False
            self._fold_all(sess, sid, self._folds_to_finish(e, alive))
        if not counts:
            return all_undone
        if all_undone and all(plans.undoable(snaps[p], e) for p, e in counts):
            if self._undo_together(sess, [], [(e.target, e.seq) for _, e in counts]) or all(
                [self._undo_apply(sess, e, []) for _, e in counts]  # noqa: C419 (every undo runs)
            ):
                return True
        # Counted on every copy (the missing increments made, deduplicated): the step was finished, or
        # it was undone but another step counted after it (the global step then runs one ahead of the
        # whole steps; every variable still holds whole updates only, and the copies agree).
        if adds:
            sess.run(adds, feeds((self._sid, sid)))
        return all_undone

    def _undo_steps(self, sess: tf.compat.v1.Session, snaps: dict[int, ec_ops.DeltaLogSnapshot], plan: list[int]) -> bool:
        """Undoes the steps `plan` (an `undo_plan`) whole: folds, then the rest; False if refused (a live trainer's)."""
        entries = [e for sid in plan for v in snaps.values() for e in v.entries if e.sid == sid]
        folds = [(e.target, e.seq) for e in entries if e.kind == ec_ops.EntryKind.FOLD]
        return self._undo_together(sess, folds, [(e.target, e.seq) for e in entries if e.kind != ec_ops.EntryKind.FOLD])

    def _undo_apply(self, sess: tf.compat.v1.Session, e: ec_ops.DeltaLogEntry, folds: list[tuple[int, Any]]) -> bool:
        self._undo_all(sess, [(f.target, f.seq) for _, f in folds])
        try:
            self._undo_all(sess, [(e.target, e.seq)])
            return True
        except tf.errors.FailedPreconditionError:
            return False  # a later update of the variable came in meanwhile: finish instead

    def _undo_together(self, sess: tf.compat.v1.Session, folds: list[tuple[int, int]], applies: list[tuple[int, int]]) -> bool:
        """Undoes a step's `folds`, then its `applies` ((target, seq) each), in a few session calls; False if an apply
        could not be undone (a later update of its variable came in): then some may have been, and the caller goes on
        one apply at a time (an undo of an entry no longer there does nothing)."""
        self._undo_all(sess, folds)
        try:
            self._undo_all(sess, applies)
            return True
        except tf.errors.FailedPreconditionError:
            return False

    def _undo_all(self, sess: tf.compat.v1.Session, entries: Sequence[tuple[int, int]]) -> None:
        """Undoes the log entries `entries` ((target, seq); a target's in the order to undo them) in one session call,
        each target's undo taking its list: a call costs a round trip, and a settlement undoes tens of entries per step
        in flight (the recovery's settle phase).  Raises as the undo that fails does; those done before stay undone."""
        for call in plans.session_lists(sess, entries):
            sess.run([self._undo[t] for t, _ in call], feeds(*((self._seq_of[t], seqs) for t, seqs in call)))

    def _folds_to_finish(self, e: ec_ops.DeltaLogEntry, alive: list[int]) -> list[tuple[int, tuple[Any, ...]]]:
        """The folds that finish apply `e` on the alive PS tasks: (target, (rows, delta, coef, source, source_seq))
        each; a lost parity is re-encoded from the data anyway.  Already there, a fold is not made twice."""
        return [(target, (rows, delta, coef, e.target, e.seq))
                for target, rows, delta, coef in self._expected(e.target, e.rows, e.delta) if self.targets[target].ps in alive]

    def _fold_all(self, sess: tf.compat.v1.Session, sid: int, folds: list[tuple[int, tuple[Any, ...]]],
                  also: Sequence[Any] = ()) -> None:
        """Makes step `sid`'s `folds` (from `_folds_to_finish`), one of a target per session call (a fold is
        commutative, and a replica has one source); the ops `also` (of `sid` too) run in the last call."""
        waves = session_waves(sess, folds)
        if also and (not waves or not getattr(sess, "batches_settlement", True)):
            waves.append([])  # a call of their own (unbatched: one kind of call per trace, `FunctionSession`)
        for i, wave in enumerate(waves):
            pairs = [(self._sid, sid)] + [pair for t, values in wave for pair in zip(self._fold_feeds[t], values)]
            sess.run([self._fold[t] for t, _ in wave] + (list(also) if i == len(waves) - 1 else []), feeds(*pairs))

    def _on_every(self, sess: tf.compat.v1.Session, ops: dict[int, Any], alive: list[int], sids: Sequence[int]) -> None:
        """Runs the per-log op `ops[p]` for `sids` on every alive log in one session call (a new session registers a
        graph on each PS per distinct call: one call, not one per PS)."""
        sess.run([ops[p] for p in alive], feeds((self._sids, sids)))

    def _snapshots(self, sess: tf.compat.v1.Session, alive: list[int]) -> dict[int, ec_ops.DeltaLogSnapshot]:
        values = sess.run({p: self._read[p] for p in alive})
        return {p: ec_ops.parse_delta_log(list(v)) for p, v in values.items()}
