"""A real Redis server for the tests (Debian's redis-server, installed by tests/setup_machine.sh): on a
free loopback port, no persistence, stopped when the context ends."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator

from harness.ports import free_port


@contextlib.contextmanager
def redis_server(workdir: str) -> Iterator[str]:
    """Starts the server; yields its URL (``redis://127.0.0.1:PORT/0``) once it answers."""
    import redis

    server = shutil.which("redis-server")
    assert server, "redis-server is missing: tests/setup_machine.sh installs Debian's redis-server"
    port = free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", workdir], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                assert proc.poll() is None, f"redis-server exited with {proc.returncode}"
                assert time.monotonic() < deadline, "redis-server did not answer within 30 s"
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
