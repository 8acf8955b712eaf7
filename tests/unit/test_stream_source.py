"""Unbounded data sources (`tf_ecrec.data.stream`): a growing directory of files, an in-process queue."""

from __future__ import annotations

import os

import pytest

from tf_ecrec.data.stream import CLOSED, MemoryQueue, StreamDirectory, append_file, close_stream, file_name, main
from tf_ecrec.errors import ConfigError, DataError


def test_a_directory_grows_file_by_file_and_reads_across_files(tmp_path):
    stream = StreamDirectory(str(tmp_path))
    assert stream.end_offset() == 0 and not stream.closed
    append_file(str(tmp_path), 0, 30)
    (tmp_path / ".part-000001.tsv.tmp").write_text("half written\n")  # not visible yet
    assert stream.refresh() == 30
    append_file(str(tmp_path), 1, 20)
    lines = stream.read("files", 25, 35)  # past what was seen: refreshed, across the two files
    assert len(lines) == 10 and stream.end_offset() == 50
    assert stream.read("files", 0, 50) == stream.read("files", 0, 30) + stream.read("files", 30, 50)
    close_stream(str(tmp_path))
    stream.refresh()
    assert stream.closed


def test_a_range_past_the_end_and_an_unknown_partition_are_refused(tmp_path):
    append_file(str(tmp_path), 0, 10)
    stream = StreamDirectory(str(tmp_path))
    with pytest.raises(DataError):
        stream.read("files", 5, 11)
    with pytest.raises(DataError):
        stream.read("other", 0, 1)
    with pytest.raises(ConfigError):
        StreamDirectory(str(tmp_path / "missing"))


def test_a_file_that_sorts_before_the_ones_taken_is_refused_by_name(tmp_path):
    append_file(str(tmp_path), 5, 10)
    stream = StreamDirectory(str(tmp_path))
    append_file(str(tmp_path), 2, 10)
    with pytest.raises(DataError) as err:
        stream.refresh()
    assert file_name(2) in str(err.value) and "rule:" in str(err.value)


def test_the_producer_writes_whole_files_and_closes(tmp_path):
    assert main([str(tmp_path), "--files", "3", "--records", "7", "--interval", "0"]) == 0
    assert sorted(os.listdir(tmp_path)) == [CLOSED, file_name(0), file_name(1), file_name(2)]
    stream = StreamDirectory(str(tmp_path))
    assert stream.end_offset() == 21 and stream.closed
    assert len(set(stream.read("files", 0, 21))) == 21  # distinct records (a seed per file)


def test_a_memory_queue_keeps_offsets_per_partition():
    q = MemoryQueue(["p0", "p1"])
    assert q.append("p0", [b"a", b"b"]) == 2 and q.append("p1", [b"c"]) == 1
    assert q.read("p0", 1, 2) == [b"b"] and q.end_offset("p1") == 1
    with pytest.raises(DataError):
        q.read("p1", 0, 2)
    q.close()
    assert q.closed
    with pytest.raises(DataError):
        q.append("p0", [b"x"])
    with pytest.raises(ConfigError):
        MemoryQueue(["a", "a"])
