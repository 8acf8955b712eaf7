"""Integration fixtures: a real ZooKeeper server, started once per test session.

The server is the Debian ``zookeeper`` package's jar run standalone with its
own config, data dir and a free loopback port.  Tests may restart it
(:meth:`ZooKeeperServer.restart`), which kills it with SIGKILL and starts it
again on the same port and data dir, as a crash and recovery would.  When a
test fails, the server's log tail is printed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

ZOOKEEPER_JAR = os.environ.get("TF_ECREC_ZOOKEEPER_JAR", "/usr/share/java/zookeeper.jar")
_SLF4J_NOP = "/usr/share/java/slf4j-nop.jar"
_STARTUP_TIMEOUT_S = 30.0


def free_port() -> int:
    from harness.ports import free_port as pick

    return pick()


def _four_letter(port: int, word: bytes, timeout: float = 1.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(word)
        chunks = []
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


class ZooKeeperServer:
    """One standalone ZooKeeper process on 127.0.0.1."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.data_dir = os.path.join(workdir, "data")
        self.log_path = os.path.join(workdir, "zookeeper.log")
        self.config_path = os.path.join(workdir, "zoo.cfg")
        os.makedirs(self.data_dir, exist_ok=True)
        with open(self.config_path, "w", encoding="utf-8") as cfg:
            cfg.write("\n".join([
                "tickTime=200",
                f"dataDir={self.data_dir}",
                f"clientPort={self.port}",
                "clientPortAddress=127.0.0.1",
                "minSessionTimeout=400",
                "maxSessionTimeout=30000",
                "admin.enableServer=false",
                "4lw.commands.whitelist=ruok,srvr",
                "forceSync=no",
                "",
            ]))
        self._process: subprocess.Popen | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        classpath = ZOOKEEPER_JAR + (f":{_SLF4J_NOP}" if os.path.exists(_SLF4J_NOP) else "")
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                ["java", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                 "-Dzookeeper.admin.enableServer=false", "-cp", classpath,
                 "org.apache.zookeeper.server.ZooKeeperServerMain", self.config_path],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited with {self._process.returncode}; "
                                   f"log: {self.log_tail()}")
            try:
                if _four_letter(self.port, b"srvr").find(b"Mode:") >= 0:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"ZooKeeper did not serve within {_STARTUP_TIMEOUT_S}s; "
                           f"log: {self.log_tail()}")

    def stop(self) -> None:
        """Kills the server (SIGKILL: a crash) and waits for it to exit."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait(timeout=10)
        self._process = None

    def restart(self, down_for: float = 0.0) -> None:
        """Crashes the server, waits ``down_for`` seconds, starts it on the same port."""
        self.stop()
        time.sleep(down_for)
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as log:
                return "".join(log.readlines()[-lines:])
        except OSError:
            return "(no log)"


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A running ZooKeeper for the whole session (the test fails if it is not installed: nothing is skipped)."""
    if not os.path.exists(ZOOKEEPER_JAR) or shutil.which("java") is None:
        pytest.fail(f"ZooKeeper not installed ({ZOOKEEPER_JAR} and java needed; "
                    "Debian package 'zookeeper')")
    server = ZooKeeperServer(str(tmp_path_factory.mktemp("zookeeper")))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def unused_port() -> Callable[[], int]:
    """Returns a function giving a loopback port nobody listens on."""
    return free_port


@pytest.fixture
def zk_job_path() -> str:
    """A job path of its own for each test."""
    return f"/tf_ecrec_tests/{uuid.uuid4().hex[:12]}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and "zookeeper" in getattr(item, "fixturenames", ()):
        server = item.funcargs.get("zookeeper") if hasattr(item, "funcargs") else None
        if isinstance(server, ZooKeeperServer):
            report.sections.append(("ZooKeeper log", server.log_tail()))
