"""Loopback ports for the tests' clusters, from below the kernel's ephemeral range.

A port found by binding port 0 comes from the ephemeral range, which every outgoing connection and
every other ``bind(0)`` on the machine draws from too: between the test's check and the server's
bind, a process of the other test worker can take it (TF then fails to start its gRPC server, or
the launcher names another port in use than the test expected).  Ports below that range are only
ever taken by an explicit bind, and each xdist worker picks from its own block of them, so two
tests running at once never pick the same port.  A pick is still checked by binding it.
"""

from __future__ import annotations

import itertools
import os
import random
import socket

from tf_ecrec.launcher.ports import ephemeral_start

_LOW = 20000


def _block() -> range:
    high = max(_LOW + 2000, ephemeral_start())
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    size = (high - _LOW) // count
    start = _LOW + (index % count) * size
    return range(start, start + size)


_WORKER_BLOCK = _block()
# The lower half for the harness's own picks, the upper half for the jobs the launcher starts
# (tf_ecrec.launcher.ports draws from TF_ECREC_PORT_RANGE, which tests/conftest.py sets to it).
_BLOCK = range(_WORKER_BLOCK.start, _WORKER_BLOCK.start + len(_WORKER_BLOCK) // 2)
LAUNCHER_RANGE = f"{_BLOCK.stop}-{_WORKER_BLOCK.stop - 1}"
# A random starting point: the fresh interpreters a test starts pick from the same block.
_CURSOR = itertools.islice(itertools.cycle(_BLOCK), random.randrange(len(_BLOCK)), None)


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(n: int) -> int:
    """The first of `n` consecutive ports, all free when asked."""
    for _ in range(len(_BLOCK)):
        first = next(_CURSOR)
        if first + n > _BLOCK.stop:
            continue
        if all(_free(p) for p in range(first, first + n)):
            for _ in range(n - 1):  # the cursor moves past the block
                next(_CURSOR)
            return first
    raise RuntimeError(f"no {n} consecutive free ports in {_BLOCK}")


def free_ports(n: int) -> list[int]:
    """`n` distinct ports, each free when asked."""
    return [free_port_block(1) for _ in range(n)]


def free_port() -> int:
    return free_port_block(1)
