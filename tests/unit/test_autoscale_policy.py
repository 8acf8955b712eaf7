"""The scaling policy (`tf_ecrec.master.autoscale`) on synthetic throughput curves."""

from __future__ import annotations

import pytest

from tf_ecrec.errors import ConfigError
from tf_ecrec.master.autoscale import AutoScaler, ScalingConfig


def drive(scaler, rate_of, start=1, seconds=400, remaining_total=None, step=1.0):
    """Runs the policy against a job whose rate with n trainers is rate_of(n); a decision takes effect
    at the next observation (the launcher's actions complete before it observes again)."""
    workers, records, t = start, 0.0, 0.0
    history = [workers]
    while t < seconds:
        t += step
        records += rate_of(workers) * step
        remaining = None if remaining_total is None else max(0, int(remaining_total - records))
        decision = scaler.observe(t, int(records), workers, remaining)
        if decision is not None:
            workers += decision.delta
            history.append(workers)
    return history


def test_a_job_that_scales_linearly_grows_to_the_maximum():
    s = AutoScaler(ScalingConfig(1, 4, window_secs=10))
    assert drive(s, lambda n: 1000 * n) == [1, 2, 3, 4]
    assert set(s.rates) == {1, 2, 3, 4}


def test_a_saturated_job_takes_the_last_trainer_back_and_stays_there():
    s = AutoScaler(ScalingConfig(1, 6, window_secs=10))
    history = drive(s, lambda n: {1: 1000, 2: 1800, 3: 1850}.get(n, 1850))
    assert history == [1, 2, 3, 2]
    assert s.ceiling == 2 and "gained less than 10%" in s.decisions[-1].reason


def test_below_the_minimum_it_adds_at_once_and_never_removes_below_it():
    s = AutoScaler(ScalingConfig(2, 3, window_secs=10))
    history = drive(s, lambda n: 1000, start=1)  # flat: no trainer pays, but 2 is the floor
    assert history[:2] == [1, 2] and min(history[1:]) == 2


def test_no_trainer_is_added_for_the_tail_of_the_data():
    s = AutoScaler(ScalingConfig(1, 4, window_secs=10, tail_secs=30))
    history = drive(s, lambda n: 1000 * n, remaining_total=25_000)
    assert max(history) <= 2  # at 1 trainer 15,000 left = 15 s < 30 s after the first window
    assert drive(AutoScaler(ScalingConfig(1, 4, window_secs=10, tail_secs=30)), lambda n: 1000 * n,
                 remaining_total=10**7)[-1] == 4


def test_a_start_up_is_not_measured():
    s = AutoScaler(ScalingConfig(1, 3, window_secs=10))
    assert s.observe(0.0, 0, 1) is None
    assert s.observe(5.0, 5000, 1) is None
    assert s.observe(6.0, 6000, 2) is None  # the count changed: a new window from here
    assert s.observe(15.0, 24000, 2) is None  # 9 s: not a window yet
    decision = s.observe(16.0, 26000, 2)
    assert decision is not None and s.rates[2] == pytest.approx(2000.0)


@pytest.mark.parametrize("kwargs", [{"min_workers": 0, "max_workers": 2}, {"min_workers": 3, "max_workers": 2},
                                    {"min_workers": 1, "max_workers": 2, "window_secs": 0}])
def test_bad_bounds_are_refused_by_name(kwargs):
    with pytest.raises(ConfigError):
        ScalingConfig(**kwargs)
