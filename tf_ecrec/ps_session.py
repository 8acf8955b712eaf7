"""Servers and session configs for reaching PS tasks from a process outside the training cluster.

A process that must talk to the PS tasks (a trainer after a failover, a
reader of live variables such as `tf_ecrec.live_cluster.PsReader`) boots its
own one-task server (`own_server`) and opens sessions that carry the cluster
they reach (`propagated_config`, ClusterSpec propagation).  Call
`fast_reconnect` before the process makes its first gRPC channel.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from tf_ecrec.errors import ConfigError

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


def own_server(address: str) -> Any:
    """A TensorFlow server at `address`, booted as a one-task job of its own (`SERVER_JOB`).

    Its sessions reach other tasks through the cluster they carry (`propagated_config`).
    """
    import tensorflow as tf

    fast_reconnect()

    return tf.distribute.Server(
        tf.train.ClusterSpec({SERVER_JOB: [address]}), job_name=SERVER_JOB, task_index=0, protocol="grpc", start=True
    )

def propagated_config(cluster: Mapping[str, Any], timeout_secs: float, base: Any = None) -> Any:
    """A ConfigProto carrying `cluster` (ClusterSpec propagation), with shared state and an operation timeout.

    Args:
      cluster: the tasks the session reaches, as `tf.train.ClusterSpec` takes them;
        one of them is the address of the server the session is opened on.
      timeout_secs: the operation timeout: the longest a session call
        (creating a session, one step, a checkpoint save) may take.
      base: a ConfigProto to start from (copied).
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
    return config
