"""The thread pools of a PS task's TensorFlow server, sized to the CPUs the task may use.

TensorFlow sizes a server's two pools (its CPU device's intra-op pool and the inter-op pool its
executors run kernels on) to the cores the process sees.  Two cases make that wrong:

- **tasks sharing a host.** The local launcher runs every PS and trainer on one machine: five PS
  and two trainers on two cores made 7 x 4 pool threads, whose spinning and wake-ups were the
  largest single item of a PS's CPU in a profile of a launched job (2026-12-02: the Eigen pool's
  `WorkerLoop` and run queue, the kernel's task switches and futex wake-ups).  Measured with
  one intra-op and one or two inter-op threads per PS, in three runs: the protected job's PS CPU
  per 1,000 samples 2-17 % lower, the unprotected job's 11-16 % lower in two and 8 % higher in
  one (docs/benchmarks.md, "PS thread pools sized to their share").
- **a CPU limit.** A container limited to 2 CPUs on a 64-core node sees 64 cores, and a PS there
  starts 128 threads for 2 CPUs of quota.

So a PS's pools follow `ENV_PS_THREADS`:

- ``auto`` (the default): the CPUs this process may use (its CPU affinity, capped by its cgroup's
  CPU quota), divided among `ENV_TASKS_PER_HOST` tasks when that is set (the local launcher sets
  it to the number of TensorFlow tasks it starts); ``intra = max(1, floor(share))`` and
  ``inter = max(2, intra)`` (two inter-op threads at least: a kernel that blocks, such as a
  variable's lock held by another op, does not stop the PS).  With neither a share nor a quota
  below the visible cores, TensorFlow's own sizing is kept;
- ``default``: TensorFlow's own sizing;
- ``INTRA,INTER``: these counts.

Only PS servers are sized here: a trainer's pools run its dense layers, where TensorFlow's sizing
was not measured to lose.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

from tf_ecrec.errors import ConfigError

ENV_PS_THREADS = "TF_ECREC_PS_THREADS"
"""``auto`` (default), ``default`` (TensorFlow's sizing) or ``INTRA,INTER``: a PS server's thread pools."""
ENV_TASKS_PER_HOST = "TF_ECREC_TASKS_PER_HOST"
"""How many TensorFlow tasks share this host's CPUs; the local launcher sets it."""

CGROUP_ROOT = "/sys/fs/cgroup"


@dataclasses.dataclass(frozen=True)
class ThreadPools:
    """A server's intra-op and inter-op thread counts."""

    intra: int
    inter: int

    def config(self) -> Any:
        """A ConfigProto carrying these counts (a server's default session config)."""
        import tensorflow as tf

        return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=self.intra,
                                        inter_op_parallelism_threads=self.inter)


def parse_cpu_quota(cpu_max: str | None, cfs_quota: str | None = None, cfs_period: str | None = None) -> float | None:
    """CPUs of quota from cgroup v2's ``cpu.max`` (``"max 100000"`` or ``"200000 100000"``), else v1's
    ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``; None when unlimited or unreadable."""
    try:
        if cpu_max is not None:
            quota, _, period = cpu_max.strip().partition(" ")
            if quota == "max":
                return None
            return int(quota) / int(period or "100000")
        if cfs_quota is not None and cfs_period is not None:
            q = int(cfs_quota.strip())
            return q / int(cfs_period.strip()) if q > 0 else None
    except (ValueError, ZeroDivisionError):
        return None
    return None


def cgroup_cpu_quota(root: str = CGROUP_ROOT) -> float | None:
    """This process's cgroup CPU quota, in CPUs (None: no quota, or no cgroup file to read)."""

    def read(*parts: str) -> str | None:
        try:
            with open(os.path.join(root, *parts), encoding="ascii") as fh:
                return fh.read()
        except OSError:
            return None

    cpu_max = read("cpu.max")
    if cpu_max is not None:
        return parse_cpu_quota(cpu_max)
    return parse_cpu_quota(None, read("cpu", "cpu.cfs_quota_us"), read("cpu", "cpu.cfs_period_us"))


def usable_cpus() -> tuple[int, float | None]:
    """(CPUs in this process's affinity, its cgroup's quota in CPUs or None)."""
    return len(os.sched_getaffinity(0)), cgroup_cpu_quota()


def ps_thread_pools(environ: Mapping[str, str] | None = None, cpus: tuple[int, float | None] | None = None,
                    ) -> ThreadPools | None:
    """A PS server's pools per `ENV_PS_THREADS` (None: TensorFlow's own sizing).

    Args:
      environ: where the settings are read (`os.environ` by default).
      cpus: (CPUs in the affinity, quota in CPUs or None), `usable_cpus()` by default.

    Raises:
      ConfigError: a setting that is none of the forms above, or a task count that is not a positive integer.
    """
    env = os.environ if environ is None else environ
    raw = env.get(ENV_PS_THREADS, "").strip() or "auto"
    if raw == "default":
        return None
    if raw != "auto":
        parts = raw.split(",")
        try:
            counts = [int(p) for p in parts]
        except ValueError:
            counts = []
        if len(counts) != 2 or min(counts) < 1:
            raise ConfigError(f"{ENV_PS_THREADS}={raw!r}; rule: auto, default, or INTRA,INTER as two positive "
                              "integers (e.g. 1,2); source: the environment")
        return ThreadPools(counts[0], counts[1])
    tasks_raw = env.get(ENV_TASKS_PER_HOST, "").strip()
    tasks = None
    if tasks_raw:
        try:
            tasks = int(tasks_raw)
        except ValueError:
            tasks = 0
        if tasks < 1:
            raise ConfigError(f"{ENV_TASKS_PER_HOST}={tasks_raw!r}; rule: a positive integer, the TensorFlow tasks "
                              "sharing this host; source: the environment")
    affinity, quota = usable_cpus() if cpus is None else cpus
    limited = quota is not None and quota < affinity
    if tasks is None and not limited:
        return None
    available = min(float(affinity), quota) if quota is not None else float(affinity)
    share = available / (tasks or 1)
    intra = max(1, math.floor(share)) if tasks else max(1, math.ceil(share))
    return ThreadPools(intra, max(2, intra))
