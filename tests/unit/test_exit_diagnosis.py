"""Why a task ended (`tf_ecrec.launcher.diagnosis`): the classification, the flags, the report's entries."""

from __future__ import annotations

import pytest

from tf_ecrec.errors import ConfigError
from tf_ecrec.launcher.diagnosis import ExitKind, classify, exit_entries, parse_injection
from tf_ecrec.launcher.events import Event
from tf_ecrec.launcher.spec import JobSpec


@pytest.mark.parametrize("code, kwargs, kind, words", [
    (-9, {"injected": True}, ExitKind.KILLED, "--kill"),
    (-9, {"hung": True}, ExitKind.HANG, "no progress"),
    (-9, {"oom_kills": 1, "limit_mb": 512}, ExitKind.OOM, "512 MB limit"),
    (-6, {"log_tail": "terminate called after throwing an instance of 'std::bad_alloc'"}, ExitKind.OOM, "SIGABRT"),
    (1, {"log_tail": "MemoryError\n"}, ExitKind.OOM, "exit code 1"),
    (-9, {}, ExitKind.SIGNAL, "SIGKILL"),
    (-11, {}, ExitKind.SIGNAL, "SIGSEGV"),
    (3, {"log_tail": "ValueError: bad"}, ExitKind.EXIT_CODE, "code 3"),
    (0, {"log_tail": "MemoryError"}, ExitKind.EXITED, "normally"),
])
def test_every_exit_gets_a_kind_and_a_sentence(code, kwargs, kind, words):
    d = classify(code, **kwargs)
    assert d.kind is kind and words in d.detail, d
    assert d.as_dict()["signal"] == (d.signal_name if code < 0 else None)


def test_injections_parse_and_bad_ones_are_refused_by_name():
    kind, spec = parse_injection("oom:ps:1@step=40")
    assert kind == "oom" and spec.task == "ps:1" and spec.step == 40
    for bad in ("boom:ps:1@step=4", "oom", "hang:worker:x@step=3"):
        with pytest.raises(ConfigError):
            parse_injection(bad)


@pytest.mark.parametrize("kwargs", [
    {"ps_memory_mb": 10},
    {"oom_growth": 1.0},
    {"hang_secs": -1},
    {"injections": ("oom:ps:1@step=5",)},  # no memory limit
    {"injections": ("oom:worker:0@step=5",), "ps_memory_mb": 512},
    {"injections": ("hang:ps:0@step=5",)},
    {"injections": ("hang:worker:0@step=5",), "hang_secs": 0},
    {"injections": ("hang:worker:7@step=5",)},
])
def test_the_launcher_refuses_limits_and_injections_it_cannot_honour(kwargs):
    with pytest.raises(ConfigError) as err:
        JobSpec(**kwargs)
    assert "source:" in str(err.value)


def test_a_job_with_limits_and_injections_round_trips():
    job = JobSpec(ps_memory_mb=512, oom_growth=2.0, hang_secs=5, injections=("oom:ps:1@step=40", "hang:worker:0@step=60"))
    assert JobSpec.from_json(job.to_json()) == job


def test_the_report_lists_kills_crashes_and_exits_with_their_diagnosis():
    events = [
        Event(1.0, "start", "ps:1", 0),
        Event(2.0, "kill", "ps:1", 30, {"diagnosis": classify(-9, injected=True).as_dict() | {"action": "restarted"}}),
        Event(3.0, "crash", "ps:0", 50, {"diagnosis": classify(-9, oom_kills=1).as_dict() | {"action": "x"}}),
        Event(4.0, "exit", "worker:0", 90, {"diagnosis": classify(0).as_dict()}),
        Event(5.0, "exit", "chief:0", 90, {}),
    ]
    out = exit_entries(events)
    assert [(e["task"], e["kind"]) for e in out] == [("ps:1", "killed"), ("ps:0", "oom"), ("worker:0", "exited")]
    assert out[1]["action"] == "x" and out[1]["global_step"] == 50
