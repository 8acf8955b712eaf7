"""`PSSRecovery.lost_tasks`: a PS is lost only when every read of its anchor fails (the real restarted PS, whose
anchor fails every read, is tests/integration/test_pss.py's recovery cases)."""

from __future__ import annotations

import types

import pytest
import tensorflow as tf

from tf_ecrec.pss.recovery import PSSRecovery


class Anchor:
    """Reads fail with the given errors, in order, then succeed."""

    def __init__(self, *failures: tf.errors.OpError) -> None:
        self.failures = list(failures)
        self.reads = 0

    def read_value(self) -> Anchor:
        return self

    def numpy(self) -> int:
        self.reads += 1
        if self.failures:
            raise self.failures.pop(0)
        return 0


def _recovery(anchors: dict[int, Anchor]) -> PSSRecovery:
    protection = types.SimpleNamespace(placement=types.SimpleNamespace(anchors=anchors))
    return PSSRecovery(protection, types.SimpleNamespace())


def _aborted() -> tf.errors.AbortedError:
    return tf.errors.AbortedError(None, None, "Unable to find a context_id matching the specified one")


def test_a_read_that_fails_once_is_not_a_loss_and_a_dead_anchor_is() -> None:
    dead_message = tf.errors.InvalidArgumentError(None, None, "invalid device")
    anchors = {0: Anchor(), 1: Anchor(_aborted()), 2: Anchor(*[dead_message] * 10), 3: Anchor(_aborted(), _aborted())}
    assert _recovery(anchors).lost_tasks(confirm_reads=3, pause_secs=0.0) == [2]
    assert [anchors[p].reads for p in range(4)] == [1, 2, 3, 3]


def test_an_unanswered_read_goes_up_and_is_no_loss() -> None:
    anchors = {0: Anchor(tf.errors.UnavailableError(None, None, "failed to connect to all addresses"))}
    with pytest.raises(tf.errors.UnavailableError):
        _recovery(anchors).lost_tasks(pause_secs=0.0)
