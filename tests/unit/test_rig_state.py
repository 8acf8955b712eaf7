"""`harness.rig_state.Snapshot`: the built state of a Rig's Python objects, put back in place."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
from harness.rig_state import Snapshot

OURS = (__name__.split(".")[0],)


class _Counter:
    def __init__(self) -> None:
        self.count = 0
        self.seen: list[int] = []
        self.by_name: dict[str, int] = {"a": 1}
        self.ids: set[int] = {1}
        self.words = np.zeros(4, np.int32)
        self.stop = threading.Event()


class _BrokenCounter(_Counter):
    pass


class _Slotted:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 1


@dataclasses.dataclass(frozen=True)
class _Frozen:
    inner: _Counter
    names: list[str]


class _Root:
    def __init__(self) -> None:
        self.counter = _Counter()
        self.nested = [{"deep": _Counter()}]
        self.slotted = _Slotted()
        self.frozen = _Frozen(_Counter(), ["x"])


def _run_a_sequence(root: _Root) -> None:
    """Every kind of change a sequence makes to our objects."""
    root.counter.count += 3
    root.counter.seen.append(7)
    root.counter.by_name["b"] = 2
    root.counter.ids.add(9)
    root.counter.words[2] = 5  # written in place
    root.counter.stop.set()
    root.counter.job = object()  # an attribute the sequence added
    root.nested[0]["deep"].seen.extend([1, 2])  # reached only through containers
    root.nested.append("more")
    root.slotted.value = 2
    root.frozen.inner.count = 4  # behind a frozen dataclass
    root.frozen.names.append("y")
    root.counter.__class__ = _BrokenCounter  # a mutation test's broken object


def test_a_restore_puts_back_every_change_a_sequence_makes_in_place():
    root = _Root()
    held = root.counter.seen  # a reference taken before: it sees the built state again
    snapshot = Snapshot(root, modules=OURS)
    _run_a_sequence(root)
    changed = snapshot.differences()
    assert len(changed) >= 10, changed
    snapshot.restore()
    assert snapshot.differences() == []
    assert type(root.counter) is _Counter
    assert root.counter.count == 0 and held == [] and root.counter.seen is held
    assert root.counter.by_name == {"a": 1} and root.counter.ids == {1} and not hasattr(root.counter, "job")
    assert root.counter.words.tolist() == [0, 0, 0, 0] and not root.counter.stop.is_set()
    assert root.nested == [{"deep": root.nested[0]["deep"]}] and root.nested[0]["deep"].seen == []
    assert root.slotted.value == 1 and root.frozen.inner.count == 0 and root.frozen.names == ["x"]
    # Twice: the recorded state is not consumed by a restore.
    _run_a_sequence(root)
    snapshot.restore()
    assert snapshot.differences() == [] and root.counter.count == 0


def test_objects_of_other_packages_are_kept_as_they_are():
    root = _Root()
    root.counter.lib = threading.Thread(target=lambda: None)  # not ours: neither walked nor copied
    snapshot = Snapshot(root, modules=OURS)
    assert {k.rsplit(".", 1)[1] for k in snapshot.kinds} == {"_Root", "_Counter", "_Slotted", "_Frozen"}
    lib = root.counter.lib
    lib.name = "renamed"
    snapshot.restore()
    assert root.counter.lib is lib and lib.name == "renamed"
