"""The launcher's fault schedule, driven by an injected clock: kills due by step, restarts due by time, recovery."""

from __future__ import annotations

from tf_ecrec.launcher.faults import FaultSchedule
from tf_ecrec.launcher.job.kill_spec import KillSpec


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_planned_kill_is_due_at_its_step_and_its_restart_after_the_delay():
    clock = Clock()
    schedule = FaultSchedule([KillSpec("ps", 1, 300), KillSpec("worker", 0, 100)], restart_delay=2.0, clock=clock)
    assert [f.task for f in schedule.faults] == ["worker:0", "ps:1"]  # by step
    assert schedule.due_kills(99) == []
    (due,) = schedule.due_kills(100)
    assert due.task == "worker:0"
    # The caller may defer a due kill (a worker not yet training): it stays due.
    assert schedule.due_kills(101) == [due]
    schedule.hit(due, 104)
    assert (due.killed_at, due.killed_at_step, due.restart_at) == (1000.0, 104, 1002.0)
    assert schedule.due_kills(200) == []
    assert schedule.due_restarts(1001.9) == []
    assert schedule.due_restarts(1002.0) == [due]
    schedule.restarted(due)
    assert due.restart_at is None and schedule.due_restarts(5000.0) == []
    assert [f.task for f in schedule.due_kills(300)] == ["ps:1"]


def test_after_a_kill_the_first_step_resumes_and_the_step_of_the_kill_regains():
    clock = Clock()
    schedule = FaultSchedule([KillSpec("ps", 0, 50)], restart_delay=0.0, clock=clock)
    (fault,) = schedule.due_kills(60)
    assert not schedule.interrupted(999.0) and not schedule.awaiting_resume()
    schedule.hit(fault, 60)
    assert schedule.awaiting_resume()
    assert not schedule.interrupted(1000.0)  # a datagram sent before the kill
    assert schedule.interrupted(1000.5)  # after it: the global step may go down
    assert schedule.progress(999.0, 61) == []  # a step from before the kill does not count
    clock.now = 1005.0
    assert schedule.progress(1003.0, 41) == [("resumed", fault)]  # rolled back to 40
    assert not schedule.awaiting_resume() and not schedule.interrupted(1004.0)
    assert schedule.progress(1004.0, 59) == []
    assert schedule.progress(1006.0, 60) == [("regained", fault)]
    assert schedule.progress(1007.0, 70) == []  # each once


def test_an_unplanned_fault_is_hit_at_once_and_restarts_like_a_planned_one():
    clock = Clock(50.0)
    schedule = FaultSchedule([], restart_delay=3.0, clock=clock)
    crash = schedule.unplanned("ps", 2, 120)
    assert crash.task == "ps:2" and crash.spec.step == 120 and schedule.due_kills(10_000) == [crash]
    schedule.hit(crash, 120)
    assert schedule.due_kills(10_000) == []
    clock.now = 60.0
    lost = schedule.unplanned("worker", 1, 130)
    schedule.hit(lost, 130)
    assert schedule.due_restarts(53.0) == [crash]
    assert schedule.due_restarts(63.0) == [crash, lost]
    schedule.restarted(crash)  # e.g. a spare PS took its role
    assert schedule.due_restarts(63.0) == [lost]


def test_the_master_is_a_fault_target_like_any_task():
    schedule = FaultSchedule([KillSpec.parse("master@step=10")], restart_delay=1.0, clock=Clock(7.0))
    (fault,) = schedule.due_kills(10)
    assert fault.on_master and fault.task == "master"
    schedule.hit(fault, 10)
    assert schedule.due_restarts(8.0) == [fault]


def test_after_a_ps_kill_only_a_step_of_a_session_created_since_resumes():
    # A step in flight at the kill that did not need the dead PS completes on the old session, with the
    # global step it read before the failure took steps back: training has not resumed (every trainer
    # re-creates its session for a lost PS).  A worker's kill leaves the other trainers' sessions alone.
    clock = Clock()
    schedule = FaultSchedule([KillSpec("ps", 1, 200), KillSpec("worker", 0, 300)], restart_delay=0.0, clock=clock)
    (ps_kill,) = schedule.due_kills(200)
    clock.now = 1000.0
    schedule.hit(ps_kill, 200)
    assert schedule.progress(1000.7, 195, session_at=990.0) == []  # the old session's step, a stale read
    assert schedule.awaiting_resume()
    assert schedule.progress(1006.0, 200, session_at=1005.5) == [("resumed", ps_kill), ("regained", ps_kill)]
    (worker_kill,) = schedule.due_kills(300)
    clock.now = 1100.0
    schedule.hit(worker_kill, 300)
    assert schedule.progress(1100.5, 301, session_at=1005.5) == [("resumed", worker_kill), ("regained", worker_kill)]


def test_a_kill_during_a_rebuild_is_due_while_one_runs_at_whatever_step():
    schedule = FaultSchedule([KillSpec.parse("chief:0@rebuild"), KillSpec.parse("ps:1@step=300")], restart_delay=1.0,
                             clock=Clock())
    assert [f.task for f in schedule.due_kills(10_000)] == ["ps:1"]  # no rebuild under way: not due at any step
    (during,) = schedule.due_kills(5, rebuilding=True)
    assert during.task == "chief:0"
    schedule.hit(during, 5)
    assert schedule.due_kills(5, rebuilding=True) == []  # once
