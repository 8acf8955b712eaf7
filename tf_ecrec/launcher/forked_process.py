"""A process forked by the launcher's fork server: the part of `subprocess.Popen` the launcher uses.

The server forks twice and its middle process exits, so the task is re-parented to the launcher (a
child subreaper) and is waited for like any child of its own; `tf_ecrec.launcher.forkserver` says
how a task is started.  `start_child` starts one child: forked from this process when this process
is itself a forked task (the test suite forks its pods' entries so), else a new interpreter.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

_PR_SET_PDEATHSIG = 1

# True in a task forked from a server: it has the server's modules loaded (`ForkServer.start` reads it).
FORKED_TASK = False


def prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return False
    return libc.prctl(option, value, 0, 0, 0) == 0


def forget_logging() -> None:
    """The logging of a new interpreter: the launcher's root handler and level (``tf-ecrec``'s
    ``basicConfig``) would make a task's own ``basicConfig(level=INFO)`` a no-op."""
    import logging

    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)


def adopt_environment(env: Mapping[str, str]) -> None:
    """In a forked process: `env` as its environment, with what its interpreter would have had of it."""
    old_path = os.environ.get("PYTHONPATH", "")
    os.environ.clear()
    os.environ.update(env)
    # Directories the new PYTHONPATH adds to the forking process's: on sys.path, as an interpreter puts them.
    known = set(filter(None, old_path.split(os.pathsep)))
    for entry in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in known]):
        sys.path.insert(0, entry)
    if "numpy" in sys.modules:  # `random` reseeds itself after a fork; NumPy's global generator does not
        sys.modules["numpy"].random.seed()
    from tf_ecrec.launcher.memory_limit import join_cgroup_from_environment

    join_cgroup_from_environment()


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


def start_child(module: str, args: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen | ForkedProcess:
    """``python -m module args`` with `env`, as a child of this process that dies with it.

    A process that is itself a forked task (`FORKED_TASK`: its imports are done) and runs no other thread
    forks the child from itself, with a new interpreter's logging and default signal handlers; any other
    starts it as a new interpreter (`tf_ecrec.launcher.child`).
    """
    if not FORKED_TASK or threading.active_count() != 1:
        from tf_ecrec.launcher.child import command

        return subprocess.Popen(command(module, *args), env=dict(env))
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return ForkedProcess(pid, [module, *args])
    code = 1
    try:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)
        adopt_environment(env)
        forget_logging()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.modules.pop(module, None)
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # pylint: disable=broad-except
        import traceback

        traceback.print_exc()
    from tf_ecrec.base.process_end import end_process

    end_process(code)
