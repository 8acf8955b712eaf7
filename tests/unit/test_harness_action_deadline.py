"""The fault-schedule harness bounds each action: a run that outlives its own deadline is a `HungAction`.

CI once saw a harness action's ``session.run`` never return although its RunOptions deadline had
passed (TensorFlow's master waits for every partition after it cancels them). Past the deadline plus
a grace, an apply under a background rebuild (run on a thread of its own) raises
`HungAction`. A session stands in for TensorFlow: what is checked is the harness's own bound, which
is pure logic.
"""

from __future__ import annotations

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


@pytest.mark.parametrize("job", [None, _Job()], ids=["this-thread", "own-thread"])
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

