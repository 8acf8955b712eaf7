"""Training seconds a failure cost the job, from the trainers' own step datagrams (pure)."""

import pytest

from tf_ecrec.launcher.events import Event
from tf_ecrec.launcher.failure_cost import failure_costs

T0 = 1000.0


def _steady(rate_per_trainer, start, stop, every=0.5, gaps=(), slow=()):
    """Datagrams of one trainer at `rate_per_trainer` samples/s, none inside `gaps`, at half rate in `slow`."""
    out, t = [], start
    while t < stop - 1e-9:
        t += every
        if any(a < t <= b for a, b in gaps):
            continue
        factor = 0.5 if any(a < t <= b for a, b in slow) else 1.0
        out.append((T0 + t, int(rate_per_trainer * every * factor)))
    return out


def _events(kill_at, resumed_at, end):
    return [Event(0.0, "start", "chief:0", 0), Event(kill_at, "kill", "ps:1", 500),
            Event(resumed_at, "resumed", "ps:1", 501), Event(end, "exit", "chief:0", 2000)]


def test_a_pause_of_five_seconds_costs_five_seconds_and_rolled_back_steps_add_their_samples():
    steps = {"chief:0": _steady(1000, 0, 60, gaps=[(30, 35)]), "worker:0": _steady(1000, 0, 60, gaps=[(30, 35)])}
    [cost] = failure_costs(_events(30, 35, 60), steps, T0, taken_back=[0], batch_size=100)
    assert cost["samples_per_sec_before"] == pytest.approx(2000, rel=0.01)
    assert cost["back"] and cost["seconds_to_rate"] == pytest.approx(5.0, abs=0.51)
    assert cost["training_seconds_lost"] == pytest.approx(5.0, abs=0.6)

    [again] = failure_costs(_events(30, 35, 60), steps, T0, taken_back=[40], batch_size=100)
    assert again["samples_lost"] - cost["samples_lost"] == 4000  # 40 steps of 100 records
    assert again["training_seconds_lost"] == pytest.approx(cost["training_seconds_lost"] + 2.0, abs=0.01)


def test_one_trainer_that_never_comes_back_is_a_lower_bound_never_back():
    steps = {"chief:0": _steady(1000, 0, 60), "worker:0": _steady(1000, 0, 60, gaps=[(30, 60)])}
    [cost] = failure_costs(_events(30, 31, 60), steps, T0, taken_back=[0], batch_size=100)
    assert not cost["back"] and cost["seconds_to_rate"] is None
    assert cost["training_seconds_lost"] == pytest.approx(15.0, abs=0.6)  # half the rate for 30 s


def test_a_slow_spell_after_the_pause_counts_until_the_rate_is_back():
    steps = {"chief:0": _steady(1000, 0, 80, gaps=[(30, 32)], slow=[(32, 52)])}
    [cost] = failure_costs(_events(30, 32, 80), steps, T0, taken_back=[0], batch_size=100)
    assert cost["seconds_to_rate"] == pytest.approx(22.0, abs=0.6)
    assert cost["training_seconds_lost"] == pytest.approx(2.0 + 10.0, abs=0.6)  # the pause, then half of 20 s


def test_no_rate_before_the_kill_gives_no_figure():
    [cost] = failure_costs(_events(0.5, 2, 30), {"chief:0": _steady(1000, 0, 30)}, T0, taken_back=[0], batch_size=1)
    assert cost["training_seconds_lost"] is None and not cost["back"]


def test_training_time_overhead_combines_the_steady_cost_and_the_failures():
    from tf_ecrec.launcher.failure_cost import training_time_overhead

    assert training_time_overhead(100.0, 100.0, 0.0, 3600.0) == 0.0
    assert training_time_overhead(50.0, 100.0, 0.0, 3600.0) == pytest.approx(1.0)  # half the rate: twice the time
    assert training_time_overhead(100.0, 100.0, 360.0, 3600.0) == pytest.approx(1 / 0.9 - 1)  # a tenth lost
    assert training_time_overhead(90.0, 100.0, 3600.0, 3600.0) == float("inf")
    with pytest.raises(ValueError):
        training_time_overhead(0.0, 100.0, 1.0, 3600.0)


def test_a_ps_killed_for_its_silence_failed_at_its_last_answer():
    steps = {"chief:0": _steady(1000, 0, 60, gaps=[(27, 35)])}
    events = _events(30, 35, 60)
    events[1].extra["diagnosis"] = {"kind": "hang", "silent_seconds": 3.0}  # silent from t=27, killed at 30
    [cost] = failure_costs(events, steps, T0, taken_back=[0], batch_size=100)
    assert cost["training_seconds_lost"] == pytest.approx(8.0, abs=0.6)


def test_a_second_kill_before_the_first_resumed_is_inside_the_first_failures_figure():
    # ps:1 killed at 30, ps:2 at 31 (during the first's move), training back at 36: the first figure counts the
    # whole pause, and the second has none of its own (no rate before it that the first did not cut). A second
    # kill after the first resumed ends the first's span instead.
    steps = {"chief:0": _steady(1000, 0, 70, gaps=[(30, 36)])}
    events = [Event(0.0, "start", "chief:0", 0), Event(30, "kill", "ps:1", 500), Event(31, "kill", "ps:2", 500),
              Event(36, "resumed", "ps:1", 501), Event(36, "resumed", "ps:2", 501), Event(70, "exit", "chief:0", 2000)]
    first, second = failure_costs(events, steps, T0, taken_back=[0, 0], batch_size=100)
    assert first["back"] and first["seconds_to_rate"] == pytest.approx(6.0, abs=0.51)
    assert first["training_seconds_lost"] == pytest.approx(6.0, abs=0.6)
    assert second["training_seconds_lost"] is None

    cut = [Event(0.0, "start", "chief:0", 0), Event(30, "kill", "ps:1", 500), Event(31, "resumed", "ps:1", 501),
           Event(33, "kill", "ps:2", 500), Event(36, "resumed", "ps:2", 501), Event(70, "exit", "chief:0", 2000)]
    steps = {"chief:0": _steady(1000, 0, 70, gaps=[(30, 31), (33, 36)])}
    first, _ = failure_costs(cut, steps, T0, taken_back=[0, 0], batch_size=100)
    assert not first["back"] and first["training_seconds_lost"] == pytest.approx(1.0, abs=0.6)  # up to the next kill
