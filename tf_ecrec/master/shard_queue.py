"""Who holds which shard of one dataset, and what is acknowledged.

Life of a shard (ids and ranges: :mod:`tf_ecrec.master.sharding`)::

    fresh --lease--> leased --acknowledge(all records)--> done
                       |  \\
                       |   acknowledge(k records): still leased, prefix of k done
                       |
                    release (task lost/left, shard reported failed)
                       v
                    pending (the unacknowledged suffix, first in line)
                       |-- lease again (attempt + 1)
                       '-- failed more than max_shard_failures times --> failed

This module is plain Python with no locking and no I/O; the master state
serializes access and persists :meth:`ShardQueue.to_dict`.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import Iterator
from typing import Any

from tf_ecrec.errors import InvalidRequestError, StaleGenerationError
from tf_ecrec.master.sharding import DatasetSpec, DataStats, Lease, Piece

_RECENT_DONE_KEPT = 512       # Completed leases remembered for idempotent retries.
_FAILED_IDS_REPORTED = 32     # Failed shard ids listed in DataStats.
_CHECKPOINT_FORMAT = 1


class ShardQueue:
    """The shards of one dataset: who holds what, and what is acknowledged."""

    def __init__(self, spec: DatasetSpec) -> None:
        self.spec = spec
        self._epoch = 0          # Cursor over fresh shards: epoch ...
        self._position = 0       # ... and position in that epoch's order.
        self._pending: collections.deque[Piece] = collections.deque()
        self._leases: dict[int, Lease] = {}
        self._failed: dict[int, tuple[int, int]] = {}  # shard id -> given-up range.
        self._recent_done: collections.OrderedDict[tuple[int, int], str] = (
            collections.OrderedDict())
        self._debt: dict[int, tuple[int, int]] = {}    # Rolled-back ranges per shard.
        self._order_cache: tuple[int, list[int]] = (-1, [])
        self.records_trained = 0
        self.records_retrained = 0
        self.records_requeued = 0
        # What exists of the records: all of them, or of a stream what arrived so far and whether it ended.
        self._available = 0 if spec.stream else spec.total_records
        self._closed = not spec.stream

    # --- a stream's records as they arrive -------------------------------------

    def extend(self, available: int, closed: bool) -> None:
        """A stream now holds `available` records (offsets ``[0, available)``), and ended if `closed`.

        Raises:
          InvalidRequestError: not a stream, fewer records than before, more than the spec's
            ``total_records``, or records added to (or reopening) a closed stream.
        """
        name = self.spec.name
        if not self.spec.stream:
            raise InvalidRequestError(f"dataset {name!r} is not a stream; rule: only streams are extended")
        if not self._available <= available <= self.spec.total_records:
            raise InvalidRequestError(
                f"stream {name!r}: available={available}; rule: {self._available} <= available <= "
                f"{self.spec.total_records} (records only arrive)")
        if self._closed and (available != self._available or not closed):
            raise InvalidRequestError(f"stream {name!r} is closed at {self._available} records; rule: a closed "
                                      "stream neither grows nor reopens")
        self._available, self._closed = available, closed

    @property
    def available(self) -> int:
        return self._available

    @property
    def closed(self) -> bool:
        return self._closed

    def _range(self, shard_id: int) -> tuple[int, int]:
        """``(start, end)`` of a shard; a stream's last shard ends at the records that exist."""
        _, start, end = self.spec.shard_range(shard_id)
        return start, min(end, self._available) if self.spec.stream and self._closed else end

    # --- leasing -------------------------------------------------------------

    def lease(self, owner: str, generation: int) -> Lease | None:
        """Hands the next shard to ``owner``; ``None`` when nothing is free.

        Released suffixes go first, then fresh shards in epoch order.
        """
        if self._pending:
            piece = self._pending.popleft()
            lease = Lease(piece.shard_id, piece.attempt + 1, owner, generation,
                          piece.start, piece.end, piece.failures)
        else:
            shard_id = self._next_fresh()
            if shard_id is None:
                return None
            start, end = self._range(shard_id)
            lease = Lease(shard_id, 1, owner, generation, start, end)
        self._leases[lease.shard_id] = lease
        return lease

    def held(self, shard_id: int, attempt: int, owner: str) -> Lease | None:
        """Returns the lease if ``owner`` still holds that attempt, else ``None``."""
        lease = self._leases.get(shard_id)
        if lease is None or lease.attempt != attempt or lease.owner != owner:
            return None
        return lease

    def _next_fresh(self) -> int | None:
        if self.spec.stream:  # the next shard in offset order, once its records exist
            start = self._position * self.spec.shard_records
            if start + self.spec.shard_records <= self._available or (self._closed and start < self._available):
                self._position += 1
                return self._position - 1
            return None
        num_shards = self.spec.num_shards
        if self._position >= num_shards:
            self._epoch += 1
            self._position = 0
        if self._epoch >= self.spec.num_epochs:
            self._epoch, self._position = self.spec.num_epochs, 0
            return None
        index = self._order(self._epoch)[self._position]
        self._position += 1
        return self._epoch * num_shards + index

    def _order(self, epoch: int) -> list[int]:
        if self._order_cache[0] != epoch:
            order = list(range(self.spec.num_shards))
            if self.spec.shuffle_seed is not None:
                random.Random(f"{self.spec.shuffle_seed}/{epoch}").shuffle(order)
            self._order_cache = (epoch, order)
        return self._order_cache[1]

    # --- acknowledgement and release ------------------------------------------

    def acknowledge(self, shard_id: int, attempt: int, owner: str, records: int) -> bool:
        """Records that ``owner`` trained the first ``records`` of its lease.

        ``records`` is cumulative, so repeating a report changes nothing.

        Returns:
          True when the shard is now completely acknowledged.

        Raises:
          InvalidRequestError: ``records`` is negative or exceeds the lease.
          StaleGenerationError: the lease was released or handed on.
          NotFoundError: the shard id does not exist.
        """
        key = (shard_id, attempt)
        if self._recent_done.get(key) == owner:
            return True
        lease = self.held(shard_id, attempt, owner)
        if lease is None:
            self.spec.shard_range(shard_id)  # NotFoundError for a bad id.
            current = self._leases.get(shard_id)
            where = (f"now attempt {current.attempt} held by {current.owner}" if current
                     else "it was handed back or finished")
            raise StaleGenerationError(
                f"dataset {self.spec.name!r} shard {shard_id} attempt {attempt} is no "
                f"longer leased to {owner} ({where}); fetch a new shard")
        size = lease.end - lease.start
        if not 0 <= records <= size:
            raise InvalidRequestError(
                f"dataset {self.spec.name!r} shard {shard_id}: records={records}; rule: "
                f"0 <= records <= {size} (the lease covers [{lease.start}, {lease.end}))")
        if records > lease.acked:
            self._count_trained(shard_id, lease.start + lease.acked, lease.start + records)
            lease.acked = records
        if lease.acked < size:
            return False
        del self._leases[shard_id]
        self._recent_done[key] = owner
        while len(self._recent_done) > _RECENT_DONE_KEPT:
            self._recent_done.popitem(last=False)
        return True

    def _count_trained(self, shard_id: int, lo: int, hi: int) -> None:
        self.records_trained += hi - lo
        debt = self._debt.get(shard_id)
        if debt is None:
            return
        overlap = min(hi, debt[1]) - max(lo, debt[0])
        if overlap > 0:
            self.records_retrained += overlap
        if hi >= debt[1]:
            del self._debt[shard_id]
        elif hi > debt[0]:
            self._debt[shard_id] = (hi, debt[1])

    def release(self, shard_id: int, *, failed: bool) -> int:
        """Gives a lease's unacknowledged suffix back; returns its record count.

        With ``failed`` the shard's failure count grows, and past
        ``max_shard_failures`` the shard is given up instead of re-queued.
        Releasing a shard that is not leased returns 0.
        """
        lease = self._leases.pop(shard_id, None)
        if lease is None:
            return 0
        start = lease.start + lease.acked
        failures = lease.failures + (1 if failed else 0)
        count = lease.end - start
        if count == 0:
            return 0
        self.records_requeued += count
        if failures > self.spec.max_shard_failures:
            self._failed[shard_id] = (start, lease.end)
        else:
            self._pending.appendleft(Piece(shard_id, start, lease.end, lease.attempt, failures))
        return count

    def release_owner(self, owner: str, *, failed: bool) -> int:
        """Releases every lease of ``owner``; returns the records given back."""
        shard_ids = [s for s, lease in self._leases.items() if lease.owner == owner]
        return sum(self.release(s, failed=failed) for s in sorted(shard_ids, reverse=True))

    def leases_of(self, owner: str) -> list[Lease]:
        return [lease for lease in self._leases.values() if lease.owner == owner]

    # --- state -----------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """True when every shard of every epoch is done or failed (a stream: closed, and all of it)."""
        if self.spec.stream:
            issued_all = self._closed and self._position * self.spec.shard_records >= self._available
            return issued_all and not self._pending and not self._leases
        exhausted = (self._epoch >= self.spec.num_epochs
                     or (self._epoch == self.spec.num_epochs - 1
                         and self._position >= self.spec.num_shards))
        return exhausted and not self._pending and not self._leases

    def stats(self) -> DataStats:
        failed_ids = sorted(self._failed)
        return DataStats(
            dataset=self.spec.name,
            records_total=self._available if self.spec.stream else self.spec.records_total,
            records_trained=self.records_trained,
            records_retrained=self.records_retrained,
            records_requeued=self.records_requeued,
            records_failed=sum(end - start for start, end in self._failed.values()),
            records_in_flight=sum(lease.unacked for lease in self._leases.values()),
            shards_failed=len(failed_ids),
            failed_shard_ids=tuple(failed_ids[:_FAILED_IDS_REPORTED]),
            finished=self.finished,
            lease_holders=tuple(sorted({lease.owner for lease in self._leases.values()})),
        )

    def acknowledged_prefixes(self) -> Iterator[tuple[int, int, int]]:
        """Yields ``(shard_id, start, acked_end)`` for every issued shard.

        ``[start, acked_end)`` is the acknowledged prefix of the shard.
        """
        open_ends: dict[int, int] = {p.shard_id: p.start for p in self._pending}
        open_ends.update({s: lease.start + lease.acked for s, lease in self._leases.items()})
        open_ends.update({s: rng[0] for s, rng in self._failed.items()})
        num_shards = self.spec.num_shards
        for epoch in range(min(self._epoch + 1, self.spec.num_epochs)):
            issued = num_shards if epoch < self._epoch else self._position
            for index in range(issued) if self.spec.stream else self._order(epoch)[:issued]:
                shard_id = epoch * num_shards + index
                start, end = self._range(shard_id)
                yield shard_id, start, open_ends.get(shard_id, end)

    # --- checkpoint (saved with the model) -----------------------------------

    def checkpoint(self) -> dict[str, Any]:
        """Returns the progress to save beside a model checkpoint.

        In-flight leases are saved as pending suffixes: a model restored from
        this checkpoint has trained only the acknowledged prefixes.
        """
        pieces = [dataclasses.asdict(p) for p in self._pending]
        pieces += [dataclasses.asdict(Piece(lease.shard_id, lease.start + lease.acked, lease.end,
                                            lease.attempt, lease.failures))
                   for lease in self._leases.values() if lease.unacked]
        return {"format": _CHECKPOINT_FORMAT, "spec": self.spec.to_dict(),
                "epoch": self._epoch, "position": self._position, "pending": pieces,
                "failed": [[s, a, b] for s, (a, b) in self._failed.items()]}

    def restore(self, data: dict[str, Any]) -> int:
        """Rolls progress back to a :meth:`checkpoint`; returns records rolled back.

        Every current lease is revoked (their holders get
        ``StaleGenerationError`` on their next report).  Records acknowledged
        since the checkpoint are pending again and are counted in
        ``records_retrained`` when acknowledged a second time.  Counters are
        never rolled back.

        Raises:
          InvalidRequestError: the checkpoint is of another dataset or format.
        """
        if data.get("format") != _CHECKPOINT_FORMAT:
            raise InvalidRequestError(
                f"shard checkpoint format {data.get('format')!r}; rule: {_CHECKPOINT_FORMAT}")
        # Everything is parsed and checked before anything changes.
        try:
            spec = DatasetSpec.from_dict(data["spec"])
            epoch, position = int(data["epoch"]), int(data["position"])
            pending = [Piece(**p) for p in data["pending"]]
            failed = {int(s): (int(a), int(b)) for s, a, b in data["failed"]}
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidRequestError(
                f"shard checkpoint is malformed ({type(exc).__name__}: {exc}); rule: a checkpoint as "
                "ShardCheckpoint returns it") from exc
        if spec != self.spec:
            raise InvalidRequestError(
                f"shard checkpoint is of {spec}, but the master has {self.spec}; rule: "
                "restore a checkpoint of the same dataset definition")
        bad = [p for p in pending if not 0 <= p.start <= p.end or p.shard_id < 0]
        if epoch < 0 or position < 0 or bad:
            raise InvalidRequestError(
                f"shard checkpoint has epoch {epoch}, position {position}"
                + (f", pieces {bad[:3]}" if bad else "")
                + "; rule: non-negative epoch and position, pieces with 0 <= start <= end")
        before = {s: end for s, _, end in self.acknowledged_prefixes()}
        self._epoch, self._position = epoch, position
        self._pending = collections.deque(pending)
        self._leases = {}
        self._failed = failed
        self._recent_done.clear()
        rolled_back = 0
        after = {s: end for s, _, end in self.acknowledged_prefixes()}
        for shard_id, end in before.items():
            start, _ = self._range(shard_id)
            now = after.get(shard_id, start)
            if end > now:
                rolled_back += end - now
                old = self._debt.get(shard_id)
                self._debt[shard_id] = (now, max(end, old[1]) if old else end)
        return rolled_back

    # --- persistence (the master's own state) ---------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = self.checkpoint()
        data["pending"] = [dataclasses.asdict(p) for p in self._pending]
        data["leases"] = [dataclasses.asdict(lease) for lease in self._leases.values()]
        data["recent_done"] = [[s, a, o] for (s, a), o in self._recent_done.items()]
        data["debt"] = [[s, a, b] for s, (a, b) in self._debt.items()]
        data["counters"] = [self.records_trained, self.records_retrained, self.records_requeued]
        data["available"] = [self._available, self._closed]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardQueue:
        queue = cls(DatasetSpec.from_dict(data["spec"]))
        queue._epoch, queue._position = int(data["epoch"]), int(data["position"])
        queue._pending = collections.deque(Piece(**p) for p in data["pending"])
        queue._leases = {int(d["shard_id"]): Lease(**d) for d in data["leases"]}
        queue._failed = {int(s): (int(a), int(b)) for s, a, b in data["failed"]}
        queue._recent_done = collections.OrderedDict(
            ((int(s), int(a)), str(o)) for s, a, o in data["recent_done"])
        queue._debt = {int(s): (int(a), int(b)) for s, a, b in data["debt"]}
        (queue.records_trained, queue.records_retrained,
         queue.records_requeued) = (int(x) for x in data["counters"])
        if "available" in data:  # a stream's watermark (older states: a dataset that is all there)
            queue._available, queue._closed = int(data["available"][0]), bool(data["available"][1])
        return queue
