"""What a recovery asks of snapshots it may restore when more PS are lost than the code covers.

`RecoveryPlan.flash` holds a `SnapshotSource` (`tf_ecrec.flash.snapshots.FlashSnapshots` is the one the
package has: `ec_model_fn` sets it): recovery owns this interface and flash implements it, so the two meet
in one direction only (flash imports recovery, never the reverse).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Snapshot(Protocol):
    """One restorable snapshot of every PS: its global step, and which tier restores it ("memory", "disk")."""

    @property
    def global_step(self) -> int: ...

    @property
    def method(self) -> str: ...


class SnapshotSource(Protocol):
    """The snapshots a recovery may restore: the newest whole one, its restore, the trainers' gate."""

    @property
    def names(self) -> Mapping[int, tuple[str, ...]]:
        """PS task -> the variable names its snapshot holds."""

    @property
    def bytes(self) -> Mapping[int, int]:
        """PS task -> the bytes its snapshot holds."""

    def choose(self, sess: Any) -> Snapshot | None:
        """The newest snapshot every PS holds a copy of, or None."""

    def restore(self, sess: Any, choice: Any, options: Any = None) -> int:
        """Writes `choice` into every PS's variables; returns its global step."""

    def init_gate(self, sess: Any) -> None:
        """Opens the gate trainers read with every step (a fresh session's)."""
