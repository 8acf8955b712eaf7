"""Folds batched over steps: a protected step as short as a stock one, its folds and commit a few steps later.

With ``commit="batched"`` (``TF_ECREC_COMMIT=batched``) a trainer's step is its
applies (each logged with its delta on its data PS) and its count, the
exchanges of a stock step; every `every` steps, or when its oldest pending
step is `max_delay_secs` old, the trainer runs a *fold round* alone
(`build_fold_round`): on each data PS the apply entries not folded yet are
taken, routed and folded into each fold target by one op per (variable,
target), the entries every target holds are marked folded, and the steps
counted on every counter copy whose applies, and every earlier apply of the
same variables, are folded are committed on every PS.  One round's exchanges
serve every step it folds, from any trainer.  docs/settlement.md ("Folds
batched over steps") has the protocol and why it keeps the invariants.

A step is *returned* when its run ended OK and *durable* once committed; the
contract is the carried commit's (`tf_ecrec.step.carried_commit`):

- records are acknowledged only for durable steps (`BatchedCommit.resolved`,
  read by `hooks.shard_progress.ShardProgressHook`);
- a durable step is never undone (settlement keeps committed steps);
- at most `bound` returned steps of a trainer are not durable: past it, the
  trainer runs rounds alone until they are (a deadline, then the session is
  given up and those steps' records are trained again).

`BatchedCommit` has the interface of `CarriedCommit` (the same registry,
the same hooks drive it); `after_return` runs the round when one is due.
"""

from __future__ import annotations

import collections
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from tf_ecrec.errors import ConfigError
from tf_ecrec.step import failpoints
from tf_ecrec.step.fold_round import FoldRound, build_fold_round
from tf_ecrec.step.step_program import GENERATION_SHIFT, StepGeneration, barrier

if TYPE_CHECKING:
    from tf_ecrec.step.optimizer import ECOptimizer
    from tf_ecrec.step.step_program import AppliedUpdate

_LOG = logging.getLogger(__name__)

EVERY = 8
"""Steps of a trainer per fold round."""
MAX_DELAY_SECS = 0.5
"""A trainer's oldest step not yet durable waits at most about this long for a round."""
BOUND_FACTOR = 4
"""Returned steps not durable, past which a trainer folds before its next step: this times `every`."""
WAIT_SECS = 30.0
"""How long a trainer over its bound runs rounds before it gives its session up."""


ENV_EVERY = "TF_ECREC_FOLD_EVERY"
ENV_DELAY = "TF_ECREC_FOLD_DELAY_SECS"


def fold_schedule_from_environ() -> tuple[int, float]:
    """(steps per round, seconds a returned step waits at most): `ENV_EVERY` and `ENV_DELAY`, else the defaults."""
    values = []
    for name, default, cast in ((ENV_EVERY, EVERY, int), (ENV_DELAY, MAX_DELAY_SECS, float)):
        raw = os.environ.get(name, "").strip()
        try:
            value = cast(raw) if raw else default
        except ValueError:
            value = -1
        if value <= 0:
            raise ConfigError(f"{name}={raw!r}; rule: a positive {cast.__name__}; source: the environment")
        values.append(value)
    return int(values[0]), float(values[1])


def batched_step(opt: ECOptimizer, applied: list[AppliedUpdate], after_apply: list[Any], global_step: Any,
                 armed: Any, step_value: tf.Tensor, generation: int | StepGeneration = 0,
                 ) -> tuple[tf.Operation, dict[int, Any], list[Any]]:
    """(train op, counts, what the count ends with) of a batched step: its applies, then its count on the
    global step and its replicas; registers the trainer's `BatchedCommit` with the step's fold round."""
    assert global_step is not None and opt.ec is not None  # apply_gradients commits in the step without one
    applies = barrier([a.delta.op for a in applied] + list(after_apply), opt.ec.r + 1, global_step.device, "applied")
    counts = opt.increment(global_step, applies)
    counted = failpoints.after_count(armed, [g.op for g in counts.values()], sorted({a.device for a in applied}), step_value)
    every, delay = fold_schedule_from_environ()
    opt.carried_commit = BatchedCommit(opt.sid, build_fold_round(opt, applied, counts, generation), every=every,
                                       max_delay_secs=delay, generation=generation).register()
    return tf.group(*counted, name="ec_step"), counts, counted


class BatchedCommit:
    """A trainer's returned steps and the fold rounds that make them durable (the `CarriedCommit` interface).

    Runs are numbered from 1 in the order they returned OK; `resolved` tells,
    for a run number, whether its step is durable, lost (its session ended
    before it was) or pending.  Thread-safe: a hook's timer may run a round
    while the trainer's run is in flight.
    """

    def __init__(self, sid: tf.Tensor, fold_round: FoldRound, every: int = EVERY,
                 max_delay_secs: float = MAX_DELAY_SECS, bound: int | None = None,
                 wait_secs: float = WAIT_SECS, generation: int | StepGeneration = 0) -> None:
        self.sid = sid
        self._generation = generation if isinstance(generation, StepGeneration) else StepGeneration(generation)
        self._fed = 0  # the id fed to the run in flight
        self.round = fold_round
        self.every = max(1, int(every))
        self.max_delay = float(max_delay_secs)
        self.bound = int(bound) if bound is not None else BOUND_FACTOR * self.every
        self.wait_secs = float(wait_secs)
        self._lock = threading.Lock()
        self._round_lock = threading.Lock()  # one round of this trainer at a time
        self._pending: collections.OrderedDict[int, tuple[int, float]] = collections.OrderedDict()  # run -> (sid, when)
        self._returned = 0
        self._resolved: dict[int, bool] = {}  # run -> durable (True) or lost (False), above the watermark
        self._through = 0  # every run up to this one is resolved
        self._lost: set[int] = set()
        self._listeners: list[Callable[[], None]] = []
        self.durable = 0
        self.lost = 0
        self.rounds = 0

    def register(self, graph: tf.Graph | None = None) -> BatchedCommit:
        from tf_ecrec.step.carried_commit import register  # pylint: disable=import-outside-toplevel

        register(self, graph)
        return self

    def on_resolved(self, listener: Callable[[], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    # ---- what a run adds -------------------------------------------------------------------------

    def fetches(self) -> tuple[dict[str, Any], dict[Any, int]]:
        """Nothing to fetch; the step's id, drawn here (its generation the session's), fed: a fetch of an id
        drawn in the graph measured about 0.5 ms of CPU per step."""
        self._fed = int((self._generation.value << GENERATION_SHIFT) | secrets.randbits(GENERATION_SHIFT))
        return {}, {self.sid: self._fed}

    def returned(self, results: dict[str, Any]) -> None:
        """The run with `fetches()` ended OK: its step (the id fed, or `results["sid"]`) is returned."""
        with self._lock:
            self._returned += 1
            self._pending[self._returned] = (int(results.get("sid", self._fed)), time.monotonic())

    def due(self) -> bool:
        with self._lock:
            if not self._pending:
                return False
            oldest = next(iter(self._pending.values()))[1]
            return len(self._pending) >= self.every or time.monotonic() - oldest >= self.max_delay

    def after_return(self, session: Any) -> None:
        """The trainer's run returned: a round if one is due; rounds until under the bound if over it."""
        if not self.due():
            return
        self.fold(session)
        deadline = time.monotonic() + self.wait_secs
        pause = 0.005
        while self.pending_count() > self.bound:
            if time.monotonic() >= deadline:
                raise tf.errors.AbortedError(
                    None, None, f"{self.pending_count()} returned steps not durable after {self.wait_secs:.0f} s of "
                    "fold rounds (a PS or the chief's settlement is behind); the session is given up and those "
                    "steps' records are trained again")
            time.sleep(pause)
            pause = min(0.2, pause * 2)
            self.fold(session)

    def fold(self, session: Any, timeout_ms: int = 30000) -> int:
        """One fold round now; returns how many of this trainer's pending steps it found durable.

        A pending step neither committed nor counted when the round began is *lost*: its count was
        undone by settlement, or its run did not include the step (a run of other fetches through the
        same hooks), and it never becomes durable."""
        with self._round_lock:
            with self._lock:
                runs = list(self._pending)
                sids = [self._pending[r][0] for r in runs]
            counter = min(self.round.counted)
            round_id = (self._generation.value << GENERATION_SHIFT) | secrets.randbits(GENERATION_SHIFT)
            out = session.run({"committed": self.round.committed, "counted": self.round.counted[counter]},
                              {self.round.pending: np.array(sids, np.int64), self.round.round_id: round_id},
                              options=tf.compat.v1.RunOptions(timeout_in_ms=timeout_ms))
            self.rounds += 1
            counted = {int(s) for s in out["counted"]}
            durable = [run for run, flag in zip(runs, out["committed"]) if flag]
            lost = [run for run, sid, flag in zip(runs, sids, out["committed"]) if not flag and sid not in counted]
            self._resolve(durable, durable=True)
            self._resolve(lost, durable=False)
            return len(durable)

    def _resolve(self, runs: list[int], durable: bool) -> None:
        if not runs:
            return
        with self._lock:
            for run in runs:
                if self._pending.pop(run, None) is None:
                    continue
                self._resolved[run] = durable
                if durable:
                    self.durable += 1
                else:
                    self.lost += 1
                    self._lost.add(run)
            while self._through + 1 in self._resolved:
                self._through += 1
                del self._resolved[self._through]
            listeners = list(self._listeners)
        for listener in listeners:
            listener()

    def pending_count(self) -> int:
        with self._lock:
            return len(self._pending)

    def reset(self) -> int | None:
        """A new session: the steps not durable are given up (settlement keeps or undoes them; their records
        are trained again)."""
        with self._lock:
            runs = list(self._pending)
        self._resolve(runs, durable=False)
        return None

    def collect(self, session: Any, sid: int, timeout_ms: int = 2000) -> None:
        """Nothing to collect: a given-up step's entries are folded by the next round or settled."""

    def idle(self, session: Any) -> None:
        """The trainer's run is in flight for long: one round, so that its returned steps do not wait for it."""
        try:
            self.fold(session)
        except tf.errors.OpError as exc:
            _LOG.debug("an idle fold round failed: %s", exc.message.splitlines()[0] if exc.message else exc)

    def flush(self, session: Any) -> bool:
        """Rounds until every returned step is durable (the trainer ends or pauses); False if some were given up."""
        deadline = time.monotonic() + self.wait_secs
        pause = 0.005
        try:
            while self.pending_count():
                self.fold(session)
                if not self.pending_count():
                    break
                if time.monotonic() >= deadline:
                    raise tf.errors.DeadlineExceededError(None, None, "fold rounds did not make the last steps durable")
                time.sleep(pause)
                pause = min(0.2, pause * 2)
        except tf.errors.OpError as exc:
            _LOG.warning("the last steps' fold round failed (%s): their records will be trained again",
                         exc.message.splitlines()[0] if exc.message else type(exc).__name__)
            self.reset()
            return False
        return True

    # ---- what the record reports read --------------------------------------------------------------------

    @property
    def returned_runs(self) -> int:
        with self._lock:
            return self._returned

    def resolved(self, run: int) -> str:
        """``"durable"``, ``"lost"`` or ``"pending"`` for run number `run` (1-based)."""
        with self._lock:
            if run <= self._through:
                return "lost" if run in self._lost else "durable"
            state = self._resolved.get(run)
            if state is None:
                return "pending"
            return "durable" if state else "lost"

    def pending_sids(self) -> set[int]:
        """This trainer's returned steps not durable yet (not a dead task's: never settle them as stale)."""
        with self._lock:
            return {sid for sid, _ in self._pending.values()}

    # ---- without hooks ---------------------------------------------------------------------------

    def run(self, session: Any, fetches: Any, feed_dict: dict | None = None, **kwargs: Any) -> Any:
        """``session.run(fetches, feed_dict)`` of a protected step, then a fold round if one is due."""
        extra, feeds = self.fetches()
        out = session.run({"user": fetches, "ec": extra}, {**(feed_dict or {}), **feeds}, **kwargs)
        self.returned(out["ec"])
        self.after_return(session)
        return out["user"]
