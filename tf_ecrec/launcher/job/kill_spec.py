"""The values of the fault and elastic flags: ``--kill TASK@step=N`` (or ``TASK@rebuild``), ``--remove-worker worker:I@step=N``,
``--add-worker step=N``.

Parsed here, one value at a time, with a message naming the flag; the rules
that need the whole job (does the task exist, is the step inside the run)
are `tf_ecrec.launcher.job.spec.JobSpec`'s.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from tf_ecrec.errors import ConfigError

_KILL = re.compile(r"^(?:(?P<type>ps|worker|chief|spare):(?P<index>\d+)|(?P<master>master))"
                   r"@(?:step=(?P<step>\d+)|(?P<during>rebuild))$")
_ADD_WORKER = re.compile(r"^step=(?P<step>\d+)$")


@dataclasses.dataclass(frozen=True)
class KillSpec:
    """``TASK@step=N``: SIGKILL the task when the global step reaches N, then restart it.

    ``TASK@rebuild``: SIGKILL it while a lost PS's rows are rebuilt in the background (the chief
    reported that trainers resumed with rows still pending, and not yet that the last one is in):
    a failure during the move to a spare, at whatever step that is.

    A chief or worker is killed at the first step >= N at which it has
    trained a step: a worker still starting up has nothing to lose.

    Also the value of ``--remove-worker worker:I@step=N`` (stop the worker for
    good at step N; see `JobSpec`).

    Attributes:
      task_type: "ps", "worker", "chief", "spare" (the I-th spare PS the launcher
        started, killed while it stands by: ``--spare-ps``; a new spare replaces it
        at once), or "master" (the job master process the launcher runs;
        restarted on the same port and state dir).
      task_index: index within the job as TF_CONFIG numbers it ("worker:1"
        is the second non-chief worker); 0 for the master.
      step: the global step that triggers the kill (0 for ``@rebuild``).
      during: "rebuild" for ``TASK@rebuild``, else "".
    """

    task_type: str
    task_index: int
    step: int
    during: str = ""

    @property
    def task(self) -> str:
        return "master" if self.task_type == "master" else f"{self.task_type}:{self.task_index}"

    @classmethod
    def parse(cls, text: str, flag: str = "--kill") -> KillSpec:
        m = _KILL.match(text.strip())
        if not m:
            raise ConfigError(
                f"{flag} {text!r} is malformed; expected TASK@step=N with TASK one of ps:I, worker:I, chief:0, "
                f"spare:I, master (e.g. {flag} ps:1@step=1200)"
                + (", or TASK@rebuild" if flag == "--kill" else "") + f"; source: {flag}"
            )
        if m["during"] and flag != "--kill":
            raise ConfigError(f"{flag} {text!r}: @rebuild is a --kill trigger; {flag} takes @step=N; source: {flag}")
        step, during = (0, m["during"]) if m["during"] else (int(m["step"]), "")
        if m["master"]:
            return cls("master", 0, step, during)
        return cls(m["type"], int(m["index"]), step, during)

    def __str__(self) -> str:
        return f"{self.task}@{self.during}" if self.during else f"{self.task}@step={self.step}"


def parse_kills(values: Sequence[str]) -> tuple[KillSpec, ...]:
    return tuple(KillSpec.parse(v) for v in values)


def parse_removes(values: Sequence[str]) -> tuple[KillSpec, ...]:
    """``--remove-worker worker:I@step=N`` values."""
    return tuple(KillSpec.parse(v, "--remove-worker") for v in values)


def parse_add_workers(values: Sequence[str]) -> tuple[int, ...]:
    """``--add-worker step=N`` values: the global steps at which a worker joins."""
    steps = []
    for text in values:
        m = _ADD_WORKER.match(text.strip())
        if not m:
            raise ConfigError(
                f"--add-worker {text!r} is malformed; expected step=N (e.g. --add-worker step=300); "
                "source: --add-worker"
            )
        steps.append(int(m["step"]))
    return tuple(steps)
