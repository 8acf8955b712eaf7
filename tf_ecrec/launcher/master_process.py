"""The job master as a child process of ``tf-ecrec run``, and the launcher's view of it.

`MasterProcess` runs ``python -m tf_ecrec.master.server`` on a fixed port
with its state in ``<model_dir>/master`` and the job token in
``<model_dir>/master.token`` (mode 0600), logging to
``<model_dir>/logs/master.log``.  ``--kill master@step=N`` SIGKILLs it and
starts it again on the same port and state dir: it resumes from its last
snapshot while the tasks' clients retry.

`MasterWatch` is the launcher's side of the master (an observer: it never
registers):

- a membership watch through the master (`EmbeddedMembership`, watching
  only).  The master's view is the membership of both backends: with
  ``--zk`` the master declares a task lost when its znode's session ends;
  without, when it stops heartbeating.  The launcher turns a task that
  left the view while its process still runs into a restart.
- failure reports (``ReportFailure``) for the tasks the launcher killed,
  tagged with the generation it last saw, so a late report never hits the
  restarted task; reports the master could not take are retried.
- the dataset's counters, for the live line, the failures' in-flight
  records and the report.

No call here waits longer than a few seconds: the supervisor's loop must
keep watching processes while the master is down.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import secrets
import signal
import subprocess
import time
from typing import Any, TextIO

from tf_ecrec.errors import EcRecError, LaunchError, MasterUnavailable, MembershipTimeout
from tf_ecrec.launcher.child import command as child_command

_LOG = logging.getLogger(__name__)

READY_LINE = "tf-ecrec master listening on"
STARTUP_TIMEOUT_SECS = 60.0
CONNECT_TIMEOUT_SECS = 10.0
# With ZooKeeper a restarted master waits out its predecessor's session
# (about 10 s) before it watches the members again; tasks must not be
# declared absent meanwhile.
ZK_MIN_TASK_TIMEOUT_SECS = 30.0


def make_token(path: str) -> str:
    """Writes a fresh job token to `path` (0600) and returns it."""
    token = secrets.token_hex(16)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")
    return token


class MasterProcess:
    """``python -m tf_ecrec.master.server`` as a child process that can be killed and restarted.

    Args:
      port: The port it serves on, every time.
      state_dir: Its snapshot directory, every time.
      token_file: The job token file.
      log_path: Where its output goes (appended across restarts).
      zk: ``HOST:PORT[,...]/path`` for ZooKeeper membership, or None.
      task_timeout: Seconds of silence (absence, with ZooKeeper) before a task is declared lost.
    """

    def __init__(self, port: int, state_dir: str, token_file: str, log_path: str, zk: str | None,
                 task_timeout: float) -> None:
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self._state_dir = state_dir
        self._token_file = token_file
        self._log_path = log_path
        self._zk = zk
        self.task_timeout = max(task_timeout, ZK_MIN_TASK_TIMEOUT_SECS) if zk else task_timeout
        self._process: subprocess.Popen | None = None
        self._log: TextIO | None = None
        self.killed = False

    def start(self, wait: bool = True, timeout: float = STARTUP_TIMEOUT_SECS) -> None:
        """Starts the process; with `wait`, returns once it serves.

        Raises:
          LaunchError: it exited or did not serve within `timeout` (its log tail included).
        """
        self.close_log()
        self._log = open(self._log_path, "a", encoding="utf-8")
        self._log.write(f"==== start master at {time.strftime('%H:%M:%S')} ====\n")
        self._log.flush()
        self._offset = self._log.tell()
        args = ["--port", str(self.port), "--state-dir", self._state_dir, "--token-file", self._token_file,
                "--heartbeat-timeout", str(self.task_timeout)]
        if self._zk:
            args += ["--zk", self._zk]
        # `python -m tf_ecrec.master.server ARGS`, dying with the launcher (see child.py).
        self._process = subprocess.Popen(child_command("tf_ecrec.master.server", *args), stdout=self._log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.killed = False
        if wait:
            self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if READY_LINE in self._new_output():
                return
            if self._process is not None and self._process.poll() is not None:
                raise LaunchError(
                    f"the job master exited with code {self._process.returncode} before serving; its log "
                    f"({self._log_path}) ends with:\n{self.tail()}"
                )
            time.sleep(0.1)
        self.kill()
        raise LaunchError(
            f"the job master did not serve on {self.address} within {timeout:g}s; its log ({self._log_path}) "
            f"ends with:\n{self.tail()}"
        )

    def _new_output(self) -> str:
        try:
            with open(self._log_path, encoding="utf-8", errors="replace") as fh:
                fh.seek(self._offset)
                return fh.read()
        except OSError:
            return ""

    def poll(self) -> int | None:
        """The exit code once the process ended, else None."""
        return None if self._process is None else self._process.poll()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def kill(self) -> None:
        """SIGKILL, as a crash would; waits for the process to be gone."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait()
        self.killed = True

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (a graceful stop), SIGKILL after `timeout`."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self.close_log()

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self, lines: int = 15) -> str:
        try:
            with open(self._log_path, encoding="utf-8", errors="replace") as fh:
                return "".join(fh.readlines()[-lines:])
        except OSError:
            return ""


@dataclasses.dataclass(frozen=True)
class Departure:
    """A task that left the master's view of live tasks."""

    task: str
    generation: int


class MasterWatch:
    """The launcher's observer of the job master; see the module docstring.

    Args:
      address: ``host:port`` of the master.
      token: The job token, or None.
      dataset: The dataset whose counters are read.
    """

    def __init__(self, address: str, token: str | None, dataset: str) -> None:
        from tf_ecrec.base.retry import Retry
        from tf_ecrec.master.client import MasterClient

        self.address = address
        self._token = token
        self._dataset = dataset
        self._client = MasterClient(address, None, token=token, timeout=2.0,
                                    retry=Retry(max_tries=2, delay=0.1, deadline=3.0))
        self._quick = MasterClient(address, None, token=token, timeout=1.0, retry=Retry(max_tries=1, deadline=None))
        self._membership: Any = None
        self._unsubscribe: Any = None
        self._events: queue.Queue = queue.Queue()
        self._pending: list[tuple[str, int, str]] = []
        self.generations: dict[str, int] = {}  # task -> generation last seen alive
        self.reachable = True

    def extend(self, available: int, closed: bool) -> None:
        """The stream dataset's records ``[0, available)`` exist (`closed`: all of them)."""
        self._client.extend_dataset(self._dataset, available, closed)

    def connect(self, timeout: float = CONNECT_TIMEOUT_SECS) -> None:
        """Checks the master answers (and accepts the token), then starts the membership watch.

        Raises:
          LaunchError: it did not answer within `timeout`, or refused us.
        """
        from tf_ecrec.master.membership import EmbeddedMembership

        deadline = time.monotonic() + timeout
        while True:
            try:
                self._client.get_cluster()
                break
            except MasterUnavailable as exc:
                if time.monotonic() >= deadline:
                    raise LaunchError(
                        f"the job master at {self.address} is not reachable ({exc}); gave up after {timeout:g}s; "
                        "start it with `tf-ecrec master --port P` or drop --master; source: --master"
                    ) from exc
                time.sleep(0.2)
            except EcRecError as exc:
                raise LaunchError(f"the job master at {self.address} refused the launcher: {exc}; source: --master") from exc
        self._membership = EmbeddedMembership(self.address, token=self._token, heartbeat_interval=0.5, timeout=3.0)
        try:
            self._unsubscribe = self._membership.watch(self._events.put)
        except MembershipTimeout as exc:
            raise LaunchError(f"the job master at {self.address} stopped answering: {exc}") from exc

    def departures(self) -> tuple[list[Departure], list[str]]:
        """``(departed, joined)`` since the last call: tasks that left the view and tasks (re)joining it."""
        from tf_ecrec.membership.base import EventKind

        departed: list[Departure] = []
        joined: list[str] = []
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return departed, joined
            if event.kind is EventKind.SUSPENDED:
                self.reachable = False
            elif event.kind in (EventKind.RESUMED, EventKind.CHANGED):
                self.reachable = True
            if event.kind is not EventKind.CHANGED:
                continue
            for key in event.departed:
                if key not in event.members:
                    departed.append(Departure(key, event.departed_members[key].generation))
            for key in event.joined:
                self.generations[key] = event.members[key].generation
                joined.append(key)

    def report_failure(self, task: str, reason: str) -> None:
        """Tells the master `task` failed (its leases go back at once); retried later if the master is away."""
        generation = self.generations.get(task, 0)
        if not generation:
            return  # never registered: nothing leased; a restart's registration would release it anyway
        self._pending.append((task, generation, reason))
        self.flush_reports()

    def flush_reports(self) -> None:
        """Retries the failure reports the master has not taken yet."""
        keep = []
        for task, generation, reason in self._pending:
            try:
                requeued = self._client.report_failure(task, reason=reason, generation=generation)
            except MasterUnavailable:
                keep.append((task, generation, reason))
                continue
            except EcRecError as exc:
                _LOG.warning("The master refused the failure report of %s: %s", task, exc)
                continue
            _LOG.info("Reported %s generation %d failed: %d records re-queued", task, generation, requeued)
        self._pending = keep

    def data_state(self) -> Any:
        """The dataset's `DataStats`, or None if the master did not answer within a second."""
        try:
            return self._quick.data_state(self._dataset)
        except EcRecError:
            return None

    def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._membership is not None:
            self._membership.close()
        self._client.close()
        self._quick.close()
