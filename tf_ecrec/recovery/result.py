"""What a recovery did: `RecoveryResult`, the value every `RecoveryPlan.prepare` returns and listeners get."""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable

from tf_ecrec.step.steplog import SettleReport


class RecoveryMethod(str, enum.Enum):
    """How the variables were brought back; the values are what reports and logs show."""

    NONE = "none"  # nothing was lost (steps a dead task left were settled)
    INIT = "init"  # a fresh start: everything initialised
    PARITY = "parity"  # lost PS rebuilt from parity and replicas
    CHECKPOINT = "checkpoint"  # every variable restored from the checkpoint, parity re-encoded
    MEMORY = "memory"  # every variable restored from a flash checkpoint in shared memory (tf_ecrec.flash)
    DISK = "disk"  # the same from a flash checkpoint persisted in the model dir
    SETTLED = "settled"  # the background settlement of a dead task's steps
    REBUILT = "rebuilt"  # the end of a background rebuild: `lost_ps` whole again

    def __str__(self) -> str:
        return self.value



@dataclasses.dataclass
class RecoveryResult:
    """What one `prepare` did.

    Attributes:
      method: what was done (`RecoveryMethod`; its values are the report's strings).
      background: for "parity": the table rows are installed in the
        background while training goes on (`tf_ecrec.rebuild.background.BackgroundRebuild`);
        a "rebuilt" result follows.
      lost_ps: PS tasks whose variables were missing.
      variables_rebuilt: how many variables were written.
      bytes_rebuilt: bytes written to rebuilt variables.
      seconds: wall time of the decision and the rebuild.
      global_step: the global step after it.
      phases: seconds of each part of `seconds`, in order (the profile of a
        recovery: "inspect", "settle", "t0" or "rebuild", "generation",
        "mark", "read_step"; "restore" and "reencode" for a checkpoint).
    """

    method: RecoveryMethod
    lost_ps: list[int]
    variables_rebuilt: int = 0
    bytes_rebuilt: int = 0
    seconds: float = 0.0
    global_step: int | None = None
    steps_undone: int = 0
    steps_finished: int = 0
    folds_rolled_back: int = 0
    background: bool = False
    phases: dict[str, float] = dataclasses.field(default_factory=dict)

    def settled(self, report: SettleReport | None) -> RecoveryResult:
        """Adds what a settlement did to this result; returns it."""
        if report is not None:
            self.steps_undone += report.undone
            self.steps_finished += report.finished
            self.folds_rolled_back += report.rolled_back
        return self


Listener = Callable[[RecoveryResult], None]


class Phases:
    """Wall seconds of consecutive parts of a procedure: ``lap(name)`` closes the part since the last lap."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._last, 4)
        self._last = now

    def add(self, seconds: dict[str, float]) -> None:
        """Splits the part since the last lap into `seconds` (measured inside it) and closes it."""
        for name, s in seconds.items():
            self.seconds[name] = round(self.seconds.get(name, 0.0) + s, 4)
        self._last = time.perf_counter()
