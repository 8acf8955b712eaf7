"""What the launcher records while a job runs, and the report it assembles from it at the end.

The supervisor feeds a `RunRecord` as things happen: events (`event`), the
steps and records of the status datagrams (`step`), the trainers' final
totals (``done_reports``), the records in flight at each failure
(`failure`) and the tasks' resident memory (`sample_memory`).  At the end,
`report` turns it into the report (`tf_ecrec.launcher.report.build_report`
has the fields; each failure's cost per trainer is
`tf_ecrec.launcher.trainer_report`'s) and `write` saves it with its throughput plot.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from typing import Any

from tf_ecrec.launcher.cpu_usage import CpuMeter, cpu_section
from tf_ecrec.launcher.events import Event, EventKind
from tf_ecrec.launcher.failure_cost import failure_costs
from tf_ecrec.launcher.job.spec import JobSpec
from tf_ecrec.launcher.process_table import TaskProcess
from tf_ecrec.launcher.report import build_report, plot_throughput, warmup_step
from tf_ecrec.launcher.trainer_report import trainer_entries

MEMORY_SAMPLE_SECS = 1.0
RATE_WINDOW_SECS = 5.0


def resident_mb(pid: int) -> float | None:
    """Resident memory of a process in MB (VmRSS), or None if it is gone or not on Linux."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024.0, 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


class RunRecord:
    """The record of one run; times are wall seconds, reported as seconds since `t0` (the launch)."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.events: list[Event] = []
        self.timeline: list[tuple[float, int, int]] = []  # (t, global step, records in datagram)
        self.trainer_steps: dict[str, list[tuple[float, int]]] = {}  # task -> [(t, records in its datagram)]
        self.done_reports: dict[str, dict[str, Any]] = {}
        self.failures: list[dict[str, Any]] = []  # per kill/loss: records in flight when it hit
        self.memory: dict[str, list[tuple[float, float]]] = {}  # task -> [(t since launch, RSS MB)]
        self._memory_sampled = 0.0
        self.cpu = CpuMeter()  # CPU seconds of the task processes (tf_ecrec.launcher.cpu_usage)

    def event(self, kind: EventKind, task: str, global_step: int, t: float | None = None, **extra: Any) -> None:
        """Records an event at `t` (default: now)."""
        self.events.append(Event(t=(t or time.time()) - self.t0, kind=kind, task=task, global_step=global_step,
                                 extra=extra))

    def step(self, t: float, global_step: int, records: int, task: str | None = None) -> None:
        """A ``step`` datagram of `task`: `records` trained since the sender's previous one."""
        self.timeline.append((t, global_step, records))
        if task is not None:
            self.trainer_steps.setdefault(task, []).append((t, records))

    def rate(self, now: float) -> float:
        """Records per second over the last `RATE_WINDOW_SECS` (the progress line's)."""
        return sum(r for (t, _, r) in self.timeline if t >= now - RATE_WINDOW_SECS) / RATE_WINDOW_SECS

    def failure(self, task: str, global_step: int, records_in_flight: int | None) -> None:
        """Records in flight (leased, not acknowledged; None if unknown) as a failure hits `task`."""
        self.failures.append({"task": task, "global_step": global_step, "records_in_flight": records_in_flight})

    def sample_memory(self, now: float, tasks: Iterable[TaskProcess]) -> None:
        """Every `MEMORY_SAMPLE_SECS`, the resident memory of every live task process."""
        if now - self._memory_sampled < MEMORY_SAMPLE_SECS:
            return
        self._memory_sampled = now
        for task in tasks:
            if task.alive:
                assert task.process is not None  # alive: it has a process
                mb = resident_mb(task.process.pid)
                if mb is not None:
                    self.memory.setdefault(task.name, []).append((round(now - self.t0, 2), mb))

    def sample_cpu(self, now: float, tasks: Iterable[TaskProcess]) -> None:
        """Every `cpu_usage.CPU_SAMPLE_SECS`, the CPU seconds of every live task process."""
        self.cpu.sample(now, [(t.name, t.process.pid) for t in tasks if t.alive and t.process is not None])

    def report(self, job: JobSpec, digest: dict[str, Any], data_state: Any) -> dict[str, Any]:
        """The run's report (fields: `tf_ecrec.launcher.report`; per trainer: `tf_ecrec.launcher.trainer_report`)."""
        report = build_report(
            job=job,
            t0=self.t0,
            events=self.events,
            timeline=self.timeline,
            done_reports=self.done_reports,
            digest=digest,
            data_state=data_state,
            failures=self.failures,
            memory=self.memory,
        )
        for entry, trainers in zip(report["recovery"], trainer_entries(self.events, self.trainer_steps, self.t0)):
            entry["trainers"] = trainers
        taken_back = [(e.get("steps_rolled_back") or 0) + (e.get("steps_undone") or 0) for e in report["recovery"]]
        for entry, cost in zip(report["recovery"], failure_costs(self.events, self.trainer_steps, self.t0, taken_back,
                                                                  job.batch_size)):
            entry.update(cost)
        report["cpu"] = cpu_section(self.cpu.series, self.timeline, warmup_step(job.steps))
        return report


def write_report(report: dict[str, Any], path: str, plot: bool = True) -> None:
    """Writes `report` to `path` as JSON, with its throughput plot beside it (``report["plot"]``: its path,
    None without `plot`)."""
    report["plot"] = plot_throughput(report, os.path.splitext(path)[0] + ".png") if plot else None
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
