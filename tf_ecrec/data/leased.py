"""A trainer's data leased from the job master: the input pipeline's shards, given back when abandoned.

The Estimator re-initializes its input iterator with every new session
(after a PS failure, for instance), which drops whatever the pipeline had
prefetched.  Each start of the pipeline is therefore an *incarnation*: the
leases the previous one had started and not finished are given back to the
master (``ReportFailure`` with their shard ids), and a lease that an
abandoned incarnation receives late is given back too.  The records a step
trained are attributed to the current incarnation's leases in reading order
(`PipelineTracker`, a `ShardTracker` that starts over), and acknowledged off
the training thread by ``tf_ecrec.hooks.shard_progress.ShardProgressHook``
(pass it `LeasedData.tracker`).

Use::

    data = LeasedData(client, "worker:0", "train", rejoin=..., stop=event)
    data.register(records_per_epoch, shard_records, epochs)   # idempotent, every trainer
    estimator.train(lambda: data.dataset(source, batch_size, table_sizes), ...)
    data.raise_failure()                                      # after a TF error: the lease loop's own

The lease loop, per incarnation::

    GetShard -> SHARD: yield it  -> GetShard ...
             -> WAIT / DRAIN: sleep, ask again (others, or we, still hold shards)
             -> END: the dataset is finished; the input ends, training ends
             -> MembershipLost: rejoin (register again, new generation), ask again
             -> MasterUnavailable: ask again until UNAVAILABLE_DEADLINE_SECS
             -> stop requested (the `stop` event): end the input
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tf_ecrec.errors import ConfigError, EcRecError, MasterError, MasterUnavailable, MembershipLost
from tf_ecrec.master.client import MasterClient
from tf_ecrec.master.progress_reporter import ShardTracker
from tf_ecrec.master.replies import ShardLease
from tf_ecrec.master.sharding import ShardStatus

_LOG = logging.getLogger(__name__)

# A shard released this often (failed tasks, rebuilt pipelines) is given up and reported.
MAX_SHARD_FAILURES = 10
# How long the lease loop rides through an unreachable master (a restart takes seconds).
UNAVAILABLE_DEADLINE_SECS = 120.0
# How long a worker waits for shards others hold before it gives up with an error.
WAIT_DEADLINE_SECS = 600.0
_POLL_SECS = 0.5


class PipelineTracker:
    """A `ShardTracker` that a rebuilt input pipeline can start over.

    Duck-types what `ShardProgressHook` calls (``record_trained``,
    ``untracked_records``); `reset` swaps in a fresh tracker and returns the
    leases the old one had not finished.  Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inner = ShardTracker()

    def add(self, lease: ShardLease) -> None:
        with self._lock:
            self._inner.add(lease)

    def record_trained(self, records: int) -> list[Any]:
        with self._lock:
            return self._inner.record_trained(records)

    @property
    def untracked_records(self) -> int:
        with self._lock:
            return self._inner.untracked_records

    def reset(self) -> list[ShardLease]:
        with self._lock:
            open_leases = [u.lease for u in self._inner.open_leases()]
            self._inner = ShardTracker()
            return open_leases


class LeasedData:
    """The shards of one dataset this task leases from the job master.  Call `register`, then `dataset`.

    Thread-safety: `dataset`'s generator runs on a tf.data thread, the
    progress hook (through `tracker`) on the training thread; shared state
    is locked.

    Args:
      client: This task's registered `MasterClient`.
      task: This task, "type:index" (for messages).
      dataset: The dataset's name at the master.
      rejoin: Called with the `MembershipLost` error when the master declared
        this task lost: registers it again (new generation).
      stop: Set to end the input after the current lease (no more leases asked).
    """

    def __init__(self, client: MasterClient, task: str, dataset: str, *,
                 rejoin: Callable[[Exception], None], stop: threading.Event) -> None:
        self.client = client
        self.task = task
        self.name = dataset
        self._rejoin = rejoin
        self._stop = stop
        self._lock = threading.Lock()
        self._incarnation = 0
        self.tracker = PipelineTracker()
        self._records_per_epoch = 0
        self.failure: BaseException | None = None

    def register(self, records_per_epoch: int, shard_records: int, epochs: int,
                 max_shard_failures: int = MAX_SHARD_FAILURES, stream: bool = False) -> None:
        """Registers the dataset (idempotent: every trainer does it, the same way); a `stream`'s records
        are leased as they arrive (`tf_ecrec.data.stream`)."""
        self._records_per_epoch = records_per_epoch
        created, stats = self.client.register_dataset(
            self.name, records_per_epoch, shard_records, epochs, max_shard_failures=max_shard_failures, stream=stream,
        )
        _LOG.info("Dataset %r %s: %d records (%d x %d epochs), %d trained so far", self.name,
                  "registered" if created else "already registered", stats.records_total, records_per_epoch, epochs,
                  stats.records_trained)

    def dataset(self, source: Any, batch_size: int, table_sizes: Sequence[int]) -> Any:
        """The input_fn's dataset: batches of the leases this task gets from the master."""
        from tf_ecrec.data.pipeline import make_leased_dataset

        if not self._records_per_epoch:
            raise ConfigError("LeasedData.dataset before register; source: LeasedData")
        return make_leased_dataset(source, self._open_ranges, batch_size, table_sizes)

    def raise_failure(self) -> None:
        """Re-raises the lease loop's error (it reaches the training loop wrapped in a TF error)."""
        if self.failure is not None:
            raise self.failure

    # ---- the lease loop ------------------------------------------------------------------

    def _open_ranges(self) -> Iterator[Any]:
        from tf_ecrec.data.pipeline import LeasedRange

        with self._lock:
            self._incarnation += 1
            incarnation = self._incarnation
            stale = self.tracker.reset()
        if stale:
            self._give_back(stale, "the input pipeline was rebuilt with a new session")
        try:
            for lease in self._leases(incarnation):
                base = lease.epoch * self._records_per_epoch
                yield LeasedRange(
                    base + lease.start,
                    base + lease.end,
                    on_start=functools.partial(self._start_lease, incarnation, lease),
                    on_empty=functools.partial(self._ack_unreadable, lease),
                )
        except EcRecError as exc:
            self.failure = exc  # the task re-raises it: a TF error would hide the type
            raise

    def _leases(self, incarnation: int) -> Iterator[ShardLease]:
        unavailable_since: float | None = None
        waiting_since: float | None = None
        while not self._stop.is_set() and incarnation == self._incarnation:
            try:
                try:
                    reply = self.client.get_shard(self.name)
                except MembershipLost as exc:
                    self._rejoin(exc)
                    continue
            except MasterUnavailable as exc:
                now = time.monotonic()
                unavailable_since = unavailable_since or now
                if now - unavailable_since > UNAVAILABLE_DEADLINE_SECS:
                    raise MasterUnavailable(
                        f"{self.task} could not reach the master at {self.client.address} for "
                        f"{UNAVAILABLE_DEADLINE_SECS:g}s to get data: {exc}"
                    ) from exc
                time.sleep(_POLL_SECS)
                continue
            unavailable_since = None
            if reply.status is ShardStatus.END:
                _LOG.info("%s: dataset %r finished", self.task, self.name)
                return
            if reply.status is ShardStatus.SHARD:
                assert reply.lease is not None  # a SHARD reply carries its lease
                waiting_since = None
                if incarnation != self._incarnation:  # abandoned while we asked
                    self._give_back([reply.lease], "it reached an abandoned input pipeline")
                    return
                yield reply.lease
                continue
            now = time.monotonic()  # WAIT or DRAIN: shards are held (maybe by us); ask again
            waiting_since = waiting_since or now
            if now - waiting_since > WAIT_DEADLINE_SECS:
                raise MasterError(
                    f"{self.task}: no shard of dataset {self.name!r} became free within "
                    f"{WAIT_DEADLINE_SECS:g}s while other tasks hold the rest"
                )
            time.sleep(max(_POLL_SECS, min(reply.retry_after, 2.0)))

    def _start_lease(self, incarnation: int, lease: ShardLease) -> None:
        with self._lock:
            if incarnation == self._incarnation:
                self.tracker.add(lease)
                return
        self._give_back([lease], "it reached an abandoned input pipeline")

    def _ack_unreadable(self, lease: ShardLease) -> None:
        _LOG.warning("%s: records [%d, %d) of epoch %d are all corrupt; acknowledged without training",
                     self.task, lease.start, lease.end, lease.epoch)
        try:
            self.client.report_progress(lease, lease.size)
        except EcRecError as exc:
            _LOG.warning("Could not acknowledge the unreadable shard %d: %s", lease.shard_id, exc)

    def _give_back(self, leases: Sequence[ShardLease], why: str) -> None:
        try:
            requeued = self.client.report_failure(
                reason=f"{self.task} dropped them: {why}", dataset=self.name,
                shard_ids=sorted({lease.shard_id for lease in leases}), not_a_failure=True,
            )
        except EcRecError as exc:
            _LOG.warning("Could not give %d leases back (%s); the master re-queues them when this task is lost",
                         len(leases), exc)
            return
        _LOG.info("%s gave %d leases (%d records) back: %s", self.task, len(leases), requeued, why)
