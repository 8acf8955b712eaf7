"""The zombie test's frame reader (`harness.h2_capture`): offsets anchored on the retransmission, calls found."""

from __future__ import annotations

import itertools
import socket
import struct

import pytest
from harness.h2_capture import PREFACE, _segment, calls, frames_from, methods, parse_frames


def _frame(kind: int, payload: bytes = b"", flags: int = 0, stream: int = 1) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


WINDOW_UPDATE, PING, DATA = _frame(8, b"\0\0\1\0", stream=0), _frame(6, b"x" * 8, stream=0), _frame(0, b"\0\0\0\0\2hi")
HEADERS = _frame(1, b"\x83\x86\x44\x1f/tensorflow.WorkerService/RunGraph\x00")


def _segments(src: str, stream: bytes, acked: int, isn: int, cuts: list[int]) -> list[dict]:
    """`stream[acked:]` as segments cut at `cuts` (offsets), seq numbers from `isn` + 1, wrapped at 2**32."""
    bounds = [acked, *cuts, len(stream)]
    return [{"src": src, "seq": (isn + 1 + a) % (1 << 32), "data": stream[a:b].hex()}
            for a, b in itertools.pairwise(bounds) if b > a]


@pytest.mark.parametrize("isn", [1000, (1 << 32) - 7])  # the second wraps inside the capture
def test_frames_past_the_written_count_are_read_from_the_retransmitted_offset(isn):
    before = _frame(0, b"z" * 40) + WINDOW_UPDATE  # written before the link came back, partly acknowledged
    stream = b"\0" * 100 + before + WINDOW_UPDATE + PING
    acked, written = 100 + 17, 100 + len(before)
    segs = _segments("10.0.0.1:5", stream, acked, isn, [acked + 10, written + 5])
    segs.append({"src": "10.0.0.2:6", "seq": 1, "data": HEADERS.hex()})  # another connection: not read
    segs.append(dict(segs[1]))  # a duplicate (retransmitted twice)
    frames = frames_from(segs, "10.0.0.1:5", acked, written)
    assert [f.type for f in frames] == ["WINDOW_UPDATE", "PING"] and not calls(frames)
    assert frames[0].offset == written


def test_a_call_after_the_written_count_is_found():
    stream = b"\0" * 50 + WINDOW_UPDATE + HEADERS + DATA
    frames = frames_from(_segments("h:1", stream, 50, 7, [60]), "h:1", 50, 50)
    assert [f.type for f in calls(frames)] == ["HEADERS", "DATA"]
    assert methods(frames) == ["/tensorflow.WorkerService/RunGraph"]
    assert methods(parse_frames(_frame(1, b"\x83\x86\xbe"))) == ["?"]  # an indexed path is not read as any method


def test_a_gap_or_a_start_that_is_not_a_frame_boundary_fails():
    stream = b"\0" * 50 + WINDOW_UPDATE + HEADERS
    segs = _segments("h:1", stream, 50, 7, [55, 60])
    with pytest.raises(AssertionError, match="misses"):
        frames_from([segs[0], segs[2]], "h:1", 50, 50)
    with pytest.raises(AssertionError):
        frames_from(segs, "h:1", 50, 52)
    with pytest.raises(AssertionError, match="no HTTP/2 frame"):
        parse_frames(b"\0\0\0\x77" + b"\0" * 5)


def test_a_captured_ethernet_frame_gives_its_tcp_payload_for_the_port_only():
    tcp = struct.pack("!HHIIBBHHH", 40000, 2222, 123, 0, 5 << 4, 0x18, 1024, 0, 0) + b"abc"
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, 6, 0,
                     socket.inet_aton("10.1.2.3"), socket.inet_aton("10.1.2.4")) + tcp
    packet = b"\0" * 12 + b"\x08\x00" + ip + b"\0" * 6  # Ethernet padding past the IP length is not payload
    assert _segment(packet, 2222) == {"src": "10.1.2.3:40000", "seq": 123, "data": b"abc".hex()}
    assert _segment(packet, 2223) is None


def test_a_new_connections_preface_is_not_a_frame_and_its_settings_are_not_a_call():
    settings = _frame(4, b"\0\3\0\0\0\x64", stream=0)
    frames = frames_from(_segments("h:1", PREFACE + settings + WINDOW_UPDATE, 0, 5, [24]), "h:1", 0, 0)
    assert [f.type for f in frames] == ["SETTINGS", "WINDOW_UPDATE"] and not calls(frames)
    with pytest.raises(AssertionError, match="no HTTP/2 frame"):
        parse_frames(PREFACE + settings, offset=9)  # the preface only opens a connection
