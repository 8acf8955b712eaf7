"""A process forked by the launcher's fork server: the part of `subprocess.Popen` the launcher uses.

The server forks twice and its middle process exits, so the task is re-parented to the launcher (a
child subreaper) and is waited for like any child of its own; `tf_ecrec.launcher.forkserver` says
how a task is started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence

# True in a task forked from a server: it has the server's modules loaded (`ForkServer.start` reads it).
FORKED_TASK = False


class ForkedProcess:
    """A task forked by the server and re-parented to this process: the part of `subprocess.Popen` the launcher uses.

    Args:
      pid: the task's process id (a child of this process).
      args: what it runs, for messages.
    """

    def __init__(self, pid: int, args: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def _reap(self, flags: int) -> int | None:
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:  # reaped elsewhere: the code is lost, not the fact that it ended
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid == 0:
                return None
            self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            code = self._reap(0)
            assert code is not None
            return code
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while True:
            code = self.poll()
            if code is not None:
                return code
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            delay = min(delay * 2, remaining, 0.05)
            time.sleep(delay)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
