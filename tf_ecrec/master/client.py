"""The task side of the master: a typed, bounded client.

Every call has a per-attempt timeout and runs under a :class:`Retry` with a
total deadline; a master that cannot be reached ends in
:class:`~tf_ecrec.errors.MasterUnavailable`, never in a hang.  Status codes
come back as the tf_ecrec error the server named (see
:mod:`tf_ecrec.master.servicer` and :mod:`tf_ecrec.master.wire`); replies are
the typed values of :mod:`tf_ecrec.master.replies`.  All calls are safe to retry: the server
deduplicates registrations by ``instance_id``, shard requests by
``request_id``, and progress reports are cumulative.

Usage (a worker)::

    client = MasterClient("127.0.0.1:50051", "worker", 1, token=token)
    cluster = client.register("10.0.0.5:2222")          # generation assigned
    for lease in client.iter_shards("train"):           # WAIT handled, END ends
        for done in train(lease.start, lease.end):      # records trained so far
            client.report_progress(lease, done)
    client.close()

The client is thread-safe; one per process and task.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from tf_ecrec import errors
from tf_ecrec.base.retry import Retry
from tf_ecrec.errors import ConfigError, MasterError, MasterUnavailable
from tf_ecrec.master.proto import master_pb2 as pb
from tf_ecrec.master.proto import master_pb2_grpc as pb_grpc
from tf_ecrec.master.replies import Cluster, ShardLease, ShardReply, data_stats_from_pb
from tf_ecrec.master.sharding import DataStats, ShardStatus
from tf_ecrec.master.wire import ERROR_KEY, NAMED_ERRORS, TOKEN_KEY, shard_status_of_pb

_TRANSIENT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                    grpc.StatusCode.CANCELLED)
_CHANNEL_OPTIONS = (
    # Reconnect quickly to a restarted master instead of backing off for minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


def _translate(exc: grpc.RpcError, address: str, method: str) -> Exception:
    """Turns a failed call into a tf_ecrec error (MasterUnavailable when transient)."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    name = ""
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == ERROR_KEY:
            name = value
    cls = NAMED_ERRORS.get(name)
    if cls is not None:
        return cls(details)
    if code in _TRANSIENT_CODES:
        return MasterUnavailable(f"master at {address} did not answer {method}: "
                                 f"{code.name}: {details}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return errors.AuthenticationError(f"master at {address} refused {method}: {details}")
    return MasterError(f"master at {address} failed {method}: {code.name}: {details}")


class MasterClient:
    """Calls the job master for one task (or, without a task, as an observer).

    Args:
      address: ``host:port`` of the master.
      task_type: This task's type; ``None`` for an observer (the launcher),
        which may only call the task-independent methods.
      task_index: This task's index.
      token: The job token, if the master requires one.
      timeout: Seconds one attempt of a call may take.
      retry: Policy for transient failures (UNAVAILABLE, timeouts); its
        ``deadline`` bounds a whole call.  Default: 8 tries within 15 s.
    """

    def __init__(self, address: str, task_type: str | None, task_index: int = 0, *,
                 token: str | None = None, timeout: float = 5.0,
                 retry: Retry | None = None) -> None:
        if timeout <= 0:
            raise ConfigError(f"MasterClient timeout={timeout}; rule: > 0")
        self.address = address
        self.task_type = task_type
        self.task_index = task_index
        self._timeout = timeout
        def is_transient(exc: BaseException) -> bool:
            return (isinstance(exc, MasterUnavailable))
        self._retry = (retry or Retry(max_tries=8, delay=0.1, max_delay=1.0,
                                      deadline=15.0)).replace(retry_if=is_transient)
        self._metadata: tuple[tuple[str, str], ...] = ((TOKEN_KEY, token),) if token else ()
        self._channel = grpc.insecure_channel(address, options=list(_CHANNEL_OPTIONS))
        self._stub = pb_grpc.MasterStub(self._channel)
        self._lock = threading.Lock()
        self._instance_id = uuid.uuid4().hex
        self._generation = 0
        self._request_ids = itertools.count(1)
        self.heartbeat_interval = 0.0  # What the master asked for, set by register().

    # --- plumbing ----------------------------------------------------------------

    @property
    def task_id(self) -> str:
        if self.task_type is None:
            raise ConfigError("this MasterClient has no task; rule: pass task_type to call "
                              "task-scoped methods")
        return f"{self.task_type}:{self.task_index}"

    @property
    def generation(self) -> int:
        """The generation of the last successful :meth:`register` (0 before)."""
        with self._lock:
            return self._generation

    def _task_ref(self) -> pb.TaskRef:
        task_id = self.task_id
        generation = self.generation
        if not generation:
            raise ConfigError(f"task {task_id} is not registered; rule: call register() first")
        return pb.TaskRef(task_id=task_id, generation=generation)

    def _call(self, method: str, request: Any, *, timeout: float | None = None,
              retry: Retry | None = None) -> Any:
        rpc = getattr(self._stub, method)
        per_try = timeout if timeout is not None else self._timeout
        policy = (retry or self._retry).replace(retry_if=self._retry.retry_if)
        started = time.monotonic()
        tries = [0]

        def attempt(remaining: float | None) -> Any:
            tries[0] += 1
            budget = per_try if remaining is None else max(min(per_try, remaining), 0.001)
            try:
                return rpc(request, timeout=budget, metadata=self._metadata)
            except grpc.RpcError as exc:
                raise _translate(exc, self.address, method) from exc

        try:
            return policy.run(attempt)
        except MasterUnavailable as exc:
            raise MasterUnavailable(
                f"{exc} (gave up after {tries[0]} tries in "
                f"{time.monotonic() - started:.1f}s)") from exc

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> MasterClient:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # --- membership --------------------------------------------------------------

    def register(self, address: str) -> Cluster:
        """Registers this task at ``address``; a new call starts a new generation.

        Retries of one call are deduplicated by the server.
        """
        response = self._call("Register", pb.RegisterRequest(
            task_type=self.task_id.partition(":")[0], task_index=self.task_index,
            address=address, instance_id=self._instance_id))
        with self._lock:
            self._generation = response.task.generation
            self._request_ids = itertools.count(1)
        self.heartbeat_interval = response.heartbeat_interval_s
        return Cluster.from_pb(response.cluster)

    def heartbeat(self, *, timeout: float | None = None,
                  retry: Retry | None = None) -> tuple[int, int]:
        """Returns ``(version, ps_version)``; raises MembershipLost if declared lost."""
        response = self._call("Heartbeat", pb.HeartbeatRequest(task=self._task_ref()),
                              timeout=timeout, retry=retry)
        return response.version, response.ps_version

    def deregister(self) -> None:
        self._call("Deregister", pb.DeregisterRequest(task=self._task_ref()))

    def get_cluster(self, *, timeout: float | None = None,
                    retry: Retry | None = None) -> Cluster:
        return Cluster.from_pb(self._call("GetCluster", pb.GetClusterRequest(),
                                          timeout=timeout, retry=retry))

    def update_address(self, address: str) -> Cluster:
        return Cluster.from_pb(self._call("UpdateTaskAddress", pb.UpdateTaskAddressRequest(
            task=self._task_ref(), address=address)))

    def report_failure(self, task_id: str | None = None, *, reason: str = "",
                       dataset: str = "", shard_ids: Sequence[int] = (),
                       generation: int = 0, not_a_failure: bool = False) -> int:
        """Reports a task lost (no ``shard_ids``, ``generation`` required) or some of its
        shards failed (or, with ``not_a_failure``, just given back).

        Shards this task gives back go with its own generation (unless ``generation`` says
        otherwise): the master refuses them from a superseded process.

        Returns:
          Records given back to the queue.

        Raises:
          StaleGenerationError: the shards' generation was superseded (nothing given back).
        """
        if shard_ids and not generation and task_id in (None, self.task_id):
            generation = self._task_ref().generation
        response = self._call("ReportFailure", pb.ReportFailureRequest(
            task_id=task_id or self.task_id, generation=generation,
            shard_ids=list(shard_ids), dataset=dataset, reason=reason, not_a_failure=not_a_failure))
        return response.records_requeued

    def barrier(self, name: str, generation: int, timeout: float, *,
                participants: Sequence[str] = (), task_types: Sequence[str] = ()) -> list[str]:
        """Waits at barrier ``(name, generation)``; see ``MasterState.barrier``.

        Raises:
          BarrierTimeout: not everyone arrived within ``timeout`` seconds.
          MasterUnavailable: the master was unreachable until the deadline.
        """
        request = pb.BarrierRequest(task=self._task_ref(), name=name, generation=generation,
                                    participants=list(participants),
                                    task_types=list(task_types), timeout_s=timeout)
        slack = self._timeout
        return list(self._call("Barrier", request, timeout=timeout + slack,
                               retry=self._retry.replace(deadline=timeout + 2 * slack)).arrived)

    # --- data --------------------------------------------------------------------

    def register_dataset(self, name: str, total_records: int, shard_records: int,
                         num_epochs: int = 1, *, shuffle_seed: int | None = None,
                         max_shard_failures: int = 0, stream: bool = False) -> tuple[bool, DataStats]:
        """Registers a dataset (idempotent); returns ``(created, stats)``.  A `stream`'s records are
        handed out as `extend_dataset` says they arrived (`total_records`: the most it may hold)."""
        request = pb.RegisterDatasetRequest(name=name, total_records=total_records,
                                            shard_records=shard_records, num_epochs=num_epochs,
                                            max_shard_failures=max_shard_failures, stream=stream)
        if shuffle_seed is not None:
            request.shuffle_seed = shuffle_seed
        response = self._call("RegisterDataset", request)
        return response.created, data_stats_from_pb(response.state)

    def get_shard(self, dataset: str) -> ShardReply:
        """Asks for a shard: a lease, WAIT, or END."""
        request = pb.GetShardRequest(task=self._task_ref(), dataset=dataset,
                                     request_id=next(self._request_ids))
        response = self._call("GetShard", request)
        status = shard_status_of_pb(response.status)
        if status is ShardStatus.SHARD:
            s = response.shard
            return ShardReply(status, ShardLease(dataset, s.shard_id, s.attempt, s.epoch,
                                                 s.start, s.end))
        if status is ShardStatus.WAIT:
            return ShardReply(status, retry_after=response.retry_after_s or 0.5)
        return ShardReply(status)

    def iter_shards(self, dataset: str, *, wait_timeout: float | None = None,
                    sleep: Callable[[float], None] = time.sleep) -> Iterator[ShardLease]:
        """Yields leases until END or DRAIN, sleeping through WAIT replies.

        WAIT lasts while other tasks hold shards; it ends when they finish or
        the master declares them lost (their records come back here).
        ``wait_timeout`` bounds one uninterrupted run of WAIT replies.  After
        the iterator ends, ``data_state(dataset).finished`` tells whether the
        dataset is done: it is not if a task that held shards at the end
        failed after everyone else had drained.

        Raises:
          MasterError: WAIT lasted longer than ``wait_timeout``.
        """
        waiting_since: float | None = None
        while True:
            reply = self.get_shard(dataset)
            if reply.status in (ShardStatus.END, ShardStatus.DRAIN):
                return
            if reply.status is ShardStatus.SHARD:
                waiting_since = None
                assert reply.lease is not None
                yield reply.lease
                continue
            now = time.monotonic()
            waiting_since = now if waiting_since is None else waiting_since
            if wait_timeout is not None and now - waiting_since > wait_timeout:
                raise MasterError(f"dataset {dataset!r}: no shard became free within "
                                  f"{wait_timeout:g}s while others hold the rest")
            sleep(reply.retry_after)

    def report_progress(self, lease: ShardLease, records: int, *,
                        timeout: float | None = None, retry: Retry | None = None) -> bool:
        """Acknowledges the first ``records`` (cumulative) of a lease as trained.

        Returns:
          True when the shard is complete.

        Raises:
          StaleGenerationError: the lease was taken away (this task was
            declared lost, or the shard checkpoint was restored).
        """
        request = pb.ReportProgressRequest(task=self._task_ref(), dataset=lease.dataset,
                                           shard_id=lease.shard_id, attempt=lease.attempt,
                                           records=records)
        return bool(self._call("ReportProgress", request, timeout=timeout,
                               retry=retry).shard_done)

    def data_state(self, dataset: str) -> DataStats:
        return data_stats_from_pb(self._call("GetDataState",
                                             pb.GetDataStateRequest(dataset=dataset)))

    def shard_checkpoint(self, dataset: str) -> bytes:
        """Returns the dataset's progress as a blob to save with the model."""
        return self._call("GetShardCheckpoint",
                          pb.GetShardCheckpointRequest(dataset=dataset)).blob

    def extend_dataset(self, dataset: str, available: int, closed: bool = False) -> DataStats:
        """A stream's records ``[0, available)`` exist now; `closed`: no more will come."""
        return data_stats_from_pb(self._call("ExtendDataset", pb.ExtendDatasetRequest(
            name=dataset, available=available, closed=closed)))

    def restore_shard_checkpoint(self, dataset: str, blob: bytes) -> DataStats:
        """Rolls the dataset back to ``blob``; every current lease is revoked.

        Raises:
          StaleGenerationError: this task's generation was superseded (nothing rolled back).
          InvalidRequestError: a client without a task (a rollback names its caller).
        """
        task = self._task_ref() if self.task_type is not None else None
        response = self._call("RestoreShardCheckpoint",
                              pb.ShardCheckpoint(dataset=dataset, blob=blob, task=task))
        return data_stats_from_pb(response.state)
