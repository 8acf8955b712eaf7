"""The chief's settlement hooks on a real session, with a plan that records what they ask of it.

The settlement itself runs against real logs in tests/integration/test_settlement_cases.py; these
tests pin the hooks' own contract: what they call, in which order, on which session, and what they
do when a PS is gone at the end.
"""

from __future__ import annotations

import logging
import threading

import pytest
import tensorflow as tf

from tf_ecrec.recovery.result import RecoveryMethod
from tf_ecrec.recovery.scaffold import SettleAtEndHook, StaleStepSettlerHook
from tf_ecrec.step.steplog import SettleReport


class _Plan:
    """A RecoveryPlan's surface as the hooks use it."""

    def __init__(self, background_done: bool = True, settle_error: Exception | None = None) -> None:
        self.calls: list[tuple[str, object]] = []
        self.background_done = background_done
        self.settle_error = settle_error
        self.reports: list[SettleReport | None] = []
        self.notified = threading.Event()
        self.results: list[object] = []
        self.reconciler = self

    def wait_background(self, timeout: float | None = None) -> bool:
        self.calls.append(("wait_background", timeout))
        return self.background_done

    def settle_left_behind(self, sess: tf.compat.v1.Session) -> None:
        self.calls.append(("settle", sess))
        if self.settle_error is not None:
            raise self.settle_error

    def reconciler_ps(self) -> list[int]:
        return [0, 1, 2]

    def settle_stale(self, sess: tf.compat.v1.Session, ps: list[int], stale_secs: float, exclude: object = ()) -> SettleReport | None:
        self.calls.append(("settle_stale", (sess, tuple(ps), stale_secs)))
        return self.reports.pop(0) if self.reports else None

    def notify(self, result: object) -> None:
        self.results.append(result)
        self.notified.set()


def test_settle_at_end_waits_for_the_background_rebuild_then_settles_on_the_ending_session():
    plan = _Plan()
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        SettleAtEndHook(plan).end(sess)
    assert [name for name, _ in plan.calls] == ["wait_background", "settle"]
    assert plan.calls[0][1] is not None and plan.calls[0][1] > 0  # a bounded wait
    assert plan.calls[1][1] is sess


def test_settle_at_end_warns_and_goes_on_when_a_ps_is_gone_or_the_rebuild_is_not_done(caplog):
    gone = tf.errors.UnavailableError(None, None, "ps:1 is gone\nmore")
    plan = _Plan(background_done=False, settle_error=gone)
    with caplog.at_level(logging.WARNING), tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        SettleAtEndHook(plan).end(sess)  # does not raise: the next recovery settles
    text = caplog.text
    assert "background rebuild was not done" in text
    assert "could not settle pending steps at the end of training: ps:1 is gone" in text


def test_settle_at_end_lets_a_bug_through():
    plan = _Plan(settle_error=KeyError("bug"))
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess, pytest.raises(KeyError):
        SettleAtEndHook(plan).end(sess)


def test_stale_step_settler_asks_every_interval_and_reports_what_it_settled():
    plan = _Plan()
    plan.reports = [None, SettleReport()]
    hook = StaleStepSettlerHook(plan, interval_secs=0.01, stale_secs=2.5)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        hook.after_create_session(sess, None)
        assert plan.notified.wait(10.0)
        hook.end(sess)
    asked = [args for name, args in plan.calls if name == "settle_stale"]
    assert len(asked) >= 2
    assert all(a == (sess, (0, 1, 2), 2.5) for a in asked)
    assert [r.method for r in plan.results] == [RecoveryMethod.SETTLED]
    n = len(asked)
    threading.Event().wait(0.1)
    assert len([1 for name, _ in plan.calls if name == "settle_stale"]) == n  # stopped at end()


def test_stale_step_settler_rejects_a_nonpositive_interval():
    with pytest.raises(ValueError, match="must be > 0"):
        StaleStepSettlerHook(_Plan(), interval_secs=0.0)
