"""The message-queue side of streaming data: one contract, run on the in-process `MemoryQueue` and on
`RedisStreamQueue` against a real Redis server (Debian's redis-server, started here on a free loopback
port, no persistence).  Offsets per partition are dense, exact and shared by concurrent producers;
reads return exactly the records of their range or fail by name; a closed topic takes no more."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from harness.redis_server import redis_server

from tf_ecrec.data.redis_stream import RedisStreamQueue
from tf_ecrec.data.stream import MemoryQueue, PartitionSource
from tf_ecrec.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(str(tmp_path_factory.mktemp("redis"))) as url:
        yield url


@pytest.fixture(params=["memory", "redis"])
def make_queue(request: pytest.FixtureRequest) -> Callable[[Sequence[str]], Any]:
    if request.param == "memory":
        return MemoryQueue
    url = request.getfixturevalue("redis_url")
    topic = f"t{uuid.uuid4().hex[:12]}"
    return lambda partitions: RedisStreamQueue.from_url(url, topic, partitions)


def test_offsets_are_kept_per_partition_and_read_by_range(make_queue: Callable[..., Any]) -> None:
    q = make_queue(["p0", "p1"])
    assert q.partitions() == ["p0", "p1"] and q.end_offset("p0") == 0 and q.read("p0", 0, 0) == []
    assert q.append("p0", [b"a", b"b"]) == 2 and q.append("p1", [b"c"]) == 1 and q.append("p0", [b"d"]) == 3
    assert q.read("p0", 1, 3) == [b"b", b"d"] and q.read("p0", 0, 1) == [b"a"] and q.read("p1", 0, 1) == [b"c"]
    assert q.end_offset("p0") == 3 and q.end_offset("p1") == 1 and not q.closed
    assert q.append("p1", [b"\x00\xff\ttab\nline"]) == 2 and q.read("p1", 1, 2) == [b"\x00\xff\ttab\nline"]


def test_bad_reads_partitions_and_late_appends_are_refused_by_name(make_queue: Callable[..., Any]) -> None:
    q = make_queue(["p0", "p1"])
    q.append("p0", [b"a", b"b"])
    with pytest.raises(DataError, match=r"\[1, 3\)"):
        q.read("p0", 1, 3)  # beyond the end
    with pytest.raises(DataError, match="'p9'"):
        q.read("p9", 0, 1)
    with pytest.raises(DataError, match="'p9'"):
        q.append("p9", [b"x"])
    q.close()
    assert q.closed
    with pytest.raises(DataError, match="closed"):
        q.append("p0", [b"x"])
    assert q.end_offset("p0") == 2 and q.read("p0", 0, 2) == [b"a", b"b"]  # what was there stays readable
    with pytest.raises(ConfigError, match="distinct"):
        make_queue(["a", "a"])


def test_concurrent_producers_share_the_offsets_batch_by_batch(make_queue: Callable[..., Any]) -> None:
    q = make_queue(["p"])
    ends: list[int] = []
    lock = threading.Lock()

    def produce(name: str) -> None:
        for i in range(25):
            end = q.append("p", [f"{name}-{i}-first".encode(), f"{name}-{i}-second".encode()])
            with lock:
                ends.append(end)

    threads = [threading.Thread(target=produce, args=(f"w{n}",)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(ends) == list(range(2, 201, 2))  # every batch got its own two offsets, none skipped
    records = q.read("p", 0, 200)
    assert len(set(records)) == 200
    for first, second in zip(records[::2], records[1::2]):  # a batch is whole at its offsets
        assert first.endswith(b"-first") and second == first.replace(b"-first", b"-second"), (first, second)


def test_a_reader_follows_a_growing_partition_to_its_close(make_queue: Callable[..., Any]) -> None:
    q = make_queue(["p"])
    written = [f"record {i}".encode() for i in range(300)]

    def produce() -> None:
        for i in range(0, 300, 30):
            q.append("p", written[i : i + 30])
            time.sleep(0.005)
        q.close()

    producer = threading.Thread(target=produce)
    producer.start()
    source = PartitionSource(q, "p")  # what the launcher's feed polls and a trainer reads
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        end = source.refresh()
        got += q.read("p", len(got), end)
        if source.closed and len(got) == end:  # nothing after a close seen with its end
            break
    producer.join(timeout=60)
    assert got == written


def test_redis_entries_not_appended_by_offset_and_trimmed_ranges_are_never_read_as_records(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    q = RedisStreamQueue(client, "foreign", ["p", "trimmed"])
    q.append("p", [b"a"])
    client.xadd("foreign:p", {"r": b"by someone else"})  # an ID from the clock, not an offset
    with pytest.raises(DataError, match="not appended by offset"):
        q.end_offset("p")
    with pytest.raises(DataError, match=r"every entry is added by RedisStreamQueue\.append"):
        q.append("p", [b"b"])
    assert q.read("p", 0, 1) == [b"a"]
    q.append("trimmed", [str(i).encode() for i in range(10)])
    assert client.xtrim("foreign:trimmed", maxlen=4, approximate=False) == 6
    assert q.end_offset("trimmed") == 10 and q.read("trimmed", 6, 10) == [b"6", b"7", b"8", b"9"]
    with pytest.raises(DataError, match=r"\[0, 10\).*found offsets 6\.\.9"):
        q.read("trimmed", 0, 10)
    # Trimmed to nothing, or its last entry deleted: the end stays, the next append takes the next offset.
    assert client.xtrim("foreign:trimmed", maxlen=0, approximate=False) == 4
    assert q.end_offset("trimmed") == 10 and q.append("trimmed", [b"10"]) == 11
    client.xdel("foreign:trimmed", "0-11")
    assert q.end_offset("trimmed") == 11 and q.append("trimmed", [b"11"]) == 12 and q.read("trimmed", 11, 12) == [b"11"]
    client.set("foreign:wrong", b"not a stream")
    wrong = RedisStreamQueue(client, "foreign", ["wrong"])
    with pytest.raises(DataError, match="WRONGTYPE"):
        wrong.end_offset("wrong")
    with pytest.raises(ConfigError, match="topic"):
        RedisStreamQueue(client, "a:b", ["p"])
    with pytest.raises(ConfigError, match="'_closed'"):
        RedisStreamQueue(client, "t", ["_closed"])  # the topic's own marker
    with pytest.raises(ConfigError, match="redis://"):
        RedisStreamQueue.from_url("http://127.0.0.1/0", "t", ["p"])


def test_a_redis_server_that_does_not_answer_is_a_stream_unavailable_and_a_bad_address_a_config_error(
        tmp_path: Any) -> None:
    from tf_ecrec.data.redis_stream import parse_partition_url
    from tf_ecrec.errors import StreamUnavailable

    with redis_server(str(tmp_path)) as url:
        q = RedisStreamQueue.from_url(url, "gone", ["p"])
        q.append("p", [b"a"])
    with pytest.raises(StreamUnavailable, match="did not answer"):
        q.end_offset("p")
    with pytest.raises(StreamUnavailable):
        q.read("p", 0, 1)
    assert parse_partition_url("redis://127.0.0.1:7000/2/clicks/p0") == ("redis://127.0.0.1:7000/2", "clicks", "p0")
    for bad in ("redis://127.0.0.1:7000/clicks/p0", "redis://127.0.0.1:7000/x/clicks/p0", "http://h:1/0/t/p",
                "redis://127.0.0.1:7000/0/t/p/extra"):
        with pytest.raises(ConfigError, match="redis://HOST:PORT/DB/TOPIC/PARTITION"):
            parse_partition_url(bad)


def test_a_partition_is_read_as_criteo_lines_with_corrupt_records_counted_or_refused(
        make_queue: Callable[..., Any], tmp_path: Any) -> None:
    from tf_ecrec.data.criteo import check_line
    from tf_ecrec.data.synthetic import write_criteo_tsv

    path = tmp_path / "records.tsv"
    assert write_criteo_tsv(str(path), 50, seed=1, corrupt_every=10) == 5
    lines = path.read_bytes().splitlines()
    q = make_queue(["p"])
    q.append("p", lines[:30])
    source = PartitionSource(q, "p")
    assert source.num_records == 30 and not source.closed
    q.append("p", lines[30:])
    q.close()
    assert source.read_lines(0, 50) == [line for line in lines if check_line(line) is None]  # past its end: refreshed
    assert source.corrupt_records == 5 and source.num_records == 50 and source.closed
    strict = PartitionSource(q, "p", on_corrupt="fail", name="the topic")
    with pytest.raises(DataError, match="offset 9 of the topic"):
        strict.read_lines(0, 50)
    with pytest.raises(ConfigError, match="'nope'"):
        PartitionSource(q, "nope")
