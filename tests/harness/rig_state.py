"""Put a built Rig's Python objects back to the state they were built in, so one graph serves many sequences.

A generated-sequence test runs tens of seeded sequences on the same configuration, and each one used to
build its own graph (the model, `ECOptimizer`, `RecoveryPlan` with its rebuild ops: about 2 CPU-s, a
quarter of a sequence).  The graph is finalized and its ops are stateless on the client: what a sequence
changes on the client side is the Python state of our objects (the plan's background job, the carried or
batched commit's counters, the step generation, a flash object's choices) and the containers they hold.
The servers' state is reset by the sequence itself (`tf.compat.v1.Session.reset`).

`Snapshot` walks every object reachable from its roots (and from the graph's collections) whose class is
ours (a module of ``tf_ecrec`` or of the harness), through lists, dicts, sets and deques, and records its
attributes and the containers' contents; `restore` writes them back, in place, so a reference held
anywhere sees the built state again.  TensorFlow objects (ops, tensors, variables, the graph) are neither
walked nor copied: the graph is the same one.  NumPy arrays are copied both ways (one could be written in
place).  A `threading.Event` gets its flag back.  An attribute a sequence added is removed; an object a
sequence created (a background job) is dropped with the attribute that held it.

What it cannot restore is state outside those objects (a module global, a class attribute); `Snapshot`
names every object it walked (`kinds`), and `tests/unit/test_rig_state.py` checks the restore on the
objects a Rig holds.
"""

from __future__ import annotations

import collections
import enum
import threading
from typing import Any

import numpy as np

OURS = ("tf_ecrec", "harness")
_CONTAINERS = (list, dict, set, collections.deque)


def _ours(obj: Any, modules: tuple[str, ...] = OURS) -> bool:
    module = type(obj).__module__ or ""
    return module.split(".")[0] in modules and not isinstance(obj, enum.Enum) and (hasattr(obj, "__dict__") or hasattr(type(obj), "__slots__"))


def _slots(obj: Any) -> list[str]:
    names: list[str] = []
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [s for s in slots if s not in ("__dict__", "__weakref__")]
    return names


def _attributes(obj: Any) -> dict[str, Any]:
    found = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
    for name in _slots(obj):
        if hasattr(obj, name):
            found[name] = getattr(obj, name)
    return found


def _copy(value: Any) -> Any:
    return value.copy() if isinstance(value, np.ndarray) else value


def _children(value: Any, modules: tuple[str, ...]) -> list[Any]:
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    if isinstance(value, (list, tuple, set, frozenset, collections.deque)):
        return list(value)
    if _ours(value, modules):
        return list(_attributes(value).values())
    return []


class Snapshot:
    """The Python state of our objects reachable from `roots` (and `graph`'s collections), restorable.

    `modules`: the top-level packages whose classes are "ours" (walked and restored); `keep`: attribute names
    that are neither restored nor compared (state meant to outlive a sequence, such as a kept session).
    """

    def __init__(self, *roots: Any, graph: Any = None, modules: tuple[str, ...] = OURS, keep: tuple[str, ...] = ()) -> None:
        self._keep_names = set(keep)
        stack = list(roots)
        if graph is not None:
            stack += [graph.get_collection(key) for key in graph.get_all_collection_keys()]
        seen: set[int] = set()
        self._objects: list[tuple[Any, dict[str, Any]]] = []
        self._classes: list[tuple[Any, type]] = []  # a test may swap an object's class for a broken one
        self._containers: list[tuple[Any, Any]] = []
        self._events: list[tuple[threading.Event, bool]] = []
        self._keep: list[Any] = []  # what the ids in `seen` refer to stays alive
        while stack:
            value = stack.pop()
            if id(value) in seen:
                continue
            seen.add(id(value))
            self._keep.append(value)
            if isinstance(value, threading.Event):
                self._events.append((value, value.is_set()))
            elif isinstance(value, dict):
                self._containers.append((value, {k: _copy(v) for k, v in value.items()}))
            elif isinstance(value, (list, set, collections.deque)):
                self._containers.append((value, [_copy(v) for v in value]))
            elif _ours(value, modules):
                self._objects.append((value, {k: _copy(v) for k, v in _attributes(value).items() if k not in self._keep_names}))
                self._classes.append((value, type(value)))
            else:
                continue
            stack.extend(_children(value, modules))

    @property
    def kinds(self) -> set[str]:
        """The classes of the objects it restores (module.name)."""
        return {f"{type(o).__module__}.{type(o).__name__}" for o, _ in self._objects}

    def differences(self) -> list[str]:
        """What differs from the recorded state now: "Class.attribute" per object, "container of Class.attribute"
        per container (compared by identity, NumPy arrays by bytes)."""

        def same(a: Any, b: Any) -> bool:
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.tobytes() == b.tobytes()
            return a is b or (type(a) is type(b) and isinstance(a, (int, float, str, bytes, bool)) and a == b)

        found = [f"{type(o).__name__} (built as {cls.__name__})" for o, cls in self._classes if type(o) is not cls]
        for obj, attributes in self._objects:
            current = {k: v for k, v in _attributes(obj).items() if k not in self._keep_names}
            name = type(obj).__name__
            found += [f"{name}.{k}" for k in current.keys() ^ attributes.keys()]
            found += [f"{name}.{k}" for k in current.keys() & attributes.keys() if not same(current[k], attributes[k])]
        for container, contents in self._containers:
            now = list(container.items()) if isinstance(container, dict) else list(container)
            was = list(contents.items()) if isinstance(contents, dict) else list(contents)
            if isinstance(container, set):
                changed = container != set(contents)
            else:
                changed = len(now) != len(was) or not all(
                    same(a[0], b[0]) and same(a[1], b[1]) if isinstance(container, dict) else same(a, b)
                    for a, b in zip(now, was))
            if changed:
                found.append(f"a {type(container).__name__} of {len(was)} items now of {len(now)}")
        return found

    def restore(self) -> None:
        for obj, cls in self._classes:
            if type(obj) is not cls:
                obj.__class__ = cls
        for obj, attributes in self._objects:
            current = {k: v for k, v in _attributes(obj).items() if k not in self._keep_names}
            for name in current.keys() - attributes.keys():
                delattr(obj, name) if name in _slots(obj) else vars(obj).pop(name)
            for name, value in attributes.items():
                if hasattr(obj, "__dict__") and name not in _slots(obj):
                    vars(obj)[name] = _copy(value)  # also past a frozen dataclass's __setattr__
                else:
                    object.__setattr__(obj, name, _copy(value))
        for container, contents in self._containers:
            container.clear()
            if isinstance(container, dict):
                container.update({k: _copy(v) for k, v in contents.items()})
            elif isinstance(container, set):
                container.update(contents)
            else:
                container.extend(_copy(v) for v in contents)
        for event, was_set in self._events:
            event.set() if was_set else event.clear()
