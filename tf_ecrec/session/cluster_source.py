"""Where the PS tasks of a job are now: the job master's view, or a cluster file a launcher keeps current.

A trainer under the failover loop (`tf_ecrec.session.failover`) and the PS
migration hooks (`tf_ecrec.session.migration`) read a `ClusterSource`; a launcher
writes the file with `write_cluster_file` (atomic replace).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from tf_ecrec.base.retry import Retry
from tf_ecrec.errors import ConfigError

ENV_CLUSTER_FILE = "TF_ECREC_CLUSTER_FILE"
"""Set by the launcher for every task: the path of the cluster file (`FileClusterSource`)."""
VERSION_KEY = "version"
"""The cluster file's optional key beside the jobs: the cluster version (TF_CONFIG's), raised at every
move.  Trainers take their step generation from it (`tf_ecrec.step.step_program.StepGeneration`)."""


class ClusterSource(Protocol):
    """Where the PS tasks are now."""

    def ps_addresses(self) -> list[str | None]:
        """Address of each PS task by index; None for a task not alive now.

        Raises:
          EcRecError: the source cannot be read now (the caller retries until its deadline).
        """
        ...


@dataclasses.dataclass(frozen=True)
class PsView:
    """One read of a source: the PS addresses and, when the source publishes one, the cluster version."""

    addresses: list[str | None]
    version: int | None = None


@runtime_checkable
class VersionedClusterSource(ClusterSource, Protocol):
    """A source that also publishes the cluster version (TF_CONFIG's ``version``, raised at every move)."""

    def ps_view(self) -> PsView:
        """The addresses and the version, from one read (raises as `ps_addresses`)."""
        ...


def read_view(source: ClusterSource) -> PsView:
    """One read of `source`: with its version if it publishes one (`VersionedClusterSource`)."""
    if isinstance(source, VersionedClusterSource):
        return source.ps_view()
    return PsView(list(source.ps_addresses()))


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
    ConfigMap.  A PS listed with an empty address is not alive; an optional
    ``version`` beside the jobs is the cluster version (`VERSION_KEY`).  The
    writer replaces the file atomically (`write_cluster_file`).
    """

    poll_secs = 0.02
    """How often a trainer reads this source (`tf_ecrec.session.failover.FailoverLoop`): a read of an unchanged
    file is one ``stat`` (the view is kept by the file's inode, size and modification time, and the
    writer's atomic replace gives every version a new inode), so a move is seen tens of ms after it."""

    def __init__(self, path: str, num_ps: int) -> None:
        self.path = path
        self._num_ps = num_ps
        self._kept: tuple[tuple[int, int, int], PsView] | None = None

    def ps_addresses(self) -> list[str | None]:
        return self.ps_view().addresses

    def ps_view(self) -> PsView:
        """The PS addresses and the file's ``version`` (None when the writer gives none)."""
        try:
            st = os.stat(self.path)
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            if self._kept is not None and self._kept[0] == key:
                return PsView(list(self._kept[1].addresses), self._kept[1].version)
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
        version = cluster.get(VERSION_KEY)
        if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
            raise ConfigError(f"cluster file {self.path!r} has {VERSION_KEY}={version!r}; rule: an integer >= 0, "
                              f"raised at every move; source: {ENV_CLUSTER_FILE}")
        self._kept = (key, PsView([a or None for a in ps], version))
        return PsView(list(self._kept[1].addresses), version)


def write_cluster_file(path: str, cluster: Mapping[str, Sequence[str]], version: int | None = None) -> None:
    """Atomically replaces the cluster file `path` (readers never see half of it); `version`, the cluster
    version (TF_CONFIG's, raised at every move), goes beside the jobs under ``"version"``."""
    tmp = f"{path}.tmp{os.getpid()}"
    content: dict[str, Any] = {k: list(v) for k, v in cluster.items()}
    if version is not None:
        content[VERSION_KEY] = int(version)
    with open(tmp, "w") as f:
        json.dump(content, f)
    os.replace(tmp, path)
