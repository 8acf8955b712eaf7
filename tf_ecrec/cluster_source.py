"""Where the PS tasks of a job are now: the job master's view, or a cluster file a launcher keeps current.

A trainer under the failover loop (`tf_ecrec.failover`) and the PS
migration hooks (`tf_ecrec.migration`) read a `ClusterSource`; a launcher
writes the file with `write_cluster_file` (atomic replace).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from tf_ecrec.errors import ConfigError
from tf_ecrec.retry import Retry

ENV_CLUSTER_FILE = "TF_ECREC_CLUSTER_FILE"
"""Set by the launcher for every task: the path of the cluster file (`FileClusterSource`)."""


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


def write_cluster_file(path: str, cluster: Mapping[str, Sequence[str]]) -> None:
    """Atomically replaces the cluster file `path` (readers never see half of it)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({k: list(v) for k, v in cluster.items()}, f)
    os.replace(tmp, path)
