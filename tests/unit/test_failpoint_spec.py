"""Parsing of TF_ECREC_FAILPOINT (tf_ecrec.step.failpoints); the ops it arms are run in tests/e2e/test_failpoints.py."""

import pytest

from tf_ecrec.errors import ConfigError
from tf_ecrec.step.failpoints import ENV, Armed, FailPoint, FailpointPlan


def test_several_comma_separated_failpoints_are_armed_in_order():
    plan = FailpointPlan.from_environ({ENV: "ps_after_apply@ps:1@step=40, worker_before_commit@chief:0@step=110"})
    assert plan is not None
    assert plan.armed == (Armed(FailPoint.PS_AFTER_APPLY, "ps:1", 40),
                          Armed(FailPoint.WORKER_BEFORE_COMMIT, "chief:0", 110))
    assert plan.arms(FailPoint.PS_AFTER_APPLY) and plan.arms(FailPoint.WORKER_BEFORE_COMMIT)
    assert not plan.arms(FailPoint.PS_AFTER_COUNT)


def test_nothing_armed_without_the_variable():
    assert FailpointPlan.from_environ({}) is None and FailpointPlan.from_environ({ENV: ""}) is None


@pytest.mark.parametrize("bad", ["ps_after_apply@ps:1", "no_such_point@ps:1@step=3", "ps_after_apply@evaluator:0@step=3"])
def test_a_malformed_entry_is_named_with_the_rule_and_the_source(bad):
    with pytest.raises(ConfigError) as err:
        FailpointPlan.from_environ({ENV: f"worker_after_apply@chief:0@step=5,{bad}"})
    message = str(err.value)
    assert repr(bad) in message and "POINT@TASK@step=N" in message and f"environment variable {ENV}" in message
