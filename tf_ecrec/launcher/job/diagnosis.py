"""Why a task's process ended: one `Diagnosis` per exit, in the log, on the console and in the report.

`classify` is a pure function of what the launcher knows when a process is gone:

==================  =========================================================================
kind                when
==================  =========================================================================
``killed``          the launcher killed it on purpose (``--kill``)
``hang``            the launcher killed it because it made no progress for ``--hang-secs``
``oom``             its memory cgroup counted an OOM kill (the kernel killed it at its
                    limit, `tf_ecrec.launcher.memory_limit`), or its log ends with an
                    allocation failure (``std::bad_alloc``, ``MemoryError``, TensorFlow's
                    ``OOM when allocating``)
``signal``          another signal ended it (the name says which)
``exit_code``       it exited with a non-zero code
``exited``          it exited with 0 (a trainer whose data is finished, a task stopped at the end)
==================  =========================================================================

The report's ``exits`` lists them, with what the launcher did about each (``action``): a task
killed by a signal is restarted as a pod would be; an out-of-memory PS is restarted with a larger
memory limit where the launcher sets one; a hung trainer is killed and restarted.
"""

from __future__ import annotations

import dataclasses
import enum
import signal
from typing import Any

from tf_ecrec.errors import ConfigError
from tf_ecrec.launcher.job.kill_spec import KillSpec

OOM_MARKERS = ("std::bad_alloc", "MemoryError", "OOM when allocating", "Out of memory", "Cannot allocate memory")


class ExitKind(str, enum.Enum):
    """How a process ended (the values are the report's strings)."""

    KILLED = "killed"
    HANG = "hang"
    OOM = "oom"
    SIGNAL = "signal"
    EXIT_CODE = "exit_code"
    EXITED = "exited"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """One process's end: its `kind`, the exit code (negative: the signal), and a sentence."""

    kind: ExitKind
    code: int
    detail: str
    silent_seconds: float | None = None  # a PS killed for its silence: since its last answer

    @property
    def signal_name(self) -> str | None:
        return signal_name(-self.code) if self.code < 0 else None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": self.kind.value, "code": self.code, "signal": self.signal_name,
                                  "detail": self.detail}
        if self.silent_seconds is not None:
            out["silent_seconds"] = round(self.silent_seconds, 3)
        return out


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def classify(code: int, *, injected: bool = False, hung: bool = False, oom_kills: int = 0, log_tail: str = "",
             limit_mb: int | None = None) -> Diagnosis:
    """The `Diagnosis` of a process that ended with `code` (`subprocess` style: -N for signal N).

    Args:
      injected: the launcher killed it for ``--kill``.
      hung: the launcher killed it for making no progress.
      oom_kills: OOM kills its memory cgroup counted while it ran.
      log_tail: the end of its log.
      limit_mb: its memory limit, if the launcher set one.
    """
    limit = f" at its {limit_mb} MB limit" if limit_mb else ""
    if injected:
        return Diagnosis(ExitKind.KILLED, code, "killed by the launcher (--kill)")
    if hung:
        return Diagnosis(ExitKind.HANG, code, "made no progress; killed by the launcher")
    if oom_kills > 0:
        return Diagnosis(ExitKind.OOM, code, f"out of memory: killed by the kernel{limit}")
    marker = next((m for m in OOM_MARKERS if m in log_tail), None)
    if code != 0 and marker is not None:
        how = f"killed by {signal_name(-code)}" if code < 0 else f"exit code {code}"
        return Diagnosis(ExitKind.OOM, code, f"out of memory{limit}: its log ends with {marker!r} ({how})")
    if code < 0:
        return Diagnosis(ExitKind.SIGNAL, code, f"killed by {signal_name(-code)}")
    if code > 0:
        return Diagnosis(ExitKind.EXIT_CODE, code, f"exited with code {code}")
    return Diagnosis(ExitKind.EXITED, 0, "exited normally")


def last_traceback(log: str, max_lines: int = 40) -> str | None:
    """The last Python traceback in a task's `log` that ended it, with its exception line; None if there is none.

    A process that dies of an exception prints it, then TensorFlow's teardown often prints pages of
    gRPC errors after it, so the last lines of a log rarely say why.  Tracebacks Python printed and
    went on from (``Exception ignored in ...``, from a destructor) are skipped.  A long
    one keeps its first line and its last `max_lines` - 1.
    """
    lines = log.splitlines()
    for start in range(len(lines) - 1, -1, -1):
        if not lines[start].startswith("Traceback (most recent call last):"):
            continue
        if any("Exception ignored in" in line for line in lines[max(0, start - 8) : start]):
            continue  # two threads' reports interleave: the marker may be a few lines up
        end = start + 1
        while end < len(lines) and (lines[end][:1].isspace() or not lines[end].strip()):
            end += 1
        if end == len(lines):  # cut off before its exception line
            continue
        block = lines[start : end + 1]
        if len(block) > max_lines:
            block = [block[0], "  ...", *block[-(max_lines - 1) :]]
        return "\n".join(block)
    return None


INJECTION_KINDS = ("oom", "hang")


def parse_injection(text: str) -> tuple[str, KillSpec]:
    """``KIND:TASK@step=N`` -> (kind, the task and step)."""
    kind, _, rest = text.strip().partition(":")
    if kind not in INJECTION_KINDS or not rest:
        raise ConfigError(f"--inject {text!r} is malformed; expected oom:ps:I@step=N or hang:worker:I@step=N "
                          "(or hang:chief:0@step=N); source: --inject")
    return kind, KillSpec.parse(rest, "--inject")


def validate(job: Any) -> None:
    """Raises ConfigError for a memory limit, hang timeout or injection the job cannot take."""
    source = "--ps-memory-mb/--oom-growth/--hang-secs/--inject"
    if job.ps_memory_mb is not None and not (int(job.ps_memory_mb) == job.ps_memory_mb and job.ps_memory_mb >= 64):
        raise ConfigError(f"--ps-memory-mb {job.ps_memory_mb!r}; rule: an integer >= 64; source: {source}")
    if not job.oom_growth > 1:
        raise ConfigError(f"--oom-growth {job.oom_growth!r}; rule: > 1; source: {source}")
    if not job.hang_secs >= 0:
        raise ConfigError(f"--hang-secs {job.hang_secs!r}; rule: >= 0 (0: off); source: {source}")
    if not 0 <= job.ps_hang_secs < float("inf"):
        raise ConfigError(f"--ps-hang-secs {job.ps_hang_secs!r}; rule: >= 0 and finite (0: off); source: --ps-hang-secs")
    for text in job.injections:
        kind, spec = parse_injection(text)
        sizes = {"ps": job.ps, "worker": job.workers - 1, "chief": 1}
        if spec.task_type == "master" or spec.task_index >= sizes[spec.task_type]:
            raise ConfigError(f"--inject {text}: the job has no task {spec.task}; source: --inject")
        if kind == "oom" and (spec.task_type != "ps" or job.ps_memory_mb is None):
            raise ConfigError(f"--inject {text}: an OOM is injected into a PS with a memory limit (--ps-memory-mb); "
                              "source: --inject")
        if kind == "hang" and spec.task_type == "ps" and not job.ps_hang_secs:
            raise ConfigError(f"--inject {text}: a hang is injected into a PS with --ps-hang-secs > 0 (else nothing "
                              "ends it); source: --inject")
        if kind == "hang" and spec.task_type != "ps" and not job.hang_secs:
            raise ConfigError(f"--inject {text}: a hang is injected into a trainer, with --hang-secs > 0; source: --inject")


def exit_entries(events: Any) -> list[dict[str, Any]]:
    """The report's ``exits``: every kill, crash and exit the launcher saw, in order, with its
    diagnosis and what the launcher did (``action``)."""
    out = []
    for e in events:
        diagnosis = e.extra.get("diagnosis") if e.kind in ("kill", "crash", "exit") else None
        if diagnosis:
            out.append({"task": e.task, "t": round(e.t, 3), "global_step": e.global_step, **diagnosis})
    return out
