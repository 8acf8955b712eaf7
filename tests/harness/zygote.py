"""One fork server per test process, for the Python processes the tests start that import TensorFlow.

A test that launches a job (``tf-ecrec run``), starts a TF_CONFIG cluster of scripts or runs a
function in a fresh interpreter starts processes that each import TensorFlow: about 5 s of CPU
apiece, which on the suite's 2 cores was a fifth of the whole run.  Here one server
(`tf_ecrec.launcher.forkserver`, the launcher's own) imports TensorFlow and the package once per
pytest process, and every such process is forked from it: a real process of its own, with the
environment, directory, arguments and standard streams it asked for, that has nothing loaded but
modules.  A launcher forked so forks its own server from itself (see `ForkServer.start`), so its
tasks import nothing either.

What a fork cannot change is fixed at the server's start: environment variables TensorFlow reads
while it is imported.  A test that needs a process started as the user starts it (the install, the
ops' loading, the README's commands) uses `subprocess` itself.  With ``TF_ECREC_FORKSERVER=0`` in the
environment every process is started with `subprocess`.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from tf_ecrec.launcher.forkserver import PRELOAD, ForkServer

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the forked processes run: the launcher and its CLI, the Estimator API the scripts use.
ZYGOTE_PRELOAD = (*PRELOAD, "tf_ecrec.cli", "tensorflow_estimator", "harness.run_script")

_lock = threading.Lock()
_server: ForkServer | None = None
_owner = 0


def _environment() -> dict[str, str]:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONPATH": os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH", "")) if p)}


def server() -> ForkServer | None:
    """This process's server, started at the first call (None: every process is started on its own)."""
    global _server, _owner  # pylint: disable=global-statement
    if os.environ.get("TF_ECREC_FORKSERVER", "1") == "0":
        return None
    with _lock:
        if _server is None or _owner != os.getpid():
            log = tempfile.NamedTemporaryFile(prefix="test-forkserver-", suffix=".log", delete=False)
            log.close()
            _server = ForkServer(_environment(), log.name, preload=ZYGOTE_PRELOAD)
            _server.start()
            _owner = os.getpid()
            atexit.register(_server.close)
        return _server if _server.usable else None


def _module_args(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    """``python -m M A`` -> (M, A); ``python S A`` / ``python -c C`` -> the script runner; else None."""
    if len(argv) < 2 or argv[0] != sys.executable:
        return None
    if argv[1] == "-m" and len(argv) > 2:
        return argv[2], list(argv[3:])
    if argv[1] == "-c" or (not argv[1].startswith("-") and argv[1].endswith(".py")):
        return "harness.run_script", list(argv[1:])
    return None


def _merged_env(env: Mapping[str, str] | None) -> dict[str, str]:
    merged = dict(os.environ if env is None else env)
    path = merged.get("PYTHONPATH", "")
    if TESTS not in path.split(os.pathsep):
        merged["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, path) if p)
    return merged


def popen(argv: Sequence[str], env: Mapping[str, str] | None = None, stdin: Any = subprocess.DEVNULL,
          stdout: Any = None, stderr: Any = None, cwd: str | None = None, name: str = "") -> Any:
    """`subprocess.Popen(argv, ...)`, forked when `argv` runs Python (``-m``, a script or ``-c``).

    The streams are descriptors or files; None is this process's own.
    """
    target = _module_args(argv)
    forks = server() if target is not None else None
    if forks is None or target is None:
        return subprocess.Popen(list(argv), env=None if env is None else dict(env), stdin=stdin, stdout=stdout,
                                stderr=stderr, cwd=cwd)
    streams = []
    opened = []
    for stream, default in ((stdin, 0), (stdout, 1), (stderr, 2)):
        if stream is None:
            stream = default
        elif stream == subprocess.DEVNULL:
            stream = os.open(os.devnull, os.O_RDWR)
            opened.append(stream)
        elif stream == subprocess.STDOUT:
            stream = streams[1]
        streams.append(stream if isinstance(stream, int) else stream.fileno())
    try:
        proc = forks.spawn(target[0], target[1], _merged_env(env), *streams, name=name, cwd=cwd)
    finally:
        for fd in opened:
            os.close(fd)
    if proc is None:
        return subprocess.Popen(list(argv), env=None if env is None else dict(env), stdin=stdin, stdout=stdout,
                                stderr=stderr, cwd=cwd)
    return proc


def run(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None,
        timeout: float | None = None) -> subprocess.CompletedProcess:
    """`subprocess.run(argv, capture_output=True, text=True, ...)`, forked as `popen` forks.

    Raises:
      subprocess.TimeoutExpired: the process did not end within `timeout` (it is killed first).
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = popen(argv, env=env, stdout=out, stderr=err, cwd=cwd)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        texts = []
        for stream in (out, err):
            stream.seek(0)
            texts.append(stream.read().decode("utf-8", errors="replace"))
    return subprocess.CompletedProcess(list(argv), code, texts[0], texts[1])
