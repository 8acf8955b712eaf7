"""Atomic JSON snapshots of the master's state, one master per directory."""

from __future__ import annotations

import fcntl
import json
import os
from typing import Any

from tf_ecrec.errors import MasterError


class SnapshotStore:
    """Atomic JSON snapshots in a directory that one master owns at a time.

    ``save`` writes ``state.json.tmp``, flushes (and fsyncs when ``fsync``),
    then renames it over ``state.json``; a reader sees the old or the new
    snapshot, never a torn one.  A ``LOCK`` file held with ``flock`` keeps a
    second master off the same directory; the kernel drops it when the
    owner dies, even by SIGKILL.  Call order: construct (takes the lock),
    ``load`` once, ``save`` on every change, ``close`` (releases the lock).

    Raises (on construction):
      MasterError: another master holds the directory.
    """

    def __init__(self, state_dir: str, *, fsync: bool = True) -> None:
        os.makedirs(state_dir, exist_ok=True)
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, "state.json")
        self._fsync = fsync
        self._lock_file = open(os.path.join(state_dir, "LOCK"), "a+")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self._lock_file.close()
            raise MasterError(
                f"state dir {state_dir!r} is in use by another master; rule: one master "
                "per state dir") from exc

    def load(self) -> dict[str, Any] | None:
        """Returns the last snapshot, or ``None`` when there is none.

        Raises:
          MasterError: the snapshot exists but cannot be read.
        """
        try:
            with open(self.path, encoding="utf-8") as handle:
                return json.load(handle)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise MasterError(
                f"master state {self.path!r} is unreadable ({exc}); move it away to start "
                "fresh") from exc

    def save(self, data: dict[str, Any]) -> None:
        """Replaces the snapshot with ``data`` (JSON-serializable) atomically."""
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(data, handle, separators=(",", ":"))
            handle.flush()
            if self._fsync:
                os.fsync(handle.fileno())
        os.replace(tmp, self.path)

    def close(self) -> None:
        """Releases the directory's lock; idempotent."""
        if not self._lock_file.closed:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
