"""The launcher's fork server (`tf_ecrec.launcher.forkserver`) against what ``python -m`` gives a task.

Each case runs in a process of its own (`run_in_fresh_process`): the server makes the process that
starts it a child subreaper.  The server preloads only `json` here
(what it saves is TensorFlow's import; what it must keep is the process contract, checked side by
side with the same module started on its own).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

from harness.procs import running

from tf_ecrec.launcher import forked_process
from tf_ecrec.launcher.child import command
from tf_ecrec.launcher.forkserver import ENV_FORKSERVER, ForkedProcess, ForkServer

PROBE = textwrap.dedent(
    """
    import json, logging, os, sys
    if __name__ == "__main__":
        line = sys.stdin.readline().strip()
        logging.basicConfig(level=logging.INFO)  # takes, as in a new interpreter: the launcher's setup is not ours
        print(json.dumps({"argv": sys.argv[1:], "stdin": line, "cwd": os.getcwd(), "ppid": os.getppid(),
                          "env": os.environ.get("PROBE_VALUE"), "name": __name__,
                          "path_has_probe_dir": os.environ.get("PROBE_DIR") in sys.path,
                          "log": [logging.getLogger().level, len(logging.getLogger().handlers)]}))
        print("to stderr", file=sys.stderr)
        sys.stdout.flush()
        code = sys.argv[1]
        if code == "raise":
            raise RuntimeError("probe failed")
        if code == "sleep":
            import time
            time.sleep(60)
        raise SystemExit(int(code))
    """
)


def _probe_dir() -> str:
    directory = tempfile.mkdtemp(prefix="fs_probe_")
    with open(os.path.join(directory, "fs_probe_mod.py"), "w", encoding="utf-8") as fh:
        fh.write(PROBE)
    return directory


def _feed_and_wait(proc: Any, stdin_w: int, code: str) -> int:
    """Writes the probe's input line and closes it; kills a "sleep" probe once it is seen alive; its exit code."""
    os.write(stdin_w, b"hello\n")
    os.close(stdin_w)
    if code == "sleep":
        time.sleep(1.0)
        assert proc.poll() is None
        proc.kill()
    return proc.wait(30)


def _run(start: Any, code: str, probe_dir: str, workdir: str) -> tuple[int, dict, str]:
    """Starts the probe with `start` (forked or on its own), feeds its stdin; (exit code, its JSON, its stderr)."""
    import json

    stdin_r, stdin_w = os.pipe()
    out_path, err_path = os.path.join(workdir, f"out{code}"), os.path.join(workdir, f"err{code}")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        env = {**os.environ, "PROBE_VALUE": f"v{code}", "PROBE_DIR": probe_dir,
               "PYTHONPATH": os.pathsep.join([probe_dir, os.environ.get("PYTHONPATH", "")])}
        proc = start("fs_probe_mod", [code, "x y"], env, stdin_r, out.fileno(), err.fileno())
    os.close(stdin_r)
    rc = _feed_and_wait(proc, stdin_w, code)
    with open(out_path) as fh:
        line = fh.read().strip().splitlines()[0]
    with open(err_path) as fh:
        return rc, json.loads(line), fh.read()


def _own_process(module: str, args: list[str], env: dict, stdin: int, stdout: int, stderr: int) -> subprocess.Popen:
    return subprocess.Popen(command(module, *args), env=env, stdin=stdin, stdout=stdout, stderr=stderr)


def contract_case(self_forked: bool = False) -> None:
    """The same probe, forked and on its own: the same argv, stdin, streams, cwd, env, parent and exit codes.

    The case runs in a process forked from the test session's server (`harness.zygote`): with
    `self_forked` its own server is a fork of itself (as a launcher forked so makes it), else a new
    interpreter (as the launcher a user starts makes it).
    """
    import logging

    forked_process.FORKED_TASK = self_forked
    logging.basicConfig(level=logging.ERROR)  # the launcher's own (tf-ecrec's CLI sets one)
    probe_dir = _probe_dir()
    workdir = tempfile.mkdtemp(prefix="fs_work_")
    server = ForkServer(os.environ, os.path.join(workdir, "forkserver.log"), preload=("json",))
    server.start()
    assert server.usable
    assert isinstance(server._proc, ForkedProcess) == self_forked, server._proc  # pylint: disable=protected-access

    def forked(*args: Any) -> ForkedProcess:
        proc = server.spawn(*args)
        assert isinstance(proc, ForkedProcess), proc
        return proc

    try:
        for code in ("0", "3", "raise", "sleep"):
            results = [_run(start, code, probe_dir, workdir) for start in (forked, _own_process)]
            (rc_f, info_f, err_f), (rc_o, info_o, err_o) = results
            expected = {"0": 0, "3": 3, "raise": 1, "sleep": -signal.SIGKILL}[code]
            assert rc_f == rc_o == expected, (code, rc_f, rc_o)
            assert info_f == info_o, (info_f, info_o)
            assert info_f["argv"] == [code, "x y"] and info_f["stdin"] == "hello" and info_f["env"] == f"v{code}"
            assert info_f["ppid"] == os.getpid() and info_f["name"] == "__main__" and info_f["path_has_probe_dir"]
            assert info_f["log"] == [logging.INFO, 1], info_f
            assert "to stderr" in err_f and "to stderr" in err_o
            assert ("probe failed" in err_f) == ("probe failed" in err_o) == (code == "raise")
            assert "RuntimeWarning" not in err_f, err_f
    finally:
        server.close()


def self_forked_contract_case() -> None:
    contract_case(self_forked=True)


def start_child_case() -> None:
    """`start_child` from a forked task (no thread but the main one) forks the child from itself: the same exit
    codes, environment and fresh logging as the child started as a new interpreter."""
    import json
    import logging

    logging.basicConfig(level=logging.ERROR)  # the parent's own, which the child must not inherit
    probe_dir = _probe_dir()
    workdir = tempfile.mkdtemp(prefix="fs_work_")
    env = {**os.environ, "PROBE_DIR": probe_dir, "PYTHONPATH": os.pathsep.join([probe_dir, os.environ.get("PYTHONPATH", "")])}
    results = {}
    for forked in (True, False):
        forked_process.FORKED_TASK = forked
        for code in ("0", "3", "raise", "sleep"):
            out = os.path.join(workdir, f"out-{forked}-{code}")
            read, write = os.pipe()
            saved = [os.dup(0), os.dup(1)]
            with open(out, "w") as fh:  # the child inherits our standard streams, as a pod's task does
                os.dup2(read, 0)
                os.dup2(fh.fileno(), 1)
                try:
                    proc = forked_process.start_child("fs_probe_mod", [code, "x y"], {**env, "PROBE_VALUE": code})
                finally:
                    os.dup2(saved[0], 0)
                    os.dup2(saved[1], 1)
                    for fd in (*saved, read):
                        os.close(fd)
            assert isinstance(proc, ForkedProcess) == forked, proc
            rc = _feed_and_wait(proc, write, code)
            with open(out) as fh:
                info = json.loads(fh.read().strip().splitlines()[0])
            info.pop("ppid")
            results[(forked, code)] = (rc, info)
    for code, expected in (("0", 0), ("3", 3), ("raise", 1), ("sleep", -signal.SIGKILL)):
        assert results[(True, code)] == results[(False, code)], (results[(True, code)], results[(False, code)])
        rc, info = results[(True, code)]
        assert rc == expected and info["env"] == code and info["log"] == [logging.INFO, 1], (code, rc, info)


def launcher_death_case() -> None:
    """A forked task dies with the process that asked for it, as a task started on its own does."""
    probe_dir = _probe_dir()
    workdir = tempfile.mkdtemp(prefix="fs_work_")
    script = textwrap.dedent(
        f"""
        import os, sys, time
        from tf_ecrec.launcher.forkserver import ForkServer
        server = ForkServer(os.environ, {os.path.join(workdir, "fs.log")!r}, preload=("json",))
        server.start()
        env = {{**os.environ, "PYTHONPATH": {probe_dir!r} + os.pathsep + os.environ.get("PYTHONPATH", "")}}
        r, w = os.pipe()
        proc = server.spawn("fs_probe_mod", ["sleep"], env, r, 1, 2)
        print(proc.pid, flush=True)
        time.sleep(60)
        """
    )
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    pid = int(launcher.stdout.readline())
    os.kill(pid, 0)  # it runs
    launcher.kill()
    launcher.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        if not running(pid):  # gone, or a zombie of init's
            return
        time.sleep(0.05)
    raise AssertionError(f"the forked task {pid} outlived its launcher")


def switched_off_case() -> None:
    """With TF_ECREC_FORKSERVER=0 there is no server: spawn says so and the caller starts the task itself."""
    os.environ[ENV_FORKSERVER] = "0"
    server = ForkServer(os.environ, os.devnull, preload=("json",))
    server.start()
    assert not server.usable
    assert server.spawn("json", [], os.environ, 0, 1, 2) is None
    server.close()


def failed_preload_case() -> None:
    """A server whose imports fail is not used: spawn returns None, so each task meets the failure in its own log."""
    workdir = tempfile.mkdtemp(prefix="fs_work_")
    log = os.path.join(workdir, "fs.log")
    server = ForkServer(os.environ, log, preload=("json", "no_such_module_for_the_fork_server"))
    server.start()
    assert server.spawn("json", [], os.environ, 0, 1, 2) is None and not server.usable
    server.close()
    with open(log) as fh:
        assert "no_such_module_for_the_fork_server" in fh.read()


def test_a_forked_task_gets_what_python_m_gives_it(fresh_process: Any) -> None:
    fresh_process("unit.test_forkserver:contract_case", timeout=120)


def test_a_server_forked_from_its_launcher_gives_tasks_the_same(fresh_process: Any) -> None:
    fresh_process("unit.test_forkserver:self_forked_contract_case", timeout=120)


def test_a_child_forked_by_a_forked_task_is_what_a_new_interpreter_would_be(fresh_process: Any) -> None:
    fresh_process("unit.test_forkserver:start_child_case", timeout=120)


def test_a_forked_task_dies_with_its_launcher(fresh_process: Any) -> None:
    fresh_process("unit.test_forkserver:launcher_death_case", timeout=120)


def test_the_server_can_be_switched_off(fresh_process: Any) -> None:
    fresh_process("unit.test_forkserver:switched_off_case", timeout=60)


def test_a_server_that_cannot_load_is_not_used(fresh_process: Any) -> None:
    fresh_process("unit.test_forkserver:failed_preload_case", timeout=60)


def test_a_task_adopted_by_another_process_than_the_launcher_leaves_at_once() -> None:
    """The launcher can die between the server's answer and the task's first look at its parent: the task is
    then adopted by another process and must leave before asking for the death signal, without waiting out
    its 30-second guard (the launcher-death case above races into this path only now and then)."""
    code = textwrap.dedent(
        """
        import os
        from tf_ecrec.launcher.forkserver import _become_task
        # Neither pid is this process's parent (pytest is), as when the launcher died and someone else adopted us.
        _become_task({"middle": os.getpid(), "fds": [0, 1, 2], "cwd": "/", "env": {}}, launcher=os.getpid())
        print("became a task", flush=True)
        """
    )
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "became a task" not in result.stdout, result
    assert time.monotonic() - started < 20, "the task waited out its guard instead of leaving"
