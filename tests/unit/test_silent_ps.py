"""The launcher's watch of silent PS tasks (`tf_ecrec.launcher.exits.ExitWatch`): a PS that answers costs
no read of its threads' CPU; one that goes silent is weighed by the CPU it spends, and killed when it spends
nothing (stopped) or, busy, after the grace.

Real child processes (one SIGSTOPped, one spinning); the probe is a stand-in whose answers the test sets
(the real probe against real PS tasks: tests/integration/test_ps_probe.py, tests/e2e/test_ps_hang.py).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from tf_ecrec.cluster.tf_config import ClusterConfig
from tf_ecrec.launcher import exits
from tf_ecrec.launcher.exits import ExitWatch
from tf_ecrec.launcher.process_table import TaskProcess, TaskState
from tf_ecrec.launcher.ps_probe import BUSY_GRACE

CLUSTER = {"ps": ("127.0.0.1:1", "127.0.0.1:2"), "chief": ("127.0.0.1:3",)}
HANG_SECS = 1.0


class _Probe:
    """Answers as the test says: name -> when that PS last answered."""

    def __init__(self) -> None:
        self.answers: dict[str, float] = {}

    def watch(self, targets) -> None:
        self.targets = dict(targets)

    def last_answer(self, name: str, address: str) -> float | None:
        return self.answers.get(name)


@pytest.fixture
def watch(monkeypatch):
    procs = [subprocess.Popen([sys.executable, "-c", code]) for code in
             ("import time\nwhile True: time.sleep(1)", "while True: pass")]
    try:  # the spinning child never outlives the test, whatever fails
        tasks = {f"ps:{i}": TaskProcess(ClusterConfig(CLUSTER, "ps", i), process=p, state=TaskState.RUNNING,
                                        started_at=1.0) for i, p in enumerate(procs)}
        job = SimpleNamespace(ps_memory_mb=None, injections=(), hang_secs=0, ps_hang_secs=HANG_SECS)
        run = SimpleNamespace(tasks=tasks, global_step=0, job=job,
                              table=SimpleNamespace(ps=lambda: list(tasks.values()), trainers=lambda: []))
        reads: list[int] = []
        real = exits.busy_seconds
        monkeypatch.setattr(exits, "busy_seconds", lambda pid: reads.append(pid) or real(pid))
        probe = _Probe()
        yield ExitWatch(run, probe=probe), probe, tasks, reads
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_ps_that_answers_is_never_read(watch):
    exit_watch, probe, tasks, reads = watch
    for _ in range(200):  # ten seconds of the supervisor's loop
        now = time.time()
        probe.answers = dict.fromkeys(tasks, now - 0.4)
        assert exit_watch.drive(now) == []
    assert reads == []
    assert all(t.alive for t in tasks.values())


def test_a_stopped_ps_is_killed_past_the_bound_and_a_busy_one_only_after_the_grace(watch):
    exit_watch, probe, tasks, reads = watch
    stopped, busy = tasks["ps:0"], tasks["ps:1"]
    stopped.process.send_signal(signal.SIGSTOP)
    last = time.time()
    probe.answers = {"ps:0": last, "ps:1": last}
    assert exit_watch.drive(last + 0.3) == [] and reads == []  # silent under half the bound: not read
    time.sleep(0.6)
    assert exit_watch.drive(time.time()) == []  # past half the bound: the CPU its silence is weighed against
    assert sorted(reads) == sorted([stopped.process.pid, busy.process.pid])
    time.sleep(HANG_SECS)  # the spinning one runs or waits to run all along: its share is near a core
    assert exit_watch.drive(time.time()) == [stopped]
    assert stopped.process.wait(timeout=10) == -signal.SIGKILL and busy.alive
    stopped.state = TaskState.KILLED  # what the supervisor makes of a task the watch returned
    while (now := time.time()) - last <= BUSY_GRACE * HANG_SECS:
        assert exit_watch.drive(now) == []
        time.sleep(0.2)
    assert exit_watch.drive(time.time()) == [busy]
    assert busy.process.wait(timeout=10) == -signal.SIGKILL
