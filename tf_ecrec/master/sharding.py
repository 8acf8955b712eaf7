"""The shard plan of a dataset and its vocabulary: specs, leases, counters.

A dataset of ``total_records`` records (synthetic generator indices, or the
lines of Criteo files mapped to a global index by the caller) is cut into
shards of ``shard_records`` consecutive records, for each of ``num_epochs``
epochs.  Shard ``i`` of epoch ``e`` has the id ``e * num_shards + i`` and the
record range ``[i * shard_records, min((i + 1) * shard_records, total))``.

Acknowledged records always form a prefix of the shard: a worker trains a
lease's records in order and reports the cumulative count, so a lost lease
gives back exactly its unacknowledged suffix.  Counters (:class:`DataStats`):

* ``records_trained``: acknowledged records, each acknowledgement counted
  (so a record trained twice counts twice).
* ``records_retrained``: acknowledged records that had been acknowledged
  before.  Only a rollback makes this happen:
  :meth:`~tf_ecrec.master.shard_queue.ShardQueue.restore` of a checkpoint
  taken before some acknowledgements.
* ``records_requeued``: records handed out, not acknowledged, and handed back
  by a release.  A worker may have trained some of them without its report
  arriving, so this bounds the retraining the master cannot see.

Who holds which shard is :class:`~tf_ecrec.master.shard_queue.ShardQueue`'s.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from tf_ecrec.errors import InvalidRequestError, NotFoundError

DEFAULT_MAX_SHARD_FAILURES = 3


class ShardStatus(str, enum.Enum):
    """The answer to a request for a shard."""

    SHARD = "shard"  # A lease is in the reply.
    WAIT = "wait"    # Nothing free; you hold nothing; others hold shards: ask again.
    END = "end"      # The dataset is finished.
    DRAIN = "drain"  # Nothing free; finish the leases you hold and ask no more.


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """What to shard.  Validated on construction.

    Attributes:
      name: Dataset name, unique within the job.
      total_records: Records in one epoch, > 0.
      shard_records: Records per shard, > 0; a few batches.
      num_epochs: Passes over the data, >= 1.
      shuffle_seed: ``None`` hands shards out in index order; an int fixes a
        different permutation of the shards for every epoch.
      max_shard_failures: A shard released as failed more often than this
        is given up and counted in ``shards_failed``.
      stream: The records arrive while the job trains (`tf_ecrec.data.stream`):
        ``total_records`` is the most the index space may hold, and the queue
        hands out only records that exist (`ShardQueue.extend`): full shards
        while the stream is open, the last partial one once it is closed.
    """

    name: str
    total_records: int
    shard_records: int
    num_epochs: int = 1
    shuffle_seed: int | None = None
    max_shard_failures: int = DEFAULT_MAX_SHARD_FAILURES
    stream: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidRequestError("dataset name is empty; rule: a non-empty string")
        for field, value, low in (("total_records", self.total_records, 1),
                                  ("shard_records", self.shard_records, 1),
                                  ("num_epochs", self.num_epochs, 1),
                                  ("max_shard_failures", self.max_shard_failures, 0)):
            if not isinstance(value, int) or value < low:
                raise InvalidRequestError(
                    f"dataset {self.name!r}: {field}={value!r}; rule: an integer >= {low}")
        if self.stream and (self.num_epochs != 1 or self.shuffle_seed is not None):
            raise InvalidRequestError(
                f"dataset {self.name!r}: a stream with num_epochs={self.num_epochs}, shuffle_seed={self.shuffle_seed}; "
                "rule: a stream is read once, in offset order (num_epochs 1, no shuffle)")

    @property
    def num_shards(self) -> int:
        """Shards per epoch."""
        return -(-self.total_records // self.shard_records)

    @property
    def records_total(self) -> int:
        """Records over all epochs."""
        return self.total_records * self.num_epochs

    def shard_range(self, shard_id: int) -> tuple[int, int, int]:
        """Returns ``(epoch, start, end)`` of a shard id."""
        epoch, index = divmod(shard_id, self.num_shards)
        if shard_id < 0 or epoch >= self.num_epochs:
            raise NotFoundError(
                f"dataset {self.name!r} has no shard {shard_id}; rule: 0 <= id < "
                f"{self.num_shards * self.num_epochs}")
        start = index * self.shard_records
        return epoch, start, min(start + self.shard_records, self.total_records)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DatasetSpec:
        return cls(**data)


@dataclasses.dataclass
class Lease:
    """Records ``[start, end)`` of a shard, handed to ``owner``; ``acked`` done."""

    shard_id: int
    attempt: int
    owner: str
    generation: int
    start: int
    end: int
    failures: int = 0
    acked: int = 0

    @property
    def unacked(self) -> int:
        return self.end - self.start - self.acked


@dataclasses.dataclass
class Piece:
    """The pending suffix ``[start, end)`` of a shard that was released."""

    shard_id: int
    start: int
    end: int
    attempt: int
    failures: int


@dataclasses.dataclass(frozen=True)
class DataStats:
    """The dataset's counters; see the module docstring."""

    dataset: str
    records_total: int
    records_trained: int
    records_retrained: int
    records_requeued: int
    records_failed: int
    records_in_flight: int
    shards_failed: int
    failed_shard_ids: tuple[int, ...]
    finished: bool
    lease_holders: tuple[str, ...] = ()  # tasks holding leases now

