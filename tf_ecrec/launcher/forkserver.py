"""Starts the local launcher's TensorFlow processes from one that has TensorFlow loaded already.

Every task of a local job (PS, chief, workers, spares, the end-of-job reader) is a Python process
that imports TensorFlow, and the import costs about 5 s of CPU per process, more than the rest of
a short job's start-up together: a 3-PS job with a chief spends most of its first 20 s of CPU
importing the same modules six times, and on a 2-core machine those imports queue behind each
other.  So the launcher starts one *fork server* first (``python -m tf_ecrec.launcher.forkserver``,
through `tf_ecrec.launcher.child`, so it dies with the launcher): it imports TensorFlow, the op
library and the task modules once, creates no session, server or thread of its own, then forks a
process per request.  A forked task shares the loaded modules copy-on-write and starts at once.

Each task is a child of the launcher, not of the fork server: the server forks twice and the
middle process exits at once, so the task is re-parented to the launcher, which has made itself a
child subreaper (``PR_SET_CHILD_SUBREAPER``) and waits for it like any child of its own
(`ForkedProcess`: exit code, or minus the signal that killed it, as `subprocess.Popen` gives).  The
task then asks for SIGKILL when the launcher dies (``PR_SET_PDEATHSIG``), as every child of the
launcher does.

The request carries what ``python -m MODULE ARGS`` with ``env`` and ``cwd`` would get; the task's
standard streams are passed as descriptors over the server's Unix socket (``SCM_RIGHTS``).  What a
fork cannot change is fixed at the server's start: environment variables that TensorFlow reads
while it is imported (``TF_CPP_MIN_LOG_LEVEL``, ``TF_ENABLE_ONEDNN_OPTS``) take the server's values;
the launcher starts the server with the environment it gives every task.

`ForkServer.start` never fails the launch, and `ForkServer.spawn` returns None when there is no
server to ask (``TF_ECREC_FORKSERVER=0``, no subreaper, or its imports failed): the launcher then
starts the task as a process of its own (``python -m``), which meets any import failure in its own
log.  `spawn` raises `LaunchError` only when a running server stops answering.

A launcher that is itself a forked task (the test suite forks its ``tf-ecrec run`` launchers from
one server that imported TensorFlow once for the whole session) has every import done: its server
is a fork of the launcher, made before the launcher starts any thread, not a new interpreter.
"""

from __future__ import annotations

import ctypes
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tf_ecrec.base.process_end import end_process
from tf_ecrec.errors import LaunchError
from tf_ecrec.launcher import forked_process
from tf_ecrec.launcher.forked_process import ForkedProcess, adopt_environment, forget_logging, prctl

ENV_FORKSERVER = "TF_ECREC_FORKSERVER"  # "0": every task imports TensorFlow itself
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_PR_SET_CHILD_SUBREAPER = 36
_MAX_REQUEST = 1 << 20
# Modules every task process needs; importing them is what the server saves each task.
PRELOAD = (
    "tensorflow",
    "tf_ecrec.ops.loader",
    "tf_ecrec.launcher.task.entry",
    "tf_ecrec.check.digest",
)


class ForkServer:
    """The launcher's side: starts the server, asks it for processes, stops it.

    Args:
      env: the environment the server is started with (the one every task gets, before its own).
      log_path: where the server's own output goes.
      preload: modules the server imports before it serves.
    """

    def __init__(self, env: Mapping[str, str], log_path: str, preload: Sequence[str] = PRELOAD) -> None:
        self._env = dict(env)
        self._log_path = log_path
        self._preload = tuple(preload)
        self._proc: subprocess.Popen | ForkedProcess | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._ready = False
        self.usable = False

    def start(self) -> None:
        """Starts the server (it imports in the background; `spawn` waits for it).

        A launcher that was itself forked from a fork server (as the test suite starts its launchers)
        and runs no thread besides its main one forks the server from itself: its imports are done
        already.  Otherwise the server is a new interpreter that imports them.
        """
        if self._proc is not None or self._sock is not None or os.environ.get(ENV_FORKSERVER, "1") == "0":
            return
        if not prctl(_PR_SET_CHILD_SUBREAPER, 1):
            return  # its tasks could not be waited for: every task is started on its own
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if forked_process.FORKED_TASK and threading.active_count() == 1:
            self._fork_self(ours, theirs)
        else:
            from tf_ecrec.launcher.child import command

            with open(self._log_path, "a", encoding="utf-8") as log:
                self._proc = subprocess.Popen(
                    command("tf_ecrec.launcher.forkserver", str(os.getpid()), *self._preload),
                    stdin=theirs.fileno(), stdout=log, stderr=subprocess.STDOUT, env=self._env,
                )
        theirs.close()
        self._sock = ours
        self.usable = True

    def _fork_self(self, ours: socket.socket, theirs: socket.socket) -> None:
        """The server as a fork of this process; it never returns into the launcher's code."""
        launcher = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            self._proc = ForkedProcess(pid, ["tf_ecrec.launcher.forkserver"])
            return
        code = 1
        try:
            ours.close()
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != launcher:
                os._exit(1)
            log = os.open(self._log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            null = os.open(os.devnull, os.O_RDONLY)
            for fd, target in ((null, 0), (log, 1), (log, 2)):
                os.dup2(fd, target)
            os.close(log)
            os.close(null)
            os.environ.clear()
            os.environ.update(self._env)
            forget_logging()
            code = _run_server(theirs, launcher, self._preload)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # pylint: disable=broad-except
            import traceback

            traceback.print_exc()
        end_process(code)

    def _await_ready(self, timeout: float) -> bool:
        """Waits for the server's imports; False (and not usable) when they failed."""
        assert self._sock is not None
        self._sock.settimeout(timeout)
        try:
            msg = self._sock.recv(_MAX_REQUEST)
        except TimeoutError:
            raise LaunchError(f"the fork server did not load TensorFlow within {timeout:.0f} s; its log: {self._log_path}") from None
        finally:
            self._sock.settimeout(None)
        self._ready = json.loads(msg or b"{}").get("ready") is True
        self.usable = self._ready
        return self._ready

    def spawn(
        self,
        module: str,
        args: Sequence[str],
        env: Mapping[str, str],
        stdin: int,
        stdout: int,
        stderr: int,
        name: str = "",
        timeout: float = 300.0,
        cwd: str | None = None,
    ) -> ForkedProcess | None:
        """Starts ``python -m module args`` with `env` and the three descriptors as its standard streams,
        in `cwd` (default: this process's directory).

        A forked task's command line is the server's; `name` (such as ``ps:0``) becomes its
        process name (``ps -o comm``, ``top``), cut to 15 bytes.

        Returns None when there is no server to ask (not started, or its imports failed: the
        caller starts the process itself, and the process meets the same failure in its own log).

        Raises:
          LaunchError: the server is gone, or did not answer within `timeout`.
        """
        if not self.usable or self._sock is None:
            return None
        with self._lock:
            try:
                if not self._ready and not self._await_ready(timeout):
                    return None
                request = json.dumps({"module": module, "args": list(args), "env": dict(env), "cwd": cwd or os.getcwd(),
                                      "name": name})
                socket.send_fds(self._sock, [request.encode()], [stdin, stdout, stderr])
                self._sock.settimeout(timeout)
                answer = json.loads(self._sock.recv(_MAX_REQUEST) or b"{}")
                self._sock.settimeout(None)
            except (OSError, ValueError) as exc:
                self.usable = False
                raise LaunchError(f"the fork server failed ({exc}); its log: {self._log_path}\n{self._tail()}") from exc
        if "pid" not in answer:
            self.usable = False
            raise LaunchError(f"the fork server could not start {module}: {answer.get('error')}; its log: {self._log_path}")
        return ForkedProcess(int(answer["pid"]), [module, *args])

    def close(self) -> None:
        """Stops the server; the tasks it started are the launcher's and stay up."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        self.usable = False

    def _tail(self, limit: int = 2000) -> str:
        try:
            with open(self._log_path, encoding="utf-8", errors="replace") as fh:
                return fh.read()[-limit:]
        except OSError:
            return ""


def start_process(
    forkserver: ForkServer | None,
    module: str,
    args: Sequence[str],
    env: Mapping[str, str],
    stdin: Any,
    stdout: Any,
    stderr: Any,
    name: str = "",
) -> subprocess.Popen | ForkedProcess:
    """``python -m module args`` as a child of this process that dies with it: forked from `forkserver`
    when there is one to ask, else started through `tf_ecrec.launcher.child`.

    The streams are descriptors or files (``fileno()``), as `subprocess.Popen` takes them.
    """
    fds = [s if isinstance(s, int) else s.fileno() for s in (stdin, stdout, stderr)]
    proc = forkserver.spawn(module, args, env, fds[0], fds[1], fds[2], name=name) if forkserver is not None else None
    if proc is not None:
        return proc
    from tf_ecrec.launcher.child import command

    return subprocess.Popen(command(module, *args), env=dict(env), stdin=fds[0], stdout=fds[1], stderr=fds[2])


# ---- the server -------------------------------------------------------------------------------


def _serve(sock: socket.socket) -> dict[str, Any] | None:
    """Answers requests until the launcher closes the socket; returns a request only in a forked task."""
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, _MAX_REQUEST, 3)
        if not msg:
            return None
        try:
            request = json.loads(msg)
            if len(fds) != 3:
                raise ValueError(f"expected 3 descriptors, got {len(fds)}")
        except ValueError as exc:
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"error": str(exc)}).encode())
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        middle = os.fork()
        if middle == 0:
            os.close(read_end)
            request["middle"] = os.getpid()
            try:
                task = os.fork()
            except OSError:
                os._exit(1)
            if task == 0:
                os.close(write_end)
                sock.close()
                request["fds"] = fds
                return request
            os.write(write_end, str(task).encode())
            os._exit(0)
        os.close(write_end)
        for fd in fds:
            os.close(fd)
        with os.fdopen(read_end, "rb") as pipe:
            pid_text = pipe.read()
        os.waitpid(middle, 0)
        answer = {"pid": int(pid_text)} if pid_text else {"error": "the fork failed"}
        sock.send(json.dumps(answer).encode())


def _become_task(request: dict[str, Any], launcher: int) -> None:
    """In the forked task: wait to be the launcher's child, then take the request's streams, directory and environment."""
    # The middle process is exiting and the launcher, a subreaper, adopts us.  Any other parent means the
    # launcher died before we saw it adopt us (it may be killed the moment `spawn` returns): leave at once,
    # as the death signal we have not asked for yet would have made us.
    deadline = time.monotonic() + 30.0
    while (parent := os.getppid()) != launcher:
        if parent != request["middle"] or time.monotonic() > deadline:
            os._exit(1)
        time.sleep(0.0005)
    forked_process.FORKED_TASK = True  # on the imported module: the server itself runs as __main__
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher:  # it died before the request took
        os._exit(1)
    if request.get("name"):
        try:
            ctypes.CDLL("libc.so.6").prctl(_PR_SET_NAME, ctypes.c_char_p(request["name"].encode()[:15]), 0, 0, 0)
        except OSError:
            pass
    for target, fd in enumerate(request["fds"]):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    adopt_environment(request["env"])


def _run_server(sock: socket.socket, launcher: int, preload: Sequence[str]) -> int:
    """The server: imports `preload`, serves until the launcher is done, and in a forked task runs the task."""
    try:
        import importlib

        for name in preload:
            importlib.import_module(name)
        if "tf_ecrec.ops.loader" in sys.modules:
            sys.modules["tf_ecrec.ops.loader"].load_library()
    except Exception as exc:  # a broken install: each task, started on its own, reports it in its log
        print(f"tf_ecrec.launcher.forkserver: loading {preload} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        sock.send(json.dumps({"ready": False}).encode())
        return 1
    sock.send(json.dumps({"ready": True}).encode())
    request = _serve(sock)
    if request is None:  # the launcher is done with us: skip TensorFlow's second of interpreter teardown
        end_process(0)
    _become_task(request, launcher)
    module, args = request["module"], request["args"]
    # As under `python -m`: the module runs as __main__ only (its imports stay loaded).
    sys.modules.pop(module, None)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or not argv[0].isdigit():
        print("usage: python -m tf_ecrec.launcher.forkserver LAUNCHER_PID [MODULE...]  (socket on stdin)", file=sys.stderr)
        return 2
    sock = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return _run_server(sock, int(argv[0]), argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
