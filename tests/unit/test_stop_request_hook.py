"""The stop-request hook on a real MonitoredSession: the step in progress completes, then training ends."""

from __future__ import annotations

import threading

import pytest
import tensorflow as tf

from tf_ecrec.errors import ConfigError
from tf_ecrec.hooks.stop_request import StopRequestHook


class Ends(tf.compat.v1.train.SessionRunHook):
    """Counts the steps its after_run saw and whether end() ran (other hooks still finish)."""

    def __init__(self) -> None:
        self.steps = 0
        self.ended = False

    def after_run(self, run_context, run_values) -> None:
        self.steps += 1

    def end(self, session) -> None:
        self.ended = True


def _train(event: threading.Event, set_at_step: int | None, max_steps: int = 50):
    other = Ends()
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.assign_add(step, 1)
        with tf.compat.v1.train.MonitoredSession(hooks=[StopRequestHook(event), other]) as session:
            runs = 0
            while not session.should_stop() and runs < max_steps:
                runs += 1
                if runs == set_at_step:
                    event.set()  # e.g. by a SIGTERM handler, while this step runs
                session.run(train_op)
            final = session.run(step) if not session.should_stop() else None
    return runs, other, final


def test_a_set_event_ends_training_after_the_current_step():
    event = threading.Event()
    runs, other, _ = _train(event, set_at_step=4)
    assert runs == 4  # the step that saw the event completed, none after it
    assert other.steps == 4 and other.ended  # the other hooks' end still ran
    assert event.is_set()  # the hook never clears it


def test_without_a_request_training_goes_on():
    runs, other, final = _train(threading.Event(), set_at_step=None, max_steps=10)
    assert runs == 10 and final == 10
    assert other.steps == 11 and other.ended  # the 11th run read the step back


def test_an_event_set_before_the_session_stops_it_after_one_step():
    event = threading.Event()
    event.set()
    runs, _, _ = _train(event, set_at_step=None)
    assert runs == 1


def test_the_event_must_be_a_threading_event():
    with pytest.raises(ConfigError, match=r"rule: a threading.Event"):
        StopRequestHook(object())
