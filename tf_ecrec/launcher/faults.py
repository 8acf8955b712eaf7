"""The fault schedule of a launched job: when each kill hits, when its restart is due, when training got over it.

A `Fault` is one kill: planned (``--kill TASK@step=N``) or unplanned (a task
that died from a signal, or that the master's membership lost while its
process ran).  Every fault goes the same way, whatever its target (a task
or the job master)::

    due_kills(step, r)   planned, not hit, the global step reached (``@rebuild``: a background
                         rebuild under way, `r`)                    -> the caller kills the target
    unplanned(...)       a fault the caller saw happen               -> (hit it at once)
    hit(fault, step)     killed now; its restart is due `restart_delay` s later
    due_restarts(now)    hit, restart due                            -> the caller restarts the target
    restarted(fault)     restarted (or replaced by a spare): nothing more is due
    progress(t, step, s) a step after the kill (after a PS's, of a session created since):
                         "resumed" once, then "regained" once the global step is back at
                         the step of the kill

The schedule only keeps the books; the supervisor acts (SIGKILL, start a
process) and records events.  Times come from `clock` (wall seconds, like
the status datagrams' ``t``), so a test drives it without waiting.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from tf_ecrec.launcher.events import EventKind
from tf_ecrec.launcher.job.kill_spec import KillSpec


@dataclasses.dataclass
class Fault:
    """One kill and what followed it.

    Attributes:
      spec: the target and the global step of a planned kill (for an
        unplanned one, the step at which it was seen).
      killed_at: when it hit (the schedule's clock), None until then.
      killed_at_step: the global step when it hit.
      restart_at: when the target's restart is due; None before the hit
        and once restarted (or replaced by a spare).
      resumed: a step completed after the hit.
      regained: the global step came back to `killed_at_step` after the hit.
    """

    spec: KillSpec
    killed_at: float | None = None
    killed_at_step: int | None = None
    restart_at: float | None = None
    resumed: bool = False
    regained: bool = False

    @property
    def task(self) -> str:
        """The target: "type:index", or "master"."""
        return self.spec.task

    @property
    def on_master(self) -> bool:
        return self.spec.task_type == "master"


class FaultSchedule:
    """The faults of one run, planned and unplanned, in the order they were planned or seen.

    Args:
      kills: the planned kills (``--kill``), in any order; kept by step.
      restart_delay: seconds from a hit to its restart (``--restart-delay``).
      clock: the current time in seconds (default `time.time`).
    """

    def __init__(self, kills: Sequence[KillSpec], restart_delay: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.faults = [Fault(k) for k in sorted(kills, key=lambda k: k.step)]
        self._delay = restart_delay
        self._clock = clock

    def due_kills(self, global_step: int, rebuilding: bool = False) -> list[Fault]:
        """Planned faults not hit yet whose step the global step reached, or, for ``TASK@rebuild``, while
        `rebuilding` (a lost PS's rows are being rebuilt in the background); the caller may defer one."""
        return [f for f in self.faults if f.killed_at is None
                and (rebuilding if f.spec.during == "rebuild" else global_step >= f.spec.step)]

    def unplanned(self, task_type: str, task_index: int, global_step: int) -> Fault:
        """Adds a fault the supervisor saw (a crash, a task lost while running); hit it next."""
        fault = Fault(KillSpec(task_type, task_index, global_step))
        self.faults.append(fault)
        return fault

    def hit(self, fault: Fault, global_step: int) -> None:
        """`fault` happened now, at `global_step`; its restart is due after the restart delay."""
        fault.killed_at, fault.killed_at_step = self._clock(), global_step
        fault.restart_at = fault.killed_at + self._delay

    def due_restarts(self, now: float) -> list[Fault]:
        """Faults whose restart is due at `now` (the caller restarts the target once it is down)."""
        return [f for f in self.faults if f.restart_at is not None and now >= f.restart_at]

    def restarted(self, fault: Fault) -> None:
        """The target of `fault` was restarted, or a spare took its place: no restart is due any more."""
        fault.restart_at = None

    def interrupted(self, t: float) -> bool:
        """Whether a fault hit before `t` and no step completed since (the global step may go down)."""
        return any(f.killed_at is not None and not f.resumed and t > f.killed_at for f in self.faults)

    def awaiting_resume(self) -> bool:
        """Whether some fault hit and training has not resumed since (no stall is reported meanwhile)."""
        return any(f.killed_at is not None and not f.resumed for f in self.faults)

    def progress(self, t: float, step: int, session_at: float | None = None) -> list[tuple[EventKind, Fault]]:
        """A step reported at `t` with global step `step` by a trainer whose session was created at `session_at`
        (None: not known): the (RESUMED | REGAINED, fault) events it makes.

        After a PS's kill only a step of a session created since counts: a step in flight at the kill that
        did not need the dead PS still completes on the old session, with the global step it read before
        the failure took steps back, and training has not resumed (every trainer re-creates its session
        for a lost PS).  A trainer's or the master's kill leaves the others' sessions as they are.
        """
        events: list[tuple[EventKind, Fault]] = []
        for f in self.faults:
            if f.killed_at is None or t <= f.killed_at:
                continue
            if f.spec.task_type == "ps" and session_at is not None and session_at <= f.killed_at:
                continue
            if not f.resumed:
                f.resumed = True
                events.append((EventKind.RESUMED, f))
            if not f.regained and step >= (f.killed_at_step or 0):
                f.regained = True
                events.append((EventKind.REGAINED, f))
        return events
