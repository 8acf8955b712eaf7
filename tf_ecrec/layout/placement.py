"""Where every chunk of every erasure-coded table lives: a pure layout planner (one table's chunks and
stripes, and the lookups on them, are `tf_ecrec.layout.table_layout`).

:func:`plan` takes the number of parameter-server (PS) tasks ``N``, a code of
``k`` data and ``r`` parity chunks per stripe (see :mod:`tf_ecrec.erasure.codec`) and
the tables to protect, and returns a :class:`Layout`.  Nothing here touches
TensorFlow; the graph builder turns each data chunk into a variable on its PS
and each parity chunk into a variable on its PS, and parity row ``i`` of a
stripe covers row ``i`` of each of the stripe's ``k`` data chunks.

The rules
---------
* A table of ``R`` rows is cut into ``S * k`` chunks of ``c`` consecutive rows
  (data chunk ``d`` holds table rows ``[d*c, (d+1)*c)``), and data chunks
  ``s*k .. s*k + k-1`` form stripe ``s``.  ``S * k * c`` may exceed ``R``: the
  rows past the end are *padding*.  Padding rows are zero, never addressed by
  a lookup, and never stand for a dropped row; they exist only so that all
  chunks of a stripe have one shape.
* The stripe count is ``S = N`` when ``R >= N * k`` (every table big enough
  gives each PS exactly ``k`` of its data chunks and ``r`` of its parity
  chunks), otherwise ``S = ceil(R / k)`` with one-row chunks (a small table
  gets as many stripes as it can fill, and less than ``k`` padding rows).
  Then ``c = ceil(R / (S * k))``, so padding is below ``N * k`` rows.
* Stripe ``s`` of the table listed ``t``-th starts at PS
  ``o = (t + floor(s * N / S)) mod N``; its chunk with index ``i`` in the
  stripe (``0 .. k-1`` data, then ``k .. k+r-1`` parity, the codec's chunk
  numbering) goes to PS ``(o + i) mod N``.  Since ``k + r <= N`` the ``k + r``
  chunks of a stripe sit on distinct PS, so the loss of any ``r`` PS costs a
  stripe at most ``r`` chunks.  The start offsets are spread evenly round the
  ring, hence every PS holds ``floor`` or ``ceil`` of ``S*k/N`` data chunks
  and of ``S*r/N`` parity chunks of each table (exactly ``k`` and ``r`` when
  ``S = N``), and parity rotates: unlike ECRec's layout, where ``N = k + r``
  put every parity on one PS, no PS holds only parity.

Worked example: ``plan(3, 2, 1, [TableSpec("emb", rows=10, dim=4)])``.
``R = 10 >= N*k = 6``, so ``S = 3`` stripes, ``c = ceil(10/6) = 2`` rows per
chunk, 12 padded rows of which 2 are padding::

    stripe  start  data chunk (rows) -> PS               parity -> PS
    0       0      0 [0,2) -> 0     1 [2,4)   -> 1       p0 -> 2
    1       1      2 [4,6) -> 1     3 [6,8)   -> 2       p0 -> 0
    2       2      4 [8,10) -> 2    5 [10,12) -> 0       p0 -> 1

Each PS holds two data chunks and one parity chunk.  Row 7 is in data
chunk 3, i.e. stripe 1, position 1, on PS 2 at local row 1.  Chunk 5 is all
padding.  With float32 values: 160 table bytes, 32 padding bytes, 192 data
bytes and 96 parity bytes, an overhead of exactly r/k = 1/2.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from tf_ecrec.erasure.codec import MAX_STRIPE_WIDTH
from tf_ecrec.errors import ConfigError
from tf_ecrec.layout.table_layout import (
    ChunkKind,
    ChunkSpec,
    RowLocation,
    StripeSpec,
    TableLayout,
    TableSpec,
    is_int,
)

logger = logging.getLogger(__name__)

__all__ = ["LAYOUT_FORMAT", "LAYOUT_VERSION", "Layout", "LayoutSummary", "PsBytes", "plan"]

LAYOUT_FORMAT = "tf_ecrec.layout"
"""Value of the ``format`` key of a serialized layout."""

LAYOUT_VERSION = 1
"""Version of the serialized layout this module writes and reads."""



@dataclass(frozen=True)
class PsBytes:
    """Bytes one PS holds.

    Attributes:
        ps: PS task index.
        data: Bytes of data chunks (padding included).
        parity: Bytes of parity chunks.
        padding: Bytes of the padding rows among ``data``.
    """

    ps: int
    data: int
    parity: int
    padding: int


@dataclass(frozen=True)
class LayoutSummary:
    """Memory accounting of a layout for values of ``itemsize`` bytes.

    Attributes:
        itemsize: Bytes per value.
        table_bytes: Bytes of real table rows.
        padding_bytes: Bytes of padding rows.
        data_bytes: ``table_bytes + padding_bytes``: the protected bytes.
        parity_bytes: Bytes of parity chunks.
        overhead_ratio: ``parity_bytes / data_bytes``, exactly ``r / k``.
        per_ps: One :class:`PsBytes` per PS task, by index.
    """

    itemsize: int
    table_bytes: int
    padding_bytes: int
    data_bytes: int
    parity_bytes: int
    overhead_ratio: Fraction
    per_ps: tuple[PsBytes, ...]


@dataclass(frozen=True)
class Layout:
    """The placement of every chunk of every table over ``num_ps`` PS tasks.

    Build it with :func:`plan` or :meth:`from_json`.

    Attributes:
        num_ps: Number of PS tasks.
        k: Data chunks per stripe.
        r: Parity chunks per stripe.
        tables: One :class:`TableLayout` per table, in the order given.
    """

    num_ps: int
    k: int
    r: int
    tables: tuple[TableLayout, ...]

    @functools.cached_property
    def _by_name(self) -> dict[str, TableLayout]:
        return {t.name: t for t in self.tables}

    def table(self, name: str) -> TableLayout:
        """Return the layout of table ``name``.

        Raises:
            ConfigError: If there is no such table.
        """
        if name in self._by_name:
            return self._by_name[name]
        raise ConfigError(f"no table {name!r} in the layout; tables: {[t.name for t in self.tables]}")

    def locate(self, table: str, row: int) -> RowLocation:
        """Return where row ``row`` of table ``table`` lives (see :meth:`TableLayout.locate`)."""
        return self.table(table).locate(row)

    def chunks(self) -> tuple[ChunkSpec, ...]:
        """Every chunk, table by table, stripe by stripe, codec order."""
        return tuple(c for t in self.tables for s in t.stripes for c in s.chunks)

    def chunks_on(self, ps: int) -> tuple[ChunkSpec, ...]:
        """The chunks PS task ``ps`` holds (what is lost when it dies)."""
        return tuple(c for c in self.chunks() if c.ps == ps)

    def stripe_of(self, chunk: ChunkSpec) -> StripeSpec:
        """Return the stripe a chunk belongs to."""
        return self.table(chunk.table).stripes[chunk.stripe]

    def parity_of(self, chunk: ChunkSpec) -> tuple[ChunkSpec, ...]:
        """Return the parity chunks (and through them the PS) protecting ``chunk``'s stripe."""
        return self.stripe_of(chunk).parity

    def unrecoverable_stripes(self, failed_ps: Iterable[int]) -> tuple[StripeSpec, ...]:
        """Stripes that lose more than ``r`` chunks if the PS in ``failed_ps`` die.

        Empty whenever at most ``r`` PS fail.
        """
        failed = tuple(failed_ps)
        return tuple(s for t in self.tables for s in t.unrecoverable_stripes(failed, self.r))

    def summary(self, itemsize: int = 4) -> LayoutSummary:
        """Return the memory accounting for values of ``itemsize`` bytes.

        Optimizer slots shaped like the table multiply every figure alike.
        """
        data = [0] * self.num_ps
        parity = [0] * self.num_ps
        padding = [0] * self.num_ps
        table_bytes = 0
        for table in self.tables:
            table_bytes += table.spec.rows * table.spec.dim * itemsize
            for chunk in (c for s in table.stripes for c in s.chunks):
                if chunk.is_data:
                    data[chunk.ps] += chunk.nbytes(itemsize)
                    padding[chunk.ps] += chunk.padding_rows * chunk.dim * itemsize
                else:
                    parity[chunk.ps] += chunk.nbytes(itemsize)
        data_bytes = sum(data)
        parity_bytes = sum(parity)
        ratio = Fraction(parity_bytes, data_bytes) if data_bytes else Fraction(self.r, self.k)
        return LayoutSummary(
            itemsize=itemsize,
            table_bytes=table_bytes,
            padding_bytes=sum(padding),
            data_bytes=data_bytes,
            parity_bytes=parity_bytes,
            overhead_ratio=ratio,
            per_ps=tuple(PsBytes(p, data[p], parity[p], padding[p]) for p in range(self.num_ps)),
        )

    def to_json(self) -> str:
        """Serialize to a stable JSON string (sorted keys, no whitespace).

        Only the inputs, the chunk size and each stripe's PS are stored; every
        other field follows from them.
        """
        doc = {
            "format": LAYOUT_FORMAT,
            "version": LAYOUT_VERSION,
            "num_ps": self.num_ps,
            "k": self.k,
            "r": self.r,
            "tables": [
                {
                    "name": t.name,
                    "rows": t.spec.rows,
                    "dim": t.spec.dim,
                    "chunk_rows": t.chunk_rows,
                    "stripes": [list(s.ps) for s in t.stripes],
                }
                for t in self.tables
            ],
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, source: str = "layout JSON") -> Layout:
        """Read a layout written by :meth:`to_json`, checking every rule.

        Args:
            text: The JSON text.
            source: Where the text came from (a manifest path), for messages.

        Raises:
            ConfigError: If the text is not a valid layout.
        """
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"layout is not valid JSON ({exc}); source: {source}") from exc
        try:
            return cls._from_doc(doc)
        except ConfigError as exc:
            raise ConfigError(f"{exc}; source: {source}") from exc
        except (AttributeError, KeyError, TypeError) as exc:
            raise ConfigError(f"layout is malformed ({type(exc).__name__}: {exc}); source: {source}") from exc

    @classmethod
    def _from_doc(cls, doc: Any) -> Layout:
        if doc.get("format") != LAYOUT_FORMAT or doc.get("version") != LAYOUT_VERSION:
            raise ConfigError(
                f"layout has format {doc.get('format')!r} version {doc.get('version')!r}, expected "
                f"{LAYOUT_FORMAT!r} version {LAYOUT_VERSION}"
            )
        num_ps, k, r = doc["num_ps"], doc["k"], doc["r"]
        _check_code(num_ps, k, r)
        tables = []
        for entry in doc["tables"]:
            spec = TableSpec(entry["name"], entry["rows"], entry["dim"])
            tables.append(_build_table(spec, num_ps, k, r, entry["chunk_rows"], entry["stripes"]))
        _check_unique([t.spec for t in tables])
        return cls(num_ps=int(num_ps), k=int(k), r=int(r), tables=tuple(tables))


# --- planning -------------------------------------------------------------------------


def _check_code(num_ps: Any, k: Any, r: Any) -> None:
    for name, value in (("num_ps", num_ps), ("k", k), ("r", r)):
        if not is_int(value):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
    if num_ps < 1:
        raise ConfigError(f"num_ps = {num_ps}: there must be at least 1 PS task")
    if k < 1:
        raise ConfigError(f"k = {k}: a stripe needs at least 1 data chunk")
    if r < 1:
        raise ConfigError(f"r = {r}: a stripe needs at least 1 parity chunk, or nothing is protected")
    if k + r > num_ps:
        raise ConfigError(
            f"code (k={k}, r={r}) puts k + r = {k + r} chunks of each stripe on distinct PS, but there "
            f"are only num_ps = {num_ps} PS tasks; use at least {k + r} PS or a smaller code"
        )
    if k + r > MAX_STRIPE_WIDTH:
        raise ConfigError(f"code (k={k}, r={r}) has k + r = {k + r} chunks per stripe, more than {MAX_STRIPE_WIDTH}")


def _check_unique(specs: Sequence[TableSpec]) -> None:
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"duplicate table name(s) {duplicates}: every table must have a unique name")


def _check_rows(spec: TableSpec, k: int) -> None:
    if spec.rows < k:
        raise ConfigError(
            f"table {spec.name!r} has {spec.rows} rows, fewer than k = {k}: a stripe needs at least one "
            f"row in each of its {k} data chunks"
        )


def _build_table(
    spec: TableSpec, num_ps: int, k: int, r: int, chunk_rows: Any, stripe_ps: Sequence[Sequence[int]]
) -> TableLayout:
    """Make a table's chunks from its chunk size and each stripe's PS, checking the rules."""
    n = k + r
    if not is_int(chunk_rows) or chunk_rows < 1:
        raise ConfigError(f"table {spec.name!r}: chunk_rows = {chunk_rows!r} must be a positive integer")
    _check_rows(spec, k)
    if len(stripe_ps) < 1 or len(stripe_ps) * k * chunk_rows < spec.rows:
        raise ConfigError(
            f"table {spec.name!r}: {len(stripe_ps)} stripes of {k} chunks of {chunk_rows} rows do not cover "
            f"its {spec.rows} rows"
        )
    stripes = []
    for s, ps_list in enumerate(stripe_ps):
        ps_list = list(ps_list)
        if len(ps_list) != n or not all(is_int(p) and 0 <= p < num_ps for p in ps_list):
            raise ConfigError(f"table {spec.name!r} stripe {s}: PS list {ps_list} must name k + r = {n} PS in 0..{num_ps - 1}")
        if len(set(ps_list)) != n:
            raise ConfigError(f"table {spec.name!r} stripe {s}: PS list {ps_list} puts two chunks of one stripe on one PS")
        first_row = s * k * chunk_rows
        stripe_real = min(chunk_rows, max(0, spec.rows - first_row))
        chunks = []
        for i, ps in enumerate(ps_list):
            if i < k:
                row_start = first_row + i * chunk_rows
                real = min(chunk_rows, max(0, spec.rows - row_start))
                kind, position, chunk_no = ChunkKind.DATA, i, s * k + i
            else:
                row_start, real = None, stripe_real
                kind, position, chunk_no = ChunkKind.PARITY, i - k, s * r + (i - k)
            chunks.append(ChunkSpec(table=spec.name, kind=kind, stripe=s, position=position, index_in_stripe=i,
                                    chunk=chunk_no, ps=int(ps), rows=int(chunk_rows), dim=spec.dim,
                                    row_start=row_start, real_rows=real))
        stripes.append(StripeSpec(table=spec.name, index=s, chunks=tuple(chunks)))
    return TableLayout(spec=spec, chunk_rows=int(chunk_rows), stripes=tuple(stripes))


def _stripe_count(rows: int, num_ps: int, k: int) -> int:
    return num_ps if rows >= num_ps * k else math.ceil(rows / k)


def plan(
    num_ps: int, code_k: int, code_r: int, tables: Iterable[TableSpec | tuple[str, int, int]]
) -> Layout:
    """Place the chunks of ``tables`` on ``num_ps`` PS for a ``(k, r)`` code.

    See the module docstring for the rules and a worked example.

    Args:
        num_ps: Number of PS tasks, at least ``code_k + code_r``.
        code_k: Data chunks per stripe.
        code_r: Parity chunks per stripe.
        tables: :class:`TableSpec` values or ``(name, rows, dim)`` tuples.

    Returns:
        The layout.

    Raises:
        ConfigError: If the code does not fit on ``num_ps`` PS, a table has
            fewer than ``k`` rows or a bad dim, or two tables share a name.
    """
    _check_code(num_ps, code_k, code_r)
    specs = [t if isinstance(t, TableSpec) else TableSpec(*t) for t in tables]
    _check_unique(specs)
    n = code_k + code_r
    layouts = []
    for t, spec in enumerate(specs):
        _check_rows(spec, code_k)
        stripes = _stripe_count(spec.rows, num_ps, code_k)
        chunk_rows = math.ceil(spec.rows / (stripes * code_k))
        starts = [(t + (s * num_ps) // stripes) % num_ps for s in range(stripes)]
        stripe_ps = [[(o + i) % num_ps for i in range(n)] for o in starts]
        layouts.append(_build_table(spec, num_ps, code_k, code_r, chunk_rows, stripe_ps))
        logger.debug(
            "table %r: %d stripes of %d x %d-row chunks, %d padding rows",
            spec.name, stripes, code_k, chunk_rows, layouts[-1].padding_rows,
        )
    return Layout(num_ps=int(num_ps), k=int(code_k), r=int(code_r), tables=tuple(layouts))

