"""A PS that never comes back: the migration hook says which, waits its bound, then gives up (pure logic;
the launched job that never restarts a PS is tests/e2e/test_launcher.py's --restart-delay inf test)."""

import threading
import time

import pytest

from tf_ecrec.errors import RecoveryError
from tf_ecrec.session.migration import ClusterSourceMigrationHook


class _Source:
    def __init__(self, addresses):
        self.addresses = list(addresses)

    def ps_addresses(self):
        return list(self.addresses)


class _Context:
    def request_stop(self):
        raise AssertionError("no stop expected")


def _spin(seconds, hook=None):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if hook is not None:
            hook.after_run(_Context(), None)  # a step completed
        time.sleep(0.01)


def test_a_ps_gone_past_the_bound_with_no_step_interrupts_the_training_thread_with_its_name(caplog):
    fired = []  # the interrupt of the training thread (_thread.interrupt_main in a trainer), again until `end`
    hook = ClusterSourceMigrationHook(_Source(["h:1", ""]), ["h:1", "h:2"], poll_secs=0.02, give_up_secs=0.3,
                                      task="worker:0", interrupt=lambda: fired.append(time.monotonic()))
    started = time.monotonic()
    hook.begin()
    try:
        deadline = time.monotonic() + 20
        while len(fired) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        hook.end(None)
    assert len(fired) >= 3 and fired[0] - started >= 0.3, fired
    assert isinstance(hook.gave_up, RecoveryError)
    assert "worker:0: ps:1 gone for" in str(hook.gave_up) and "(the bound: 0.3 s)" in str(hook.gave_up)
    assert any("ps:1 gone" in r.getMessage() and "waiting up to" in r.getMessage() for r in caplog.records)


def _wait_for(condition, seconds=20):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_interrupts_the_training_thread_ignores_end_in_on_stuck_once_after_the_bound():
    # Interrupts that land inside native code can be lost (a trainer once re-created sessions for ten
    # minutes): after stuck_exit_secs with no acknowledge, on_stuck ends the process, once.
    fired, stuck = [], []
    hook = ClusterSourceMigrationHook(_Source(["h:1", ""]), ["h:1", "h:2"], poll_secs=0.02, give_up_secs=0.2,
                                      task="chief:0", interrupt=lambda: fired.append(time.monotonic()),
                                      stuck_exit_secs=0.5, on_stuck=lambda error: stuck.append((time.monotonic(), error)))
    hook.begin()
    try:
        _wait_for(lambda: stuck)
        time.sleep(0.2)  # the poller has returned: no second call, no more interrupts
        after = len(fired)
        time.sleep(0.2)
    finally:
        hook.end(None)
    assert len(stuck) == 1 and stuck[0][1] is hook.gave_up, stuck
    assert stuck[0][0] - fired[0] >= 0.5 and len(fired) >= 3, (stuck, fired)
    assert len(fired) == after


def test_an_acknowledged_give_up_stops_the_interrupts_and_never_ends_the_process():
    fired, stuck = [], []
    hook = ClusterSourceMigrationHook(_Source(["h:1", ""]), ["h:1", "h:2"], poll_secs=0.02, give_up_secs=0.2,
                                      interrupt=lambda: fired.append(1), stuck_exit_secs=0.5, on_stuck=stuck.append)
    hook.begin()
    try:
        _wait_for(lambda: fired)
        hook.acknowledge()  # the failover loop raised the RecoveryError: the training thread stopped
        time.sleep(0.1)
        count = len(fired)
        time.sleep(0.8)  # past stuck_exit_secs
    finally:
        hook.end(None)
    assert stuck == [] and len(fired) == count, (stuck, fired)


def test_steps_or_the_ps_coming_back_keep_the_hook_waiting():
    source = _Source(["h:1", ""])
    hook = ClusterSourceMigrationHook(source, ["h:1", "h:2"], poll_secs=0.02, give_up_secs=0.3)
    hook.begin()
    try:
        _spin(1.0, hook)  # steps complete (the PS is not needed by them): no giving up
        assert hook.gave_up is None
        source.addresses = ["h:1", "h:2"]  # back at its address
        _spin(1.0)
        assert hook.gave_up is None and hook.migration is None
    finally:
        hook.end(None)


def test_off_the_main_thread_the_hook_only_says_which_ps_is_gone(caplog):
    hook = ClusterSourceMigrationHook(_Source(["", "h:2"]), ["h:1", "h:2"], poll_secs=0.02, give_up_secs=0.1)
    worker = threading.Thread(target=hook.begin)
    worker.start()
    worker.join()
    try:
        _spin(0.6)
    finally:
        hook.end(None)
    assert hook.gave_up is None
    assert any("ps:0 gone" in r.getMessage() for r in caplog.records)


def test_a_bound_must_be_positive():
    from tf_ecrec.errors import ConfigError

    with pytest.raises(ConfigError, match="give_up_secs=0"):
        ClusterSourceMigrationHook(_Source(["h:1"]), ["h:1"], give_up_secs=0)


def test_the_repeat_filter_lets_one_record_through_per_period_and_counts_the_rest():
    import logging

    from tf_ecrec.master.rate_limited_log import RepeatFilter

    now = [0.0]
    quiet = RepeatFilter(("An error was raised",), every_secs=30.0, clock=lambda: now[0])
    record = lambda msg: logging.LogRecord("tensorflow", logging.INFO, __file__, 1, msg, (), None)  # noqa: E731
    assert quiet.filter(record("An error was raised while a session was being created. Error: %s"))
    assert not any(quiet.filter(record("An error was raised again")) for _ in range(40))
    assert quiet.filter(record("Graph was finalized."))  # anything else passes
    now[0] = 31.0
    later = record("An error was raised, later")
    assert quiet.filter(later) and "(40 more like it in the last 30 s, not shown)" in later.msg
