"""What a host received on a TCP port, frame by frame: proof that no gRPC call reached a process.

Byte counts cannot tell a gRPC call from the HTTP/2 frames a peer's own frames
provoke (a connection that receives DATA answers with WINDOW_UPDATE and PING
frames: flow control and gRPC's bandwidth probe), so the zombie test captures
what reaches the zombie's host once its link is back and reads the frames:
a call begins with a HEADERS frame, its message is DATA; flow control,
PINGs, RST_STREAM, SETTINGS and GOAWAY are not calls, nor is a connection's
preface (a channel that reconnects, with no call to make).  gRPC writes a
call's method (``:path``) as a plain literal in every HEADERS frame (seen on
TensorFlow's channels: every HEADERS frame of a capture had it), so each
call's method is read without an HPACK decoder; a HEADERS frame without one
reads as ``"?"``, which no allow-list admits.

A call written after a peer came back may have been made while it was cut
off (gRPC holds a call until its connection is ready: the old session's
``DeleteWorkerSession`` goes out once the link is back), so the zombie test
reads methods, not only frames: a step on the zombie needs a ``RunGraph`` (or a
new session's ``CreateWorkerSession``, ``RegisterGraph``) from a job host.

``python h2_capture.py PORT OUT`` (run on the host: ``host.run([...])``)
records every IPv4 TCP segment with a payload that arrives for local `PORT`
on any interface, one JSON line per segment (source ``ip:port``, sequence
number, payload hex), until SIGTERM.  `frames_from` reassembles one
connection's bytes from those lines and parses the HTTP/2 frames from a
stream offset on.

The offset anchor: a sender's first data segment after its peer comes back
starts at its oldest unacknowledged byte (a retransmission, or new data when
nothing was queued), which is the sender's ``bytes_acked`` (`netns.Host.
tcp_written`); a keepalive or window probe carries no data and is not recorded.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import struct
import sys
from collections.abc import Iterable, Sequence
from typing import NamedTuple

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
FRAME_TYPES = {0: "DATA", 1: "HEADERS", 2: "PRIORITY", 3: "RST_STREAM", 4: "SETTINGS", 5: "PUSH_PROMISE",
               6: "PING", 7: "GOAWAY", 8: "WINDOW_UPDATE", 9: "CONTINUATION"}
CALL_FRAMES = frozenset({"DATA", "HEADERS", "PUSH_PROMISE", "CONTINUATION"})
"""Frames that carry a call (its headers or its message); every other type is connection or stream control."""
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
"""What a client writes first on a connection (RFC 9113 3.4), before its SETTINGS frame: not a frame."""
MAX_FRAME = 1 << 24  # HTTP/2's largest frame payload (SETTINGS_MAX_FRAME_SIZE's ceiling)


_METHOD = re.compile(rb"/[A-Za-z_][\w.]*/\w+")


class Frame(NamedTuple):
    offset: int  # stream offset of the frame's first header byte
    type: str
    flags: int
    stream: int
    length: int
    method: str = ""  # a HEADERS frame's ``:path`` ("?" when it is not a plain literal)


def _segment(packet: bytes, port: int) -> dict | None:
    """The TCP segment in Ethernet frame `packet` if it is IPv4, for local `port`, with a payload."""
    if len(packet) < 14 + 20 or packet[12:14] != b"\x08\x00":
        return None
    ip = packet[14:]
    header = (ip[0] & 0x0F) * 4
    if ip[9] != 6 or len(ip) < header + 20:
        return None
    total = struct.unpack("!H", ip[2:4])[0]
    tcp = ip[header:total]
    sport, dport, seq = struct.unpack("!HHI", tcp[:8])
    payload = tcp[(tcp[12] >> 4) * 4:]
    if dport != port or not payload:
        return None
    return {"src": f"{socket.inet_ntoa(ip[12:16])}:{sport}", "seq": seq, "data": payload.hex()}


def capture(port: int, out: str) -> None:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(ETH_P_ALL))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with open(out, "w", encoding="utf-8") as fh:
        print("ready", flush=True)
        while True:
            packet, address = sock.recvfrom(1 << 16)
            if address[0] == "lo" or address[2] == PACKET_OUTGOING:
                continue
            seg = _segment(packet, port)
            if seg is not None:
                fh.write(json.dumps(seg) + "\n")
                fh.flush()


def read_segments(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def frames_from(segments: Iterable[dict], src: str, acked: int, start: int) -> list[Frame]:
    """The HTTP/2 frames `src` sent from stream offset `start` on (see the module doc for `acked`).

    Raises:
      AssertionError: the capture misses bytes of the range, or the bytes do not parse as HTTP/2 frames
        from `start` (an offset that is not a frame boundary).
    """
    mine = [(s["seq"], bytes.fromhex(s["data"])) for s in segments if s["src"] == src]
    if not mine:
        return []
    base = mine[0][0]

    def rel(seq: int) -> int:  # sequence numbers wrap at 2**32; the capture spans far less than 2**31 bytes
        d = (seq - base) % (1 << 32)
        return d - (1 << 32) if d >= 1 << 31 else d

    first = min(rel(seq) for seq, _ in mine)
    stream: dict[int, int] = {}
    for seq, data in mine:
        at = acked + rel(seq) - first
        for i, b in enumerate(data):
            stream.setdefault(at + i, b)
    end = max(stream) + 1
    missing = [o for o in range(start, end) if o not in stream]
    assert not missing, f"the capture misses {len(missing)} bytes of {src} in [{start}, {end}), first {missing[0]}"
    data = bytes(stream[o] for o in range(start, end))
    return parse_frames(data, start, src)


def parse_frames(data: bytes, offset: int = 0, src: str = "") -> list[Frame]:
    """The frames of `data`, the bytes of a connection from stream `offset` on (at 0, past the client preface)."""
    frames: list[Frame] = []
    at = len(PREFACE) if offset == 0 and data.startswith(PREFACE) else 0
    while at < len(data):
        assert len(data) - at >= 9, f"{src}: a partial frame header at offset {offset + at}: {data[at:].hex()}"
        length = int.from_bytes(data[at:at + 3], "big")
        kind, flags = data[at + 3], data[at + 4]
        stream = int.from_bytes(data[at + 5:at + 9], "big") & 0x7FFFFFFF
        assert kind in FRAME_TYPES and length <= MAX_FRAME, (
            f"{src}: no HTTP/2 frame at offset {offset + at} (type {kind}, length {length}): {data[at:at + 32].hex()}")
        method = ""
        if FRAME_TYPES[kind] == "HEADERS":
            found = _METHOD.search(data[at + 9:at + 9 + length])
            method = found.group().decode() if found else "?"
        frames.append(Frame(offset + at, FRAME_TYPES[kind], flags, stream, length, method))
        at += 9 + length
    assert at == len(data), f"{src}: the last frame at offset {frames[-1].offset} runs past the capture"
    return frames


def calls(frames: Sequence[Frame]) -> list[Frame]:
    """The frames of `frames` that carry a call."""
    return [f for f in frames if f.type in CALL_FRAMES]


def methods(frames: Sequence[Frame]) -> list[str]:
    """The method of every call `frames` start, in order."""
    return [f.method for f in frames if f.type == "HEADERS"]


if __name__ == "__main__":
    capture(int(sys.argv[1]), sys.argv[2])
