"""A reader of the Criteo click-log TSV format, by record ranges.

The files are indexed once (the byte offset of every line start, found with a
vectorised scan of a memory map) so that any range of records can be read
without reading what precedes it: the master's dynamic sharding and static
round-robin sharding both address records by a global index over the files
in the order given.

Lines are validated in bulk: one compiled regular expression counts the
well-formed lines of a whole range; only when the count falls short are the
lines checked one by one.  A corrupt line (wrong field count, label not 0/1,
non-integer count, non-hex categorical) is counted and skipped, or, with
``on_corrupt="fail"``, raises `tf_ecrec.errors.DataError` naming the file, the
line number, the rule and the line.  It is never trained on.

Well-formed lines are parsed in the TensorFlow graph (`decode_csv`, then the
categoricals hashed into each table's rows), see `tf_ecrec.data.pipeline`.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import threading
from collections.abc import Sequence

import numpy as np

from tf_ecrec.data.schema import NUM_CAT, NUM_DENSE
from tf_ecrec.errors import ConfigError, DataError

_LOG = logging.getLogger(__name__)

ON_CORRUPT = ("skip", "fail")
# Empty, or an integer of at most 18 digits: every such value fits int64, which
# the graph parses it into ("-" alone, or a longer number, is a corrupt line).
_INT = rb"(?:-?[0-9]{1,18})?"
_HEX = rb"[0-9a-fA-F]*"
_LINE = rb"[01](?:\t" + _INT + rb"){%d}(?:\t" % NUM_DENSE + _HEX + rb"){%d}\r?" % NUM_CAT
_VALID_LINE = re.compile(_LINE)
_VALID_LINES = re.compile(rb"^" + _LINE + rb"$", re.MULTILINE)


def check_line(line: bytes) -> str | None:
    """Returns None for a well-formed line, else the rule it breaks."""
    if _VALID_LINE.fullmatch(line):
        return None
    fields = line.rstrip(b"\r").split(b"\t")
    if len(fields) != 1 + NUM_DENSE + NUM_CAT:
        return f"expected {1 + NUM_DENSE + NUM_CAT} tab-separated fields, found {len(fields)}"
    if fields[0] not in (b"0", b"1"):
        return f"label must be 0 or 1, found {fields[0][:20]!r}"
    for i, f in enumerate(fields[1 : 1 + NUM_DENSE]):
        if not re.fullmatch(_INT, f):
            return f"integer feature I{i + 1} must be an integer of at most 18 digits (int64) or empty, found {f[:20]!r}"
    for i, f in enumerate(fields[1 + NUM_DENSE :]):
        if not re.fullmatch(_HEX, f):
            return f"categorical feature C{i + 1} must be hex or empty, found {f[:20]!r}"
    return "malformed line"  # pragma: no cover - the checks above are exhaustive


class CriteoFiles:
    """Records of one or more Criteo TSV files, addressed by a global index.

    Args:
      paths: the files, read in this order.
      on_corrupt: "skip" (count and drop corrupt lines) or "fail".

    Attributes:
      num_records: lines in all files (corrupt ones included: a record index
        names a line, whether or not it turns out to be trainable).
      corrupt_records: corrupt lines met so far by `read_lines` (thread-safe).
    """

    def __init__(self, paths: Sequence[str], on_corrupt: str = "skip") -> None:
        if on_corrupt not in ON_CORRUPT:
            raise ConfigError(f"on_corrupt must be one of {ON_CORRUPT}, got {on_corrupt!r}; source: --on-corrupt")
        if not paths:
            raise ConfigError("criteo data needs at least one file; source: --data criteo:PATH")
        self.paths = [os.fspath(p) for p in paths]
        self.on_corrupt = on_corrupt
        self._maps: list[mmap.mmap | bytes] = []
        self._offsets: list[np.ndarray] = []
        for path in self.paths:
            try:
                with open(path, "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    data: mmap.mmap | bytes = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
            except OSError as exc:
                raise ConfigError(f"cannot open Criteo file {path!r} ({exc}); source: --data") from exc
            self._maps.append(data)
            self._offsets.append(_line_starts(data))
        counts = np.array([len(o) - 1 for o in self._offsets], dtype=np.int64)
        self._first = np.concatenate([[0], np.cumsum(counts)])
        self.num_records = int(self._first[-1])
        if self.num_records == 0:
            raise ConfigError(f"Criteo files {self.paths} contain no records; source: --data")
        self._lock = threading.Lock()
        self.corrupt_records = 0

    def describe(self) -> str:
        return f"criteo({', '.join(self.paths)}; records={self.num_records})"

    def read_lines(self, start: int, end: int) -> list[bytes]:
        """The well-formed lines among records [start, end) (indices modulo the epoch).

        Raises:
          DataError: a corrupt line under on_corrupt="fail".
        """
        out: list[bytes] = []
        n = self.num_records
        pos = start
        while pos < end:
            epoch_pos = pos % n
            take = min(end - pos, n - epoch_pos)
            out.extend(self._read_epoch_range(epoch_pos, epoch_pos + take))
            pos += take
        return out

    def _read_epoch_range(self, start: int, end: int) -> list[bytes]:
        out: list[bytes] = []
        f = int(np.searchsorted(self._first, start, side="right")) - 1
        while start < end:
            local_start = start - int(self._first[f])
            local_end = min(end, int(self._first[f + 1])) - int(self._first[f])
            offsets = self._offsets[f]
            lo, hi = int(offsets[local_start]), int(offsets[local_end])
            chunk = self._maps[f][lo:hi]
            lines = chunk.split(b"\n")
            if lines and lines[-1] == b"":
                lines.pop()
            if len(_VALID_LINES.findall(chunk)) == len(lines):
                out.extend(lines)
            else:
                out.extend(self._filter(lines, f, local_start))
            start = int(self._first[f]) + local_end
            f += 1
        return out

    def _filter(self, lines: list[bytes], f: int, first_line: int) -> list[bytes]:
        good = []
        for i, line in enumerate(lines):
            rule = check_line(line)
            if rule is None:
                good.append(line)
                continue
            where = f"{self.paths[f]}:{first_line + i + 1}"
            if self.on_corrupt == "fail":
                raise DataError(
                    f"corrupt record at {where}: {rule}; line: {line[:120]!r}. "
                    "Fix the file or run with --on-corrupt skip to count and skip such lines."
                )
            with self._lock:
                self.corrupt_records += 1
                count = self.corrupt_records
            if count <= 10 or count % 1000 == 0:
                _LOG.warning("skipping corrupt record %s (%s); %d skipped so far", where, rule, count)
        return good


def _line_starts(data: mmap.mmap | bytes) -> np.ndarray:
    """Byte offsets of every line start plus the end offset (a final line may lack its newline)."""
    size = len(data)
    if size == 0:
        return np.zeros(1, dtype=np.int64)
    buf = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(buf == ord("\n")).astype(np.int64)
    starts = np.concatenate([[0], newlines + 1])
    if starts[-1] != size:  # last line without a trailing newline
        starts = np.concatenate([starts, [size]])
    return starts
