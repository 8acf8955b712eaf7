"""The failover module: train, and when a parameter server comes back at a new address, rebuild and go on.

TensorFlow fixes a task's cluster when its server starts, `RunConfig` reads
``TF_CONFIG`` once and an Estimator fixes its RunConfig at construction
(DESIGN.md section 2), so a PS that moves means a new TF_CONFIG, RunConfig,
Estimator and session.  This module does that in-process.

How a trainer (chief or worker) runs under it:

- its TensorFlow server boots as a one-task job of its own
  (`tf_ecrec.cluster.ps_session.start_server`), and every session carries the
  cluster (the PS tasks and this task) in its ``ConfigProto.cluster_def``
  (ClusterSpec propagation), with state shared between sessions, so a
  session built for a new cluster reaches the moved PS while the surviving
  PS keep their variables (`tf_ecrec.cluster.ps_session.session_config`);
- sessions have an operation timeout: a session re-created for the old
  cluster waits for the dead address forever inside TensorFlow (its device
  scan has no deadline), and the timeout turns that wait into
  ``DeadlineExceededError``, which leaves ``Estimator.train``;
- a `tf_ecrec.session.cluster_source.ClusterSource` (the job master, or a file a
  launcher keeps current) says where the PS tasks are now.

The loop, `FailoverLoop.train`, is a state machine with bounded waits
(DESIGN.md invariant 6)::

    BUILD  with TF_CONFIG set for the current cluster, build RunConfig (with
           the session config above) and the Estimator      -> TRAIN
    TRAIN  Estimator.train, with TF_CONFIG still that cluster's (the model_fn
           reads its version) and a ClusterSourceMigrationHook watching the source
             the source shows the PS at new addresses: write
             them into the live session ConfigProto (see
             below), keep training                           -> RETARGET
             returns, no migration seen                      -> DONE
             returns after the hook stopped it (PS moved)    -> WAIT
             session error: DeadlineExceeded, Unavailable,
             Aborted (a PS died, or a session was built for
             an old cluster), Cancelled (a step whose
             partitions TensorFlow cancelled: the master
             reports a peer's cancelled RecvTensor when that
             is the only root error it received)             -> WAIT
    WAIT   poll the source until every PS task is alive, at
           most `wait_secs` (else RecoveryError naming the missing PS);
           take the addresses it reports (moved or not)      -> BUILD
           more than `max_failovers` WAITs in a row with no
           step completed between them                      -> RecoveryError
    DONE   return

Retargeting in place.  When a PS dies, TensorFlow's MonitoredSession closes
the session and creates a new one from the same ConfigProto, inside
``Estimator.train``; with the old address in it, that creation can only
fail, after the operation timeout (measured: 20 s from the kill, one
timeout for the close and one for the creation, before this loop could
rebuild).  So the loop makes the creation reach the new cluster instead:

- ``GRPC_FAIL_FAST=true`` (`tf_ecrec.cluster.ps_session.fast_reconnect`): TensorFlow's device scan of a
  session being created fails at once on a task that is down, instead of
  waiting for it until the timeout; MonitoredSession retries the creation;
- the migration hook's poller (`tf_ecrec.session.migration`), on seeing every PS alive at the source's new
  addresses, writes them into the ConfigProto the Estimator hands to every
  session it creates (``Estimator._session_config``: read, never replaced;
  tf.estimator 2.15 is its last release), so the next retry reaches the
  moved PS, the chief's recovery runs in that session and training goes on
  in the same ``Estimator.train`` call: no graph rebuilt, no process
  started.  A session created before the retarget is stopped at its next
  step and rebuilt (BUILD) as before.

The generation of a retargeted trainer's steps.  The cluster version (TF_CONFIG's ``version``) is
the source's when it publishes one (the launcher's cluster file does), else this trainer's count of
moves; BUILD builds the graph for it, and a retarget raises the graph's `StepGeneration` target to
it before the ConfigProto names the new cluster, so the chief's recovery in a retargeted session
raises the PS to the new version, and a session created after it carries that version or, if the
PS admit a later one, theirs (`tf_ecrec.recovery.generation`): a worker that followed the move in
place is not refused by the cluster it now reaches.

Stall fixed (issue 33): MonitoredSession closes the failed session before it creates the next one,
and the close of a ClusterSpec-propagated session deletes its worker session on every task, this
trainer's own included; that local deletion has no deadline and holds the trainer's TensorFlow
SessionMgr, so the next session's creation waits until it ends.  It destroys the input pipeline's
iterator, whose destructor joined tf.data's autotuning thread, asleep for up to a minute between
optimizations (native stacks, docs/benchmarks.md): 6-54 s in about one launched run in two.  `train`
therefore runs the input_fn's dataset with ``autotune.enabled = False`` unless the user's dataset
sets it (`tf_ecrec.data.pipeline.input_fn_without_autotune`); the close takes tens of milliseconds.
A close or creation cut by the operation timeout is the DeadlineExceeded that sends this loop to
WAIT and BUILD, which rebuilds the graph.

The rebuild of the lost PS's variables is not this module's: the chief's
new session runs it (`tf_ecrec.recovery`), exactly as for a PS restarted at
its old address.  Workers' sessions wait for the chief's rebuild through the
model's ready op.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tf_ecrec.cluster.ps_session import live_session_config, session_cluster, session_config
from tf_ecrec.cluster.tf_config import ClusterConfig, tf_config_env
from tf_ecrec.errors import ConfigError, EcRecError, RecoveryError
from tf_ecrec.master.rate_limited_log import RepeatFilter
from tf_ecrec.session.cluster_source import ClusterSource, read_view
from tf_ecrec.session.migration import ClusterSourceMigrationHook
from tf_ecrec.step.step_program import StepGeneration

_LOG = logging.getLogger(__name__)


class State(enum.Enum):
    BUILD = "build"
    TRAIN = "train"
    WAIT = "wait"
    RETARGET = "retarget"
    DONE = "done"


Build = Callable[[ClusterConfig, Any], Any]  # (cluster, session ConfigProto) -> Estimator


class FailoverLoop:
    """Trains with an Estimator rebuilt whenever the PS tasks move (see the module doc).

    Args:
      cluster: this trainer's cluster at the start.
      build: ``build(cluster, session_config)`` returns the Estimator for a
        cluster; called with TF_CONFIG already set for that cluster (so a
        RunConfig it creates reads it) and the session ConfigProto to pass as
        ``RunConfig(session_config=...)``.
      source: where the PS tasks are now.
      session_timeout_secs: operation timeout of the sessions.
      wait_secs: how long a PS may stay gone: WAIT waits that long for every PS task to be alive,
        and TRAIN gives up after that long with a PS listed as not alive at the source and no step
        completed (`tf_ecrec.session.migration.ClusterSourceMigrationHook`'s ``give_up_secs``: TensorFlow
        re-creates failed sessions inside ``Estimator.train`` for ever); both raise RecoveryError.
      max_failovers: WAITs allowed in a row without a completed step
        between them (a job that keeps training may fail over any number
        of times; one that never gets a step done gives up).
      poll_secs: how often WAIT and the migration hook read the source; default: the source's own
        ``poll_secs`` if it has one (a cluster file: 20 ms, an unchanged file costs a stat), else 0.2 s.
        A move seen before MonitoredSession's next session creation saves that creation: begun with the
        old cluster, it retries inside TensorFlow (about 0.4 s) before it fails.
      on_transition: called with (state, reason) on every transition (reports, tests).
      on_stuck: ends the process when the training thread did not stop after TRAIN gave up
        (`ClusterSourceMigrationHook`'s ``on_stuck``; default: log and exit with code 3).
    """

    def __init__(
        self,
        cluster: ClusterConfig,
        build: Build,
        source: ClusterSource,
        *,
        session_timeout_secs: float = 30.0,
        wait_secs: float = 120.0,
        max_failovers: int = 10,
        poll_secs: float | None = None,
        on_transition: Callable[[State, str], None] | None = None,
        on_stuck: Callable[[RecoveryError], None] | None = None,
    ) -> None:
        poll_secs = float(getattr(source, "poll_secs", 0.2)) if poll_secs is None else poll_secs
        if cluster.task_type not in ("chief", "worker", "master"):
            raise ConfigError(f"the failover loop runs trainers, not {cluster.task}; source: TF_CONFIG task")
        if wait_secs <= 0 or poll_secs <= 0 or max_failovers < 0:
            raise ConfigError(
                f"failover wait_secs={wait_secs}, poll_secs={poll_secs}, max_failovers={max_failovers}; "
                "rule: waits > 0, max_failovers >= 0; source: FailoverLoop"
            )
        self.cluster = cluster
        self._build = build
        self._source = source
        self._timeout = session_timeout_secs
        self._wait_secs = wait_secs
        self._max_failovers = max_failovers
        self._poll = poll_secs
        self._on_transition = on_transition
        self._on_stuck = on_stuck
        self.history: list[tuple[float, State, str]] = []
        self.estimator: Any = None
        self._lock = threading.Lock()  # self.cluster: the poller retargets it while TRAIN runs
        self._live_config: Any = None
        self._migration: ClusterSourceMigrationHook | None = None  # the hook of the Estimator training now

    def _enter(self, state: State, reason: str) -> State:
        self.history.append((time.time(), state, reason))
        _LOG.info("failover: %s (%s)", state.value, reason)
        if self._on_transition is not None:
            self._on_transition(state, reason)
        return state

    @property
    def moving(self) -> bool:
        """Whether the Estimator training now is stopping to follow a moved PS (its hooks' ``end`` is not the end)."""
        return self._migration is not None and self._migration.migration is not None

    def train(self, input_fn: Callable[[], Any], *, max_steps: int | None = None, hooks: Sequence[Any] = (),
              saving_listeners: Sequence[Any] | None = None) -> None:
        """Estimator.train under the loop; returns when training ends normally.

        Raises:
          RecoveryError: a PS task stayed down longer than `wait_secs`, or
            more than `max_failovers` failovers in this call.
          Anything else `Estimator.train` raises (not a session failure).
        """
        import tensorflow as tf

        from tf_ecrec.data.pipeline import input_fn_without_autotune

        # A cancelled step is a failed one: its pending steps are given up and trained again, as after an abort.
        session_errors = (tf.errors.DeadlineExceededError, tf.errors.UnavailableError, tf.errors.AbortedError,
                          tf.errors.CancelledError)
        # MonitoredSession logs each failed session creation, tens a second for a PS that is down: one in 30 s.
        input_fn = input_fn_without_autotune(input_fn)  # a session close would wait for its thread
        quiet = RepeatFilter(("An error was raised while a session was being created",
                              "An error was raised while considering whether the session is complete"))
        tf.get_logger().addFilter(quiet)
        try:
            self._train(input_fn, max_steps, hooks, saving_listeners, session_errors)
        except BaseException:
            # The migration hook gave up on a gone PS by interrupting this thread; the interrupt lands wherever
            # the thread was (a KeyboardInterrupt, or a RuntimeError from inside TensorFlow's bindings).
            gave_up = self._migration.gave_up if self._migration is not None else None
            if gave_up is not None and self._migration is not None:
                self._migration.acknowledge()
                raise gave_up from None
            raise
        finally:
            tf.get_logger().removeFilter(quiet)

    def _train(self, input_fn: Callable[[], Any], max_steps: int | None, hooks: Sequence[Any],
               saving_listeners: Sequence[Any] | None, session_errors: tuple[type[BaseException], ...]) -> None:
        failovers = 0
        state = self._enter(State.BUILD, f"start at PS {list(self.cluster.ps_addresses)}")
        migration: Any = None
        built = self.cluster  # the cluster TF_CONFIG names while the Estimator built for it trains
        while True:
            if state is State.BUILD:
                built = self.cluster
                config = session_config(built, self._timeout)
                with tf_config_env(built):
                    self.estimator = self._build(built, config)
                self._live_config = live_session_config(self.estimator, config)
                migration = self._migration = ClusterSourceMigrationHook(
                    self._source, built.ps_addresses, poll_secs=self._poll, give_up_secs=self._wait_secs,
                    retarget=self._retarget if self._live_config is not None else None, task=self.cluster.task,
                    on_stuck=self._on_stuck,
                )
                state = self._enter(State.TRAIN, "estimator built")
            elif state is State.TRAIN:
                try:
                    with tf_config_env(built):
                        self.estimator.train(input_fn, max_steps=max_steps, hooks=[*hooks, migration],
                                             saving_listeners=saving_listeners)
                except session_errors as exc:
                    if migration.steps_seen:
                        failovers = 0
                    message = str(getattr(exc, "message", "") or "")
                    first = message.strip().splitlines()[0] if message.strip() else ""
                    where = getattr(exc, "op", None)
                    _LOG.info("the session failed at %s: %s", where.name if where is not None else "session creation",
                              message[:2000])
                    state = self._enter(State.WAIT, f"session failed: {type(exc).__name__}: {first[:200]}")
                    continue
                if migration.migration is None:
                    self._enter(State.DONE, "training ended")
                    return
                failovers = 0
                state = self._enter(State.WAIT, "the migration hook saw the PS tasks move")
            elif state is State.WAIT:
                failovers += 1
                if failovers > self._max_failovers:
                    raise RecoveryError(
                        f"{self.cluster.task}: {failovers - 1} failovers in a row without a completed step, more "
                        f"than max_failovers = {self._max_failovers}; the cluster keeps failing; source: FailoverLoop"
                    )
                addresses, version = self._wait_for_ps()
                with self._lock:
                    old = list(self.cluster.ps_addresses)
                    self.cluster = self._moved(self.cluster, addresses, version)
                if addresses != old:
                    state = self._enter(State.BUILD, f"PS moved: {old} -> {addresses}")
                else:
                    state = self._enter(State.BUILD, "PS at the same addresses")

    @staticmethod
    def _moved(cluster: ClusterConfig, addresses: Sequence[str], version: int | None = None) -> ClusterConfig:
        """`cluster` with the PS at `addresses`: the version is the source's (`version`), else one more per move."""
        for index, address in enumerate(addresses):
            if address != cluster.ps_addresses[index]:
                cluster = cluster.replace_address("ps", index, address)
        if version is not None and version != cluster.version:
            cluster = dataclasses.replace(cluster, version=version)
        return cluster

    def _retarget(self, addresses: Sequence[str], version: int | None = None, steps: StepGeneration | None = None) -> None:
        """The migration hook's poller saw the PS at `addresses` (cluster `version`, if the source gives one):
        new sessions go there, and their steps carry the new version (see the module doc)."""
        import tensorflow as tf

        with self._lock:
            old = list(self.cluster.ps_addresses)
            moved = self._moved(self.cluster, addresses, version)
            if steps is not None:  # before the config names the new cluster: no session reaches it with the old version
                steps.follow(moved.version)
            # One assignment of the whole message: a creation that serializes the config sees the old
            # cluster or the new one, never a mix (the GIL holds across the copy).
            self._live_config.cluster_def.CopyFrom(tf.train.ClusterSpec(session_cluster(moved)).as_cluster_def())
            self.cluster = moved
        self._enter(State.RETARGET, f"PS moved: {old} -> {list(addresses)} (cluster version {moved.version})")

    def _wait_for_ps(self) -> tuple[list[str], int | None]:
        """The PS addresses once every PS task is alive, and the cluster version if the source publishes one."""
        deadline = time.monotonic() + self._wait_secs
        last: list[str | None] = []
        problem = ""
        while True:
            try:
                view = read_view(self._source)
                last = view.addresses
                problem = ""
                if all(last):
                    return [a for a in last if a], view.version
            except EcRecError as exc:
                problem = f" (the cluster source failed: {exc})"
            if time.monotonic() >= deadline:
                missing = [f"ps:{i}" for i, a in enumerate(last) if not a] or ["unknown"]
                raise RecoveryError(
                    f"{self.cluster.task}: PS tasks {', '.join(missing)} not alive within {self._wait_secs:.0f} s"
                    f"{problem}; restart them (same or new address) or raise the wait; source: FailoverLoop"
                )
            time.sleep(self._poll)
