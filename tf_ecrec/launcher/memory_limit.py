"""Memory limits of the local launcher's tasks: one memory cgroup per task, and its OOM kills.

`MemoryLimits` is the interface the supervisor uses: give a task a limit before it starts (the
child joins its cgroup itself, `ENV_CGROUP`, so everything it allocates is charged), count the OOM
kills of its cgroup, raise the limit before a restart.  `CgroupMemoryLimits` implements it with
the kernel's memory controller, cgroup v1 (``/sys/fs/cgroup/memory``) or v2 (a hierarchy whose
``cgroup.controllers`` lists ``memory``); a job on a cluster would implement it with its
scheduler's resource requests (a pod's ``resources.limits.memory``).
"""

from __future__ import annotations

import os
import re
from typing import Protocol

from tf_ecrec.errors import ConfigError

ENV_CGROUP = "TF_ECREC_CGROUP"
"""Set in a task's environment: the cgroup directory it writes its pid into before it starts."""

_V1_ROOT = "/sys/fs/cgroup/memory"
_V2_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")


class MemoryLimits(Protocol):
    def environment(self, task: str, limit_mb: int) -> dict[str, str]: ...
    def oom_kills(self, task: str) -> int: ...
    def limit_mb(self, task: str) -> int | None: ...
    def close(self) -> None: ...


def join_cgroup_from_environment() -> None:
    """In a task's process: joins the cgroup the launcher made for it (`ENV_CGROUP`), if any."""
    path = os.environ.get(ENV_CGROUP)
    if path:
        with open(os.path.join(path, "cgroup.procs"), "w", encoding="ascii") as fh:
            fh.write(str(os.getpid()))


class CgroupMemoryLimits:
    """One memory cgroup per task under ``<root>/tf_ecrec-<launcher pid>``.

    Raises:
      ConfigError: no writable memory controller on this machine (the rule and the flag named).
    """

    def __init__(self, source: str = "--ps-memory-mb") -> None:
        self._v1 = _writable(_V1_ROOT)
        root = _V1_ROOT if self._v1 else next((r for r in _V2_ROOTS if _v2_with_memory(r)), None)
        if root is None:
            raise ConfigError(
                "a memory limit needs a writable memory cgroup (cgroup v1 /sys/fs/cgroup/memory, or v2 with the "
                f"memory controller enabled); none on this machine; source: {source}"
            )
        self._dir = os.path.join(root, f"tf_ecrec-{os.getpid()}")
        os.makedirs(self._dir, exist_ok=True)
        if not self._v1:
            _write(os.path.join(self._dir, "cgroup.subtree_control"), "+memory")
        self._limits: dict[str, int] = {}
        self._kills_before: dict[str, int] = {}

    def _task_dir(self, task: str) -> str:
        return os.path.join(self._dir, task.replace(":", "-"))

    def environment(self, task: str, limit_mb: int) -> dict[str, str]:
        """Sets `task`'s limit (its cgroup made if needed); the environment its process needs."""
        path = self._task_dir(task)
        os.makedirs(path, exist_ok=True)
        limit = str(int(limit_mb) << 20)
        if self._v1:
            _write(os.path.join(path, "memory.limit_in_bytes"), limit)
        else:
            _write(os.path.join(path, "memory.max"), limit)
            _write(os.path.join(path, "memory.swap.max"), "0", missing_ok=True)
        self._limits[task] = int(limit_mb)
        self._kills_before[task] = self._count(task)
        return {ENV_CGROUP: path}

    def _count(self, task: str) -> int:
        name = "memory.oom_control" if self._v1 else "memory.events"
        try:
            with open(os.path.join(self._task_dir(task), name), encoding="ascii") as fh:
                found = re.search(r"^oom_kill (\d+)$", fh.read(), re.MULTILINE)
        except FileNotFoundError:
            return 0
        return int(found.group(1)) if found else 0

    def oom_kills(self, task: str) -> int:
        """OOM kills in `task`'s cgroup since its limit was last set."""
        return self._count(task) - self._kills_before.get(task, 0)

    def limit_mb(self, task: str) -> int | None:
        return self._limits.get(task)

    def close(self) -> None:
        """Removes the cgroups (their processes are gone)."""
        for task in self._limits:
            try:
                os.rmdir(self._task_dir(task))
            except OSError:
                pass
        try:
            os.rmdir(self._dir)
        except OSError:
            pass


def _writable(root: str) -> bool:
    return os.path.isdir(root) and os.access(root, os.W_OK) and os.path.exists(os.path.join(root, "cgroup.procs"))


def _v2_with_memory(root: str) -> bool:
    try:
        with open(os.path.join(root, "cgroup.controllers"), encoding="ascii") as fh:
            return "memory" in fh.read().split() and os.access(root, os.W_OK)
    except OSError:
        return False


def _write(path: str, value: str, missing_ok: bool = False) -> None:
    try:
        with open(path, "w", encoding="ascii") as fh:
            fh.write(value)
    except FileNotFoundError:
        if not missing_ok:
            raise
