"""The recovery decision table (`tf_ecrec.recovery.decision`), on plain values, and the loss rule it uses."""

from __future__ import annotations

import pytest

from tf_ecrec.layout.placement import plan
from tf_ecrec.recovery.decision import Action, decide, unrecoverable_reason

TOO_MUCH = "stripe 0 of 'emb' lost 2 chunks and the code 2+1 rebuilds 1"


@pytest.mark.parametrize(
    "missing, everything, job_started, checkpoint, unrecoverable, expected",
    [
        # Nothing missing: settle what a dead task left, whatever else is true.
        (False, False, True, True, None, Action.SETTLE),
        (False, False, None, False, None, Action.SETTLE),
        # Everything gone.
        (True, True, True, True, TOO_MUCH, Action.RESTORE),
        (True, True, None, True, None, Action.RESTORE),
        (True, True, True, False, TOO_MUCH, Action.REFUSE_LOST_JOB),
        (True, True, False, False, TOO_MUCH, Action.INITIALISE),
        (True, True, None, False, None, Action.INITIALISE),  # no model dir: a first start
        # Some gone, the job never started (no marker): a fresh start cut mid-way.
        (True, False, False, False, TOO_MUCH, Action.INITIALISE),
        (True, False, False, False, None, Action.INITIALISE),
        # Some gone after the start: parity and replicas if they cover it.
        (True, False, True, False, None, Action.REBUILD),
        (True, False, True, True, None, Action.REBUILD),  # a checkpoint is not read when parity suffices
        (True, False, None, False, None, Action.REBUILD),
        (True, False, False, True, None, Action.REBUILD),  # marker missing but a checkpoint: not fresh
        # More than the code covers.
        (True, False, True, True, TOO_MUCH, Action.FALLBACK),
        (True, False, True, False, TOO_MUCH, Action.REFUSE_UNRECOVERABLE),
        (True, False, None, False, TOO_MUCH, Action.REFUSE_UNRECOVERABLE),
    ],
)
def test_the_decision_table(missing, everything, job_started, checkpoint, unrecoverable, expected):
    got = decide(missing=missing, everything=everything, job_started=job_started, checkpoint=checkpoint,
                 unrecoverable=unrecoverable)
    assert got is expected


def test_actions_keep_their_strings():
    assert str(Action.REBUILD) == "rebuild" and Action("fallback") is Action.FALLBACK


def _layouts():
    # 3 PS, code 2+1: table "emb" has 3 stripes on PS (0,1,2), (1,2,0), (2,0,1).
    return {"emb": plan(3, 2, 1, [("emb", 10, 4)])}


def test_one_lost_ps_of_a_2_plus_1_code_is_recoverable():
    copies = {"dense": [0, 1]}  # the primary on PS 0, its replica on PS 1
    protected = {"emb/data", "dense", "dense/ec_replica_0"}
    for lost in ([0], [1], [2]):
        assert unrecoverable_reason(["emb/data"], protected, lost, _layouts(), copies) is None


def test_two_lost_ps_break_a_stripe_of_a_2_plus_1_code():
    reason = unrecoverable_reason(["emb/data"], {"emb/data"}, [0, 1], _layouts(), {})
    assert reason == "stripe 0 of 'emb' lost 2 chunks and the code 2+1 rebuilds 1"


def test_a_lost_variable_without_parity_or_replica_is_unrecoverable():
    reason = unrecoverable_reason(["emb/data", "other"], {"emb/data"}, [0], _layouts(), {})
    assert reason == "these lost variables have no parity or replica: ['other']"


def test_a_dense_variable_lost_with_every_replica_is_unrecoverable():
    layouts = {"emb": plan(4, 2, 1, [("emb", 10, 4)])}  # one lost PS costs a stripe at most one chunk
    reason = unrecoverable_reason(["dense"], {"dense", "dense/ec_replica_0"}, [3], layouts, {"dense": [3, 3]})
    assert reason == "dense and all 1 of its replicas were lost"
