"""The events of a launched run (the report's ``events``): what happened, to which task, at which step.

Kinds (`EventKind`; the values are the report's):

- ``start``/``kill``/``restart``/``exit``: the supervisor's own actions and
  observations on processes (task ``master`` for the job master);
- ``crash``: a task died from a signal (``signal``) and is restarted;
- ``lost``: the master's view lost a task whose process still ran;
- ``move``: a PS got a new address (``old``, ``new``; ``spare`` when a spare took its role);
- ``spare``: a spare PS started;
- ``spare_lost``: a standing-by spare PS was killed (``--kill spare:I``) or died
  (``code``); a new one starts at once (nothing to recover: it held no role);
- ``add``/``remove``: elastic workers started and asked to leave;
- ``session``: a task (re)created its training session, at ``global_step``;
- ``recovered``: the chief rebuilt lost variables (``method``, ``lost_ps``,
  ``bytes_rebuilt``, ``rebuild_seconds``, ``phases``);
- ``rebuilding``: the chief let trainers resume while it installs the lost
  rows in the background (``lost_ps``, ``seconds``, ``phases``);
- ``settled``: steps cut by a failure were undone or finished;
- ``failover``: a trainer's failover loop changed state (``state``, ``reason``);
- ``resumed``: the first step completed after a kill;
- ``regained``: the global step is back at the step of the kill.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class EventKind(str, enum.Enum):
    """The kinds of events (see the module docstring); a member equals its value."""

    START = "start"
    KILL = "kill"
    RESTART = "restart"
    EXIT = "exit"
    CRASH = "crash"
    LOST = "lost"
    MOVE = "move"
    SPARE = "spare"
    SPARE_LOST = "spare_lost"
    ADD = "add"
    REMOVE = "remove"
    SESSION = "session"
    RECOVERED = "recovered"
    REBUILDING = "rebuilding"
    SETTLED = "settled"
    FAILOVER = "failover"
    RESUMED = "resumed"
    REGAINED = "regained"
    SCALE = "scale"


@dataclasses.dataclass
class Event:
    """One event; `t` in seconds since the launch; `kind` may be given as its value ("kill")."""

    t: float
    kind: EventKind
    task: str
    global_step: int
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.kind = EventKind(self.kind)

    def to_json(self) -> dict[str, Any]:
        return {"t": round(self.t, 3), "kind": self.kind.value, "task": self.task, "global_step": self.global_step,
                **self.extra}
