"""The status channel from training tasks to the local launcher: JSON datagrams over loopback UDP.

A datagram is one JSON object with at least ``kind`` (a `StatusKind` value),
``task`` and ``t`` (the sender's wall clock).  Kinds:

- ``step``: ``step`` (global step last seen), ``records`` (records trained
  since the previous datagram);
- ``session``: a (re)created training session; ``step`` is the global step it
  starts from;
- ``done``: training ended; ``corrupt_records`` and other totals;
- ``recovered``/``rebuilding``/``settled``: the chief's recovery of lost PS
  tasks (`tf_ecrec.launcher.task.entry`);
- ``failover``: a trainer's failover loop changed state (``state``, ``reason``);
- ``error``: a failure description.

The first three come from `tf_ecrec.hooks.throughput.ThroughputHook`, which
a `StatusSender` serves as its status reporter.

UDP because the sender must never block a training step: ``sendto`` on
loopback either queues the datagram or drops it, and the launcher tolerates a
lost ``step`` datagram (the next carries the step; the records it summed are
reconciled with the final ``done`` totals).
"""

from __future__ import annotations

import enum
import json
import logging
import socket
import time
from typing import Any

_LOG = logging.getLogger(__name__)

ENV_STATUS_ADDRESS = "TF_ECREC_STATUS_ADDRESS"


class StatusKind(str, enum.Enum):
    """The kinds of status datagrams (the values go on the wire)."""

    STEP = "step"
    SESSION = "session"
    DONE = "done"
    RECOVERED = "recovered"
    REBUILDING = "rebuilding"
    SETTLED = "settled"
    FAILOVER = "failover"
    ERROR = "error"


class StatusSender:
    """Sends status datagrams to ``host:port``; never raises, never blocks."""

    def __init__(self, address: str, task: str) -> None:
        host, _, port = address.rpartition(":")
        self._target = (host, int(port))
        self._task = task
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self._warned = False

    def send(self, kind: StatusKind | str, **fields: Any) -> None:
        """Sends one datagram of `kind` (a `StatusKind` or its value) with `fields`."""
        payload = {"kind": kind, "task": self._task, "t": time.time(), **fields}
        try:
            self._sock.sendto(json.dumps(payload).encode(), self._target)
        except OSError as exc:  # a full buffer or a gone launcher must not stop training
            if not self._warned:
                _LOG.warning("status datagram to %s:%d dropped (%s); further drops are silent", *self._target, exc)
                self._warned = True

    def close(self) -> None:
        self._sock.close()


class StatusReceiver:
    """Receives status datagrams on a loopback port (0: pick a free one)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self._sock.bind((host, port))
        host, port = self._sock.getsockname()[:2]
        self.address = f"{host}:{port}"

    def poll(self, timeout: float) -> list[dict[str, Any]]:
        """All datagrams that arrive within `timeout` seconds (at least one wait)."""
        self._sock.settimeout(timeout)
        out: list[dict[str, Any]] = []
        try:
            data = self._sock.recv(65536)
        except TimeoutError:
            return out
        self._sock.setblocking(False)
        while True:
            try:
                out.append(json.loads(data))
            except ValueError:
                _LOG.debug("ignoring malformed status datagram %r", data[:100])
            try:
                data = self._sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return out

    def close(self) -> None:
        self._sock.close()
