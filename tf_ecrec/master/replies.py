"""What the master's calls return, as typed values: the cluster, shard leases, data counters.

:class:`~tf_ecrec.master.client.MasterClient` builds these from the protobuf
replies; tasks, hooks and the launcher use them without touching protobufs.
"""

from __future__ import annotations

import dataclasses

from tf_ecrec.errors import ConfigError
from tf_ecrec.master.proto import master_pb2 as pb
from tf_ecrec.master.sharding import DataStats, ShardStatus
from tf_ecrec.master.state.tasks import TaskStatus
from tf_ecrec.master.wire import task_status_of_pb


@dataclasses.dataclass(frozen=True)
class TaskInfo:
    """One task slot as the master last saw it."""

    task_type: str
    task_index: int
    address: str
    generation: int
    status: TaskStatus

    @property
    def task_id(self) -> str:
        return f"{self.task_type}:{self.task_index}"


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The master's view of the cluster.

    ``version`` changes on every membership change, ``ps_version`` only when
    the parameter servers change.
    """

    version: int
    ps_version: int
    tasks: tuple[TaskInfo, ...]

    def alive(self) -> dict[str, TaskInfo]:
        """The ALIVE tasks by task id."""
        return {t.task_id: t for t in self.tasks if t.status == TaskStatus.ALIVE}

    def tf_cluster(self) -> dict[str, list[str]]:
        """Returns the TF_CONFIG ``cluster`` dict (evaluators excluded).

        Every slot ever registered is listed at its last address, alive or
        not, so indices stay dense.

        Raises:
          ConfigError: a type's indices have a hole (e.g. worker:2 without
            worker:1), which TF_CONFIG cannot express.
        """
        by_type: dict[str, dict[int, str]] = {}
        for task in self.tasks:
            if task.task_type != "evaluator":
                by_type.setdefault(task.task_type, {})[task.task_index] = task.address
        cluster = {}
        for task_type, slots in sorted(by_type.items()):
            if sorted(slots) != list(range(len(slots))):
                raise ConfigError(
                    f"cluster version {self.version}: {task_type} indices {sorted(slots)} "
                    "are not 0..n-1; rule: TF_CONFIG lists every index of a type")
            cluster[task_type] = [slots[i] for i in range(len(slots))]
        return cluster

    @classmethod
    def from_pb(cls, message: pb.Cluster) -> Cluster:
        return cls(message.version, message.ps_version, tuple(
            TaskInfo(t.task_type, t.task_index, t.address, t.generation,
                     task_status_of_pb(t.status)) for t in message.tasks))


@dataclasses.dataclass(frozen=True)
class ShardLease:
    """Records ``[start, end)`` of epoch ``epoch`` leased to this task."""

    dataset: str
    shard_id: int
    attempt: int
    epoch: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclasses.dataclass(frozen=True)
class ShardReply:
    """The answer to a shard request: a lease (SHARD), or WAIT, END or DRAIN."""

    status: ShardStatus
    lease: ShardLease | None = None
    retry_after: float = 0.0


def data_stats_from_pb(message: pb.DataState) -> DataStats:
    """The counters of a dataset from their protobuf."""
    return DataStats(
        dataset=message.dataset, records_total=message.records_total,
        records_trained=message.records_trained, records_retrained=message.records_retrained,
        records_requeued=message.records_requeued, records_failed=message.records_failed,
        records_in_flight=message.records_in_flight, shards_failed=message.shards_failed,
        failed_shard_ids=tuple(message.failed_shard_ids), finished=message.finished,
        lease_holders=tuple(message.lease_holders))
