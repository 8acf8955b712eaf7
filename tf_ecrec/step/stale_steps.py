"""Steps a dead task left in the delta logs, settled with training going on (part of `steplog.Reconciler`), and
the pure parts of settlement's calls: which entries go together in a session call, which steps can be undone at once.

A live trainer's step commits within milliseconds of its writes (or, with the commit carried by its
next run, `tf_ecrec.step.carried_commit`, within one step); a step pending longer than `STALE_SECS` whose
round-1 commit is not waiting behind an earlier step is a dead task's. `settle_stale` settles those
(the chief's background settler), `settle_left_behind` those pending when a trainer ends.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import tensorflow as tf

from tf_ecrec.ops.log_snapshot import EntryKind

STALE_SECS = 5.0
"""A step pending this long and not waiting behind another belongs to a dead task."""


@dataclasses.dataclass
class SettleReport:
    """What one settlement did (counts of steps, and of fold entries rolled back)."""

    undone: int = 0
    finished: int = 0
    committed: int = 0
    rolled_back: int = 0

    def add(self, other: SettleReport) -> None:
        """Adds `other`'s counts to these."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def counts(self) -> dict[str, int]:
        return {"undone": self.undone, "finished": self.finished, "committed": self.committed}


class StaleSteps:
    """The stale-step half of `steplog.Reconciler` (which provides `settle`, `_read` and `_pending`)."""

    _read: dict[int, Any]
    _pending: dict[int, Any]

    def settle(self, sess: Any, alive: Iterable[int], lost: Iterable[int], only: Any = None) -> Any:
        raise NotImplementedError

    def settle_stale(self, sess: tf.compat.v1.Session, alive: Iterable[int], stale_secs: float,
                     exclude: Iterable[int] = ()) -> SettleReport | None:
        """Settles the steps pending longer than `stale_secs` whose commit is not waiting on an
        earlier step (a live step waits; a dead task's does not), with training going on; never the
        steps `exclude` (this trainer's own, whose commit its next run carries)."""
        alive = sorted(p for p in alive if p in self._read)
        age, waiting = self._pending_ages(sess, alive)
        mine = set(exclude)
        stale = sorted(s for s, a in age.items() if a >= stale_secs and s not in waiting and s not in mine)
        if not stale:
            return None
        return self.settle(sess, alive, (), only=stale)

    def settle_left_behind(self, sess: tf.compat.v1.Session, alive: Iterable[int], stale_secs: float = STALE_SECS,
                           poll_secs: float = 0.05, clock: Callable[[], float] = time.monotonic,
                           sleep: Callable[[float], None] = time.sleep) -> SettleReport:
        """At the end of a trainer's training: settles the steps pending now that dead tasks left.

        Other trainers' steps commit within milliseconds and are left alone (fencing them would fail
        them). Each step pending at the first read is watched until it commits, or settled once stale
        (`settle_stale`'s rule); the wait is bounded by about ``2 * stale_secs``."""
        alive = sorted(p for p in alive if p in self._read)
        total = SettleReport()
        deadline = clock() + 2 * stale_secs
        watched: set[int] | None = None
        while True:
            age, waiting = self._pending_ages(sess, alive)
            watched = set(age) if watched is None else watched
            left = watched & set(age)
            stale = sorted(s for s in left if age[s] >= stale_secs and s not in waiting)
            if not stale and clock() >= deadline:  # a step that waits this long: whatever waits on it
                stale = sorted(left)
            if stale:
                total.add(self.settle(sess, alive, (), only=stale))
                left -= set(stale)
            if not left:
                return total
            sleep(poll_secs)

    def _pending_ages(self, sess: tf.compat.v1.Session, alive: list[int]) -> tuple[dict[int, float], set[int]]:
        """Every pending sid's age in seconds (its oldest entry on any log) and those waiting in round 1."""
        values = sess.run({p: self._pending[p] for p in alive})
        age: dict[int, float] = {}
        waiting: set[int] = set()
        for sids, ages, waits in values.values():
            for s, a, w in zip(sids, ages, waits):
                age[int(s)] = max(age.get(int(s), 0.0), float(a))
                if w:
                    waiting.add(int(s))
        return age, waiting


def session_waves(sess: Any, entries: Sequence[tuple[int, Any]]) -> list[list[tuple[int, Any]]]:
    """`entries` ((target, feeds) each) grouped into session calls of at most one entry per target, a
    target's in the order given; one per call where a distinct call costs a trace (`FunctionSession`)."""
    if not getattr(sess, "batches_settlement", True):
        return [[entry] for entry in entries]
    calls: list[list[tuple[int, Any]]] = []
    depth: dict[int, int] = {}
    for entry in entries:
        i = depth[entry[0]] = depth.get(entry[0], -1) + 1
        if i == len(calls):
            calls.append([])
        calls[i].append(entry)
    return calls


def session_lists(sess: Any, entries: Sequence[tuple[int, int]]) -> list[list[tuple[int, list[int]]]]:
    """`entries` ((target, seq) each) as session calls of (target, its seqs in the order given): one call for them
    all (an undo takes a list), or one entry per call where a distinct call costs a trace (`FunctionSession`)."""
    if not getattr(sess, "batches_settlement", True):
        return [[(target, [seq])] for target, seq in entries]
    lists: dict[int, list[int]] = {}
    for target, seq in entries:
        lists.setdefault(target, []).append(seq)
    return [list(lists.items())] if lists else []


def undoable(snap: Any, entry: Any) -> bool:
    """Whether an ordered undo of `entry` would pass now: `snap` (its log's `DeltaLogSnapshot`) holds no later entry
    of its target, and no later one left the log with its update in effect."""
    return bool(snap.undoable(entry)) and not any(o.target == entry.target and o.seq > entry.seq for o in snap.entries)


def step_undoable(snaps: dict[int, Any], sid: int, kinds: tuple[int, ...] = (EntryKind.APPLY,)) -> bool:
    """Whether every entry of step `sid` in `snaps` of one of `kinds` (by default its applies) is `undoable`."""
    return all(undoable(v, e) for v in snaps.values() for e in v.entries if e.sid == sid and e.kind in kinds)


def undo_plan(snaps: dict[int, Any], candidates: Sequence[int]) -> tuple[list[int], dict[int, Any]]:
    """(steps, view): the run of `candidates` (step ids) that can be undone one after the other, newest first (each
    one's applies and counts undoable once the ones before are gone), and the logs' view without them; settlement
    undoes such a run in two session calls (every fold, then every other entry)."""
    plan: list[int] = []
    left = list(candidates)
    while True:
        sid = next((s for s in left if step_undoable(snaps, s, (EntryKind.APPLY, EntryKind.COUNTER))), None)
        if sid is None:
            return plan, snaps
        plan.append(sid)
        left.remove(sid)
        snaps = without(snaps, sid)


def without(snaps: dict[int, Any], sid: int) -> dict[int, Any]:
    """`snaps` (per PS, a `DeltaLogSnapshot`) without step `sid`'s entries: the logs once it is undone."""
    return {p: dataclasses.replace(v, entries=[e for e in v.entries if e.sid != sid]) for p, v in snaps.items()}
