"""Task slots of one job: registrations, generations, cluster versions, liveness.

A slot is ``type:index``; every registration of it that is not a retry
starts a new generation.  :class:`TaskTable` keeps the slots, the cluster
versions and when each task was last heard from (or absent since).  It has
no lock and does no I/O: :class:`~tf_ecrec.master.state.master_state.MasterState`
serializes access, releases leases and persists.

Liveness has two sources (:class:`Liveness`):

* ``HEARTBEAT`` (embedded membership): an ALIVE task silent for longer than
  ``heartbeat_timeout`` is overdue.
* ``EXTERNAL`` (ZooKeeper): the members present are fed to :meth:`TaskTable.observe`;
  a task absent for ``heartbeat_timeout`` (never joined, or gone while the
  master was down) is overdue.  While the view is suspended nothing is.

Heartbeat times are not persisted: after a restart every ALIVE task gets a
fresh ``heartbeat_timeout`` to be heard from.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable
from typing import Any

from tf_ecrec.cluster.tf_config import TASK_TYPES
from tf_ecrec.errors import InvalidRequestError, MembershipLost, NotFoundError, StaleGenerationError

_SUPERSEDED_KEPT = 8


class TaskStatus(str, enum.Enum):
    """Where a task's current generation stands; the values go on disk."""

    ALIVE = "alive"
    LOST = "lost"        # Silent past its deadline, its session ended, or reported failed.
    LEFT = "left"        # Deregistered.
    UNKNOWN = "unknown"  # Only in a client's view: a status newer than the client.


class Liveness(str, enum.Enum):
    """Who tells the master that a task is alive; see the module docstring."""

    HEARTBEAT = "heartbeat"
    EXTERNAL = "external"


def parse_task_id(task_id: str) -> tuple[str, int]:
    """Splits ``"worker:1"`` into ``("worker", 1)``.

    Raises:
      InvalidRequestError: the id is not ``<type>:<index>`` with a known type.
    """
    task_type, sep, index = task_id.partition(":")
    if not sep or task_type not in TASK_TYPES or not index.isdigit():
        raise InvalidRequestError(
            f"task id {task_id!r} is malformed; rule: '<type>:<index>' with type in "
            f"{TASK_TYPES} and a non-negative index")
    return task_type, int(index)


def check_address(address: str) -> None:
    """Raises InvalidRequestError unless ``address`` is ``host:port``."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidRequestError(
            f"task address {address!r} is malformed; rule: 'host:port' with 0 < port < 65536")


def check_registration(task_type: str, task_index: int, address: str) -> None:
    """Raises InvalidRequestError unless a registration names a known slot and ``host:port``."""
    if task_type not in TASK_TYPES:
        raise InvalidRequestError(f"task type {task_type!r}; rule: one of {TASK_TYPES}")
    if task_index < 0:
        raise InvalidRequestError(f"task index {task_index}; rule: >= 0")
    check_address(address)


@dataclasses.dataclass
class TaskRecord:
    """One task slot and its current generation."""

    task_type: str
    task_index: int
    address: str
    generation: int
    status: TaskStatus
    instance_id: str = ""
    reason: str = ""
    # request ids of the last GetShard per dataset, for idempotent retries:
    # dataset -> [request_id, shard_id, attempt]
    last_get_shard: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    # instance ids of the earlier processes of this slot another one replaced (the last few): they may
    # not register again (a superseded process would take the slot back from its successor)
    superseded: list[str] = dataclasses.field(default_factory=list)

    @property
    def task_id(self) -> str:
        return f"{self.task_type}:{self.task_index}"

    def to_dict(self) -> dict[str, Any]:
        """The record as persisted (field order and values as on disk)."""
        data = dataclasses.asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskRecord:
        """Inverse of :meth:`to_dict`; TypeError or ValueError if malformed."""
        record = cls(**data)
        record.status = TaskStatus(record.status)
        return record


@dataclasses.dataclass(frozen=True)
class ClusterView:
    """A consistent copy of the cluster for a reply."""

    version: int
    ps_version: int
    tasks: tuple[TaskRecord, ...]


class TaskTable:
    """The task slots, cluster versions and liveness clocks.  Not thread-safe.

    Args:
      heartbeat_timeout: Seconds of silence (heartbeat liveness) or of
        absence (external liveness) after which a task is overdue.
      liveness: Where liveness comes from.
      clock: Monotonic seconds.
    """

    def __init__(self, heartbeat_timeout: float, liveness: Liveness,
                 clock: Callable[[], float]) -> None:
        self.heartbeat_timeout = heartbeat_timeout
        self.liveness = liveness
        self._clock = clock
        self.version = 0
        self.ps_version = 0
        self.records: dict[str, TaskRecord] = {}
        self._seen: dict[str, float] = {}   # task id -> last heard / absent since
        self._present: set[str] = set()     # external liveness: members present
        self._suspended = False

    def load(self, version: int, ps_version: int, records: Iterable[TaskRecord]) -> None:
        """Restores a snapshot; every task counts as heard from now."""
        self.version, self.ps_version = version, ps_version
        now = self._clock()
        for record in records:
            self.records[record.task_id] = record
            self._seen[record.task_id] = now

    def checked(self, task_id: str, generation: int) -> TaskRecord:
        """The ALIVE record of ``task_id`` if ``generation`` is its current one.

        Raises:
          InvalidRequestError: a malformed id, or a generation never issued.
          NotFoundError: the task never registered.
          StaleGenerationError: an older generation.
          MembershipLost: the generation is LOST or LEFT.
        """
        parse_task_id(task_id)
        record = self.records.get(task_id)
        if record is None:
            raise NotFoundError(f"task {task_id!r} is not registered; rule: Register first")
        if generation < record.generation:
            raise StaleGenerationError(
                f"task {task_id} generation {generation} is stale; the current generation "
                f"is {record.generation}")
        if generation > record.generation:
            raise InvalidRequestError(
                f"task {task_id} generation {generation} was never issued (current "
                f"{record.generation})")
        if record.status is not TaskStatus.ALIVE:
            raise MembershipLost(
                f"task {task_id} generation {generation} is {record.status.value} "
                f"({record.reason}); register again")
        return record

    def bump(self, task_type: str) -> None:
        """Counts a membership change (of a PS: also in ``ps_version``)."""
        self.version += 1
        if task_type == "ps":
            self.ps_version += 1

    def retried(self, task_id: str, address: str, instance_id: str) -> TaskRecord | None:
        """The ALIVE record a repeated registration by ``instance_id`` refers to, if any.

        A repeat counts as hearing from the task.
        """
        record = self.records.get(task_id)
        if (record is not None and record.status is TaskStatus.ALIVE and instance_id
                and record.instance_id == instance_id and record.address == address):
            self.heard(task_id)
            return record
        return None

    def check_not_superseded(self, task_id: str, instance_id: str) -> None:
        """Refuses a registration by a process that a later one of the slot replaced.

        Raises:
          StaleGenerationError: ``instance_id`` registered before the current process did.
        """
        record = self.records.get(task_id)
        if record is not None and instance_id and instance_id in record.superseded:
            raise StaleGenerationError(
                f"{task_id}: this process (instance {instance_id[:8]}) was superseded by generation "
                f"{record.generation} (another process of the task); rule: a replaced process stops, it "
                "does not register again")

    def new_generation(self, task_type: str, task_index: int, address: str,
                       instance_id: str) -> TaskRecord:
        """Starts the next generation of a slot, ALIVE; bumps the versions.

        The caller releases the previous generation's leases first.
        """
        task_id = f"{task_type}:{task_index}"
        previous = self.records.get(task_id)
        generation = previous.generation + 1 if previous else 1
        superseded = list(previous.superseded) if previous else []
        if previous is not None and previous.instance_id and previous.instance_id != instance_id:
            superseded = [*superseded, previous.instance_id][-_SUPERSEDED_KEPT:]
        record = TaskRecord(task_type, task_index, address, generation, TaskStatus.ALIVE,
                            instance_id, superseded=superseded)
        self.records[task_id] = record
        self.heard(task_id)
        self.bump(task_type)
        return record

    def heard(self, task_id: str) -> None:
        """Notes that the task was heard from now."""
        self._seen[task_id] = self._clock()

    def heartbeat(self, task_id: str) -> None:
        """A heartbeat: counts only under heartbeat liveness."""
        if self.liveness is Liveness.HEARTBEAT:
            self.heard(task_id)

    def overdue(self) -> list[str]:
        """The ALIVE tasks past their liveness deadline (none while suspended)."""
        if self._suspended:
            return []
        now = self._clock()
        overdue = []
        for task_id, record in self.records.items():
            if record.status is not TaskStatus.ALIVE:
                continue
            since = self._seen.get(task_id, now)
            if self.liveness is Liveness.EXTERNAL and task_id in self._present:
                continue
            if now - since > self.heartbeat_timeout:
                overdue.append(task_id)
        return overdue

    def overdue_reason(self) -> str:
        """Why an overdue task is declared lost."""
        what = ("silent" if self.liveness is Liveness.HEARTBEAT
                else "absent from the membership service")
        return f"{what} for more than {self.heartbeat_timeout:g}s"

    def observe(self, present: set[str], *, suspended: bool) -> None:
        """External liveness: the members now present; see ``MasterState.observe_members``."""
        self._suspended = suspended
        if suspended:
            return
        now = self._clock()
        for task_id in self._present - present:
            self._seen[task_id] = now  # Absent from now on.
        self._present = present

    def alive_ids(self, task_types: Iterable[str]) -> set[str]:
        """The ids of the ALIVE tasks of ``task_types``."""
        types = set(task_types)
        return {t.task_id for t in self.records.values()
                if t.status is TaskStatus.ALIVE and t.task_type in types}

    def view(self) -> ClusterView:
        """A copy of the cluster, tasks sorted by type and index."""
        tasks = sorted(self.records.values(), key=lambda t: (t.task_type, t.task_index))
        return ClusterView(self.version, self.ps_version,
                           tuple(dataclasses.replace(t) for t in tasks))
