"""A step's commit carried by the trainer's next step: a protected step as long as apply, fold, count.

With ``commit="carried"`` (the default under `tf_ecrec.ec_model_fn`), a step's
``session.run`` ends after its applies, folds and count; the two commit rounds
of that step (`tf_ecrec.step.steplog`: round 1 on its data PS, then round 2 on every
PS) run inside the trainer's *next* ``session.run``, beside that step's own
applies, so they leave the critical path. A step is *returned* when its run
ended OK and *durable* when its commit ran OK (docs/settlement.md, "Durable
steps"):

- records are acknowledged to the master only for durable steps
  (`hooks.shard_progress.ShardProgressHook` asks `resolved`), so a returned
  step that a failure undoes is trained again, never lost;
- a returned step that is not durable is counted (its count ran), so
  settlement keeps it whole unless a data PS it wrote is lost; a durable step
  is never undone;
- at most one returned step per trainer is not durable: the one whose commit
  the next run carries.

This object is the trainer's side: which step's commit the next run carries.
`CarriedCommitHook` drives it in a MonitoredSession; anything else that runs
the protected step (a benchmark, a test) calls `run`. A session created anew
(`reset`) gives up the step it carried: its commit is left to settlement, and
its records to be trained again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_ecrec.base.graph_registry import GraphRegistry
from tf_ecrec.errors import ConfigError

_LOG = logging.getLogger(__name__)

_REGISTRY: GraphRegistry[CarriedCommit] = GraphRegistry()

MODES = ("carried", "in_step", "batched")
ENV_COMMIT = "TF_ECREC_COMMIT"
"""Overrides the default commit mode of every ECOptimizer built without ``commit=`` (one of `MODES`)."""


def commit_mode_from_environ() -> str | None:
    """``TF_ECREC_COMMIT`` (None when unset); ConfigError for anything but one of `MODES`."""
    value = os.environ.get(ENV_COMMIT, "").strip()
    if not value:
        return None
    if value not in MODES:
        raise ConfigError(f"{ENV_COMMIT}={value!r}; rule: one of {MODES}; source: the environment")
    return value


def carried_commits(graph: tf.Graph | None = None) -> list[CarriedCommit]:
    """The deferred commits of `graph` (the default graph): one per ECOptimizer in carried or batched mode
    (`tf_ecrec.step.batched_commit.BatchedCommit` has the same interface)."""
    return _REGISTRY.items(graph)


def register(commit: Any, graph: tf.Graph | None = None) -> None:
    """Adds a deferred commit (carried or batched) to `graph`'s, for the hooks to drive."""
    _REGISTRY.add(commit, graph)


class CarriedCommit:
    """Which step's commit a trainer's next run carries, and which runs are durable.

    Args:
      sid: the step id tensor of the protected step (fetched with every run).
      carried: the placeholder the carried step's id is fed to.
      tail: the op committing the fed step (round 1, then round 2).
    Runs are numbered from 1 in the order they returned OK; `resolved` tells,
    for a run number, whether its step is durable, lost (never durable: its
    session ended first) or still pending.  Thread-safe.
    """

    def __init__(self, sid: tf.Tensor, carried: tf.Tensor, tail: tf.Operation) -> None:
        self.sid = sid
        self.carried = carried
        self.tail = tail
        self._lock = threading.Lock()
        self._pending: tuple[int, int] | None = None  # (run number, sid) returned, commit not run yet
        self._returned = 0  # runs returned OK
        self._durable_through = 0  # every run up to this one is resolved (durable or lost)
        self._lost: set[int] = set()
        self._listeners: list[Callable[[], None]] = []
        self.durable = 0
        self.lost = 0

    def on_resolved(self, listener: Callable[[], None]) -> None:
        """Calls `listener()` (from whichever thread resolved it) whenever a run became durable or lost."""
        with self._lock:
            self._listeners.append(listener)

    def _notify(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener()

    def register(self, graph: tf.Graph | None = None) -> CarriedCommit:
        register(self, graph)
        return self

    def after_return(self, session: Any) -> None:
        """Nothing: the next run carries the commit."""

    def idle(self, session: Any) -> None:
        """The trainer's run is in flight for long: its carried commit, alone (idempotent)."""
        self.flush(session)

    # ---- what a run adds -------------------------------------------------------------------------

    def fetches(self) -> tuple[dict[str, Any], dict[Any, int]]:
        """The fetches and feeds to add to the next run: the step id, and the carried commit if any."""
        with self._lock:
            pending = self._pending
        if pending is None:
            return {"sid": self.sid}, {}
        return {"sid": self.sid, "carried": self.tail}, {self.carried: pending[1]}

    def returned(self, results: dict[str, Any]) -> None:
        """The run with `fetches()` ended OK: the step it carried is durable, its own step is pending."""
        with self._lock:
            carried = self._pending if "carried" in results else None
            resolved = carried is not None
            if carried is not None:
                self.durable += 1
                self._durable_through = carried[0]
            self._returned += 1
            self._pending = (self._returned, int(results["sid"]))
        if resolved:
            self._notify()

    def reset(self) -> int | None:
        """A new session: the carried step is given up (settlement commits or undoes it); returns its id."""
        with self._lock:
            pending, self._pending = self._pending, None
            resolved = pending is not None
            if pending is not None:
                self._lost.add(pending[0])
                self._durable_through = pending[0]
                self.lost += 1
        if resolved:
            self._notify()
        return None if pending is None else pending[1]

    def collect(self, session: Any, sid: int, timeout_ms: int = 2000) -> None:
        """Commits a given-up step `sid` if nothing else settled it, as garbage collection only (it stays
        not durable: its records are trained again), so that later steps' round 1 does not wait for the
        chief's stale settler (seconds) to take it.  Refused (fenced, an older generation) or slow: left
        to settlement."""
        try:
            session.run(self.tail, {self.carried: sid}, options=tf.compat.v1.RunOptions(timeout_in_ms=timeout_ms))
        except tf.errors.OpError as exc:
            _LOG.debug("the given-up step %d was left to settlement: %s", sid, exc.message.splitlines()[0] if exc.message else exc)

    def flush(self, session: Any) -> bool:
        """Runs the carried commit alone (the trainer ends or pauses); False if it failed."""
        with self._lock:
            pending = self._pending
        if pending is None:
            return True
        try:
            session.run(self.tail, {self.carried: pending[1]})
        except tf.errors.OpError as exc:
            _LOG.warning("the last step's commit failed (%s): its records will be trained again",
                         exc.message.splitlines()[0] if exc.message else type(exc).__name__)
            self.reset()
            return False
        with self._lock:
            resolved = self._pending == pending
            if resolved:
                self.durable += 1
                self._durable_through = pending[0]
                self._pending = None
        if resolved:
            self._notify()
        return True

    # ---- what the record reports read --------------------------------------------------------------------

    @property
    def returned_runs(self) -> int:
        with self._lock:
            return self._returned

    def resolved(self, run: int) -> str:
        """``"durable"``, ``"lost"`` or ``"pending"`` for run number `run` (1-based)."""
        with self._lock:
            if run > self._durable_through:
                return "pending"
            return "lost" if run in self._lost else "durable"

    def pending_sids(self) -> set[int]:
        """The step this trainer returned and has not committed yet (not a dead task's: never settle it as stale)."""
        with self._lock:
            return set() if self._pending is None else {self._pending[1]}

    # ---- without hooks ---------------------------------------------------------------------------

    def run(self, session: Any, fetches: Any, feed_dict: dict | None = None, **kwargs: Any) -> Any:
        """``session.run(fetches, feed_dict)`` of a protected step, carrying the previous step's commit."""
        extra, feeds = self.fetches()
        out = session.run({"user": fetches, "ec": extra}, {**(feed_dict or {}), **feeds}, **kwargs)
        self.returned(out["ec"])
        return out["user"]


IDLE_FLUSH_SECS = 1.0
"""A run still in flight after this long (its input waits for data, a hook blocks) has its carried
commit confirmed from a thread: the step it carried is durable already (the commit ran at the run's
start) and its records must not wait for the run to end (a stream's master hands out the next shard
only once the last is acknowledged)."""


class CarriedCommitHook(tf.compat.v1.train.SessionRunHook):
    """Drives the deferred commits of the graph in a MonitoredSession (every trainer, chief or not): the
    `CarriedCommit`s, or the `tf_ecrec.step.batched_commit.BatchedCommit`s, which have the same interface.

    ``before_run`` adds the step id (and the carried commit) to the run; ``after_run`` moves on (a
    batched commit runs its fold round there when one is due); ``after_create_session`` gives up the
    steps a failed session left not durable; ``end`` makes the last ones durable.  A run in flight
    longer than `idle_flush_secs` has its commit run alone from a watcher thread (idempotent: the
    commit of a committed step does nothing; a fold round folds what is there), which makes returned
    steps durable for the record reports without waiting for the run.  One watcher per session, not a
    timer per run: a thread started per run costs CPU on every step.
    """

    def __init__(self, idle_flush_secs: float = IDLE_FLUSH_SECS) -> None:
        self._commits: list[CarriedCommit] = []
        self._idle = float(idle_flush_secs)
        self._lock = threading.Lock()  # held by an idle flush: after_run waits for it to end
        self._in_flight: tuple[float, Any] | None = None  # (started, session) of the run in flight
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def begin(self) -> None:
        self._commits = carried_commits()

    def after_create_session(self, session: Any, coord: Any) -> None:
        for commit in self._commits:
            given_up = commit.reset()
            if given_up is not None:
                commit.collect(session, given_up)
        if self._commits and self._idle > 0 and self._watcher is None:
            self._stop.clear()
            self._watcher = threading.Thread(target=self._watch, name="ec-idle-commit", daemon=True)
            self._watcher.start()

    def before_run(self, run_context: Any) -> Any:
        if not self._commits:
            return None
        fetches, feeds = {}, {}
        for i, commit in enumerate(self._commits):
            f, d = commit.fetches()
            fetches[i] = f
            feeds.update(d)
        with self._lock:
            self._in_flight = (time.monotonic(), run_context.session)
        return tf.compat.v1.train.SessionRunArgs(fetches, feed_dict=feeds)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        with self._lock:  # an idle flush in flight ends before the run's results are read
            self._in_flight = None
        for i, commit in enumerate(self._commits):
            commit.returned(run_values.results[i])
            commit.after_return(run_context.session)

    def end(self, session: Any) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=60.0)
            self._watcher = None
        self._flush_all(session)

    def _flush_all(self, session: Any) -> None:
        for commit in self._commits:
            commit.flush(session)

    def _watch(self) -> None:
        """Runs the commits alone once per run that is in flight longer than the idle bound."""
        flushed: float | None = None
        while not self._stop.wait(min(self._idle, 0.25)):
            with self._lock:
                if self._in_flight is None or self._in_flight[0] == flushed:
                    continue
                started, session = self._in_flight
                if time.monotonic() - started < self._idle or not any(c.pending_sids() for c in self._commits):
                    continue
                flushed = started
                for commit in self._commits:
                    try:
                        commit.idle(session)
                    except (tf.errors.OpError, RuntimeError) as exc:  # the session failed or closed meanwhile
                        _LOG.debug("an idle commit was left to the next run: %s", exc)
