"""The master's state as plain Python, persisted on every mutation.

:class:`MasterState` owns tasks (one slot per ``type:index``, a generation per
registration), the cluster versions, the datasets' :class:`ShardQueue` and
the barriers.  Every public method takes one lock, checks the request,
mutates, and, when something changed, writes a snapshot through
:class:`SnapshotStore` before returning, so a reply is only sent for a state
that is on disk.  A master killed at any point restarts from the last
snapshot: in-flight leases stay with their tasks, acknowledged progress stays.

Liveness has two sources:

* ``"heartbeat"`` (embedded membership): an ALIVE task silent for longer
  than ``heartbeat_timeout`` is declared LOST by :meth:`expire_silent`.
* ``"external"`` (ZooKeeper): the server calls :meth:`declare_lost` with
  the generation of every membership that ended (its znode's session is
  gone), and feeds the members present to :meth:`observe_members`; a task
  absent for ``heartbeat_timeout`` (never joined, or gone while the master
  was down) is declared LOST by :meth:`expire_silent`.

Heartbeat times are not persisted: after a restart every ALIVE task gets a
fresh ``heartbeat_timeout`` to be heard from.

A task declared LOST releases its leases as failed (their unacknowledged
records are re-queued) and bumps ``version`` (and ``ps_version`` for a PS).
Its later requests fail with :class:`~tf_ecrec.errors.MembershipLost`; it must
register again and gets a new generation.

The lock is held while a snapshot is written (a few KB, no network) and is
never held across an RPC; barrier waits release it.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from tf_ecrec.errors import (BarrierTimeout, InvalidRequestError, MasterError, MasterUnavailable,
                             MembershipLost, NotFoundError, StaleGenerationError)
from tf_ecrec.master.sharding import DataStats, DatasetSpec, Lease, ShardQueue

_LOG = logging.getLogger(__name__)

TASK_TYPES = ("chief", "ps", "worker", "evaluator")
ALIVE, LOST, LEFT = "alive", "lost", "left"
_DEFAULT_BARRIER_TYPES = ("chief", "worker")
_MAX_BARRIER_TIMEOUT_S = 3600.0
_DONE_BARRIERS_KEPT = 64
_STATE_FORMAT = 1


def parse_task_id(task_id: str) -> Tuple[str, int]:
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


def _check_address(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidRequestError(
            f"task address {address!r} is malformed; rule: 'host:port' with 0 < port < 65536")


@dataclasses.dataclass
class TaskRecord:
    """One task slot and its current generation."""

    task_type: str
    task_index: int
    address: str
    generation: int
    status: str
    instance_id: str = ""
    reason: str = ""
    # request ids of the last GetShard per dataset, for idempotent retries:
    # dataset -> [request_id, shard_id, attempt]
    last_get_shard: Dict[str, List[int]] = dataclasses.field(default_factory=dict)

    @property
    def task_id(self) -> str:
        return f"{self.task_type}:{self.task_index}"


@dataclasses.dataclass(frozen=True)
class ClusterView:
    """A consistent copy of the cluster for a reply."""

    version: int
    ps_version: int
    tasks: Tuple[TaskRecord, ...]


@dataclasses.dataclass
class _Barrier:
    expected: Set[str]
    arrived: Set[str]
    done: bool = False


class SnapshotStore:
    """Atomic JSON snapshots in a directory that one master owns at a time.

    ``save`` writes ``state.json.tmp``, flushes (and fsyncs when ``fsync``),
    then renames it over ``state.json``; a reader sees the old or the new
    snapshot, never a torn one.  A ``LOCK`` file held with ``flock`` keeps a
    second master off the same directory; the kernel drops it when the
    owner dies, even by SIGKILL.
    """

    def __init__(self, state_dir: str, *, fsync: bool = True) -> None:
        os.makedirs(state_dir, exist_ok=True)
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, "state.json")
        self._fsync = fsync
        self._lock_file = open(os.path.join(state_dir, "LOCK"), "a+")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self._lock_file.close()
            raise MasterError(
                f"state dir {state_dir!r} is in use by another master; rule: one master "
                "per state dir") from exc

    def load(self) -> Optional[Dict[str, Any]]:
        """Returns the last snapshot, or ``None`` when there is none.

        Raises:
          MasterError: the snapshot exists but cannot be read.
        """
        try:
            with open(self.path, "r", encoding="utf-8") as handle:
                return json.load(handle)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise MasterError(
                f"master state {self.path!r} is unreadable ({exc}); move it away to start "
                "fresh") from exc

    def save(self, data: Dict[str, Any]) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(data, handle, separators=(",", ":"))
            handle.flush()
            if self._fsync:
                os.fsync(handle.fileno())
        os.replace(tmp, self.path)

    def close(self) -> None:
        if not self._lock_file.closed:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()


class MasterState:
    """Tasks, versions, datasets and barriers of one job.  Thread-safe.

    Args:
      store: Where snapshots go; ``None`` keeps the state in memory only.
      heartbeat_timeout: Seconds of silence (heartbeat liveness) or of
        absence (external liveness) after which a task is declared LOST.
      liveness: ``"heartbeat"`` or ``"external"``; see the module docstring.
      clock: Monotonic seconds; injected by tests.
    """

    def __init__(self, store: Optional[SnapshotStore] = None, *,
                 heartbeat_timeout: float = 10.0, liveness: str = "heartbeat",
                 clock: Callable[[], float] = time.monotonic) -> None:
        if liveness not in ("heartbeat", "external"):
            raise ValueError(f"liveness={liveness!r}; rule: 'heartbeat' or 'external'")
        if heartbeat_timeout <= 0:
            raise ValueError(f"heartbeat_timeout={heartbeat_timeout}; rule: > 0")
        self.heartbeat_timeout = heartbeat_timeout
        self.liveness = liveness
        self._clock = clock
        self._store = store
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._closing = False
        self._version = 0
        self._ps_version = 0
        self._tasks: Dict[str, TaskRecord] = {}
        self._datasets: Dict[str, ShardQueue] = {}
        self._barriers: Dict[str, _Barrier] = {}
        self._seen: Dict[str, float] = {}          # task id -> last heard / absent since
        self._present: Set[str] = set()            # external liveness: members present
        self._suspended = False
        data = store.load() if store else None
        if data is not None:
            self._load(data)
            _LOG.info("Restored master state from %s: version %d, %d tasks, %d datasets",
                      store.path if store else "", self._version, len(self._tasks),
                      len(self._datasets))

    # --- persistence -----------------------------------------------------------

    def _persist(self) -> None:
        if self._store is not None:
            self._store.save(self.to_dict())

    def to_dict(self) -> Dict[str, Any]:
        with self._lock:
            return {
                "format": _STATE_FORMAT, "version": self._version, "ps_version": self._ps_version,
                "tasks": [dataclasses.asdict(t) for t in self._tasks.values()],
                "datasets": [q.to_dict() for q in self._datasets.values()],
                "barriers": [[k, sorted(b.expected), sorted(b.arrived), b.done]
                             for k, b in self._barriers.items()],
            }

    def _load(self, data: Any) -> None:
        if not isinstance(data, dict) or data.get("format") != _STATE_FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise MasterError(f"master state format {found!r}; rule: {_STATE_FORMAT}")
        try:
            version, ps_version = int(data["version"]), int(data["ps_version"])
            tasks = [TaskRecord(**raw) for raw in data["tasks"]]
            queues = [ShardQueue.from_dict(raw) for raw in data["datasets"]]
            barriers = {key: _Barrier(set(expected), set(arrived), bool(done))
                        for key, expected, arrived, done in data["barriers"]}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MasterError(
                f"master state is malformed ({type(exc).__name__}: {exc}); rule: a snapshot this "
                "master wrote; move it away to start fresh") from exc
        self._version, self._ps_version = version, ps_version
        now = self._clock()
        for record in tasks:
            self._tasks[record.task_id] = record
            self._seen[record.task_id] = now
        for queue in queues:
            self._datasets[queue.spec.name] = queue
        self._barriers.update(barriers)

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

    def _task(self, task_id: str, generation: int) -> TaskRecord:
        parse_task_id(task_id)
        record = self._tasks.get(task_id)
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
        if record.status != ALIVE:
            raise MembershipLost(
                f"task {task_id} generation {generation} is {record.status} "
                f"({record.reason}); register again")
        return record

    def _bump(self, task_type: str) -> None:
        self._version += 1
        if task_type == "ps":
            self._ps_version += 1
        self._changed.notify_all()

    def register(self, task_type: str, task_index: int, address: str,
                 instance_id: str) -> Tuple[TaskRecord, ClusterView]:
        """Registers a task; returns its record and the cluster.

        A repeat by the same ``instance_id`` of an ALIVE task returns the
        same generation.  Otherwise a new generation starts: the previous
        one's leases are released as failed and the cluster version is bumped.
        """
        if task_type not in TASK_TYPES:
            raise InvalidRequestError(f"task type {task_type!r}; rule: one of {TASK_TYPES}")
        if task_index < 0:
            raise InvalidRequestError(f"task index {task_index}; rule: >= 0")
        _check_address(address)
        task_id = f"{task_type}:{task_index}"
        with self._lock:
            record = self._tasks.get(task_id)
            if (record is not None and record.status == ALIVE and instance_id
                    and record.instance_id == instance_id and record.address == address):
                self._seen[task_id] = self._clock()
                return dataclasses.replace(record), self._view()
            if record is not None and record.status == ALIVE:
                # The old process died without being noticed: its leases failed.
                self._release_task(record, failed=True)
            generation = record.generation + 1 if record else 1
            record = TaskRecord(task_type, task_index, address, generation, ALIVE, instance_id)
            self._tasks[task_id] = record
            self._seen[task_id] = self._clock()
            self._bump(task_type)
            self._persist()
            _LOG.info("Registered %s generation %d at %s; cluster version %d",
                      task_id, generation, address, self._version)
            return dataclasses.replace(record), self._view()

    def heartbeat(self, task_id: str, generation: int) -> Tuple[int, int]:
        """Notes that the task is alive; returns ``(version, ps_version)``."""
        with self._lock:
            self._task(task_id, generation)
            if self.liveness == "heartbeat":
                self._seen[task_id] = self._clock()
            return self._version, self._ps_version

    def deregister(self, task_id: str, generation: int) -> None:
        """The task leaves: its leases are released (not as failures)."""
        with self._lock:
            record = self._task(task_id, generation)
            self._set_gone(record, LEFT, "deregistered", failed=False)
            self._persist()

    def update_address(self, task_id: str, generation: int, address: str) -> ClusterView:
        """Moves a task to a new address; bumps the version if it changed."""
        _check_address(address)
        with self._lock:
            record = self._task(task_id, generation)
            if record.address != address:
                _LOG.info("Task %s moved from %s to %s", task_id, record.address, address)
                record.address = address
                self._bump(record.task_type)
                self._persist()
            return self._view()

    def cluster(self) -> ClusterView:
        with self._lock:
            return self._view()

    def versions(self) -> Tuple[int, int]:
        with self._lock:
            return self._version, self._ps_version

    def _view(self) -> ClusterView:
        tasks = sorted(self._tasks.values(), key=lambda t: (t.task_type, t.task_index))
        return ClusterView(self._version, self._ps_version,
                           tuple(dataclasses.replace(t) for t in tasks))

    def declare_lost(self, task_id: str, reason: str, generation: int = 0) -> int:
        """Declares a task LOST; returns the records given back.

        ``generation`` 0 means the current one.  Declaring a task that is
        not ALIVE (or an older generation) changes nothing.
        """
        with self._lock:
            record = self._tasks.get(task_id)
            if record is None:
                parse_task_id(task_id)
                raise NotFoundError(f"task {task_id!r} is not registered")
            if record.status != ALIVE or generation not in (0, record.generation):
                return 0
            requeued = self._set_gone(record, LOST, reason, failed=True)
            self._persist()
            _LOG.warning("Task %s generation %d declared lost (%s); %d records re-queued; "
                         "cluster version %d", task_id, record.generation, reason, requeued,
                         self._version)
            return requeued

    def _set_gone(self, record: TaskRecord, status: str, reason: str, *, failed: bool) -> int:
        record.status, record.reason = status, reason
        requeued = self._release_task(record, failed=failed)
        for barrier in self._barriers.values():
            barrier.expected.discard(record.task_id)
            self._check_barrier(barrier)
        self._bump(record.task_type)
        return requeued

    def _release_task(self, record: TaskRecord, *, failed: bool) -> int:
        record.last_get_shard.clear()
        return sum(q.release_owner(record.task_id, failed=failed)
                   for q in self._datasets.values())

    def expire_silent(self) -> List[str]:
        """Declares LOST every task past its liveness deadline; returns their ids."""
        with self._lock:
            if self._suspended:
                return []
            now = self._clock()
            expired = []
            for task_id, record in self._tasks.items():
                if record.status != ALIVE:
                    continue
                since = self._seen.get(task_id, now)
                if self.liveness == "external" and task_id in self._present:
                    continue
                if now - since > self.heartbeat_timeout:
                    expired.append(task_id)
            for task_id in expired:
                what = ("silent" if self.liveness == "heartbeat"
                        else "absent from the membership service")
                self.declare_lost(task_id, f"{what} for more than {self.heartbeat_timeout:g}s")
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
            self._suspended = suspended
            if suspended:
                return
            now = self._clock()
            for task_id in self._present - present_set:
                self._seen[task_id] = now  # Absent from now on.
            self._present = present_set

    def report_failure(self, task_id: str, generation: int, reason: str,
                       dataset: str = "", shard_ids: Sequence[int] = (), *, failed: bool = True) -> int:
        """Fails some shards of a task, or (no shard ids) the whole task.

        With ``failed=False`` the shards go back to the queue without a
        failure counted against them (a holder's input pipeline was rebuilt:
        a session re-creation is not a shard failure).

        Returns:
          The records given back to the queue.

        Raises:
          InvalidRequestError: a whole-task report without the generation it is
            about (0, the protobuf default, would hit whatever incarnation is
            live now, e.g. the one that replaced the failed one).
        """
        if not shard_ids:
            if generation < 1:
                raise InvalidRequestError(
                    f"ReportFailure for task {task_id!r} has generation {generation}; rule: a task failure "
                    "names the generation that failed (>= 1, as its registration returned)")
            return self.declare_lost(task_id, reason or "reported failed", generation)
        with self._lock:
            queue = self._queue(dataset)
            owned = {lease.shard_id for lease in queue.leases_of(task_id)}
            requeued = sum(queue.release(s, failed=failed) for s in shard_ids if s in owned)
            if requeued:
                self._persist()
            return requeued

    # --- datasets --------------------------------------------------------------

    def _queue(self, dataset: str) -> ShardQueue:
        queue = self._datasets.get(dataset)
        if queue is None:
            raise NotFoundError(f"dataset {dataset!r} is not registered; rule: "
                                "RegisterDataset first")
        return queue

    def register_dataset(self, spec: DatasetSpec) -> Tuple[bool, DataStats]:
        """Adds a dataset; a repeat with the same spec is a no-op.

        Raises:
          MasterError: a dataset of that name exists with another spec.
        """
        with self._lock:
            queue = self._datasets.get(spec.name)
            if queue is not None:
                if queue.spec != spec:
                    raise MasterError(
                        f"dataset {spec.name!r} is registered as {queue.spec}; got {spec}; "
                        "rule: one definition per dataset name")
                return False, queue.stats()
            queue = ShardQueue(spec)
            self._datasets[spec.name] = queue
            self._persist()
            return True, queue.stats()

    def get_shard(self, task_id: str, generation: int, dataset: str,
                  request_id: int) -> Tuple[str, Optional[Lease]]:
        """Leases a shard to a task.

        Returns:
          ``("shard", lease)``; or, when nothing is free, ``("end", None)`` if
          the dataset is finished, ``("drain", None)`` if the task holds
          leases itself (it must finish them; waiting could deadlock its
          pipeline), else ``("wait", None)``.  Repeating the last
          ``request_id`` returns the same lease while the task still holds it.
        """
        with self._lock:
            record = self._task(task_id, generation)
            queue = self._queue(dataset)
            last = record.last_get_shard.get(dataset)
            if last is not None and request_id and last[0] == request_id:
                lease = queue.held(last[1], last[2], task_id)
                if lease is not None:
                    return "shard", dataclasses.replace(lease)
            lease = queue.lease(task_id, generation)
            if lease is None:
                if queue.finished:
                    return "end", None
                return ("drain" if queue.leases_of(task_id) else "wait"), None
            record.last_get_shard[dataset] = [request_id, lease.shard_id, lease.attempt]
            self._persist()
            return "shard", dataclasses.replace(lease)

    def report_progress(self, task_id: str, generation: int, dataset: str, shard_id: int,
                        attempt: int, records: int) -> bool:
        """Acknowledges ``records`` (cumulative) of a lease; True when the shard is done."""
        with self._lock:
            self._task(task_id, generation)
            queue = self._queue(dataset)
            before = (queue.records_trained, len(queue.leases_of(task_id)))
            done = queue.acknowledge(shard_id, attempt, task_id, records)
            if (queue.records_trained, len(queue.leases_of(task_id))) != before:
                self._persist()
            if done:
                self._changed.notify_all()
            return done

    def dataset_spec(self, dataset: str) -> DatasetSpec:
        with self._lock:
            return self._queue(dataset).spec

    def data_stats(self, dataset: str) -> DataStats:
        with self._lock:
            return self._queue(dataset).stats()

    def shard_checkpoint(self, dataset: str) -> bytes:
        with self._lock:
            return json.dumps(self._queue(dataset).checkpoint()).encode("utf-8")

    def restore_shard_checkpoint(self, dataset: str, blob: bytes) -> DataStats:
        """Rolls a dataset back to a blob from :meth:`shard_checkpoint`."""
        try:
            data = json.loads(blob.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise InvalidRequestError(
                f"shard checkpoint of dataset {dataset!r} is not valid JSON ({exc})") from exc
        with self._lock:
            queue = self._queue(dataset)
            rolled_back = queue.restore(data)
            for record in self._tasks.values():
                record.last_get_shard.pop(dataset, None)
            self._persist()
            _LOG.info("Restored shard checkpoint of %r: %d acknowledged records rolled back",
                      dataset, rolled_back)
            return queue.stats()

    # --- barriers --------------------------------------------------------------

    def barrier(self, task_id: str, generation: int, name: str, scope: int,
                participants: Sequence[str], task_types: Sequence[str],
                timeout: float) -> List[str]:
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
        if not name:
            raise InvalidRequestError("barrier name is empty; rule: a non-empty string")
        if not 0 < timeout <= _MAX_BARRIER_TIMEOUT_S:
            raise InvalidRequestError(
                f"barrier {name!r} timeout_s={timeout}; rule: 0 < timeout_s <= "
                f"{_MAX_BARRIER_TIMEOUT_S:g}")
        for participant in participants:
            parse_task_id(participant)
        types = tuple(task_types) or _DEFAULT_BARRIER_TYPES
        key = f"{name}@{scope}"
        deadline = self._clock() + timeout
        with self._lock:
            self._task(task_id, generation)
            barrier = self._barriers.get(key)
            if barrier is None:
                expected = set(participants) or {
                    t.task_id for t in self._tasks.values()
                    if t.status == ALIVE and t.task_type in types}
                barrier = self._barriers[key] = _Barrier(expected, set())
            if task_id not in barrier.arrived:
                barrier.arrived.add(task_id)
                self._check_barrier(barrier)
                self._prune_barriers()
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

    def _check_barrier(self, barrier: _Barrier) -> None:
        if not barrier.done and barrier.expected <= barrier.arrived:
            barrier.done = True
            self._changed.notify_all()

    def _prune_barriers(self) -> None:
        done = [k for k, b in self._barriers.items() if b.done]
        for key in done[:max(0, len(done) - _DONE_BARRIERS_KEPT)]:
            del self._barriers[key]
