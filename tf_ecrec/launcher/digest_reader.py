"""The launcher's end-of-job read of the PS tasks (digest, parity), from a process started ahead of time.

The report's ``variables_sha256`` and ``parity`` come from reading every
variable back from the PS tasks once training is over (`tf_ecrec.check.live_cluster`).
That reader is a TensorFlow process, and a Python process importing
TensorFlow spends seconds of CPU before it can read anything: started after
the last step, that time sits between training and the report, in every run.
So the launcher starts the reader while the job trains (`start`, once the
chief has its session: the start-up of the PS and trainer processes is over
by then); it loads TensorFlow and waits on its stdin.  At the end `read`
hands it the PS addresses of that moment (a PS may have moved since) and
waits for its answer.  A reader never started (the job ended before the
chief's session) is started by `read`; `close` stops one left waiting.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Sequence
from typing import IO, Any

from tf_ecrec.errors import LaunchError
from tf_ecrec.launcher.forkserver import ForkedProcess, ForkServer, start_process


class DigestReader:
    """One `tf_ecrec.check.digest` process per job, started early, asked once.

    Args:
      manifest: the chief's variable manifest (read by the reader when asked).
      log_path: where the reader's stderr goes (its tail is in the error when it fails).
      timeout: seconds `read` waits for the answer.
      forkserver: forks the reader when it can (TensorFlow already loaded); else it is a process of its own.
    """

    def __init__(self, manifest: str, log_path: str, timeout: float = 300.0, forkserver: ForkServer | None = None) -> None:
        self._manifest = manifest
        self._log_path = log_path
        self._timeout = timeout
        self.forkserver = forkserver
        self._proc: subprocess.Popen | ForkedProcess | None = None
        self._stdin: int | None = None  # our ends of its stdin and stdout pipes
        self._stdout: int | None = None
        self._log: IO[str] | None = None

    @property
    def started(self) -> bool:
        return self._proc is not None

    def start(self) -> None:
        """Starts the reader (it loads TensorFlow, then waits); no-op once started."""
        if self._proc is not None:
            return
        self._log = open(self._log_path, "w", encoding="utf-8")  # closed by close()
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        stdin_r, self._stdin = os.pipe()
        self._stdout, stdout_w = os.pipe()
        try:
            self._proc = start_process(self.forkserver, "tf_ecrec.check.digest", [self._manifest, "-"], env,
                                       stdin_r, stdout_w, self._log, name="digest")
        finally:
            os.close(stdin_r)
            os.close(stdout_w)

    def read(self, ps: Sequence[str]) -> dict[str, Any]:
        """The digest (and parity check) of the variables on `ps`, the PS addresses in task order.

        Raises:
          LaunchError: the reader failed, printed no answer, or took longer than the timeout.
        """
        self.start()
        assert self._proc is not None and self._stdin is not None and self._stdout is not None
        deadline = time.monotonic() + self._timeout
        try:
            os.write(self._stdin, (",".join(ps) + "\n").encode())
        except BrokenPipeError:  # it died waiting: its exit code and log tell why
            pass
        os.close(self._stdin)
        self._stdin = None
        out = b""
        while True:
            # poll, not select: a launcher with many open files has descriptors above select's 1024.
            poller = select.poll()
            poller.register(self._stdout, select.POLLIN | select.POLLHUP | select.POLLERR)
            ready = poller.poll(max(0.0, deadline - time.monotonic()) * 1000.0)
            if not ready:
                self.close()
                raise LaunchError(
                    f"reading the variables back from the PS tasks {list(ps)} took more than {self._timeout:.0f} s "
                    f"(its log: {self._log_path})"
                )
            chunk = os.read(self._stdout, 1 << 16)
            if not chunk:
                break
            out += chunk
        try:
            code = self._proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
        self.close()
        lines = out.decode(errors="replace").strip().splitlines()
        if code != 0 or not lines:
            raise LaunchError(
                f"reading the variables back from the PS tasks {list(ps)} failed (exit code {code}):\n"
                f"{self._log_tail()}"
            )
        return dict(json.loads(lines[-1]))

    def close(self) -> None:
        """Stops a reader still waiting (a job that ended in an error) and closes its log."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        for fd in (self._stdin, self._stdout):
            if fd is not None:
                os.close(fd)
        self._stdin = self._stdout = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def _log_tail(self, limit: int = 2000) -> str:
        try:
            with open(self._log_path, encoding="utf-8", errors="replace") as fh:
                return fh.read()[-limit:]
        except OSError as e:
            return f"(its log {self._log_path} unreadable: {e})"
