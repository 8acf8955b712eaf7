"""Cluster configuration as an immutable value, parsed from and written to TF_CONFIG.

TF_CONFIG is the JSON a TensorFlow PS job reads from its environment::

    {"cluster": {"chief": ["127.0.0.1:2222"],
                 "worker": ["127.0.0.1:2223"],
                 "ps": ["127.0.0.1:2224", "127.0.0.1:2225"]},
     "task": {"type": "worker", "index": 0}}

>>> cfg = ClusterConfig.from_tf_config(json.loads(text))
>>> cfg.task_type, cfg.task_index, cfg.num_ps, cfg.address
('worker', 0, 2, '127.0.0.1:2223')

`from_tf_config` and `to_tf_config` are pure.  The only place that sets the
environment variable is the `tf_config_env` context manager: TF_CONFIG is
never used as a channel between threads (RunConfig reads it once, in its
constructor, which is why failover builds a new RunConfig from a new
`ClusterConfig` rather than editing the environment under a running job).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

from tf_ecrec.errors import ConfigError

TASK_TYPES = ("chief", "worker", "ps", "evaluator")
_SOURCE_ENV = "environment variable TF_CONFIG"


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """One task's view of the cluster.

    Attributes:
      cluster: job name -> tuple of "host:port" addresses, in task-index order.
      task_type: this task's job name (``chief``, ``worker``, ``ps``, ``evaluator``).
      task_index: this task's index within its job.
      version: the cluster version (bumped by the job master whenever an
        address changes); 0 when the configuration did not come from a master.
    """

    cluster: Mapping[str, tuple[str, ...]]
    task_type: str
    task_index: int
    version: int = 0

    def __post_init__(self) -> None:
        _validate(self.cluster, self.task_type, self.task_index, source="ClusterConfig")
        # Freeze the mapping so the value really is immutable.
        object.__setattr__(
            self, "cluster", {k: tuple(v) for k, v in sorted(self.cluster.items())}
        )

    # ---- derived properties -------------------------------------------------

    @property
    def address(self) -> str:
        """This task's own "host:port"."""
        return self.cluster[self.task_type][self.task_index]

    @property
    def task(self) -> str:
        """This task as "type:index", the spelling used in logs and flags."""
        return f"{self.task_type}:{self.task_index}"

    @property
    def num_ps(self) -> int:
        return len(self.cluster.get("ps", ()))

    @property
    def ps_addresses(self) -> tuple[str, ...]:
        return tuple(self.cluster.get("ps", ()))

    @property
    def num_workers(self) -> int:
        """Training workers, the chief included."""
        return len(self.cluster.get("chief", ())) + len(self.cluster.get("worker", ()))

    @property
    def is_chief(self) -> bool:
        return self.task_type == "chief"

    @property
    def worker_position(self) -> int:
        """Position among the training workers: the chief is 0, worker i follows the chief."""
        if self.task_type == "chief":
            return 0
        if self.task_type != "worker":
            raise ConfigError(f"{self.task} is not a training worker; source: ClusterConfig.worker_position")
        return self.task_index + len(self.cluster.get("chief", ()))

    def replace_address(self, task_type: str, task_index: int, address: str) -> ClusterConfig:
        """Returns a copy in which one task moved to `address`, version bumped."""
        _validate_address(address, f"{task_type}:{task_index}", source="replace_address")
        jobs = {k: list(v) for k, v in self.cluster.items()}
        if task_type not in jobs or not 0 <= task_index < len(jobs[task_type]):
            raise ConfigError(
                f"task {task_type}:{task_index} is not in the cluster {dict(self.cluster)}; "
                "only an existing task can move to a new address"
            )
        jobs[task_type][task_index] = address
        return ClusterConfig(
            {k: tuple(v) for k, v in jobs.items()},
            self.task_type,
            self.task_index,
            self.version + 1,
        )

    def for_task(self, task_type: str, task_index: int) -> ClusterConfig:
        """The same cluster seen from another task."""
        return ClusterConfig(self.cluster, task_type, task_index, self.version)

    # ---- TF_CONFIG -------------------------------------------------------------

    @classmethod
    def from_tf_config(cls, tf_config: Mapping[str, Any], *, source: str = _SOURCE_ENV) -> ClusterConfig:
        """Parses a TF_CONFIG dictionary.

        Raises:
          ConfigError: naming the bad field, the rule and `source`.
        """
        if not isinstance(tf_config, Mapping):
            raise ConfigError(f"TF_CONFIG must be a JSON object, got {tf_config!r}; source: {source}")
        cluster = tf_config.get("cluster")
        task = tf_config.get("task")
        if not isinstance(cluster, Mapping) or not cluster:
            raise ConfigError(
                f"TF_CONFIG 'cluster' must be a non-empty object of job -> address list, "
                f"got {cluster!r}; source: {source}"
            )
        if not isinstance(task, Mapping):
            raise ConfigError(
                f"TF_CONFIG 'task' must be an object {{\"type\": ..., \"index\": ...}}, "
                f"got {task!r}; source: {source}"
            )
        task_type = task.get("type")
        task_index = task.get("index", 0)
        jobs: dict[str, tuple[str, ...]] = {}
        for job, addresses in cluster.items():
            if isinstance(addresses, str) or not isinstance(addresses, (list, tuple)):
                raise ConfigError(
                    f"TF_CONFIG cluster['{job}'] must be a list of \"host:port\" strings, "
                    f"got {addresses!r}; source: {source}"
                )
            jobs[str(job)] = tuple(addresses)
        _validate(jobs, task_type, task_index, source=source)
        assert isinstance(task_type, str)  # _validate checked it is a job of `jobs`
        version = tf_config.get("version", 0)
        if not isinstance(version, int) or version < 0:
            raise ConfigError(f"TF_CONFIG 'version' must be an integer >= 0, got {version!r}; source: {source}")
        return cls(jobs, task_type, task_index, version)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> ClusterConfig:
        """Parses TF_CONFIG from `environ` (default: os.environ)."""
        environ = os.environ if environ is None else environ
        text = environ.get("TF_CONFIG")
        if not text:
            raise ConfigError(
                "TF_CONFIG is not set; a distributed task needs it "
                "(e.g. {\"cluster\": {...}, \"task\": {\"type\": \"worker\", \"index\": 0}}); "
                f"source: {_SOURCE_ENV}"
            )
        try:
            parsed = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"TF_CONFIG is not valid JSON ({exc}): {text[:200]!r}; source: {_SOURCE_ENV}") from exc
        return cls.from_tf_config(parsed)

    def to_tf_config(self) -> dict[str, Any]:
        """The TF_CONFIG dictionary of this task (inverse of `from_tf_config`)."""
        out: dict[str, Any] = {
            "cluster": {job: list(addresses) for job, addresses in self.cluster.items()},
            "task": {"type": self.task_type, "index": self.task_index},
        }
        if self.version:
            out["version"] = self.version
        return out


def _validate(cluster: Mapping[str, tuple[str, ...]], task_type: Any, task_index: Any, *, source: str) -> None:
    for job, addresses in cluster.items():
        if job not in TASK_TYPES:
            raise ConfigError(
                f"TF_CONFIG has unknown job '{job}'; jobs must be among {list(TASK_TYPES)}; source: {source}"
            )
        if not addresses:
            raise ConfigError(f"TF_CONFIG cluster['{job}'] is empty; list at least one address; source: {source}")
        for i, address in enumerate(addresses):
            _validate_address(address, f"{job}:{i}", source=source)
    if len(cluster.get("chief", ())) > 1:
        raise ConfigError(
            f"TF_CONFIG lists {len(cluster['chief'])} chiefs; at most one is allowed; source: {source}"
        )
    seen: dict[str, str] = {}
    for job, addresses in cluster.items():
        for i, address in enumerate(addresses):
            if address in seen:
                raise ConfigError(
                    f"address {address} is used by both {seen[address]} and {job}:{i}; "
                    f"every task needs its own port; source: {source}"
                )
            seen[address] = f"{job}:{i}"
    if task_type not in cluster:
        raise ConfigError(
            f"TF_CONFIG task type {task_type!r} is not a job of the cluster {sorted(cluster)}; source: {source}"
        )
    if isinstance(task_index, bool) or not isinstance(task_index, int):
        raise ConfigError(f"TF_CONFIG task index must be an integer, got {task_index!r}; source: {source}")
    if not 0 <= task_index < len(cluster[task_type]):
        raise ConfigError(
            f"TF_CONFIG task index {task_index} is out of range for job '{task_type}' "
            f"with {len(cluster[task_type])} task(s); source: {source}"
        )


def _validate_address(address: Any, task: str, *, source: str) -> None:
    if not isinstance(address, str) or address.count(":") < 1:
        raise ConfigError(f"address of {task} must be \"host:port\", got {address!r}; source: {source}")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"address of {task} must be \"host:port\" with a port in 1..65535, got {address!r}; source: {source}"
        )


TF_ENVIRONMENT = {"TF_ENABLE_ONEDNN_OPTS": "0"}
"""What every task's TensorFlow starts with unless its environment says otherwise (read once, at import).

oneDNN's graph rewrite (``MklLayoutRewritePass``) runs on every graph a task registers and asks, for
each node, for the list of every kernel registered for its op: on a trainer's step graph and a
recovery's calls it was 88 % of the CPU of registering a graph (a new session's first step, each
of a recovery's first calls), and the steps it rewrites were no faster (docs/benchmarks.md,
"oneDNN's graph rewrite"). With it off, a trainer's first step after a PS failure came 0.3-0.5 s
sooner. A user who wants oneDNN sets ``TF_ENABLE_ONEDNN_OPTS=1`` in the task's environment."""


def with_tf_environment(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with `TF_ENVIRONMENT`'s variables added where `env` does not set them.

    In a process that runs TensorFlow itself (a benchmark, the tests), ``os.environ.update(with_tf_environment(
    os.environ))`` before TensorFlow is imported; this module does not import it."""
    return {**TF_ENVIRONMENT, **env}


@contextlib.contextmanager
def tf_config_env(cfg: ClusterConfig | None) -> Iterator[None]:
    """Sets TF_CONFIG to `cfg` (or removes it for None) for the block, then restores it.

    This is the one place tf_ecrec writes TF_CONFIG: around the construction
    of a RunConfig, which reads the variable once.
    """
    old = os.environ.get("TF_CONFIG")
    try:
        if cfg is None:
            os.environ.pop("TF_CONFIG", None)
        else:
            os.environ["TF_CONFIG"] = json.dumps(cfg.to_tf_config())
        yield
    finally:
        if old is None:
            os.environ.pop("TF_CONFIG", None)
        else:
            os.environ["TF_CONFIG"] = old
