"""One table's chunks and stripes, and the lookups on them: what `tf_ecrec.layout.placement.plan` returns per table.

A `TableLayout` is computed once (by `tf_ecrec.layout.placement.plan` or read from
JSON) and every other module asks it: where a row lives (`locate_many`),
which chunks a PS holds and at which local rows (`chunks_on`,
`local_rows`), where the deltas of a PS's data fold (`fold_routes`) and which
stripes a loss breaks (`unrecoverable_stripes`).  Lookups are dicts and
arrays built once per layout.  Nothing here touches TensorFlow.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tf_ecrec.erasure.codec import Code
from tf_ecrec.errors import ConfigError


class ChunkKind(str, enum.Enum):
    """What a chunk holds: table rows (data) or parity of a stripe's data."""

    DATA = "data"
    PARITY = "parity"

    def __str__(self) -> str:
        return self.value


def is_int(value: Any) -> bool:
    """True for a Python or NumPy integer that is not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


@dataclass(frozen=True)
class TableSpec:
    """A table to protect.

    Attributes:
        name: Unique table name.
        rows: Number of rows (vocabulary size), at least ``k`` of the code.
        dim: Values per row, at least 1.
    """

    name: str
    rows: int
    dim: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"table name must be a non-empty string, got {self.name!r}")
        for field in ("rows", "dim"):
            value = getattr(self, field)
            if not is_int(value):
                raise ConfigError(f"table {self.name!r}: {field} must be an integer, got {value!r}")
            if value < 1:
                raise ConfigError(f"table {self.name!r} has {field} = {value}; {field} must be at least 1")
            object.__setattr__(self, field, int(value))


@dataclass(frozen=True)
class ChunkSpec:
    """One chunk: a block of ``rows x dim`` values held by one PS.

    Attributes:
        table: Name of the table.
        kind: `ChunkKind.DATA` or `ChunkKind.PARITY`.
        stripe: Index of the stripe in its table.
        position: Data position ``0 .. k-1`` or parity index ``0 .. r-1``.
        index_in_stripe: The codec's chunk index: ``position`` for data,
            ``k + position`` for parity.
        chunk: Data chunks are numbered ``stripe * k + position`` in row order;
            parity chunks ``stripe * r + position``.
        ps: The PS task index holding the chunk.
        rows: Rows in the chunk (the table's chunk size, padding included).
        dim: Values per row.
        row_start: For data, the table row of local row 0; ``None`` for parity.
        real_rows: Leading rows that are not padding (for parity: rows that
            cover at least one real data row).
    """

    table: str
    kind: ChunkKind
    stripe: int
    position: int
    index_in_stripe: int
    chunk: int
    ps: int
    rows: int
    dim: int
    row_start: int | None
    real_rows: int

    @property
    def is_data(self) -> bool:
        """True for a data chunk."""
        return self.kind == ChunkKind.DATA

    @property
    def name(self) -> str:
        """A stable name, e.g. ``"emb/data_3"`` or ``"emb/parity_1_0"``."""
        if self.is_data:
            return f"{self.table}/data_{self.chunk}"
        return f"{self.table}/parity_{self.stripe}_{self.position}"

    @property
    def padding_rows(self) -> int:
        """Rows of the chunk that are padding."""
        return self.rows - self.real_rows

    def nbytes(self, itemsize: int = 4) -> int:
        """Bytes of the chunk for values of ``itemsize`` bytes."""
        return self.rows * self.dim * itemsize


@dataclass(frozen=True)
class StripeSpec:
    """``k`` data chunks and their ``r`` parity chunks, on ``k + r`` distinct PS.

    Attributes:
        table: Name of the table.
        index: Index of the stripe in its table.
        chunks: The ``k + r`` chunks in codec order (data, then parity).
    """

    table: str
    index: int
    chunks: tuple[ChunkSpec, ...]

    @property
    def data(self) -> tuple[ChunkSpec, ...]:
        """The data chunks, position order."""
        return tuple(c for c in self.chunks if c.is_data)

    @property
    def parity(self) -> tuple[ChunkSpec, ...]:
        """The parity chunks, parity-index order."""
        return tuple(c for c in self.chunks if not c.is_data)

    @property
    def ps(self) -> tuple[int, ...]:
        """PS of each chunk, codec order."""
        return tuple(c.ps for c in self.chunks)


@dataclass(frozen=True)
class RowLocation:
    """Where one table row lives.

    Attributes:
        table: Table name.
        row: Table row id.
        chunk: Data chunk number in the table.
        stripe: Stripe index.
        position: Position of the chunk in its stripe (its codec index).
        ps: PS task holding the row.
        offset: Row within the chunk; parity row ``offset`` of the stripe covers it.
    """

    table: str
    row: int
    chunk: int
    stripe: int
    position: int
    ps: int
    offset: int


@dataclass(frozen=True, eq=False)
class RowLocations:
    """:class:`RowLocation` for an array of rows, one ``int64`` array per field."""

    table: str
    row: np.ndarray
    chunk: np.ndarray
    stripe: np.ndarray
    position: np.ndarray
    ps: np.ndarray
    offset: np.ndarray


@dataclass(frozen=True, eq=False)
class FoldRoute:
    """Where the deltas of some of one PS's data chunks fold: one parity index on one PS, one coefficient.

    Attributes:
        ps: The PS holding the parity chunks.
        position: The parity index ``0 .. r-1``.
        coef: The code's coefficient of these data chunks in that parity.
        local_chunks: ``int64``: the local indices of the data chunks routed here.
        parity_base: ``int64``, one per local data chunk of the data PS: the
            first row of its stripe's parity chunk in ``ps``'s parity variable
            (``-1`` for a chunk routed elsewhere).
    """

    ps: int
    position: int
    coef: int
    local_chunks: np.ndarray
    parity_base: np.ndarray


def route_rows(rows: np.ndarray, bases: np.ndarray, chunk_rows: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Where the rows of one data PS's update fold: per route (a row of `bases`, a `FoldRoute.parity_base`
    each), the positions in `rows` of the rows it takes and their rows in its PS's parity variable.

    The one statement of fold routing: `EcRec>RouteDeltas` computes it in the step's graph and is tested
    against this function (tests/unit/test_ops_parity.py); settlement's expected folds call it.
    """
    local = rows // chunk_rows
    out = []
    for base in bases:
        at = np.flatnonzero(base[local] >= 0)
        out.append((at, base[local[at]] + rows[at] % chunk_rows))
    return out


@dataclass(frozen=True)
class TableLayout:
    """The chunks and stripes of one table.

    Attributes:
        spec: The table.
        chunk_rows: Rows per chunk.
        stripes: The stripes, in row order.
    """

    spec: TableSpec
    chunk_rows: int
    stripes: tuple[StripeSpec, ...]

    @property
    def name(self) -> str:
        """Table name."""
        return self.spec.name

    @property
    def num_stripes(self) -> int:
        """Number of stripes."""
        return len(self.stripes)

    @property
    def data_chunks(self) -> tuple[ChunkSpec, ...]:
        """Data chunks in row order (index = chunk number)."""
        return tuple(c for s in self.stripes for c in s.data)

    @property
    def parity_chunks(self) -> tuple[ChunkSpec, ...]:
        """Parity chunks in chunk-number order."""
        return tuple(c for s in self.stripes for c in s.parity)

    @property
    def padded_rows(self) -> int:
        """Rows of all data chunks, padding included."""
        return len(self.data_chunks) * self.chunk_rows

    @property
    def padding_rows(self) -> int:
        """Rows added past the end of the table."""
        return self.padded_rows - self.spec.rows

    @functools.cached_property
    def chunk_ps(self) -> np.ndarray:
        """Read-only ``int64`` array: the PS of each data chunk, by chunk number."""
        ps = np.array([c.ps for c in self.data_chunks], dtype=np.int64)
        ps.flags.writeable = False
        return ps

    @functools.cached_property
    def _on_ps(self) -> dict[tuple[int, str], tuple[ChunkSpec, ...]]:
        on: dict[tuple[int, str], list[ChunkSpec]] = {}
        for c in self.data_chunks + self.parity_chunks:  # chunk-number order within each kind
            on.setdefault((c.ps, c.kind), []).append(c)
        return {key: tuple(chunks) for key, chunks in on.items()}

    @functools.cached_property
    def _local(self) -> dict[ChunkSpec, int]:
        return {c: i for chunks in self._on_ps.values() for i, c in enumerate(chunks)}

    def chunks_on(self, ps: int, kind: ChunkKind) -> tuple[ChunkSpec, ...]:
        """The chunks of ``kind`` held by ``ps``, in the order its variable of that kind stacks them.

        A PS holds one variable per kind (and per slot) for the table: its
        chunks of that kind one after another, in chunk-number order (for
        parity: stripe, then parity index).
        """
        return self._on_ps.get((int(ps), kind), ())

    @functools.cached_property
    def chunk_local(self) -> np.ndarray:
        """Read-only ``int64`` array: the local index of each data chunk (by chunk number) on its PS."""
        local = np.array([self.local_index(c) for c in self.data_chunks], dtype=np.int64)
        local.flags.writeable = False
        return local

    def local_index(self, chunk: ChunkSpec) -> int:
        """Position of ``chunk`` in :meth:`chunks_on` of its PS and kind."""
        return self._local[chunk]

    def local_rows(self, chunk: ChunkSpec) -> tuple[int, int]:
        """Rows ``[start, stop)`` of ``chunk`` in its PS's variable of its kind."""
        start = self.local_index(chunk) * self.chunk_rows
        return start, start + self.chunk_rows

    def folds_from(self, ps: int) -> tuple[tuple[int, ChunkSpec, ChunkSpec], ...]:
        """Where updates of the data ``ps`` holds fold: ``(local data chunk, data chunk, parity chunk)``
        for every parity chunk protecting each of its data chunks, in local order."""
        return tuple((i, dc, pc) for i, dc in enumerate(self.chunks_on(ps, ChunkKind.DATA)) for pc in self.stripes[dc.stripe].parity)

    @functools.cached_property
    def _routes(self) -> dict[tuple[int, int, int], tuple[FoldRoute, ...]]:
        return {}

    def fold_routes(self, ps: int, code: Code) -> tuple[FoldRoute, ...]:
        """The data of ``ps`` grouped by where its deltas fold, sorted by (parity index, PS, coefficient).

        Computed once per PS and code; the layout says where, ``code`` with
        which coefficient.
        """
        key = (int(ps), code.k, code.r)
        if key not in self._routes:
            groups: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
            for lc, dc, pc in self.folds_from(ps):
                group = (pc.position, pc.ps, code.coef(pc.position, dc.position))
                groups.setdefault(group, []).append((lc, self.local_rows(pc)[0]))
            routes = []
            for (position, q, coef), members in sorted(groups.items()):
                base = np.full(len(self.chunks_on(ps, ChunkKind.DATA)), -1, dtype=np.int64)
                for lc, first in members:
                    base[lc] = first
                local = np.array([lc for lc, _ in members], dtype=np.int64)
                routes.append(FoldRoute(q, position, coef, local, base))
            self._routes[key] = tuple(routes)
        return self._routes[key]

    def unrecoverable_stripes(self, failed_ps: Iterable[int], r: int) -> tuple[StripeSpec, ...]:
        """Stripes of this table that lose more than ``r`` chunks if the PS in ``failed_ps`` die."""
        failed = set(failed_ps)
        return tuple(s for s in self.stripes if sum(p in failed for p in s.ps) > r)

    def locate(self, row: int) -> RowLocation:
        """Return where table row ``row`` lives.

        Raises:
            ConfigError: If ``row`` is not a row of the table.
        """
        found = self.locate_many(np.array([row]))
        return RowLocation(
            table=self.name,
            row=int(found.row[0]),
            chunk=int(found.chunk[0]),
            stripe=int(found.stripe[0]),
            position=int(found.position[0]),
            ps=int(found.ps[0]),
            offset=int(found.offset[0]),
        )

    def locate_many(self, rows: np.ndarray | Sequence[int]) -> RowLocations:
        """Vectorized :meth:`locate` for an array of row ids (any shape).

        Raises:
            ConfigError: If an id is not an integer row of the table; padding
                rows are not rows of the table.
        """
        ids = np.asarray(rows)
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise ConfigError(f"row ids of table {self.name!r} must be integers, got dtype {ids.dtype}")
        ids = ids.astype(np.int64)
        bad = (ids < 0) | (ids >= self.spec.rows)
        if bad.any():
            raise ConfigError(
                f"row id {int(ids[bad].reshape(-1)[0])} is outside table {self.name!r}, whose rows are "
                f"0..{self.spec.rows - 1}"
            )
        k = len(self.stripes[0].data)
        chunk = ids // self.chunk_rows
        return RowLocations(
            table=self.name,
            row=ids,
            chunk=chunk,
            stripe=chunk // k,
            position=chunk % k,
            ps=self.chunk_ps[chunk],
            offset=ids % self.chunk_rows,
        )
