"""TF's refusal of a call its transport delivered twice is retried by the flash gate, nothing else is."""

import pytest
import tensorflow as tf

from tf_ecrec.base.retry import duplicate_request
from tf_ecrec.flash import snapshots

TWICE = ("The same RunGraph (Worker) request was received twice. graph_handle: \"0000000000000007\" "
         "step_id: 85086140218583148")


def test_only_the_twice_received_abort_is_a_duplicate_request():
    assert duplicate_request(tf.errors.AbortedError(None, None, TWICE))
    assert not duplicate_request(tf.errors.AbortedError(None, None, "step 7 is of generation 0 but this PS admits 1"))
    assert not duplicate_request(tf.errors.UnavailableError(None, None, TWICE))
    assert not duplicate_request(RuntimeError(TWICE))


class _Session:
    def __init__(self, errors):
        self.errors, self.calls = list(errors), []

    def run(self, fetches, feed_dict=None):
        self.calls.append((fetches, feed_dict))
        if self.errors:
            raise self.errors.pop(0)
        return "value"


def test_the_flash_gate_runs_a_twice_delivered_call_again_and_lets_other_errors_through():
    sess = _Session([tf.errors.AbortedError(None, None, TWICE)])
    assert snapshots._rerun(sess, "fetch", {"x": 1}) == "value"
    assert sess.calls == [("fetch", {"x": 1})] * 2

    refused = tf.errors.AbortedError(None, None, "fenced")
    sess = _Session([refused])
    with pytest.raises(tf.errors.AbortedError, match="fenced"):
        snapshots._rerun(sess, "fetch")
    assert len(sess.calls) == 1

    sess = _Session([tf.errors.AbortedError(None, None, TWICE)] * 3)
    with pytest.raises(tf.errors.AbortedError, match="twice"):
        snapshots._rerun(sess, "fetch")
    assert len(sess.calls) == 3
