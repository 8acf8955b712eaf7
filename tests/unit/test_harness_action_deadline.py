"""The fault-schedule harness bounds each action: a run that outlives its own deadline is a `HungAction`.

CI once saw a harness action's ``session.run`` never return although its RunOptions deadline had
passed (TensorFlow's master waits for every partition after it cancels them). Past the deadline plus
a grace, an action on the harness's action thread raises `HungAction`; one on the test's own thread
ends the process with every thread's stack (`faulthandler`: the case below runs in a child). A
session stands in for TensorFlow: what is checked is the harness's own bound, which is pure logic.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from harness import fault_schedule


class _Session:
    def __init__(self, blocks: bool) -> None:
        self.blocks = blocks
        self.release = threading.Event()
        self.timeouts: list[int] = []

    def run(self, fetch: Any, feed: Any, options: Any) -> Any:
        self.timeouts.append(options.timeout_in_ms)
        if self.blocks:
            self.release.wait(30)
        return ("ran", fetch)


class _Job:
    """A background rebuild whose lookups never ask for a row."""

    def install_wanted(self, sess: Any, wait_ms: int) -> int:
        time.sleep(wait_ms / 1000)
        return 0


def _sequence(sess: _Session, job: Any = None) -> Any:
    return SimpleNamespace(sess=sess, seed=7, stats=SimpleNamespace(rows_asked_by_lookups=0), _job=lambda: job)


@pytest.mark.parametrize("job", [None, _Job()], ids=["this-thread", "action-thread"])
def test_an_action_that_returns_gives_its_value_under_the_action_deadline(job: Any) -> None:
    sess = _Session(blocks=False)
    assert fault_schedule.Sequence._run_action(_sequence(sess, job), "op", {}, lookups=True) == ("ran", "op")
    assert sess.timeouts == [fault_schedule.ACTION_TIMEOUT_MS]


def test_an_apply_under_a_rebuild_that_outlives_its_deadline_is_a_hung_action(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fault_schedule, "ACTION_TIMEOUT_MS", 100)
    monkeypatch.setattr(fault_schedule, "HUNG_GRACE_SECS", 0.3)
    sess = _Session(blocks=True)
    started = time.monotonic()
    try:
        with pytest.raises(fault_schedule.HungAction, match="seed 7: op did not return"):
            fault_schedule.Sequence._run_action(_sequence(sess, _Job()), "op", {}, lookups=True)
    finally:
        sess.release.set()
    assert time.monotonic() - started < 10  # bounded by the deadline, not by the run


def test_an_action_on_the_tests_thread_that_outlives_its_deadline_ends_the_process_with_the_stacks() -> None:
    code = """
import sys, threading
from types import SimpleNamespace
from harness import fault_schedule
fault_schedule.ACTION_TIMEOUT_MS, fault_schedule.HUNG_GRACE_SECS = 100, 0.3
class Session:
    def run(self, fetch, feed, options):
        threading.Event().wait(30)
seq = SimpleNamespace(sess=Session(), seed=7, stats=None, _job=lambda: None)
fault_schedule.Sequence._run_action(seq, "op", {}, lookups=False)
print("returned")
"""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1 and "returned" not in done.stdout, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "Timeout (0:00:00" in done.stderr and "_run_action" in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - started < 25  # the import, then 0.4 s: not the 30 s of the run
