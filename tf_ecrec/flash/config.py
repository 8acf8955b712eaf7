"""`FlashConfig`: when a flash checkpoint is taken, where its tiers live, and the manifest it writes.

A flash checkpoint (`tf_ecrec.flash`) is a copy of every variable of every PS taken at one
global step while no step is in flight.  Its tiers, newest first at restore:

- ``own``: each PS's copy in shared memory on its own host (``<shm_dir>/<job key>/own/ps<p>``):
  it outlives the PS process, not the host;
- ``peer``: a second copy in shared memory on the next PS's host (``.../peer/ps<p>``, written by
  PS ``(p + 1) % num_ps``): a lost host is covered;
- ``disk``: every `persist_every`-th snapshot, and the newest one when a PS gets SIGTERM,
  under ``<model_dir>/flash/ps<p>``.

Each tier keeps two slots per PS; a round writes the slot that does not hold the newest complete
snapshot, emptying its manifest first and writing it last, so a round cut anywhere leaves the
other slot whole.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

from tf_ecrec.errors import ConfigError

DEFAULT_SHM_DIR = "/dev/shm/tf_ecrec"
MANIFEST = "MANIFEST"
FORMAT = 1
SLOTS = 2


class Tier(str, enum.Enum):
    """Where a snapshot copy lives; the values are the manifests' and the report's strings."""

    OWN = "own"
    PEER = "peer"
    DISK = "disk"


@dataclasses.dataclass(frozen=True)
class FlashConfig:
    """How often a flash checkpoint is taken and where it is kept.

    Args:
      every_steps: take one when the global step has advanced this much since the last (0: off).
      every_secs: or when this many seconds passed since the last (0: off); at least one of the two.
      shm_dir: the shared-memory directory of every PS host.
      persist_every: write every n-th snapshot to disk as well (0: only on SIGTERM).
      park_secs: how long a round waits for the other trainers to pause at a step boundary
        before it checks the logs anyway (a round that finds a step in flight is skipped).
    """

    every_steps: int = 0
    every_secs: float = 0.0
    shm_dir: str = DEFAULT_SHM_DIR
    persist_every: int = 10
    park_secs: float = 0.5

    def __post_init__(self) -> None:
        source = "FlashConfig / --flash-checkpoint-steps / --flash-checkpoint-secs"
        if int(self.every_steps) != self.every_steps or self.every_steps < 0:
            raise ConfigError(f"every_steps={self.every_steps!r}; rule: an integer >= 0; source: {source}")
        if not self.every_secs >= 0:
            raise ConfigError(f"every_secs={self.every_secs!r}; rule: >= 0; source: {source}")
        if not (self.every_steps or self.every_secs):
            raise ConfigError(f"every_steps={self.every_steps}, every_secs={self.every_secs}; rule: one of them > 0; source: {source}")
        if int(self.persist_every) != self.persist_every or self.persist_every < 0:
            raise ConfigError(f"persist_every={self.persist_every!r}; rule: an integer >= 0; source: {source}")
        if not self.park_secs > 0:
            raise ConfigError(f"park_secs={self.park_secs!r}; rule: > 0; source: {source}")
        if not self.shm_dir or not os.path.isabs(self.shm_dir):
            raise ConfigError(f"shm_dir={self.shm_dir!r}; rule: an absolute path; source: {source}")

    def due(self, step: int, last_step: int, now: float, last_time: float, early_steps: int = 0) -> bool:
        """Whether a snapshot is due at `step` and `now`, the last one taken at `last_step`, `last_time`.

        `early_steps`: start that many steps before the interval is up (at least one step after the
        last): the steps a round takes from being due to its snapshot being complete, so that a
        complete snapshot is never more than ``every_steps`` global steps behind.
        """
        interval = max(1, self.every_steps - max(0, int(early_steps)))
        return bool((self.every_steps and step - last_step >= interval)
                    or (self.every_secs and now - last_time >= self.every_secs))


def early_steps(lateness: Sequence[int]) -> int:
    """How many steps early the next round starts, from the last rounds' lateness (global steps from
    being due to their snapshot complete in memory): the largest, plus a tenth for its variation."""
    worst = max(lateness, default=0)
    return worst + (worst + 9) // 10 if worst > 0 else 0


def job_key(model_dir: str) -> str:
    """The name a job's snapshots go under in shared memory: a hash of its model dir."""
    return hashlib.sha256(os.path.abspath(model_dir).encode()).hexdigest()[:16]


def shm_root(config: FlashConfig, model_dir: str) -> str:
    """The job's directory in shared memory (on every PS host)."""
    return os.path.join(config.shm_dir, job_key(model_dir))


def slot_dir(tier: Tier, ps: int, slot: int, *, root: str, model_dir: str) -> str:
    """The directory of PS `ps`'s copy in `slot` of `tier` (`root`: `shm_root`)."""
    if tier is Tier.DISK:
        return os.path.join(model_dir, "flash", f"ps{ps}", f"slot{slot}")
    return os.path.join(root, tier.value, f"ps{ps}", f"slot{slot}")


BUNDLE = "snap"
"""A copy's tensors: one TensorFlow tensor bundle (SaveV2/RestoreV2) named by variable, in `FILES`."""
FILES = (f"{BUNDLE}.index", f"{BUNDLE}.data-00000-of-00001")


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What one PS's copy holds: written last, so a copy with a manifest is complete."""

    epoch: int
    global_step: int
    ps: int
    num_ps: int
    variables: tuple[str, ...]

    def encode(self) -> bytes:
        return json.dumps({"format": FORMAT, "epoch": self.epoch, "global_step": self.global_step, "ps": self.ps,
                           "num_ps": self.num_ps, "variables": list(self.variables)}).encode()

    @classmethod
    def decode(cls, blob: bytes) -> Manifest | None:
        """The manifest in `blob`, or None for an emptied or foreign one (a round cut mid-way)."""
        try:
            data: Any = json.loads(blob.decode())
            if data.get("format") != FORMAT:
                return None
            return cls(int(data["epoch"]), int(data["global_step"]), int(data["ps"]), int(data["num_ps"]),
                       tuple(str(n) for n in data["variables"]))
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            return None


@dataclasses.dataclass(frozen=True)
class Copy:
    """One complete copy found: PS `ps`'s variables at `manifest.epoch` in `slot` of `tier`."""

    tier: Tier
    slot: int
    manifest: Manifest

    @property
    def ps(self) -> int:
        return self.manifest.ps


@dataclasses.dataclass(frozen=True)
class Choice:
    """The snapshot a restore reads: one copy per PS, all of the same epoch (the same global step)."""

    epoch: int
    global_step: int
    copies: dict[int, Copy]

    @property
    def method(self) -> str:
        """"memory" when every copy is in shared memory, else "disk"."""
        return "disk" if any(c.tier is Tier.DISK for c in self.copies.values()) else "memory"


def choose(found: list[Copy], num_ps: int, variables: dict[int, tuple[str, ...]]) -> Choice | None:
    """The newest epoch every PS has a complete copy of (own before peer before disk), or None.

    A copy counts only if it names the variables the graph has on that PS (`variables`, in order)
    and the same PS count: a snapshot of another model or cluster shape is never restored.
    """
    order = {Tier.OWN: 0, Tier.PEER: 1, Tier.DISK: 2}
    by_epoch: dict[int, dict[int, Copy]] = {}
    for copy in found:
        m = copy.manifest
        if m.num_ps != num_ps or m.variables != variables.get(m.ps):
            continue
        best = by_epoch.setdefault(m.epoch, {}).get(m.ps)
        if best is None or order[copy.tier] < order[best.tier]:
            by_epoch[m.epoch][m.ps] = copy
    for epoch in sorted(by_epoch, reverse=True):
        copies = by_epoch[epoch]
        steps = {c.manifest.global_step for c in copies.values()}
        if len(copies) == num_ps and len(steps) == 1:
            return Choice(epoch, steps.pop(), copies)
    return None
