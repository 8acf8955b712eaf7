"""CPU seconds the job's processes spend, per 1,000 samples trained: the protection's own cost, apart
from contention.

A throughput ratio on a shared 2-core machine mixes two things: the CPU the protection spends (the
folds, logs and transfers of each step) and how the machine shares its cores.  CPU time per sample
separates them: it does not depend on what else runs.  The launcher samples, once a second, the
user + system time of every live task process (``/proc/PID/stat``), keeps each process's last
reading (a process that ended keeps what it spent up to its last sample), and reports, for the
steady window of the run (from the warm-up step to the last step datagram, the window of
``samples_per_sec``):

    cpu_seconds_per_1000_samples = CPU seconds of every task in the window / records trained in it * 1000

in total and by role (``ps``, ``chief``, ``worker``), with the whole run's CPU seconds beside it.
The launcher itself, the job master and the fork server are not tasks and are not counted; a
task's CPU between its last sample and its end is missed (up to a second of it per task that ends
inside the window).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from tf_ecrec.launcher.report import steady_window

CPU_SAMPLE_SECS = 1.0
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def busy_seconds(pid: int) -> float | None:
    """Seconds the threads of a process have run or waited to run so far, or None if it is gone.

    Summed over ``/proc/PID/task/*/schedstat`` (time on a CPU, time waiting on a run queue): a process
    that computes on a machine whose cores other processes take keeps gaining it as fast as one that
    has a core to itself, where its CPU time alone (`cpu_seconds`) grows with the share it is given; a
    stopped process, or one blocked on a lock or a network that answers nothing, gains next to nothing.
    Falls back to `cpu_seconds` where the kernel keeps no schedstat.
    """
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total, read = 0, False
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as fh:
                running, waiting = fh.read().split()[:2]
            total, read = total + int(running) + int(waiting), True
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9 if read else cpu_seconds(pid)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (``/proc/PID/stat``), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after the command name, which may hold spaces
    try:
        return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime: fields 14 and 15 of stat(5)
    except (IndexError, ValueError):
        return None


def role_of(task: str) -> str:
    """``ps:1`` -> ``ps``; a spare PS (``spare:0``) counts as ``ps``."""
    role = task.split(":", 1)[0]
    return "ps" if role == "spare" else role


class CpuMeter:
    """Cumulative CPU seconds of the job's task processes, by role, sampled over time."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, int], float] = {}  # (task, pid) -> its CPU seconds at its last sample
        self._sampled = float("-inf")
        self.series: list[tuple[float, dict[str, float]]] = []  # (t, role -> cumulative CPU seconds)

    def sample(self, now: float, processes: Iterable[tuple[str, int]], force: bool = False) -> None:
        """Reads every live ``(task name, pid)`` (every `CPU_SAMPLE_SECS`, or now with `force`)."""
        if not force and now - self._sampled < CPU_SAMPLE_SECS:
            return
        self._sampled = now
        for task, pid in processes:
            seconds = cpu_seconds(pid)
            if seconds is not None:
                self._last[(task, pid)] = seconds
        totals: dict[str, float] = {}
        for (task, _), seconds in self._last.items():
            totals[role_of(task)] = totals.get(role_of(task), 0.0) + seconds
        self.series.append((now, totals))


def cpu_section(series: Sequence[tuple[float, dict[str, float]]], timeline: Sequence[tuple[float, int, int]],
                warmup_step: int) -> dict[str, Any]:
    """The report's ``cpu`` section (module doc); per-1,000-sample figures are None without a window."""
    total = {role: round(s, 2) for role, s in (series[-1][1] if series else {}).items()}
    out: dict[str, Any] = {"cpu_seconds": round(sum(total.values()), 2), "cpu_seconds_by_role": total,
                           "window_seconds": None, "cpu_seconds_per_1000_samples": None,
                           "cpu_seconds_per_1000_samples_by_role": None}
    window = steady_window(timeline, warmup_step)
    if window is None or not series:
        return out
    inside = [(t, totals) for t, totals in series if window[0] <= t <= window[1]]
    if len(inside) < 2:
        return out
    (a, first), (b, last) = inside[0], inside[-1]
    records = sum(r for t, _, r in timeline if a < t <= b)
    if records <= 0:
        return out
    out.update(window_seconds=round(b - a, 2),
               cpu_seconds_per_1000_samples=round((sum(last.values()) - sum(first.values())) / records * 1000, 4),
               cpu_seconds_per_1000_samples_by_role={
                   role: round((last[role] - first.get(role, 0.0)) / records * 1000, 4) for role in last})
    return out
