"""The launcher's end of a job with a master: a trainer still running after the data is finished and the
chief has ended is asked to leave, then killed (tf_ecrec.launcher.master_driver).

Real child processes; the run around them is a stand-in holding only what `MasterDriver` reads
(its task table, its events, its console, the master's dataset counters).
"""

from __future__ import annotations

import selectors
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from tf_ecrec.cluster.tf_config import ClusterConfig
from tf_ecrec.launcher import master_driver
from tf_ecrec.launcher.events import EventKind
from tf_ecrec.launcher.master_driver import MasterDriver
from tf_ecrec.launcher.process_table import TaskProcess, TaskState

CLUSTER = {"ps": ("127.0.0.1:1",), "chief": ("127.0.0.1:2",), "worker": ("127.0.0.1:3", "127.0.0.1:4")}
# Each child says "ready" once its signal dispositions are in place (a fixed sleep was not enough on a
# loaded machine: SIGTERM reached the deaf one before it ignored it).
SLEEPER = "import time\nprint('ready', flush=True)\nwhile True: time.sleep(1)"
DEAF = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\nwhile True: time.sleep(1)"
READY_SECS = 60.0  # an interpreter's start; the wait ends at the line, not at the deadline


class _Watch:
    def __init__(self) -> None:
        self.finished = False

    def departures(self):
        return [], []

    def flush_reports(self) -> None:
        pass

    def data_state(self):
        return SimpleNamespace(finished=self.finished)


class _Run:
    def __init__(self, tasks: dict[str, TaskProcess]) -> None:
        self.tasks = tasks
        self.table = SimpleNamespace(trainers=lambda: [t for t in tasks.values() if t.cluster.task_type != "ps"])
        self.watch = _Watch()
        self.master = None
        self.job = SimpleNamespace(added_at=lambda name: None, removes=())
        self.global_step = 100
        self.events: list[tuple] = []
        self.lines: list[str] = []
        self.reports: list[tuple[str, str]] = []
        self.console = SimpleNamespace(print=self.lines.append)
        self.record = SimpleNamespace(done_reports={})

    def event(self, kind, task, step=None, t=None, **extra) -> None:
        self.events.append((kind, task, extra))

    def watch_report(self, name: str, reason: str) -> None:
        self.reports.append((name, reason))


@pytest.fixture
def run():
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for code in (SLEEPER, DEAF)]
    for proc in procs:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as waiting:  # epoll: a worker process may hold descriptors past select's 1024
            waiting.register(proc.stdout, selectors.EVENT_READ)
            ready = waiting.select(READY_SECS)
        assert ready and proc.stdout.readline() == "ready\n", f"a child did not start within {READY_SECS} s"
    tasks = {"chief:0": TaskProcess(ClusterConfig(CLUSTER, "chief", 0), state=TaskState.DONE)}
    for i, proc in enumerate(procs):
        tasks[f"worker:{i}"] = TaskProcess(ClusterConfig(CLUSTER, "worker", i), process=proc, state=TaskState.RUNNING)
    yield _Run(tasks)
    for proc in procs:
        proc.kill()
        proc.wait()


def test_trainers_left_running_after_the_data_and_the_chief_are_done_leave_then_are_killed(run, monkeypatch):
    monkeypatch.setattr(master_driver, "FINISHED_GRACE_SECS", 0.3)
    monkeypatch.setattr(master_driver, "FINISHED_LEAVE_SECS", 1.0)
    driver = MasterDriver(run, lost=lambda task: pytest.fail(f"{task.name} counted as lost"))

    # the data is not finished: nobody is asked anything, however long
    driver.drive(time.time())
    driver.drive(time.time() + 100)
    assert [t.state for t in run.tasks.values()] == [TaskState.DONE, TaskState.RUNNING, TaskState.RUNNING]

    run.watch.finished = True
    t0 = time.time() + 200  # the driver's clock is the one it is given
    driver.drive(t0)  # seen finished: the grace starts
    assert run.tasks["worker:0"].state is TaskState.RUNNING
    driver.drive(t0 + 0.5)  # past the grace: SIGTERM to both
    assert [e[:2] for e in run.events] == [(EventKind.REMOVE, "worker:0"), (EventKind.REMOVE, "worker:1")]
    assert all(t.state is TaskState.LEAVING for n, t in run.tasks.items() if n != "chief:0")
    assert "still running 0.3 s after the data was finished" in run.lines[0]
    assert run.tasks["worker:0"].process.wait(timeout=10) == -signal.SIGTERM

    # the one that ignores SIGTERM is killed at its deadline, and said so
    deaf = run.tasks["worker:1"]
    driver.drive(t0 + 0.6)
    assert deaf.alive and deaf.state is TaskState.LEAVING
    driver.drive(deaf.leave_deadline + 0.01)
    assert deaf.state is TaskState.REMOVED and deaf.process.returncode == -signal.SIGKILL
    assert run.reports == [("worker:1", "did not leave by its deadline after SIGTERM")]


def test_nothing_is_asked_while_the_chief_still_trains(run, monkeypatch):
    monkeypatch.setattr(master_driver, "FINISHED_GRACE_SECS", 0.0)
    run.tasks["chief:0"].state = TaskState.RUNNING
    run.watch.finished = True
    driver = MasterDriver(run, lost=lambda task: None)
    driver.drive(time.time())
    driver.drive(time.time() + 100)
    assert run.events == [] and all(t.state is TaskState.RUNNING for n, t in run.tasks.items() if n != "chief:0")


def test_a_trainer_waiting_for_records_is_not_hung_but_one_idle_while_records_wait_is(run):
    from tf_ecrec.launcher.exits import HANG_MIN_STEPS, ExitWatch

    run.job = SimpleNamespace(ps_memory_mb=None, injections=(), hang_secs=4.0)
    worker = run.tasks["worker:0"]
    worker.training = True
    watch = ExitWatch(run)
    t0 = time.time()
    watch.progressed("worker:0", t0)
    run.global_step = 100 + HANG_MIN_STEPS + 5  # the others trained on
    # every record that can be leased is trained or leased, and it holds none: waiting is not a hang
    assert watch.drive(t0 + 60, waiting={"worker:0"}) == []
    assert worker.alive
    # records came: the clock starts again from there, and a worker still idle 4 s later is hung
    assert watch.drive(t0 + 62) == []
    run.global_step += HANG_MIN_STEPS
    assert watch.drive(t0 + 64.5) == [worker] and worker.process.returncode == -signal.SIGKILL


def test_a_trainer_holding_a_lease_is_hung_even_when_nothing_is_left_to_lease(run):
    # A trainer hung with the last records leased is what leaves nothing to lease: the others wait
    # (exempt), it does not.
    from tf_ecrec.launcher.exits import HANG_MIN_STEPS, ExitWatch

    run.job = SimpleNamespace(ps_memory_mb=None, injections=(), hang_secs=4.0)
    worker, other = run.tasks["worker:0"], run.tasks["worker:1"]
    worker.training = other.training = True
    watch = ExitWatch(run)
    t0 = time.time()
    watch.progressed("worker:0", t0)
    watch.progressed("worker:1", t0)
    run.global_step = 100 + HANG_MIN_STEPS + 5
    assert watch.drive(t0 + 5, waiting={"worker:1"}) == [worker]
    assert worker.process.returncode == -signal.SIGKILL and other.alive
