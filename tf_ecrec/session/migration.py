"""Stopping a session between steps when the parameter servers change, and following a move in place.

`MigrationHook` is the part every PS-change hook shares: something off the
training thread (a poller, a watch) calls `MigrationHook._changed_to` when it
sees a change, and the hook acts on it only between steps::

    __init__     validate; remember what the session was built for
    begin        start watching (`_start_watching`: a poller thread, a subscription)
    after_create_session  remember which retarget the session was created after; a stop asked
                 only because the session before it predated a retarget is withdrawn
    before_run   nothing to fetch
    after_run    if a change was seen (or this session predates a retarget):
                 request_stop() once, record ``migration`` = (old, new)
    end          stop watching (`_stop_watching`)

A stop is asked of a *session*: when the session it was asked of fails instead (a step of a session
from before a retarget may complete, then the next one meet the moved PS), MonitoredSession creates
the next one inside ``Estimator.train`` and the request goes with the failed one.  If that next
session was created after every retarget so far, it is the one the stop was for, so the hook withdraws
``migration``: otherwise ``Estimator.train`` would run on to its end and the failover loop, finding
``migration`` set, would rebuild the Estimator for nothing (seen: a worker that followed two moves in
place went to WAIT and BUILD when its training ended).  A change the hook could not retarget
(`_changed_to`) is never withdrawn.

After ``Estimator.train`` returns, a non-None ``migration`` says the hook
stopped the session: the failover loop (`tf_ecrec.session.failover`) then rebuilds
TF_CONFIG, the Estimator and the session for the new cluster.

`ClusterSourceMigrationHook` polls a `tf_ecrec.session.cluster_source.ClusterSource`
for the PS addresses and is the one the failover loop runs.  The hooks that
poll the job master's ``ps_version`` or watch a membership backend are in
``tf_ecrec.hooks.ps_migration``.
"""

from __future__ import annotations

import _thread
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import tensorflow as tf

from tf_ecrec.base.process_end import end_process
from tf_ecrec.errors import ConfigError, EcRecError, RecoveryError
from tf_ecrec.master.rate_limited_log import RateLimitedLogger
from tf_ecrec.session.cluster_source import ClusterSource, read_view
from tf_ecrec.step.embedding import current_context
from tf_ecrec.step.step_program import StepGeneration

_LOG = logging.getLogger(__name__)

Retarget = Callable[[Sequence[str], "int | None", "StepGeneration | None"], None]
"""``retarget(addresses, version, steps)``: see `ClusterSourceMigrationHook`."""


class MigrationHook(tf.compat.v1.train.SessionRunHook):
    """Requests a stop after the first step that ends once a PS change was seen.

    Subclasses watch for changes in `_start_watching` / `_stop_watching`
    and report one with `_changed_to`.

    Attributes:
      migration: ``(old, new)`` versions (-1 where unknown) once the hook
        stopped a session; None until then.
      steps_seen: Steps completed under this hook (the failover loop's
        progress signal).
    """

    def __init__(self) -> None:
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._baseline: int | None = None
        self._new: int | None = None
        self._stop_requested = False
        self._target_gen = 0  # retargets so far
        self._session_gen = 0  # retargets before the current session was created
        self._stale_stop = False  # the stop was asked only because the session predated a retarget
        self._unfollowed = False  # a change was seen that no retarget followed
        self.migration: tuple[int, int] | None = None
        self.steps_seen = 0

    # --- hook contract -----------------------------------------------------------

    def begin(self) -> None:
        self._stop.clear()
        self._start_watching()

    def after_create_session(self, session: Any, coord: Any) -> None:
        with self._lock:
            self._session_gen = self._target_gen
            if self._stale_stop and not self._unfollowed:  # the stale session is gone; this one is current
                _LOG.info("the session stopped for migration was replaced by one created for the new cluster; "
                          "training goes on in it")
                self._stale_stop = self._stop_requested = False
                self.migration = None
                self._changed.clear()

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self.steps_seen += 1
        with self._lock:
            stale = self._session_gen != self._target_gen  # a session of the cluster before a retarget
        if stale and not self._stop_requested:
            self._changed.set()
        if not self._changed.is_set() or self._stop_requested:
            return
        with self._lock:
            old, new = self._baseline, self._new
            self._stale_stop = stale
        self.migration = (-1 if old is None else old, -1 if new is None else new)
        self._stop_requested = True
        _LOG.info("Parameter servers changed (version %s -> %s); stopping the session for "
                  "migration", *self.migration)
        run_context.request_stop()

    def end(self, session: Any) -> None:
        self._stop.set()
        self._stop_watching()

    # --- for subclasses -------------------------------------------------------------

    def _start_watching(self) -> None:
        """Called by `begin`: start noticing changes off the training thread."""
        raise NotImplementedError

    def _stop_watching(self) -> None:
        """Called by `end`: stop noticing changes."""
        raise NotImplementedError

    def _changed_to(self, new: int | None = None) -> None:
        """A change was seen (`new`: the new version, when known); the next step ends the session."""
        with self._lock:
            if new is not None:
                self._new = new
            self._unfollowed = True
        self._changed.set()


class PollingMigrationHook(MigrationHook):
    """A `MigrationHook` whose watch is a daemon thread running `_run_poller` until `end`.

    Args:
      poll_secs: Seconds between polls; > 0.
      warn_every_secs: Minimum seconds between "not polled" warnings.
    """

    def __init__(self, *, poll_secs: float = 1.0, warn_every_secs: float = 30.0) -> None:
        if poll_secs <= 0:
            raise ConfigError(f"{type(self).__name__} poll_secs={poll_secs}; rule: > 0")
        super().__init__()
        self._poll_secs = poll_secs
        self._unreachable = RateLimitedLogger(_LOG, warn_every_secs)
        self._thread: threading.Thread | None = None

    def _start_watching(self) -> None:
        self._thread = threading.Thread(target=self._run_poller, daemon=True, name="tf-ecrec-ps-migration-poller")
        self._thread.start()

    def _stop_watching(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=self._poll_secs + 5.0)
            self._thread = None

    def _run_poller(self) -> None:
        raise NotImplementedError


class ClusterSourceMigrationHook(PollingMigrationHook):
    """Polls a cluster source for the PS addresses; stops (or retargets) when the PS tasks move.

    A change is every PS task alive at addresses other than ``expected_ps``
    (a PS that is down is not a change yet; one back at its old address is none).

    Args:
      source: The `ClusterSource` to poll.
      expected_ps: The PS addresses the session was built for.
      poll_secs: Seconds between polls.
      warn_every_secs: Minimum seconds between "not polled" warnings.
      give_up_secs: how long a PS may stay gone (the source lists it as not alive) with no step
        completed meanwhile before the hook gives up (None: never).  TensorFlow's MonitoredSession
        re-creates a session that fails for a PS that is down for ever, inside ``Estimator.train``;
        giving up interrupts the training thread (the main one: the hook gives up only when it was
        begun there) and leaves ``gave_up``, a `RecoveryError` naming the PS, for the caller to raise
        (`tf_ecrec.session.failover.FailoverLoop` does, and then calls `acknowledge`).  The first poll that
        finds a PS gone says which, and for how long the hook waits.
      stuck_exit_secs: how long the hook keeps interrupting the training thread after giving up
        before it ends the process.  An interrupt that lands inside TensorFlow's native code can be
        lost (seen once in a loaded test run: ten minutes of session re-creations with the
        interrupt repeated every poll); a trainer that can never train again must not hang, so
        once this bound passes with no `acknowledge`, ``on_stuck(gave_up)`` runs (default: log the
        RecoveryError and ``os._exit(3)``, the launcher task's exit code for a tf_ecrec error).
      on_stuck: what ends the process then (the launcher's task also reports the error first).
      retarget: ``retarget(addresses, version, steps)`` points the sessions
        TensorFlow creates from now on at the PS `addresses` (the failover
        loop writes them into the live session ConfigProto); `version` is the
        cluster version the source publishes (None if it publishes none) and
        `steps` the graph's `StepGeneration` (None outside `ec_model_fn`),
        whose target follows the new cluster.  With it a move is followed
        in place: the poller retargets and keeps watching, and only a session
        created before the move is stopped (one created after it already
        reaches the new addresses).  The source must publish a new address
        only once the task at the old one is gone (a replacement after a
        failure, as the launcher and a Kubernetes controller do).

    Attributes:
      retargets: Moves followed in place so far.
      gave_up: the `RecoveryError` the hook gave up with (None until then).
    """

    def __init__(self, source: ClusterSource, expected_ps: Sequence[str], *, poll_secs: float = 1.0,
                 warn_every_secs: float = 30.0, give_up_secs: float | None = None,
                 retarget: Retarget | None = None, task: str = "this trainer",
                 interrupt: Any = None, stuck_exit_secs: float = 30.0,
                 on_stuck: Callable[[RecoveryError], None] | None = None) -> None:
        if source is None or expected_ps is None:
            raise ConfigError("ClusterSourceMigrationHook needs source= and expected_ps= (the PS addresses the "
                              "session uses)")
        super().__init__(poll_secs=poll_secs, warn_every_secs=warn_every_secs)
        self._source = source
        self._expected_ps = list(expected_ps)
        self._retarget = retarget
        self._steps: StepGeneration | None = None
        self.retargets = 0
        if give_up_secs is not None and give_up_secs <= 0:
            raise ConfigError(f"ClusterSourceMigrationHook give_up_secs={give_up_secs}; rule: > 0 or None")
        self._give_up_secs = give_up_secs
        self._task = task
        self._interrupt = interrupt or _thread.interrupt_main  # tests pass their own
        self._on_main_thread = interrupt is not None
        self._gone_since: float | None = None  # monotonic: when the polls first found a PS gone
        self._last_step = time.monotonic()
        self.gave_up: RecoveryError | None = None
        self._gave_up_at = 0.0
        self._acknowledged = threading.Event()
        if stuck_exit_secs <= 0:
            raise ConfigError(f"ClusterSourceMigrationHook stuck_exit_secs={stuck_exit_secs}; rule: > 0")
        self._stuck_exit_secs = stuck_exit_secs
        self._on_stuck = on_stuck or exit_process

    def acknowledge(self) -> None:
        """The training thread stopped after the hook gave up: stop interrupting it."""
        self._acknowledged.set()

    def begin(self) -> None:
        context = current_context()  # the graph being trained; its steps follow a retarget
        self._steps = context.steps if context is not None else None
        self._on_main_thread = self._on_main_thread or threading.current_thread() is threading.main_thread()
        self._last_step = time.monotonic()
        super().begin()

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self._last_step = time.monotonic()
        super().after_run(run_context, run_values)

    def _run_poller(self) -> None:
        while not self._stop.is_set():
            if self.gave_up is not None:  # an interrupt can be lost inside TensorFlow: again until acknowledged
                if self._acknowledged.is_set():
                    return
                if time.monotonic() - self._gave_up_at >= self._stuck_exit_secs:
                    _LOG.error("%s: the training thread did not stop within %.0f s of giving up; ending the process",
                               self._task, self._stuck_exit_secs)
                    self._on_stuck(self.gave_up)
                    return
                self._interrupt()
                self._stop.wait(self._poll_secs)
                continue
            try:
                view = read_view(self._source)
            except EcRecError as exc:
                self._unreachable.warning("PS addresses not polled: %s", exc)
            else:
                now = view.addresses
                if not all(now) and self._waited_too_long(now):
                    continue
                if all(now):
                    self._gone_since = None
                if all(now) and list(now) != self._expected_ps:
                    _LOG.info("PS tasks moved from %s to %s (cluster version %s)", self._expected_ps, now,
                              "not published" if view.version is None else view.version)
                    # all(now) holds, so no address is None
                    if self._retarget is None or not self._retarget_to(cast("list[str]", list(now)), view.version):
                        self._changed_to()
                        return
            self._stop.wait(self._poll_secs)

    def _waited_too_long(self, now: Sequence[str | None]) -> bool:
        """Notes a poll that found PS tasks gone; True once the hook gave up on them (see give_up_secs)."""
        gone = [f"ps:{i}" for i, address in enumerate(now) if not address]
        at = time.monotonic()
        if self._gone_since is None:
            self._gone_since = at
            bound = "for ever" if self._give_up_secs is None else f"up to {self._give_up_secs:.0f} s"
            _LOG.warning("%s: %s gone (the cluster source lists %s as not alive); waiting %s for %s or a "
                         "replacement", self._task, ", ".join(gone), "it" if len(gone) == 1 else "them", bound,
                         "it" if len(gone) == 1 else "them")
        if self._give_up_secs is None or not self._on_main_thread:
            return False
        waited = at - max(self._gone_since, self._last_step)
        if waited < self._give_up_secs:
            return False
        self.gave_up = RecoveryError(
            f"{self._task}: {', '.join(gone)} gone for {at - self._gone_since:.1f} s with no step completed in the "
            f"last {waited:.1f} s (the bound: {self._give_up_secs:g} s); restart {'it' if len(gone) == 1 else 'them'} "
            "(same or new address), add a spare PS, or raise the wait; source: the cluster source")
        _LOG.error("%s", self.gave_up)
        self._gave_up_at = time.monotonic()
        self._interrupt()  # out of MonitoredSession's session re-creation loop; the caller raises gave_up
        return True

    def _retarget_to(self, addresses: list[str], version: int | None) -> bool:
        """Points new sessions at `addresses`; False if that failed (then the session is stopped)."""
        try:
            assert self._retarget is not None
            self._retarget(addresses, version, self._steps)
        except Exception:  # fall back to stopping the session, which rebuilds everything
            _LOG.exception("retargeting the sessions at %s failed; stopping the session instead", addresses)
            return False
        with self._lock:
            self._expected_ps = addresses
            self._target_gen += 1
            self.retargets += 1
        return True



def exit_process(error: RecoveryError) -> None:
    """Ends this process with exit code 3 after logging `error` (a trainer stuck after giving up)."""
    _LOG.error("%s: %s", type(error).__name__, error)
    end_process(3)
