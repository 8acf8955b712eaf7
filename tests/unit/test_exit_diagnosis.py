"""Why a task ended (`tf_ecrec.launcher.job.diagnosis`): the classification, the flags, the report's entries."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tf_ecrec.errors import ConfigError
from tf_ecrec.launcher.events import Event
from tf_ecrec.launcher.job.diagnosis import ExitKind, classify, exit_entries, last_traceback, parse_injection
from tf_ecrec.launcher.job.spec import JobSpec


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
    {"ps_hang_secs": -1},
    {"ps_hang_secs": float("inf")},
    {"injections": ("oom:ps:1@step=5",)},  # no memory limit
    {"injections": ("oom:worker:0@step=5",), "ps_memory_mb": 512},
    {"injections": ("hang:ps:0@step=5",), "ps_hang_secs": 0},  # a PS frozen with its watch off
    {"injections": ("hang:worker:0@step=5",), "hang_secs": 0},
    {"injections": ("hang:worker:7@step=5",)},
])
def test_the_launcher_refuses_limits_and_injections_it_cannot_honour(kwargs):
    with pytest.raises(ConfigError) as err:
        JobSpec(**kwargs)
    assert "source:" in str(err.value)


def test_a_job_with_limits_and_injections_round_trips():
    job = JobSpec(ps_memory_mb=512, oom_growth=2.0, hang_secs=5, ps_hang_secs=3,
                  injections=("oom:ps:1@step=40", "hang:worker:0@step=60", "hang:ps:0@step=70"))
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


def test_the_traceback_that_ended_a_process_is_found_under_the_noise_after_it():
    """A real interpreter: a destructor's ignored exception first, then the fatal one (chained), then pages
    of teardown errors, as TensorFlow's gRPC channels print them after a task dies of an exception."""
    script = textwrap.dedent(
        """
        import atexit, sys

        class Closes:
            def __del__(self):
                raise RuntimeError("ignored in a destructor")

        def noise():
            for i in range(200):
                print(f"E context.cc:884] Failed to remove function remotely {i}", file=sys.stderr)

        atexit.register(noise)
        c = Closes()
        del c

        def recover():
            try:
                raise ValueError("the first")
            except ValueError as exc:
                raise KeyError("the PS is not up") from exc

        recover()
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "ignored in a destructor" in result.stderr
    found = last_traceback(result.stderr)
    assert found is not None and found.startswith("Traceback (most recent call last):"), found
    assert found.endswith("KeyError: 'the PS is not up'") and "in recover" in found, found
    assert "destructor" not in found and "Failed to remove" not in found, found


def test_interleaved_ignored_tracebacks_a_cut_one_and_none_are_not_taken_for_the_error():
    ignored = [
        "Exception ignored in: <function Executor.__del__>Exception ignored in: <function Executor.__del__>",
        "Traceback (most recent call last):",
        '  File "executor.py", line 46, in __del__',
        "",
        "Traceback (most recent call last):",
        '  File "executor.py", line 46, in __del__',
        "tensorflow.python.framework.errors_impl.UnavailableError: Socket closed",
    ]
    assert last_traceback("\n".join(ignored)) is None
    fatal = ["Traceback (most recent call last):", '  File "fit.py", line 9, in fit', "RecoveryError: gone"]
    assert last_traceback("\n".join(fatal + ignored)) == "\n".join(fatal)
    assert last_traceback("\n".join(fatal + ["Traceback (most recent call last):", '  File "x.py"'])) == "\n".join(fatal)
    assert last_traceback("no traceback here\nat all") is None
    long = ["Traceback (most recent call last):", *[f'  File "f{i}.py", line 1, in f' for i in range(100)], "E: x"]
    cut = last_traceback("\n".join(long), max_lines=10)
    assert cut is not None and cut.splitlines()[:2] == ["Traceback (most recent call last):", "  ..."]
    assert len(cut.splitlines()) == 11 and cut.endswith("E: x")
