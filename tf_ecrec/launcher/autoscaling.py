"""Automatic scaling of the local launcher's trainers (``--min-workers/--max-workers``).

`AutoScaling` feeds the policy (`tf_ecrec.master.autoscale.AutoScaler`) the job-wide records the
master counts as trained and the trainers training now, and hands its decisions to a `Scaler`:
`LocalScaler` starts a worker slot's process, or asks the newest worker to leave (SIGTERM: it
finishes its step, reports its progress and leaves; its leases go back to the queue).  On a cluster
a `Scaler` would ask its scheduler for a pod instead.  Nothing is observed while a scaling action is
in flight (a worker started but not yet training, or leaving), so a start-up is never measured.
Each decision is an event (``scale``) and a line of the report's ``scaling``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from tf_ecrec.launcher.events import EventKind
from tf_ecrec.launcher.process_table import TaskProcess, TaskState
from tf_ecrec.master.autoscale import AutoScaler, ScalingConfig

OBSERVE_SECS = 1.0


class Scaler(Protocol):
    def add(self) -> str | None: ...
    def remove(self) -> str | None: ...
    def busy(self) -> bool: ...
    def training(self) -> int: ...


class LocalScaler:
    """Worker processes of the local launcher (`tf_ecrec.launcher.run_state.RunState`)."""

    def __init__(self, run: Any, leave_deadline: float) -> None:
        self._run = run
        self._leave = leave_deadline

    def _workers(self) -> list[TaskProcess]:
        return sorted((t for t in self._run.tasks.values() if t.cluster.task_type == "worker"),
                      key=lambda t: t.cluster.task_index)

    def add(self) -> str | None:
        task = next((t for t in self._workers() if t.state in (TaskState.LATER, TaskState.REMOVED)), None)
        if task is None:
            return None
        self._run.start(task, kind=EventKind.ADD)
        return task.name

    def remove(self) -> str | None:
        task = next((t for t in reversed(self._workers()) if t.state is TaskState.RUNNING), None)
        if task is None or task.process is None:
            return None
        task.process.terminate()  # finish the step, report progress, leave
        task.state, task.leave_deadline = TaskState.LEAVING, time.time() + self._leave
        self._run.event(EventKind.REMOVE, task.name)
        return task.name

    def busy(self) -> bool:
        return any(t.state is TaskState.LEAVING or (t.state is TaskState.RUNNING and not t.training)
                   for t in self._run.table.trainers())

    def training(self) -> int:
        return sum(t.state is TaskState.RUNNING and t.training for t in self._run.table.trainers())


class AutoScaling:
    """Drives `AutoScaler` with the run's observations and carries its decisions out (module docstring)."""

    def __init__(self, run: Any, config: ScalingConfig, scaler: Scaler) -> None:
        self._run = run
        self.policy = AutoScaler(config)
        self._scaler = scaler
        self._last = 0.0

    def drive(self, now: float, data_state: Any) -> None:
        if data_state is None or now - self._last < OBSERVE_SECS or self._scaler.busy():
            return
        self._last = now
        remaining = max(0, data_state.records_total - data_state.records_trained)
        decision = self.policy.observe(now, data_state.records_trained, self._scaler.training(), remaining)
        if decision is None:
            return
        task = self._scaler.add() if decision.delta > 0 else self._scaler.remove()
        rates = {str(n): round(r, 1) for n, r in decision.rates.items()}
        self._run.event(EventKind.SCALE, task or "-", delta=decision.delta, workers=decision.workers,
                        reason=decision.reason, rates=rates)
        what = ("added " if decision.delta > 0 else "asked to leave: ") + (task or "no free slot")
        self._run.console.print(f"autoscaling at global step {self._run.global_step}: {decision.reason}; {what}")


def scaling_entries(events: Sequence[Any]) -> list[dict[str, Any]]:
    """The report's ``scaling``: every decision, in order (trainers then, the change, why, rates measured)."""
    return [{"t": round(e.t, 3), "global_step": e.global_step, "task": e.task, **e.extra}
            for e in events if e.kind == "scale"]
