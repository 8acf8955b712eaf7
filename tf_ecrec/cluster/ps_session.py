"""ClusterSpec propagation: a trainer's own server, and sessions that carry the cluster they reach.

A trainer's TensorFlow server boots as a one-task job of its own
(`own_server`), and each of its sessions carries the PS tasks and the
trainer in its ``ConfigProto.cluster_def`` (`session_config`), with state
shared between sessions and an operation timeout.  A session built for a
new cluster then reaches a moved PS while the surviving PS keep their
variables (`tf_ecrec.session.failover`); `tf_ecrec.check.live_cluster` reads the PS tasks the
same way.  `fast_reconnect` sets the gRPC options every task of a job
should run with.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from tf_ecrec.cluster.tf_config import ClusterConfig
from tf_ecrec.cluster.threads import ENV_PS_THREADS, ENV_TASKS_PER_HOST, ps_thread_pools
from tf_ecrec.errors import ClusterUnavailable, ConfigError

_LOG = logging.getLogger(__name__)

GET_STATUS = "/tensorflow.WorkerService/GetStatus"
"""The worker service call a master makes to list a task's devices: an answer means the task serves."""

# The job name a trainer's own server boots under: TensorFlow refuses a propagated
# cluster that names the task exactly as its server booted.
SERVER_JOB = "localhost"


GRPC_RECONNECT_OPTIONS = (
    "grpc.initial_reconnect_backoff_ms=200,grpc.min_reconnect_backoff_ms=200,grpc.max_reconnect_backoff_ms=500"
)
"""gRPC channel arguments every task of a job should run with (`fast_reconnect`)."""


def fast_reconnect() -> None:
    """Makes this process's TensorFlow gRPC channels reconnect to a restarted task within half a second.

    A channel to a task that died waits out gRPC's connection backoff (a
    20 s minimum connect timeout by default; TensorFlow caps only the backoff
    itself) before it dials again, so after a PS restarts at the same address
    the next session's device scan, and the close of the old session, stalled
    for up to 20 s past the moment the PS served again (measured: 21.7 s from
    the kill to the first step after it, against 8.9 s with these options).
    TensorFlow reads ``TF_GRPC_DEFAULT_OPTIONS`` once, when it makes its first
    channel, so this must run before any server or session of the process; a
    value the user set is kept.
    """
    os.environ.setdefault("TF_GRPC_DEFAULT_OPTIONS", GRPC_RECONNECT_OPTIONS)
    # A session's device scan otherwise waits for a task that is down until the operation
    # timeout; failing at once lets MonitoredSession retry, and a retargeted retry reach
    # a moved PS (see the module doc).  TensorFlow reads it on every call.
    os.environ.setdefault("GRPC_FAIL_FAST", "true")


def own_server(address: str, ps: bool = False) -> Any:
    """A TensorFlow server at `address`, booted as a one-task job of its own (`SERVER_JOB`).

    Its sessions reach other tasks through the cluster they carry (`propagated_config`).  `ps`: a PS's
    server (a spare's), its thread pools sized by `tf_ecrec.cluster.threads`.
    """
    import tensorflow as tf

    fast_reconnect()

    return tf.distribute.Server(
        tf.train.ClusterSpec({SERVER_JOB: [address]}), job_name=SERVER_JOB, task_index=0, protocol="grpc",
        config=_ps_config() if ps else None, start=True,
    )


def start_server(cluster: ClusterConfig) -> Any:
    """This trainer's TensorFlow server, at its TF_CONFIG address."""
    return own_server(cluster.address)


def session_cluster(cluster: ClusterConfig) -> dict[str, dict[int, str]]:
    """The cluster a trainer's sessions carry: every PS task and the trainer itself."""
    return {"ps": dict(enumerate(cluster.ps_addresses)), cluster.task_type: {cluster.task_index: cluster.address}}


ENV_GRAPPLER = "TF_ECREC_GRAPPLER"
"""``on``: the sessions `propagated_config` makes keep TensorFlow's graph optimiser (Grappler), off by default."""


def propagated_config(cluster: Mapping[str, Any], timeout_secs: float, base: Any = None) -> Any:
    """A ConfigProto carrying `cluster` (ClusterSpec propagation), with shared state and an operation timeout.

    Args:
      cluster: the tasks the session reaches, as `tf.train.ClusterSpec` takes them;
        one of them is the address of the server the session is opened on.
      timeout_secs: the operation timeout: the longest a session call
        (creating a session, one step, a checkpoint save) may take.
      base: a ConfigProto to start from (copied), its graph options kept; without one, Grappler is off
        (unless ``TF_ECREC_GRAPPLER=on``): its work on each first call of a session is most of a
        recovery's calls and of the first step after it, and saved nothing per step on these graphs.
    """
    import tensorflow as tf

    if timeout_secs <= 0:
        raise ConfigError(f"session timeout {timeout_secs} s; rule: > 0; source: the failover's session_timeout_secs")
    config = tf.compat.v1.ConfigProto()
    if base is not None:
        config.CopyFrom(base)
    config.cluster_def.CopyFrom(tf.train.ClusterSpec(dict(cluster)).as_cluster_def())
    # Without this a propagated cluster isolates each session's state: variables on the PS would
    # not be shared between the trainers, nor survive a session.
    config.experimental.share_session_state_in_clusterspec_propagation = True
    # Calls go to this process's master over gRPC, so that the timeout holds: an in-process
    # master waits for the call it timed out to finish, which a scan of a dead address never does.
    config.rpc_options.use_rpc_for_inprocess_master = True
    config.operation_timeout_in_ms = int(timeout_secs * 1000)
    # The propagated cluster is what the session may reach; a base's filters (the Estimator's
    # default names other workers) would only narrow it.
    config.device_filters[:] = []
    if base is None:
        # As the Estimator's default session config: a canned estimator's summaries read variables inside a
        # cond whose branch would otherwise be pinned to the trainer and colocated with the PS (refused).
        config.allow_soft_placement = True
    if base is None and os.environ.get(ENV_GRAPPLER) != "on":
        # Grappler optimises every new call signature of a session; a recovery is a dozen first calls on a new
        # session, and each trainer's first step after it one more: measured with a spare PS, 0.4-0.5 s less
        # from the kill to the first step without it, and no step slower (docs/benchmarks.md, 2026-11-30).
        config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


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


def answers(address: str, timeout_secs: float) -> bool:
    """Whether the TensorFlow server at `address` answers ``GetStatus`` within `timeout_secs`."""
    import grpc

    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(GET_STATUS, request_serializer=lambda x: x, response_deserializer=lambda x: x)
        try:
            call(b"", timeout=timeout_secs)
        except grpc.RpcError:
            return False
    return True


def wait_until_serving(tasks: Mapping[str, str], timeout_secs: float, source: str, probe_secs: float = 2.0,
                       report_secs: float = 10.0) -> float:
    """Waits until every task of `tasks` (name -> address) answers; returns the seconds it waited.

    Logs the tasks still awaited every `report_secs`; raises `ClusterUnavailable` naming them, with their
    addresses and `source`, after `timeout_secs`.
    """
    start = time.monotonic()
    waiting = dict(tasks)
    reported = start
    while True:
        waiting = {name: address for name, address in waiting.items() if not answers(address, probe_secs)}
        now = time.monotonic()
        if not waiting:
            return now - start
        missing = ", ".join(f"{name} at {address}" for name, address in sorted(waiting.items()))
        if now - start >= timeout_secs:
            raise ClusterUnavailable(
                f"{missing} did not answer within {timeout_secs:g} s; rule: every task the cluster names serves "
                f"before training starts; source: {source}")
        if now - reported >= report_secs:
            _LOG.warning("waiting for %s to serve (%.0f s of %g s)", missing, now - start, timeout_secs)
            reported = now
        time.sleep(min(0.5, max(0.0, timeout_secs - (now - start))))


def cluster_server(cluster: ClusterConfig) -> Any:
    """This task's TensorFlow server as a member of the whole cluster (a PS task's), started, with the job's gRPC
    options set first (`start_server` is a trainer's, a job of its own); a PS's thread pools sized by
    `tf_ecrec.cluster.threads`."""
    import tensorflow as tf

    fast_reconnect()  # before the server makes its first channel

    return tf.distribute.Server(
        tf.train.ClusterSpec({k: list(v) for k, v in cluster.cluster.items()}),
        job_name=cluster.task_type,
        task_index=cluster.task_index,
        protocol="grpc",
        config=_ps_config() if cluster.task_type == "ps" else None,
        start=True,
    )


def _ps_config() -> Any:
    """A PS server's default session config: its thread pools (None: TensorFlow's sizing), logged."""
    pools = ps_thread_pools()
    setting = os.environ.get(ENV_PS_THREADS, "auto") or "auto"
    tasks = os.environ.get(ENV_TASKS_PER_HOST)
    if pools is None:
        _LOG.info("PS thread pools: TensorFlow's sizing (%s=%s)", ENV_PS_THREADS, setting)
        return None
    _LOG.info("PS thread pools: %d intra-op, %d inter-op (%s=%s%s)", pools.intra, pools.inter, ENV_PS_THREADS, setting,
              f", {tasks} tasks on this host" if tasks else "")
    return pools.config()
