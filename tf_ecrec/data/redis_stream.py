"""A message queue with per-partition offsets on a real broker: Redis Streams.

`RedisStreamQueue` is a `tf_ecrec.data.stream.PartitionedStream` (and has `MemoryQueue`'s producer
side), so a job's shard state (offset ranges per partition) addresses its records as it addresses a
growing directory's.  The mapping onto Redis:

- a topic's partition ``p`` is the stream key ``{topic}:{p}``; the record at offset ``i`` is the
  entry with ID ``0-(i+1)`` and one field, ``r``, holding the record's bytes.  Offsets are dense
  and exact: ``append`` runs as one server-side script that refuses
  the write if the topic is closed, and adds its records under the next IDs (``0-*``), so concurrent
  producers interleave whole batches and never share or skip an offset;
- the end of a partition is one past its last generated ID (not ``XLEN`` nor the last entry, which
  trimming lowers);
- ``{topic}:_closed`` exists once the topic is closed (the end of an unbounded source that ends).

A read checks what it got: an entry appended under another ID (a producer calling ``XADD *``) or a
range trimmed away (``XTRIM``) is a `DataError` naming the partition, the offsets and the rule;
it is never read as other records.  A server that does not answer is a `StreamUnavailable` (a
`DataError` a caller may retry).  The connection is redis-py's; `from_url` takes its URL
(``redis://host:port/db``); ``python -m tf_ecrec.data.redis_stream`` is a producer of synthetic
Criteo records for ``tf-ecrec run --data stream:redis://HOST:PORT/DB/TOPIC/PARTITION``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tf_ecrec.errors import ConfigError, DataError, StreamUnavailable

FIELD = b"r"

# KEYS[1]: the partition's stream, KEYS[2]: the topic's closed marker; ARGV: the records (at least one).  ``0-*`` takes
# the next sequence number after the stream's last generated ID (which trimming or deleting entries
# does not lower), so offsets never repeat.  Returns the partition's new end offset, -1 when closed.
_APPEND = """
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
local id = nil
for i = 1, #ARGV do id = redis.call('XADD', KEYS[1], '0-*', 'r', ARGV[i]) end
local ms, seq = string.match(id, '^(%d+)-(%d+)$')
if ms ~= '0' then return redis.error_reply('entry ' .. id .. ' was not appended by offset') end
return tonumber(seq)
"""

CONNECT_SECS = 5.0
"""How long `from_url`'s connections wait to connect."""
ANSWER_SECS = 30.0
"""How long they then wait for each answer (a server that takes longer is `StreamUnavailable`)."""


class RedisStreamQueue:
    """A topic's partitions as Redis streams (see the module doc).

    Args:
      client: a ``redis.Redis`` connection (bytes responses: no ``decode_responses``).
      topic: the prefix of the partitions' keys.
      partitions: the partitions' names, distinct, at least one.
    """

    def __init__(self, client: Any, topic: str, partitions: Sequence[str]) -> None:
        if not partitions or len(set(partitions)) != len(partitions):
            raise ConfigError(f"partitions={list(partitions)!r}; rule: distinct names, at least one; source: RedisStreamQueue")
        for what, name in [("topic", topic), *(("partition", p) for p in partitions)]:
            if not name or ":" in name or name.startswith("_"):
                raise ConfigError(f"{what}={name!r}; rule: a non-empty name without ':', not starting with '_' "
                                  "(the topic's own keys); source: RedisStreamQueue")
        self._client = client
        self._where = _describe(client)
        self._topic = topic
        self._partitions = list(partitions)
        self._closed_key = f"{topic}:_closed"
        self._append = client.register_script(_APPEND)

    @classmethod
    def from_url(cls, url: str, topic: str, partitions: Sequence[str]) -> RedisStreamQueue:
        """Connects to the Redis server at `url` (``redis://host:port/db``)."""
        import redis

        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=CONNECT_SECS, socket_timeout=ANSWER_SECS)
        except ValueError as exc:
            raise ConfigError(f"Redis URL {url!r}: {exc}; rule: redis://host:port[/db]; source: RedisStreamQueue") from exc
        return cls(client, topic, partitions)

    # ---- the producer's side -----------------------------------------------------------------------

    def append(self, partition: str, records: Sequence[bytes]) -> int:
        """Appends `records` to `partition` at its next offsets, all or none; returns its new end offset.

        Raises:
          DataError: the topic is closed, or the partition holds an entry not appended by offset.
          StreamUnavailable: the server did not answer; the batch may have been written all the
            same (compare `end_offset` before appending it again).
        """
        import redis

        key = self._key(partition)
        if not records:
            if self.closed:
                raise DataError(f"append to a closed topic {self._topic!r}; source: RedisStreamQueue partition {partition!r}")
            return self.end_offset(partition)
        try:
            end = int(self._call(self._append, keys=[key, self._closed_key], args=list(records)))
        except redis.ResponseError as exc:
            raise DataError(f"cannot append to partition {partition!r} of topic {self._topic!r}: {exc}; rule: "
                            "every entry is added by RedisStreamQueue.append; source: Redis") from exc
        if end < 0:
            raise DataError(f"append to a closed topic {self._topic!r}; source: RedisStreamQueue partition {partition!r}")
        return end

    def close(self) -> None:
        """Ends the topic: no more appends; readers see `closed`."""
        self._call(self._client.set, self._closed_key, b"1")

    # ---- PartitionedStream ---------------------------------------------------------------------------

    def partitions(self) -> list[str]:
        return list(self._partitions)

    def end_offset(self, partition: str) -> int:
        """One past the last offset ever appended (trimming or deleting entries does not lower it)."""
        key = self._key(partition)
        if not self._call(self._client.exists, key):
            return 0
        info = self._call(self._client.xinfo_stream, key)
        return _offset_of(info["last-generated-id"], partition) + 1

    @property
    def closed(self) -> bool:
        return bool(self._call(self._client.exists, self._closed_key))

    def read(self, partition: str, start: int, end: int) -> list[bytes]:
        """The records at offsets ``[start, end)``.

        Raises:
          DataError: the range is not all there (beyond the end, trimmed away, or not appended by offset).
        """
        key = self._key(partition)
        if not 0 <= start <= end:
            raise DataError(f"offsets [{start}, {end}) of partition {partition!r}; rule: 0 <= start <= end; "
                            "source: RedisStreamQueue")
        if start == end:
            return []
        entries = self._call(self._client.xrange, key, min=f"0-{start + 1}", max=f"0-{end}")
        offsets = [_offset_of(entry_id, partition) for entry_id, _ in entries]
        if offsets != list(range(start, end)):
            have = f"offsets {offsets[0]}..{offsets[-1]} ({len(offsets)} entries)" if offsets else "no entry"
            raise DataError(f"offsets [{start}, {end}) of partition {partition!r} of topic {self._topic!r}: found {have}; "
                            f"rule: a read stays below the end ({self.end_offset(partition)}) and above what was "
                            "trimmed; source: Redis")
        missing = [offset for offset, (_, fields) in zip(offsets, entries) if FIELD not in fields]
        if missing:
            raise DataError(f"offset {missing[0]} of partition {partition!r} of topic {self._topic!r} has no field "
                            f"{FIELD.decode()!r}; rule: entries are added by RedisStreamQueue.append; source: Redis")
        return [fields[FIELD] for _, fields in entries]

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        import redis

        try:
            return fn(*args, **kwargs)
        except redis.AuthenticationError as exc:
            raise ConfigError(f"Redis at {self._where} refused the credentials ({exc}); source: the Redis URL") from exc
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StreamUnavailable(f"Redis at {self._where} did not answer ({exc}); topic {self._topic!r}; "
                                    "source: RedisStreamQueue") from exc
        except redis.ResponseError as exc:
            if fn is self._append:
                raise  # append names the partition and the rule
            raise DataError(f"Redis at {self._where} refused a command on topic {self._topic!r}: {exc}; rule: the "
                            f"topic's keys ({self._topic}:PARTITION, {self._closed_key}) hold what RedisStreamQueue "
                            "wrote; source: Redis") from exc

    def _key(self, partition: str) -> str:
        if partition not in self._partitions:
            raise DataError(f"no partition {partition!r}; rule: one of {self._partitions}; source: RedisStreamQueue")
        return f"{self._topic}:{partition}"


def _describe(client: Any) -> str:
    try:
        kwargs = client.connection_pool.connection_kwargs
        return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
    except AttributeError:
        return repr(client)


def _offset_of(entry_id: bytes | str, partition: str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    if ms != "0" or not seq.isdigit() or int(seq) < 1:
        raise DataError(f"entry {text} of partition {partition!r} was not appended by offset; rule: entries are added "
                        "by RedisStreamQueue.append under IDs 0-<offset + 1>; source: Redis")
    return int(seq) - 1


def parse_partition_url(text: str) -> tuple[str, str, str]:
    """``redis://HOST:PORT/DB/TOPIC/PARTITION`` -> (the server's URL ``redis://HOST:PORT/DB``, topic, partition)."""
    from urllib.parse import urlsplit

    parts = urlsplit(text)
    path = [p for p in parts.path.split("/") if p]
    if parts.scheme != "redis" or not parts.hostname or len(path) != 3 or not path[0].isdigit():
        raise ConfigError(f"stream {text!r}; rule: redis://HOST:PORT/DB/TOPIC/PARTITION (DB a number); source: --data")
    return f"redis://{parts.netloc}/{path[0]}", path[1], path[2]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tf_ecrec.data.redis_stream redis://HOST:PORT/DB/TOPIC/PARTITION --batches N --records R
    --interval S``: a producer that appends N batches of R synthetic Criteo records to the partition, one
    every S seconds, then closes the topic (unless ``--keep-open``)."""
    import argparse
    import os
    import tempfile
    import time

    from tf_ecrec.data.synthetic import write_criteo_tsv

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("target")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep-open", action="store_true")
    args = parser.parse_args(argv)
    url, topic, partition = parse_partition_url(args.target)
    queue = RedisStreamQueue.from_url(url, topic, [partition])
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.batches):
            path = os.path.join(tmp, f"batch-{i}.tsv")
            write_criteo_tsv(path, args.records, seed=args.seed + i)
            with open(path, "rb") as fh:
                records = fh.read().splitlines()
            for first in range(0, len(records), 5000):  # one script call per 5,000 records: the server stays responsive
                queue.append(partition, records[first : first + 5000])
            if i + 1 < args.batches:
                time.sleep(args.interval)
    if not args.keep_open:
        queue.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
