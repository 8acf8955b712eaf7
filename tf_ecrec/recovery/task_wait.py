"""A trainer's bounded wait for the tasks its session will reach, before TensorFlow's unbounded one.

TensorFlow's ``CreateSession`` asks every task its session reaches (the session config's device
filters, or the whole cluster without them) for its devices, and waits for each one for ever:
a worker whose script passes its own session config, started after its chief died, waits in
``CreateSession`` for the dead chief with nothing in its log but "CreateSession still waiting".
`TaskWaitHook` waits for those tasks first, with a deadline, and names the ones that never answer.

Lifecycle::

    __init__(targets, deadline)   validate (task -> "host:port", seconds > 0)
    begin()                       before the session is created: each target's port accepts a
                                  connection, or RecoveryError after `deadline_secs`

A task that answers and dies before ``CreateSession`` reaches it is not covered (the window is
the graph's finalization); a task that never came up or died earlier is.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import tensorflow as tf

from tf_ecrec.base.retry import Retry, retry_on
from tf_ecrec.errors import ConfigError, RecoveryError

_LOG = logging.getLogger(__name__)

TASK_WAIT_SECS = 1800.0
"""How long a trainer waits for a task its session reaches (as long as a worker's ready wait)."""


def session_targets(cluster: Mapping[str, Any], device_filters: Iterable[str], me: str) -> dict[str, str]:
    """The tasks (``"type:index"`` -> address) a session of task `me` reaches: those of `cluster`
    (``ClusterSpec.as_dict()``: a list or an index -> address dict per job) the device filters name
    (``/job:ps`` or ``/job:ps/task:1``), every one without filters; never `me`."""
    filters = [f.strip() for f in device_filters if f.strip()]
    out: dict[str, str] = {}
    for job, addresses in sorted(cluster.items()):
        indexed = addresses.items() if isinstance(addresses, Mapping) else enumerate(addresses)
        for index, address in sorted(indexed):
            task = f"{job}:{index}"
            wanted = not filters or any(_matches(f, job, index) for f in filters)
            if wanted and task != me:
                out[task] = address
    return out


def run_config_targets(config: Any) -> tuple[dict[str, str], str]:
    """`session_targets` of a RunConfig's trainer, and its task: a session config carrying a cluster
    (ClusterSpec propagation, `tf_ecrec.cluster.ps_session`) reaches that cluster, else the RunConfig's."""
    me = f"{config.task_type}:{config.task_id}"
    session = config.session_config
    cluster = config.cluster_spec
    if session is not None and session.cluster_def.job:
        cluster = tf.train.ClusterSpec(session.cluster_def)
    filters = session.device_filters if session is not None else ()
    return session_targets(cluster.as_dict(), filters, me), me


def _matches(device_filter: str, job: str, index: int) -> bool:
    parts = dict(part.split(":", 1) for part in device_filter.strip("/").split("/") if ":" in part)
    return parts.get("job") == job and parts.get("task", str(index)) == str(index)


class TaskWaitHook(tf.compat.v1.train.SessionRunHook):
    """Waits in ``begin`` for each target task's port, at most `deadline_secs` in all.

    Args:
      targets: task -> "host:port" (`session_targets`).
      me: this task, for the message.
      deadline_secs: how long to wait for all of them.
      connect: opens and closes a connection (raises ``OSError`` while the task is down); tests inject it.
      retry: the wait's policy (default: every 0.5 s up to 2 s apart, until the deadline).
    """

    def __init__(self, targets: dict[str, str], me: str, deadline_secs: float = TASK_WAIT_SECS,
                 connect: Callable[[str], None] | None = None, retry: Retry | None = None) -> None:
        if deadline_secs <= 0:
            raise ConfigError(f"TaskWaitHook deadline_secs={deadline_secs}; rule: > 0; source: ec_model_fn")
        self._targets = dict(targets)
        self._me = me
        self._deadline = float(deadline_secs)
        self._connect = connect or _connect
        self._retry = retry or Retry(max_tries=1_000_000, delay=0.5, max_delay=2.0, deadline=self._deadline,
                                     retry_if=retry_on(OSError))

    def begin(self) -> None:
        for task, address in sorted(self._targets.items()):
            try:
                self._retry(self._connect, address)
            except OSError as exc:
                raise RecoveryError(
                    f"{self._me}: {task} at {address} did not answer within {self._deadline:.0f} s ({exc}); rule: every "
                    f"task this trainer's session reaches answers (TensorFlow's CreateSession would wait for it for "
                    f"ever); is {task} running? see its log; source: the session config's device filters"
                ) from exc


def _connect(address: str) -> None:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
        pass
