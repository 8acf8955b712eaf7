"""The worker side of shard progress: attributes trained records to leases and reports them.

The input pipeline reads leases in order and registers each with a
:class:`ShardTracker` as it starts reading it.  After every training step
the shard-progress hook tells the tracker how many records the step
trained; the tracker attributes them to the oldest leases first and returns
cumulative counts, which a :class:`ProgressSender` delivers to the master on
its own thread.  Because counts are cumulative, a newer update replaces an
older one, so the sender coalesces and never needs to block or drop.

The attribution is exact when the pipeline trains each lease's records in
order (shuffle within a lease, never across leases): then an acknowledged
count ``k`` means the first ``k`` records of the lease are in the model.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tf_ecrec.errors import EcRecError, MasterUnavailable
from tf_ecrec.master.rate_limited_log import RateLimitedLogger
from tf_ecrec.master.replies import ShardLease

_LOG = logging.getLogger(__name__)

_Key = tuple[str, int, int]  # (dataset, shard_id, attempt)


def _key(lease: ShardLease) -> _Key:
    return (lease.dataset, lease.shard_id, lease.attempt)


@dataclasses.dataclass(frozen=True)
class ProgressUpdate:
    """``records`` of ``lease`` trained so far (cumulative)."""

    lease: ShardLease
    records: int


class ShardTracker:
    """Leases being read, oldest first, with the records trained of each.  Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: collections.deque[list[Any]] = collections.deque()  # [lease, trained]
        self.untracked_records = 0

    def add(self, lease: ShardLease) -> None:
        """Registers a lease the pipeline starts reading (call in reading order)."""
        with self._lock:
            self._leases.append([lease, 0])

    def record_trained(self, records: int) -> list[ProgressUpdate]:
        """Attributes ``records`` trained by one step; returns the updates to send.

        Records beyond every tracked lease are counted in
        ``untracked_records`` (a pipeline that read data it did not lease).
        """
        if records < 0:
            raise ValueError(f"records={records}; rule: >= 0")
        updates = []
        with self._lock:
            while records and self._leases:
                entry = self._leases[0]
                lease, trained = entry
                take = min(records, lease.size - trained)
                entry[1] = trained + take
                records -= take
                updates.append(ProgressUpdate(lease, entry[1]))
                if entry[1] == lease.size:
                    self._leases.popleft()
            self.untracked_records += records
        return updates

    def open_leases(self) -> list[ProgressUpdate]:
        """The leases not yet fully trained, with their counts."""
        with self._lock:
            return [ProgressUpdate(lease, trained) for lease, trained in self._leases]


def track(leases: Iterable[ShardLease], tracker: ShardTracker) -> Iterator[ShardLease]:
    """Yields ``leases``, registering each with ``tracker`` as it is handed out."""
    for lease in leases:
        tracker.add(lease)
        yield lease


class ProgressSender:
    """Sends progress updates on a background thread.

    ``submit`` never blocks: updates go through a bounded queue, and when the
    queue is full they are merged into an overflow map keyed by lease
    (counts are cumulative, so only the latest matters).  While the master
    is unreachable the latest counts are kept and re-sent every
    ``retry_interval`` seconds, with a rate-limited warning.  A lease the
    master no longer recognizes (this task was declared lost, the shard
    checkpoint was restored) is dropped with a warning.

    Args:
      report: Sends one update; ``MasterClient.report_progress``.
      max_queue: Capacity of the queue.
      retry_interval: Seconds between attempts while the master is away.
      min_interval: Seconds between two rounds of sending (a throttle: the
        counts of several steps go in one round); ``flush`` skips it.
      warn_every_secs: Minimum seconds between two "unreachable" warnings.
    """

    def __init__(self, report: Callable[[ShardLease, int], bool], *, max_queue: int = 1024,
                 retry_interval: float = 1.0, min_interval: float = 0.2,
                 warn_every_secs: float = 30.0, logger: logging.Logger = _LOG) -> None:
        if max_queue < 1 or retry_interval <= 0 or min_interval < 0 or warn_every_secs < 0:
            raise ValueError(f"max_queue={max_queue} (>= 1), retry_interval={retry_interval} "
                             f"(> 0), min_interval={min_interval} (>= 0), "
                             f"warn_every_secs={warn_every_secs} (>= 0)")
        self._min_interval = min_interval
        self._flushing = threading.Event()
        self._report = report
        self._queue: queue.Queue[ProgressUpdate] = queue.Queue(max_queue)
        self._retry_interval = retry_interval
        self._logger = logger
        self._unreachable = RateLimitedLogger(logger, warn_every_secs)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._overflow: dict[_Key, ProgressUpdate] = {}
        self._pending: dict[_Key, ProgressUpdate] = {}
        self._busy = False
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.dropped = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tf-ecrec-progress-sender",
                                            daemon=True)
            self._thread.start()

    def submit(self, update: ProgressUpdate) -> None:
        """Queues an update; never blocks."""
        try:
            self._queue.put_nowait(update)
        except queue.Full:
            with self._lock:
                _merge(self._overflow, update)
        self._wake.set()

    @property
    def unsent(self) -> list[ProgressUpdate]:
        """Updates not yet acknowledged by the master."""
        with self._lock:
            merged = dict(self._pending)
            for update in self._overflow.values():
                _merge(merged, update)
        for update in list(self._queue.queue):
            _merge(merged, update)
        return list(merged.values())

    def flush(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds for everything to be sent; True if it was."""
        deadline = time.monotonic() + timeout
        self._flushing.set()
        self._wake.set()
        try:
            with self._lock:
                while self._busy or self._pending or self._overflow or not self._queue.empty():
                    left = deadline - time.monotonic()
                    if left <= 0 or self._thread is None or not self._thread.is_alive():
                        return False
                    self._idle.wait(min(left, 0.05))
                    self._wake.set()
                return True
        finally:
            self._flushing.clear()

    def stop(self, timeout: float = 5.0) -> None:
        """Ends the thread (unsent updates stay in :attr:`unsent`)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        backoff = False
        while not self._stopping.is_set():
            self._wake.wait(self._retry_interval if backoff else 0.5)
            self._wake.clear()
            if self._stopping.is_set():
                return
            with self._lock:
                self._busy = True
                while True:
                    try:
                        _merge(self._pending, self._queue.get_nowait())
                    except queue.Empty:
                        break
                for update in self._overflow.values():
                    _merge(self._pending, update)
                self._overflow.clear()
                batch = list(self._pending.values())
            backoff = False
            for update in batch:
                try:
                    self._report(update.lease, update.records)
                except MasterUnavailable as exc:
                    self._unreachable.warning(
                        "Shard progress not delivered, master unreachable (%s); %d updates "
                        "kept for retry", exc, len(batch))
                    backoff = True
                    break
                except EcRecError as exc:
                    self._logger.warning("Dropping progress of dataset %r shard %d attempt "
                                         "%d: %s", update.lease.dataset, update.lease.shard_id,
                                         update.lease.attempt, exc)
                    self.dropped += 1
                except Exception:  # keep the sender alive, report the bug.
                    self._logger.exception("Internal error while sending shard progress")
                    backoff = True
                    break
                else:
                    self.sent += 1
                with self._lock:
                    if self._pending.get(_key(update.lease)) == update:
                        del self._pending[_key(update.lease)]
            with self._lock:
                self._busy = False
                self._idle.notify_all()
            if not backoff and not self._flushing.is_set():
                self._stopping.wait(self._min_interval)  # Throttle: batch the next steps.


def _merge(into: dict[_Key, ProgressUpdate], update: ProgressUpdate) -> None:
    key = _key(update.lease)
    old = into.get(key)
    if old is None or update.records > old.records:
        into[key] = update
