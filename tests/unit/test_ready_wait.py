"""`EcRec>AwaitInitialized`: a worker's ready check waits on the PS for the chief's whole marker.

The wait returns as soon as the variable exists and is initialised, gives up
(False) after its bound, and a cancelled step (the session's operation
timeout) stops it.
"""

from __future__ import annotations

import threading
import time

import pytest
import tensorflow as tf

from tf_ecrec.ops import load_library

V1 = tf.compat.v1


def _graph(max_wait_secs: float):
    graph = tf.Graph()
    with graph.as_default():
        marker = V1.Variable(True, name="ps0_whole", use_resource=True, trainable=False, collections=[])
        wait = load_library().ec_rec_await_initialized(marker.handle, max_wait_micros=int(max_wait_secs * 1e6))
    return graph, marker, wait


def test_the_wait_gives_up_after_its_bound_when_the_variable_never_comes():
    graph, _, wait = _graph(0.3)
    with V1.Session(graph=graph) as sess:
        started = time.monotonic()
        assert not sess.run(wait)
        assert time.monotonic() - started >= 0.3


def test_the_wait_returns_true_at_once_when_initialised_meanwhile():
    graph, marker, wait = _graph(60.0)
    with V1.Session(graph=graph) as sess:
        timer = threading.Timer(0.3, lambda: sess.run(marker.initializer))
        timer.start()
        started = time.monotonic()
        try:
            assert sess.run(wait)
        finally:
            timer.join()
        assert time.monotonic() - started < 30.0  # not the 60 s bound
        assert sess.run(wait)  # already there: no wait


def test_a_cancelled_step_stops_waiting():
    graph, _, wait = _graph(60.0)
    with V1.Session(graph=graph) as sess:
        started = time.monotonic()
        with pytest.raises(tf.errors.DeadlineExceededError):
            sess.run(wait, options=V1.RunOptions(timeout_in_ms=300))
        assert time.monotonic() - started < 30.0


def test_a_negative_bound_is_refused():
    graph = tf.Graph()
    with graph.as_default():
        marker = V1.Variable(True, use_resource=True, collections=[])
        wait = load_library().ec_rec_await_initialized(marker.handle, max_wait_micros=-1)
    with V1.Session(graph=graph) as sess, pytest.raises(tf.errors.InvalidArgumentError, match="max_wait_micros"):
        sess.run(wait)
