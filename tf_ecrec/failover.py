"""The failover module: train, and when a parameter server comes back at a new address, rebuild and go on.

TensorFlow fixes a task's cluster when its server starts, `RunConfig` reads
``TF_CONFIG`` once and an Estimator fixes its RunConfig at construction
(DESIGN.md section 2), so a PS that moves means a new TF_CONFIG, RunConfig,
Estimator and session.  This module does that in-process.

How a trainer (chief or worker) runs under it:

- its TensorFlow server boots as a one-task job of its own (`start_server`),
  and every session carries the cluster (the PS tasks and this task) in its
  ``ConfigProto.cluster_def`` (ClusterSpec propagation), with state shared
  between sessions, so a session built for a new cluster reaches the moved
  PS while the surviving PS keep their variables (`session_config`);
- sessions have an operation timeout: a session re-created for the old
  cluster waits for the dead address forever inside TensorFlow (its device
  scan has no deadline), and the timeout turns that wait into
  ``DeadlineExceededError``, which leaves ``Estimator.train``;
- a `ClusterSource` (the job master, or a file a launcher keeps current)
  says where the PS tasks are now.

The loop, `FailoverLoop.train`, is a state machine with bounded waits
(DESIGN.md invariant 6)::

    BUILD  write TF_CONFIG for the current cluster, build RunConfig (with the
           session config above) and the Estimator          -> TRAIN
    TRAIN  Estimator.train with a PsMigrationHook watching the source
             the source shows the PS at new addresses: write
             them into the live session ConfigProto (see
             below), keep training                           -> RETARGET
             returns, no migration seen                      -> DONE
             returns after the hook stopped it (PS moved)    -> WAIT
             session error: DeadlineExceeded, Unavailable,
             Aborted (a PS died, or a session was built for
             an old cluster)                                 -> WAIT
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

- ``GRPC_FAIL_FAST=true`` (`fast_reconnect`): TensorFlow's device scan of a
  session being created fails at once on a task that is down, instead of
  waiting for it until the timeout; MonitoredSession retries the creation;
- the migration hook's poller, on seeing every PS alive at the source's new
  addresses, writes them into the ConfigProto the Estimator hands to every
  session it creates (``Estimator._session_config``: read, never replaced;
  tf.estimator 2.15 is its last release), so the next retry reaches the
  moved PS, the chief's recovery runs in that session and training goes on
  in the same ``Estimator.train`` call: no graph rebuilt, no process
  started.  A session created before the retarget is stopped at its next
  step and rebuilt (BUILD) as before.

The rebuild of the lost PS's variables is not this module's: the chief's
new session runs it (`tf_ecrec.recovery`), exactly as for a PS restarted at
its old address.  Workers' sessions wait for the chief's rebuild through the
model's ready op.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from tf_ecrec.config import ClusterConfig
from tf_ecrec.errors import ConfigError, EcRecError, RecoveryError
from tf_ecrec.ps_session import own_server, propagated_config

_LOG = logging.getLogger(__name__)

ENV_CLUSTER_FILE = "TF_ECREC_CLUSTER_FILE"


class ClusterSource(Protocol):
    """Where the PS tasks are now."""

    def ps_addresses(self) -> list[str | None]:
        """Address of each PS task by index; None for a task not alive now.

        Raises:
          EcRecError: the source cannot be read now (the caller retries until its deadline).
        """
        ...


class MasterClusterSource:
    """The job master's view: every PS task's last registered address, None unless alive."""

    def __init__(self, client: Any, num_ps: int, timeout_secs: float = 2.0) -> None:
        self._client = client
        self._num_ps = num_ps
        self._timeout = timeout_secs

    def ps_addresses(self) -> list[str | None]:
        from tf_ecrec.retry import Retry

        cluster = self._client.get_cluster(timeout=self._timeout, retry=Retry(max_tries=1, deadline=None))
        out: list[str | None] = [None] * self._num_ps
        for task in cluster.tasks:
            if task.task_type == "ps" and task.task_index < self._num_ps and task.status == "alive":
                out[task.task_index] = task.address
        return out


class FileClusterSource:
    """A JSON file holding the cluster (TF_CONFIG's ``cluster`` dict), kept current by a launcher.

    The way a Kubernetes operator publishes a cluster through a mounted
    ConfigMap.  A PS listed with an empty address is not alive.  The writer
    replaces the file atomically (`write_cluster_file`).
    """

    def __init__(self, path: str, num_ps: int) -> None:
        self.path = path
        self._num_ps = num_ps

    def ps_addresses(self) -> list[str | None]:
        try:
            with open(self.path) as f:
                cluster = json.load(f)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cluster file {self.path!r} is not readable JSON ({exc}); source: {ENV_CLUSTER_FILE}") from exc
        ps = list(cluster.get("ps", []))
        if len(ps) != self._num_ps:
            raise ConfigError(
                f"cluster file {self.path!r} lists {len(ps)} PS tasks, the job has {self._num_ps}; "
                f"rule: the PS count does not change; source: {ENV_CLUSTER_FILE}"
            )
        return [a or None for a in ps]


def write_cluster_file(path: str, cluster: dict[str, Sequence[str]]) -> None:
    """Atomically replaces the cluster file `path` (readers never see half of it)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({k: list(v) for k, v in cluster.items()}, f)
    os.replace(tmp, path)


# ---- servers and sessions ----------------------------------------------------------------------


def start_server(cluster: ClusterConfig) -> Any:
    """This trainer's TensorFlow server, at its TF_CONFIG address."""
    return own_server(cluster.address)


def session_cluster(cluster: ClusterConfig) -> dict[str, dict[int, str]]:
    """The cluster a trainer's sessions carry: every PS task and the trainer itself."""
    return {"ps": dict(enumerate(cluster.ps_addresses)), cluster.task_type: {cluster.task_index: cluster.address}}




def session_config(cluster: ClusterConfig, timeout_secs: float, base: Any = None) -> Any:
    """The ConfigProto of a trainer's sessions: `propagated_config` of `session_cluster`."""
    return propagated_config(session_cluster(cluster), timeout_secs, base)


def live_session_config(estimator: Any, built: Any) -> Any:
    """The ConfigProto `estimator` creates its sessions from, if it carries the cluster of `built`; else None.

    `tf.estimator.Estimator` keeps one (``_session_config``; its RunConfig's,
    possibly a copy) and passes that object to every MonitoredSession it
    runs, which re-creates sessions from it after a failure.  None (no
    retargeting, the session is rebuilt instead) when the Estimator holds no
    such object or one for another cluster (a `build` that ignored the
    session config it was given).
    """
    live = getattr(estimator, "_session_config", None)
    if live is None or not hasattr(live, "cluster_def") or live.cluster_def != built.cluster_def:
        return None
    return live


# ---- the loop --------------------------------------------------------------------------------


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
      wait_secs: how long WAIT waits for every PS task to be alive.
      max_failovers: WAITs allowed in a row without a completed step
        between them (a job that keeps training may fail over any number
        of times; one that never gets a step done gives up).
      poll_secs: how often WAIT and the migration hook read the source.
      on_transition: called with (state, reason) on every transition (reports, tests).
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
        poll_secs: float = 0.2,
        on_transition: Callable[[State, str], None] | None = None,
    ) -> None:
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
        self.history: list[tuple[float, State, str]] = []
        self.estimator: Any = None
        self._lock = threading.Lock()  # self.cluster: the poller retargets it while TRAIN runs
        self._live_config: Any = None

    def _enter(self, state: State, reason: str) -> State:
        self.history.append((time.time(), state, reason))
        _LOG.info("failover: %s (%s)", state.value, reason)
        if self._on_transition is not None:
            self._on_transition(state, reason)
        return state

    def train(self, input_fn: Callable[[], Any], *, max_steps: int | None = None, hooks: Sequence[Any] = (),
              saving_listeners: Sequence[Any] | None = None) -> None:
        """Estimator.train under the loop; returns when training ends normally.

        Raises:
          RecoveryError: a PS task stayed down longer than `wait_secs`, or
            more than `max_failovers` failovers in this call.
          Anything else `Estimator.train` raises (not a session failure).
        """
        import tensorflow as tf

        from tf_ecrec.hooks.ps_migration import PsMigrationHook

        session_errors = (tf.errors.DeadlineExceededError, tf.errors.UnavailableError, tf.errors.AbortedError)
        failovers = 0
        state = self._enter(State.BUILD, f"start at PS {list(self.cluster.ps_addresses)}")
        migration: Any = None
        while True:
            if state is State.BUILD:
                os.environ["TF_CONFIG"] = json.dumps(self.cluster.to_tf_config())
                config = session_config(self.cluster, self._timeout)
                self.estimator = self._build(self.cluster, config)
                self._live_config = live_session_config(self.estimator, config)
                migration = PsMigrationHook(source=self._source, expected_ps=self.cluster.ps_addresses,
                                            poll_secs=self._poll,
                                            retarget=self._retarget if self._live_config is not None else None)
                state = self._enter(State.TRAIN, "estimator built")
            elif state is State.TRAIN:
                try:
                    self.estimator.train(input_fn, max_steps=max_steps, hooks=[*hooks, migration],
                                         saving_listeners=saving_listeners)
                except session_errors as exc:
                    if migration.steps_seen:
                        failovers = 0
                    first = (exc.message or "").strip().splitlines()[0] if exc.message else ""
                    where = getattr(exc, "op", None)
                    _LOG.info("the session failed at %s: %s", where.name if where is not None else "session creation",
                              (exc.message or "")[:2000])
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
                addresses = self._wait_for_ps()
                with self._lock:
                    old = list(self.cluster.ps_addresses)
                    self.cluster = self._moved(self.cluster, addresses)
                if addresses != old:
                    state = self._enter(State.BUILD, f"PS moved: {old} -> {addresses}")
                else:
                    state = self._enter(State.BUILD, "PS at the same addresses")

    @staticmethod
    def _moved(cluster: ClusterConfig, addresses: Sequence[str]) -> ClusterConfig:
        for index, address in enumerate(addresses):
            if address != cluster.ps_addresses[index]:
                cluster = cluster.replace_address("ps", index, address)
        return cluster

    def _retarget(self, addresses: Sequence[str]) -> None:
        """The migration hook's poller saw the PS at `addresses`: new sessions go there (see the module doc)."""
        import tensorflow as tf

        with self._lock:
            old = list(self.cluster.ps_addresses)
            moved = self._moved(self.cluster, addresses)
            # One assignment of the whole message: a creation that serializes the config sees the old
            # cluster or the new one, never a mix (the GIL holds across the copy).
            self._live_config.cluster_def.CopyFrom(tf.train.ClusterSpec(session_cluster(moved)).as_cluster_def())
            self.cluster = moved
        self._enter(State.RETARGET, f"PS moved: {old} -> {list(addresses)}")

    def _wait_for_ps(self) -> list[str]:
        deadline = time.monotonic() + self._wait_secs
        last: list[str | None] = []
        problem = ""
        while True:
            try:
                last = self._source.ps_addresses()
                problem = ""
                if all(last):
                    return [a for a in last if a]
            except EcRecError as exc:
                problem = f" (the cluster source failed: {exc})"
            if time.monotonic() >= deadline:
                missing = [f"ps:{i}" for i, a in enumerate(last) if not a] or ["unknown"]
                raise RecoveryError(
                    f"{self.cluster.task}: PS tasks {', '.join(missing)} not alive within {self._wait_secs:.0f} s"
                    f"{problem}; restart them (same or new address) or raise the wait; source: FailoverLoop"
                )
            time.sleep(self._poll)
