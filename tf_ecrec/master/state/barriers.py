"""Named barriers: who is expected, who arrived, whether it is done.

A barrier ``(name, scope)`` fixes its expected participants when the first
task arrives.  It is done once every expected participant arrived; a
participant declared lost is no longer expected.  Done barriers are kept
(the newest :data:`DONE_BARRIERS_KEPT`) so that a late arrival passes at
once.  :class:`BarrierTable` has no lock and does not wait:
:class:`~tf_ecrec.master.state.master_state.MasterState` holds the lock,
persists, and wakes the waiters when a barrier is done.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from tf_ecrec.errors import InvalidRequestError
from tf_ecrec.master.state.tasks import parse_task_id

DEFAULT_BARRIER_TYPES = ("chief", "worker")
MAX_BARRIER_TIMEOUT_S = 3600.0
DONE_BARRIERS_KEPT = 64


@dataclasses.dataclass
class Barrier:
    """The participants of one barrier."""

    expected: set[str]
    arrived: set[str]
    done: bool = False

    def settle(self) -> bool:
        """Marks the barrier done if everyone expected arrived; True if it just was."""
        if not self.done and self.expected <= self.arrived:
            self.done = True
            return True
        return False


def check_request(name: str, timeout: float, participants: Sequence[str]) -> None:
    """Validates a barrier request before any state is touched.

    Raises:
      InvalidRequestError: an empty name, a timeout out of range, or a
        malformed participant id.
    """
    if not name:
        raise InvalidRequestError("barrier name is empty; rule: a non-empty string")
    if not 0 < timeout <= MAX_BARRIER_TIMEOUT_S:
        raise InvalidRequestError(
            f"barrier {name!r} timeout_s={timeout}; rule: 0 < timeout_s <= "
            f"{MAX_BARRIER_TIMEOUT_S:g}")
    for participant in participants:
        parse_task_id(participant)


class BarrierTable:
    """The job's barriers by ``name@scope`` key.  Not thread-safe."""

    def __init__(self) -> None:
        self._barriers: dict[str, Barrier] = {}

    @staticmethod
    def key(name: str, scope: int) -> str:
        return f"{name}@{scope}"

    def arrive(self, key: str, task_id: str,
               expected: Callable[[], set[str]]) -> tuple[Barrier, bool]:
        """``task_id`` arrives at ``key``; creates the barrier with ``expected()``.

        Returns:
          The barrier and whether anything changed (a first arrival of
          ``task_id``); on a change, done barriers beyond the kept number
          are forgotten.
        """
        barrier = self._barriers.get(key)
        if barrier is None:
            barrier = self._barriers[key] = Barrier(expected(), set())
        if task_id in barrier.arrived:
            return barrier, False
        barrier.arrived.add(task_id)
        barrier.settle()
        self._prune()
        return barrier, True

    def discard(self, task_id: str) -> bool:
        """No barrier waits for ``task_id`` any more; True if one became done."""
        settled = False
        for barrier in self._barriers.values():
            barrier.expected.discard(task_id)
            settled = barrier.settle() or settled
        return settled

    def _prune(self) -> None:
        done = [k for k, b in self._barriers.items() if b.done]
        for key in done[:max(0, len(done) - DONE_BARRIERS_KEPT)]:
            del self._barriers[key]

    def to_list(self) -> list[list[Any]]:
        """The barriers as persisted: ``[key, expected, arrived, done]`` each."""
        return [[k, sorted(b.expected), sorted(b.arrived), b.done]
                for k, b in self._barriers.items()]

    @staticmethod
    def parse(data: Any) -> dict[str, Barrier]:
        """Parses :meth:`to_list` output; TypeError or ValueError if malformed."""
        return {key: Barrier(set(expected), set(arrived), bool(done))
                for key, expected, arrived, done in data}

    def load(self, barriers: dict[str, Barrier]) -> None:
        """Adds barriers parsed by :meth:`parse`."""
        self._barriers.update(barriers)
