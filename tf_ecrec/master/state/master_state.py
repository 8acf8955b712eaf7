"""The master's state: one lock over tasks, datasets and barriers, persisted.

:class:`MasterState` composes the task slots (:mod:`~tf_ecrec.master.state.tasks`), the datasets
(:mod:`~tf_ecrec.master.state.datasets`) and the barriers (:mod:`~tf_ecrec.master.state.barriers`).
Every public method takes one lock, checks the request, mutates, and, when something changed, writes a
snapshot (:mod:`~tf_ecrec.master.state.snapshot`) before returning, so a reply is only sent for a
state that is on disk.  A master killed at any point restarts from the last snapshot: in-flight leases
stay with their tasks, acknowledged progress stays.

Every call of a task that changes state names the task's generation and is refused from a superseded
one (a process its restart replaced); the dataset definitions and a stream's watermark name no task.

A task declared LOST (silent or absent past its deadline, see ``tasks``; its membership ended;
reported failed) releases its leases as failed (their unacknowledged records are re-queued) and bumps
``version`` (and ``ps_version`` for a PS).  Its later requests fail with
:class:`~tf_ecrec.errors.MembershipLost`; it must register again and gets a new generation.

The lock is held while a snapshot is written (a few KB, no network), never across an RPC.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tf_ecrec.errors import BarrierTimeout, InvalidRequestError, MasterError, MasterUnavailable, NotFoundError
from tf_ecrec.master.sharding import DatasetSpec, DataStats, Lease, ShardStatus
from tf_ecrec.master.state.barriers import DEFAULT_BARRIER_TYPES, BarrierTable, check_request
from tf_ecrec.master.state.datasets import DatasetTable
from tf_ecrec.master.state.snapshot import SnapshotStore
from tf_ecrec.master.state.tasks import (
    ClusterView,
    Liveness,
    TaskRecord,
    TaskStatus,
    TaskTable,
    check_address,
    check_registration,
    parse_task_id,
)

_LOG = logging.getLogger(__name__)

_STATE_FORMAT = 1


class MasterState:
    """Tasks, versions, datasets and barriers of one job.  Thread-safe.

    Args:
      store: Where snapshots go; ``None`` keeps the state in memory only.
        A snapshot in it is loaded on construction.
      heartbeat_timeout: Seconds of silence (heartbeat liveness) or of
        absence (external liveness) after which a task is declared LOST.
      liveness: ``"heartbeat"`` or ``"external"``; see the module docstring.
      clock: Monotonic seconds; injected by tests.

    Call :meth:`close` after the server stopped.
    """

    def __init__(self, store: SnapshotStore | None = None, *,
                 heartbeat_timeout: float = 10.0, liveness: Liveness | str = Liveness.HEARTBEAT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if liveness not in tuple(Liveness) or heartbeat_timeout <= 0:
            raise ValueError(f"liveness={liveness!r}, heartbeat_timeout={heartbeat_timeout}; rule: 'heartbeat' or "
                             "'external', and a timeout > 0")
        self._clock = clock
        self._store = store
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._closing = False
        self._tasks = TaskTable(heartbeat_timeout, Liveness(liveness), clock)
        self._datasets = DatasetTable()
        self._barriers = BarrierTable()
        data = store.load() if store else None
        if data is not None:
            self._load(data)
            _LOG.info("Restored master state from %s: version %d, %d tasks, %d datasets", store.path if store else "",
                      self._tasks.version, len(self._tasks.records), len(self._datasets))

    @property
    def heartbeat_timeout(self) -> float:
        return self._tasks.heartbeat_timeout

    @property
    def liveness(self) -> Liveness:
        return self._tasks.liveness

    # --- persistence -----------------------------------------------------------

    def _persist(self) -> None:
        if self._store is not None:
            self._store.save(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The snapshot: JSON-serializable, in the format :class:`SnapshotStore` keeps."""
        with self._lock:
            return {"format": _STATE_FORMAT, "version": self._tasks.version, "ps_version": self._tasks.ps_version,
                    "tasks": [t.to_dict() for t in self._tasks.records.values()],
                    "datasets": self._datasets.to_list(), "barriers": self._barriers.to_list()}

    def _load(self, data: Any) -> None:
        if not isinstance(data, dict) or data.get("format") != _STATE_FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise MasterError(f"master state format {found!r}; rule: {_STATE_FORMAT}")
        try:
            version, ps_version = int(data["version"]), int(data["ps_version"])
            tasks = [TaskRecord.from_dict(raw) for raw in data["tasks"]]
            queues = DatasetTable.parse(data["datasets"])
            parsed_barriers = BarrierTable.parse(data["barriers"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MasterError(
                f"master state is malformed ({type(exc).__name__}: {exc}); rule: a snapshot this "
                "master wrote; move it away to start fresh") from exc
        self._tasks.load(version, ps_version, tasks)
        self._datasets.load(queues)
        self._barriers.load(parsed_barriers)

    def interrupt_waiters(self) -> None:
        """Ends every barrier wait with ``MasterUnavailable``; for shutdown."""
        with self._lock:
            self._closing = True
            self._changed.notify_all()

    def close(self) -> None:
        """Interrupts waiters and releases the store; call after the server stopped."""
        self.interrupt_waiters()
        if self._store is not None:
            self._store.close()

    # --- tasks -----------------------------------------------------------------

    def _bump(self, task_type: str) -> None:
        self._tasks.bump(task_type)
        self._changed.notify_all()

    def register(self, task_type: str, task_index: int, address: str,
                 instance_id: str) -> tuple[TaskRecord, ClusterView]:
        """Registers a task; returns its record and the cluster.

        A repeat by the same ``instance_id`` of an ALIVE task returns the same generation; a process
        another one superseded is refused (StaleGenerationError).  Otherwise a new generation starts:
        the previous one's leases are released as failed and the cluster version is bumped.
        """
        check_registration(task_type, task_index, address)
        task_id = f"{task_type}:{task_index}"
        with self._lock:
            repeat = self._tasks.retried(task_id, address, instance_id)
            if repeat is not None:
                return dataclasses.replace(repeat), self._tasks.view()
            self._tasks.check_not_superseded(task_id, instance_id)
            previous = self._tasks.records.get(task_id)
            if previous is not None and previous.status is TaskStatus.ALIVE:
                # The old process died without being noticed: its leases failed.
                self._datasets.release_owner(previous, failed=True)
            record = self._tasks.new_generation(task_type, task_index, address, instance_id)
            self._changed.notify_all()
            self._persist()
            _LOG.info("Registered %s generation %d at %s; cluster version %d",
                      task_id, record.generation, address, self._tasks.version)
            return dataclasses.replace(record), self._tasks.view()

    def heartbeat(self, task_id: str, generation: int) -> tuple[int, int]:
        """Notes that the task is alive; returns ``(version, ps_version)``."""
        with self._lock:
            self._tasks.checked(task_id, generation)
            self._tasks.heartbeat(task_id)
            return self._tasks.version, self._tasks.ps_version

    def deregister(self, task_id: str, generation: int) -> None:
        """The task leaves: its leases are released (not as failures)."""
        with self._lock:
            record = self._tasks.checked(task_id, generation)
            self._set_gone(record, TaskStatus.LEFT, "deregistered", failed=False)
            self._persist()

    def update_address(self, task_id: str, generation: int, address: str) -> ClusterView:
        """Moves a task to a new address; bumps the version if it changed."""
        check_address(address)
        with self._lock:
            record = self._tasks.checked(task_id, generation)
            if record.address != address:
                _LOG.info("Task %s moved from %s to %s", task_id, record.address, address)
                record.address = address
                self._bump(record.task_type)
                self._persist()
            return self._tasks.view()

    def cluster(self) -> ClusterView:
        """A consistent copy of the cluster."""
        with self._lock:
            return self._tasks.view()

    def versions(self) -> tuple[int, int]:  # ``(version, ps_version)``
        with self._lock:
            return self._tasks.version, self._tasks.ps_version

    def declare_lost(self, task_id: str, reason: str, generation: int = 0) -> int:
        """Declares a task LOST; returns the records given back.  ``generation`` 0 means the current
        one; a task not ALIVE (or an older generation) is left as it is."""
        with self._lock:
            record = self._tasks.records.get(task_id)
            if record is None:
                parse_task_id(task_id)
                raise NotFoundError(f"task {task_id!r} is not registered")
            if record.status is not TaskStatus.ALIVE or generation not in (0, record.generation):
                return 0
            requeued = self._set_gone(record, TaskStatus.LOST, reason, failed=True)
            self._persist()
            _LOG.warning("Task %s generation %d declared lost (%s); %d records re-queued; "
                         "cluster version %d", task_id, record.generation, reason, requeued,
                         self._tasks.version)
            return requeued

    def _set_gone(self, record: TaskRecord, status: TaskStatus, reason: str, *,
                  failed: bool) -> int:
        record.status, record.reason = status, reason
        requeued = self._datasets.release_owner(record, failed=failed)
        self._barriers.discard(record.task_id)
        self._bump(record.task_type)  # Also wakes the waiters of a barrier now done.
        return requeued

    def expire_silent(self) -> list[str]:
        """Declares LOST every task past its liveness deadline; returns their ids."""
        with self._lock:
            expired = self._tasks.overdue()
            for task_id in expired:
                self.declare_lost(task_id, self._tasks.overdue_reason())
            return expired

    def observe_members(self, present: Iterable[str], *, suspended: bool = False) -> None:
        """External liveness: the members now present.

        A task ALIVE here but absent from the members for longer than
        ``heartbeat_timeout`` is declared LOST by :meth:`expire_silent` (it
        never joined, or vanished while the master was down).  Ended
        memberships are reported through :meth:`declare_lost` with their
        generation.  While ``suspended`` the view is not trusted and
        nothing expires.
        """
        present_set = set(present)
        with self._lock:
            self._tasks.observe(present_set, suspended=suspended)

    def report_failure(self, task_id: str, generation: int, reason: str,
                       dataset: str = "", shard_ids: Sequence[int] = (), *,
                       failed: bool = True) -> int:
        """Fails some shards of a task, or (no shard ids) the whole task.

        With ``failed=False`` the shards go back without a failure counted (a session re-creation
        rebuilt the holder's input pipeline: not a shard failure).

        Returns:
          The records given back to the queue.

        Raises:
          InvalidRequestError: no generation (0, the protobuf default, would hit whatever
            incarnation is live now, e.g. the one that replaced the failed one).
          StaleGenerationError, MembershipLost: shards given back by a superseded generation.
        """
        if generation < 1:
            what = ("a give-back names the generation holding the shards" if shard_ids else "a task failure names the generation that failed")
            raise InvalidRequestError(f"ReportFailure for task {task_id!r} has generation {generation}; rule: "
                                      f"{what} (>= 1, as its registration returned)")
        if not shard_ids:
            return self.declare_lost(task_id, reason or "reported failed", generation)
        with self._lock:
            self._tasks.checked(task_id, generation)
            requeued = self._datasets.release_shards(task_id, dataset, shard_ids, failed=failed)
            if requeued:
                self._persist()
            return requeued

    # --- datasets --------------------------------------------------------------

    def register_dataset(self, spec: DatasetSpec) -> tuple[bool, DataStats]:
        """Adds a dataset; a repeat with the same spec is a no-op.

        Raises:
          MasterError: a dataset of that name exists with another spec.
        """
        with self._lock:
            created, stats = self._datasets.register(spec)
            if created:
                self._persist()
            return created, stats

    def get_shard(self, task_id: str, generation: int, dataset: str,
                  request_id: int) -> tuple[ShardStatus, Lease | None]:
        """Leases a shard to a task.

        Returns:
          ``(SHARD, lease)``; or, when nothing is free, ``(END, None)`` if the dataset is finished,
          ``(DRAIN, None)`` if the task holds leases itself (it must finish them; waiting could deadlock
          its pipeline), else ``(WAIT, None)``.  Repeating the last ``request_id`` returns the same
          lease while the task still holds it.
        """
        with self._lock:
            record = self._tasks.checked(task_id, generation)
            status, lease, changed = self._datasets.lease(record, dataset, request_id)
            if changed:
                self._persist()
            return status, lease

    def report_progress(self, task_id: str, generation: int, dataset: str, shard_id: int,
                        attempt: int, records: int) -> bool:
        """Acknowledges ``records`` (cumulative) of a lease; True when the shard is done."""
        with self._lock:
            self._tasks.checked(task_id, generation)
            queue = self._datasets.queue(dataset)
            before = (queue.records_trained, len(queue.leases_of(task_id)))
            done = queue.acknowledge(shard_id, attempt, task_id, records)
            if (queue.records_trained, len(queue.leases_of(task_id))) != before:
                self._persist()
            if done:
                self._changed.notify_all()
            return done

    def dataset_spec(self, dataset: str) -> DatasetSpec:
        with self._lock:
            return self._datasets.queue(dataset).spec

    def data_stats(self, dataset: str) -> DataStats:
        with self._lock:
            return self._datasets.queue(dataset).stats()

    def shard_checkpoint(self, dataset: str) -> bytes:
        """The dataset's progress as a JSON blob to save beside a model checkpoint."""
        with self._lock:
            return self._datasets.checkpoint(dataset)

    def restore_shard_checkpoint(self, task_id: str, generation: int, dataset: str, blob: bytes) -> DataStats:
        """Rolls a dataset back to a blob from :meth:`shard_checkpoint`, for the live generation of ``task_id``."""
        with self._lock:
            if not task_id:  # a superseded chief must roll nothing back
                raise InvalidRequestError(f"rollback of {dataset!r} by no task; rule: a rollback names its caller")
            self._tasks.checked(task_id, generation)
            rolled_back, stats = self._datasets.restore(dataset, blob, self._tasks.records.values())
            self._persist()
        _LOG.info("Restored shard checkpoint of %r: %d acknowledged records rolled back", dataset, rolled_back)
        return stats

    def extend_dataset(self, dataset: str, available: int, closed: bool) -> DataStats:
        """A stream's records arrived (offsets ``[0, available)``), or it ended (`ShardQueue.extend`)."""
        with self._lock:
            queue = self._datasets.queue(dataset)
            before = (queue.available, queue.closed)
            queue.extend(available, closed)
            if (available, closed) != before:
                self._persist()
            return queue.stats()

    # --- barriers --------------------------------------------------------------

    def barrier(self, task_id: str, generation: int, name: str, scope: int,
                participants: Sequence[str], task_types: Sequence[str],
                timeout: float) -> list[str]:
        """Arrives at barrier ``(name, scope)`` and waits for the others.

        The expected participants are fixed when the first task arrives:
        ``participants`` if given, else every ALIVE task of ``task_types``
        (default chief and worker).  A participant declared LOST is no longer
        waited for.  Arriving again is harmless; a finished barrier passes at
        once.

        Returns:
          The ids of the tasks that arrived.

        Raises:
          BarrierTimeout: not everyone arrived within ``timeout`` seconds.
          MasterError: the master is shutting down.
        """
        check_request(name, timeout, participants)
        types = tuple(task_types) or DEFAULT_BARRIER_TYPES
        deadline = self._clock() + timeout
        with self._lock:
            self._tasks.checked(task_id, generation)
            barrier, changed = self._barriers.arrive(
                BarrierTable.key(name, scope), task_id,
                lambda: set(participants) or self._tasks.alive_ids(types))
            if changed:
                if barrier.done:
                    self._changed.notify_all()
                self._persist()
            while not barrier.done and not self._closing:
                left = deadline - self._clock()
                if left <= 0:
                    missing = sorted(barrier.expected - barrier.arrived)
                    raise BarrierTimeout(
                        f"barrier {name!r} scope {scope}: {len(barrier.arrived)} arrived, "
                        f"still waiting for {missing} after {timeout:g}s")
                self._changed.wait(left)
            if not barrier.done:
                raise MasterUnavailable(f"barrier {name!r}: the master is shutting down; "
                                        "retry against its successor")
            return sorted(barrier.arrived)
