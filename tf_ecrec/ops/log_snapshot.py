"""Delta log snapshots in NumPy: parsing ``delta_log_read``'s outputs, and the word view of arrays.

This module needs only NumPy: it imports neither TensorFlow nor the op
library's loader, so tools and tests can parse fetched snapshots (and
recovery can plan on them) in any process. The outputs it parses come from
:func:`tf_ecrec.ops.delta_log_ops.delta_log_read`, whose kernel writes them
in ``ops/cc/kernels/delta_log_snapshot.cc``.

Typical use, after a session fetched the read op's outputs::

    snapshot = parse_delta_log(session.run(read_op))
    for sid in snapshot.sids():
        for entry in snapshot.of_sid(sid):
            if entry.kind is EntryKind.APPLY and snapshot.undoable(entry):
                ...
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

import numpy as np

__all__ = ["DeltaLogEntry", "DeltaLogSnapshot", "EntryKind", "as_words", "parse_delta_log"]


class EntryKind(enum.IntEnum):
    """Kinds of log entries, with the values the kernels write (``kinds`` of ``delta_log_read``)."""

    APPLY = 0
    """An optimizer's update of a variable and its slots (``SparseApply*WithDeltaLogged``)."""
    FOLD = 1
    """A fold of an apply's delta into a parity or a replica (``ParityUpdateLogged``)."""
    COUNTER = 2
    """A counter add (``AssignAddLogged``)."""


def as_words(array: np.ndarray) -> np.ndarray:
    """A NumPy array as the int32 word matrix the log ops see: ``[rows, W]``.

    Rows are the first dimension (one row for a scalar); a 64-bit element is
    two words, low word first (little-endian hosts).
    """
    array = np.ascontiguousarray(array)
    if array.dtype.itemsize % 4:
        raise TypeError(f"{array.dtype} elements are not whole 32-bit words")
    rows = 1 if array.ndim == 0 else array.shape[0]
    width = int(np.prod(array.shape[1:], dtype=np.int64)) * array.dtype.itemsize // 4
    return array.reshape(-1).view(np.int32).reshape(rows, width)


@dataclasses.dataclass(frozen=True)
class DeltaLogEntry:
    """One update recorded in a delta log.

    Attributes:
        seq: Append sequence number, increasing within the log.
        sid: Step id.
        target: Id of the updated variable (group).
        source: Id of the variable a folded delta came from, or -1.
        rows: int64 ``[n]``, distinct rows written, ascending.
        delta: int32 ``[n, width]``, the words XORed into each row.
        source_seq: For a fold, the seq of its source apply entry; -1 else.
        kind: What kind of update it was.
    """

    seq: int
    sid: int
    target: int
    source: int
    rows: np.ndarray
    delta: np.ndarray
    source_seq: int = -1
    kind: EntryKind = EntryKind.APPLY

    @property
    def width(self) -> int:
        return int(self.delta.shape[1])


@dataclasses.dataclass(frozen=True)
class DeltaLogSnapshot:
    """A parsed :func:`delta_log_read`.

    Attributes:
        entries: In seq order.
        committed: The remembered committed step ids, oldest first.
        settled: target -> highest seq of its entries that left the log by
            commit or drop with their update still in effect.
        fenced: Fenced step ids not committed since, ascending.
        settled_source: source target -> highest source_seq of its folds
            that left this log by commit or drop.
        data_committed: Step ids committed by round 1 here, oldest first.
        generation: The minimum generation the log admits.
    """

    entries: list[DeltaLogEntry]
    committed: np.ndarray
    settled: dict[int, int]
    fenced: np.ndarray
    settled_source: dict[int, int] = dataclasses.field(default_factory=dict)
    data_committed: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros([0], np.int64))
    generation: int = 0

    def sids(self) -> list[int]:
        """Step ids with entries, in the order of their first entry."""
        return list(dict.fromkeys(e.sid for e in self.entries))

    def of_sid(self, sid: int) -> list[DeltaLogEntry]:
        """The entries of step ``sid``, in seq order."""
        return [e for e in self.entries if e.sid == sid]

    def is_committed(self, sid: int) -> bool:
        """Committed by round 2 here."""
        return bool(np.any(self.committed == sid))

    def is_data_committed(self, sid: int) -> bool:
        """Committed by round 1 here."""
        return bool(np.any(self.data_committed == sid))

    def undoable(self, entry: DeltaLogEntry) -> bool:
        """Whether ``entry`` can be undone with ``ordered=True`` after every
        later entry of its target in this snapshot has been undone."""
        return entry.seq > self.settled.get(entry.target, -1)


def parse_delta_log(values: Sequence[np.ndarray]) -> DeltaLogSnapshot:
    """Parses the fetched outputs of :func:`delta_log_read` (in their order)."""
    if len(values) != 18:
        raise ValueError(f"expected the 18 outputs of delta_log_read, got {len(values)}")
    (
        seq, sid, target, source, splits, rows, widths, deltas, committed, settled_targets, settled_seq, fenced,
        source_seq, kinds, settled_sources, settled_source_seq, data_committed, generation,
    ) = (np.asarray(v) for v in values)
    entries: list[DeltaLogEntry] = []
    offset = 0
    for i in range(seq.size):
        entry_rows = rows[splits[i] : splits[i + 1]].astype(np.int64)
        width = int(widths[i])
        size = entry_rows.size * width
        delta = deltas[offset : offset + size].astype(np.int32).reshape(entry_rows.size, width)
        offset += size
        entries.append(
            DeltaLogEntry(
                int(seq[i]), int(sid[i]), int(target[i]), int(source[i]), entry_rows, delta, int(source_seq[i]), EntryKind(int(kinds[i]))
            )
        )
    if offset != deltas.size:
        raise ValueError(f"delta_log_read outputs are inconsistent: {deltas.size} delta words, entries use {offset}")
    settled = {int(t): int(s) for t, s in zip(settled_targets, settled_seq)}
    settled_source = {int(t): int(s) for t, s in zip(settled_sources, settled_source_seq)}
    return DeltaLogSnapshot(
        entries, committed.astype(np.int64), settled, fenced.astype(np.int64),
        settled_source, data_committed.astype(np.int64), int(generation),
    )
