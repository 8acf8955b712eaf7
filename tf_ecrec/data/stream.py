"""Unbounded data: records that arrive while the job trains, addressed by offsets.

Two shapes of stream, one interface (`PartitionedStream`): partitions, each an append-only
sequence of records with offsets ``0, 1, 2, ...``, whose end grows.

- `StreamDirectory`: a directory of Criteo TSV files that grows.  A producer writes each file under
  a hidden or ``.tmp`` name and renames it into place (``part-000017.tsv``), so a visible file is
  whole and never changes; files are taken in name order, so names must sort in the order they
  appear (a file that sorts before one already taken is refused: `DataError`).  The directory is
  one partition whose offsets run across its files.  A ``_CLOSED`` file ends the stream.
- A message queue (Kafka-like topics): a `PartitionedStream` whose partitions are the topic's, its
  offsets the broker's.  `MemoryQueue` is the in-process implementation, and
  `tf_ecrec.data.redis_stream.RedisStreamQueue` the one on a real broker (Redis Streams; Kafka does
  not install from this machine's package registries); one contract test runs on both.

What a job has trained is a set of offset ranges per partition (the master's shard state, saved
with the model), so a restart resumes at the saved offsets: nothing skipped, nothing repeated beyond
the records in flight when the state was saved.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Protocol

from tf_ecrec.data.criteo import CriteoFiles, check_line
from tf_ecrec.errors import ConfigError, DataError, StreamUnavailable

CLOSED = "_CLOSED"
SUFFIX = ".tsv"
CAPACITY = 1 << 50
"""The most records a stream's index space holds (its master dataset's ``total_records``)."""
READ_RETRY_SECS = 60.0
"""How long a trainer's read of a queue partition retries a broker that does not answer."""


class PartitionedStream(Protocol):
    """Append-only partitions of records addressed by offsets."""

    def partitions(self) -> list[str]: ...
    def end_offset(self, partition: str) -> int: ...
    def read(self, partition: str, start: int, end: int) -> list[bytes]: ...
    @property
    def closed(self) -> bool: ...


class StreamDirectory:
    """A growing directory of Criteo TSV files as one partition (see the module docstring).

    Args:
      path: the directory.
      on_corrupt: what a corrupt line does (`tf_ecrec.data.criteo.CriteoFiles`).
    """

    PARTITION = "files"

    def __init__(self, path: str, on_corrupt: str = "skip") -> None:
        if not os.path.isdir(path):
            raise ConfigError(f"stream directory {path!r} does not exist; rule: an existing directory; source: --data stream:DIR")
        self.path = path
        self.on_corrupt = on_corrupt
        self._files: list[tuple[str, CriteoFiles]] = []
        self._first: list[int] = [0]  # offset of each file's first record, then the end
        self._closed = False
        self._lock = threading.Lock()
        self.refresh()

    def refresh(self) -> int:
        """Takes the files that appeared since the last call; returns the end offset."""
        with self._lock:
            closed = os.path.exists(os.path.join(self.path, CLOSED))  # before the listing: no file after it is missed
            names = sorted(n for n in os.listdir(self.path) if n.endswith(SUFFIX) and not n.startswith((".", "_")))
            last = self._files[-1][0] if self._files else None
            for name in names:
                if last is not None and name <= last:
                    if name < last and name not in {n for n, _ in self._files}:
                        raise DataError(
                            f"stream file {name!r} appeared after {last!r} but sorts before it; rule: files appear in "
                            f"name order (part-000001.tsv, part-000002.tsv, ...); source: {self.path}")
                    continue
                files = CriteoFiles([os.path.join(self.path, name)], on_corrupt=self.on_corrupt)
                self._files.append((name, files))
                self._first.append(self._first[-1] + files.num_records)
                last = name
            self._closed = closed
            return self._first[-1]

    def partitions(self) -> list[str]:
        return [self.PARTITION]

    def end_offset(self, partition: str = PARTITION) -> int:
        self._check(partition)
        return self._first[-1]

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def corrupt_records(self) -> int:
        return sum(f.corrupt_records for _, f in self._files)

    def read(self, partition: str, start: int, end: int) -> list[bytes]:
        """The well-formed lines among offsets [start, end) (refreshing if the range is not all seen yet).

        Raises:
          DataError: the range goes past the stream's end, or a corrupt line under on_corrupt="fail".
        """
        self._check(partition)
        if end > self._first[-1]:
            self.refresh()
        if not 0 <= start <= end <= self._first[-1]:
            raise DataError(f"stream offsets [{start}, {end}) are outside [0, {self._first[-1]}); source: {self.path}")
        out: list[bytes] = []
        for i, (_, files) in enumerate(self._files):
            lo, hi = max(start, self._first[i]), min(end, self._first[i + 1])
            if lo < hi:
                out.extend(files.read_lines(lo - self._first[i], hi - self._first[i]))
        return out

    # As a source of TSV lines by record index (the leased pipeline reads it like `CriteoFiles`).

    @property
    def num_records(self) -> int:
        return self._first[-1]

    def read_lines(self, start: int, end: int) -> list[bytes]:
        return self.read(self.PARTITION, start, end)

    def describe(self) -> str:
        return f"stream({self.path}; records={self._first[-1]}{', closed' if self._closed else ''})"

    def _check(self, partition: str) -> None:
        if partition != self.PARTITION:
            raise DataError(f"stream partition {partition!r}; rule: a directory stream has the one partition "
                            f"{self.PARTITION!r}; source: {self.path}")


class MemoryQueue:
    """An in-process message queue: topics' partitions of records, appended by producers."""

    def __init__(self, partitions: Sequence[str]) -> None:
        if not partitions or len(set(partitions)) != len(partitions):
            raise ConfigError(f"partitions={list(partitions)!r}; rule: distinct names, at least one; source: MemoryQueue")
        self._records: dict[str, list[bytes]] = {p: [] for p in partitions}
        self._closed = False
        self._lock = threading.Lock()

    def append(self, partition: str, records: Sequence[bytes]) -> int:
        """Appends `records` to `partition`; returns its new end offset."""
        with self._lock:
            if self._closed:
                raise DataError(f"append to a closed queue; source: MemoryQueue partition {partition!r}")
            self._records[self._known(partition)].extend(records)
            return len(self._records[partition])

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def partitions(self) -> list[str]:
        return list(self._records)

    def end_offset(self, partition: str) -> int:
        with self._lock:
            return len(self._records[self._known(partition)])

    @property
    def closed(self) -> bool:
        return self._closed

    def read(self, partition: str, start: int, end: int) -> list[bytes]:
        with self._lock:
            records = self._records[self._known(partition)]
            if not 0 <= start <= end <= len(records):
                raise DataError(f"offsets [{start}, {end}) are outside [0, {len(records)}) of partition {partition!r}; "
                                "source: MemoryQueue")
            return records[start:end]

    def _known(self, partition: str) -> str:
        if partition not in self._records:
            raise DataError(f"no partition {partition!r}; rule: one of {list(self._records)}; source: MemoryQueue")
        return partition


class PartitionSource:
    """One partition of a message queue (`PartitionedStream`) as a source of Criteo TSV lines by record
    index: what the launcher's feed and the leased pipeline read, as they read a `StreamDirectory`.

    Records are Criteo lines; a malformed one is counted and skipped (``on_corrupt="skip"``) or a
    `DataError` naming its partition and offset (``"fail"``), as a file's would be.
    """

    def __init__(self, queue: PartitionedStream, partition: str, on_corrupt: str = "skip", name: str = "") -> None:
        if partition not in queue.partitions():
            raise ConfigError(f"partition {partition!r}; rule: one of {queue.partitions()}; source: {name or 'the queue'}")
        self.queue = queue
        self.partition = partition
        self.on_corrupt = on_corrupt
        self.name = name or f"partition {partition}"
        self.corrupt_records = 0
        self._end = 0
        self._closed = False
        self._lock = threading.Lock()
        self.refresh()

    def refresh(self) -> int:
        """Reads the partition's end (and whether the topic is closed); returns the end offset."""
        closed = self.queue.closed  # before the end: a close seen means every append before it is counted
        end = self.queue.end_offset(self.partition)
        with self._lock:
            self._end, self._closed = max(self._end, end), self._closed or closed
            return self._end

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def num_records(self) -> int:
        return self._end

    def read_lines(self, start: int, end: int) -> list[bytes]:
        """The well-formed records among offsets [start, end)."""
        if end > self._end:
            self.refresh()
        good = []
        for i, record in enumerate(self._read(start, end)):
            line = record.rstrip(b"\n")
            rule = check_line(line)
            if rule is None:
                good.append(line)
                continue
            if self.on_corrupt == "fail":
                raise DataError(f"corrupt record at offset {start + i} of {self.name}: {rule}; record: {line[:120]!r}. "
                                "Fix the producer or run with --on-corrupt skip to count and skip such records.")
            with self._lock:
                self.corrupt_records += 1
        return good

    def describe(self) -> str:
        return f"stream({self.name}; records={self._end}{', closed' if self._closed else ''})"

    def _read(self, start: int, end: int) -> list[bytes]:
        """The queue's records, a broker that does not answer retried for up to `READ_RETRY_SECS`."""
        from tf_ecrec.base.retry import Retry

        retry = Retry(max_tries=20, delay=0.2, deadline=READ_RETRY_SECS, retry_if=lambda exc: isinstance(exc, StreamUnavailable))
        return retry(self.queue.read, self.partition, start, end)


def open_stream(target: str, on_corrupt: str = "skip") -> StreamDirectory | PartitionSource:
    """What ``--data stream:TARGET`` names: a directory, or a Redis Streams partition
    (``redis://HOST:PORT/DB/TOPIC/PARTITION``, `tf_ecrec.data.redis_stream`)."""
    if target.startswith("redis://"):
        from tf_ecrec.data.redis_stream import RedisStreamQueue, parse_partition_url

        url, topic, partition = parse_partition_url(target)
        return PartitionSource(RedisStreamQueue.from_url(url, topic, [partition]), partition, on_corrupt, name=target)
    return StreamDirectory(target, on_corrupt=on_corrupt)


def file_name(index: int) -> str:
    """The name of a stream directory's `index`-th file (names sort in the order files appear)."""
    return f"part-{index:06d}{SUFFIX}"


def append_file(path: str, index: int, records: int, seed: int = 0) -> str:
    """Writes one file of `records` synthetic Criteo records into the stream directory `path`, whole:
    under a hidden name, then renamed into place.  Returns its name."""
    from tf_ecrec.data.synthetic import write_criteo_tsv

    name = file_name(index)
    hidden = os.path.join(path, f".{name}.tmp")
    write_criteo_tsv(hidden, records, seed=seed + index)
    os.replace(hidden, os.path.join(path, name))
    return name


def close_stream(path: str) -> None:
    """Ends the stream in `path` (after its last file)."""
    with open(os.path.join(path, CLOSED), "w", encoding="ascii") as fh:
        fh.write("closed\n")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tf_ecrec.data.stream DIR --files N --records R --interval S``: a producer that
    appends N files of R synthetic Criteo records to DIR, one every S seconds, then closes the stream."""
    import argparse
    import time

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("dir")
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", type=int, default=0, help="index of the first file (to resume a producer)")
    args = parser.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    for i in range(args.first, args.first + args.files):
        append_file(args.dir, i, args.records, args.seed)
        if i + 1 < args.first + args.files:
            time.sleep(args.interval)
    close_stream(args.dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
