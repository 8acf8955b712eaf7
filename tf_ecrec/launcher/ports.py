"""Ports for a launched job's tasks on loopback: consecutive from a base, or any free ones."""

from __future__ import annotations

import socket

from tf_ecrec.errors import LaunchError


def pick_ports(count: int, base_port: int = 0, host: str = "127.0.0.1") -> list[int]:
    """`count` free ports: consecutive from `base_port`, or any free ones when it is 0.

    Raises:
      LaunchError: a requested port is in use (naming it).
    """
    ports: list[int] = []
    holders: list[socket.socket] = []
    try:
        for i in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            holders.append(s)
            port = base_port + i if base_port else 0
            try:
                s.bind((host, port))
            except OSError as exc:
                raise LaunchError(
                    f"port {host}:{port} is in use ({exc.strerror}); the job needs ports "
                    f"{base_port}..{base_port + count - 1}; pick another --base-port or 0 for free ports; "
                    "source: --base-port"
                ) from exc
            ports.append(s.getsockname()[1])
    finally:
        for s in holders:
            s.close()
    return ports
