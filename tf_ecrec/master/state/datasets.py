"""The job's datasets: one :class:`~tf_ecrec.master.shard_queue.ShardQueue` each.

:class:`DatasetTable` finds a dataset by name, leases its shards with
idempotent retries (a task's last request id per dataset is kept on its
:class:`~tf_ecrec.master.state.tasks.TaskRecord`), and releases a task's
leases everywhere.  It has no lock and does no I/O:
:class:`~tf_ecrec.master.state.master_state.MasterState` holds the lock and
persists after every change.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from typing import Any

from tf_ecrec.errors import InvalidRequestError, MasterError, NotFoundError
from tf_ecrec.master.shard_queue import ShardQueue
from tf_ecrec.master.sharding import DatasetSpec, DataStats, Lease, ShardStatus
from tf_ecrec.master.state.tasks import TaskRecord


class DatasetTable:
    """The job's shard queues by dataset name.  Not thread-safe."""

    def __init__(self) -> None:
        self._queues: dict[str, ShardQueue] = {}

    def __len__(self) -> int:
        return len(self._queues)

    def queue(self, dataset: str) -> ShardQueue:
        """The queue of ``dataset``.

        Raises:
          NotFoundError: no dataset of that name was registered.
        """
        queue = self._queues.get(dataset)
        if queue is None:
            raise NotFoundError(f"dataset {dataset!r} is not registered; rule: "
                                "RegisterDataset first")
        return queue

    def register(self, spec: DatasetSpec) -> tuple[bool, DataStats]:
        """Adds a dataset; returns ``(created, stats)``.  A repeat of the same spec is a no-op.

        Raises:
          MasterError: a dataset of that name exists with another spec.
        """
        queue = self._queues.get(spec.name)
        if queue is not None:
            if queue.spec != spec:
                raise MasterError(
                    f"dataset {spec.name!r} is registered as {queue.spec}; got {spec}; "
                    "rule: one definition per dataset name")
            return False, queue.stats()
        queue = self._queues[spec.name] = ShardQueue(spec)
        return True, queue.stats()

    def lease(self, record: TaskRecord, dataset: str,
              request_id: int) -> tuple[ShardStatus, Lease | None, bool]:
        """Leases a shard of ``dataset`` to the task of ``record``.

        Returns:
          ``(status, a copy of the lease or None, changed)``; see
          ``MasterState.get_shard``.  ``changed`` says whether state changed
          (a new lease), which must then be persisted.
        """
        queue = self.queue(dataset)
        task_id = record.task_id
        last = record.last_get_shard.get(dataset)
        if last is not None and request_id and last[0] == request_id:
            lease = queue.held(last[1], last[2], task_id)
            if lease is not None:
                return ShardStatus.SHARD, dataclasses.replace(lease), False
        lease = queue.lease(task_id, record.generation)
        if lease is None:
            if queue.finished:
                return ShardStatus.END, None, False
            held = queue.leases_of(task_id)
            return (ShardStatus.DRAIN if held else ShardStatus.WAIT), None, False
        record.last_get_shard[dataset] = [request_id, lease.shard_id, lease.attempt]
        return ShardStatus.SHARD, dataclasses.replace(lease), True

    def release_owner(self, record: TaskRecord, *, failed: bool) -> int:
        """Releases every lease of the task, in every dataset; returns the records given back."""
        record.last_get_shard.clear()
        return sum(q.release_owner(record.task_id, failed=failed)
                   for q in self._queues.values())

    def release_shards(self, task_id: str, dataset: str, shard_ids: Sequence[int], *,
                       failed: bool) -> int:
        """Gives back those of ``shard_ids`` the task holds; returns the records given back."""
        queue = self.queue(dataset)
        owned = {lease.shard_id for lease in queue.leases_of(task_id)}
        return sum(queue.release(s, failed=failed) for s in shard_ids if s in owned)

    def checkpoint(self, dataset: str) -> bytes:
        """The dataset's progress as a JSON blob (see ``ShardQueue.checkpoint``)."""
        return json.dumps(self.queue(dataset).checkpoint()).encode("utf-8")

    def restore(self, dataset: str, blob: bytes,
                records: Iterable[TaskRecord]) -> tuple[int, DataStats]:
        """Rolls ``dataset`` back to a :meth:`checkpoint` blob; forgets retry ids.

        Returns:
          The acknowledged records rolled back, and the stats after.

        Raises:
          InvalidRequestError: the blob is not a checkpoint of this dataset.
        """
        try:
            data = json.loads(blob.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise InvalidRequestError(
                f"shard checkpoint of dataset {dataset!r} is not valid JSON ({exc})") from exc
        queue = self.queue(dataset)
        rolled_back = queue.restore(data)
        for record in records:
            record.last_get_shard.pop(dataset, None)
        return rolled_back, queue.stats()

    def to_list(self) -> list[dict[str, Any]]:
        """The queues as persisted."""
        return [q.to_dict() for q in self._queues.values()]

    @staticmethod
    def parse(data: Any) -> list[ShardQueue]:
        """Parses :meth:`to_list` output; KeyError, TypeError or ValueError if malformed."""
        return [ShardQueue.from_dict(raw) for raw in data]

    def load(self, queues: Iterable[ShardQueue]) -> None:
        """Adds queues parsed by :meth:`parse`."""
        for queue in queues:
            self._queues[queue.spec.name] = queue
