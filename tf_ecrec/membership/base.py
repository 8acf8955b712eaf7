"""The membership interface: who is in the job, and who was lost.

A :class:`MembershipBackend` is used by one process.  A task ``join``\\ s with
its address and stays a member while its process lives; every process may
``watch`` the member set.  Implementations:

* :class:`~tf_ecrec.master.membership.EmbeddedMembership`: heartbeats to the
  job master, which declares a task silent past its deadline lost.
* :class:`~tf_ecrec.membership.zookeeper.ZooKeeperMembership`: an ephemeral
  znode per member, kept by the ZooKeeper session.
* :class:`~tf_ecrec.membership.fake.FakeMembership`: in memory, for tests.

All three pass the same contract suite (``tests/integration/
test_membership_contract.py``).  The contract:

* ``join`` is idempotent and returns once the member is visible to others,
  or raises :class:`~tf_ecrec.errors.MembershipTimeout` within its deadline.
* ``watch(callback)`` calls ``callback`` once with the current view, then on
  every change, always on a backend thread (never inside a ZooKeeper state
  listener or a gRPC callback), one event at a time, in order.  A callback
  that raises is logged and does not end the watch.
* A member whose process stops without ``leave`` disappears from every view
  within the backend's liveness deadline, as ``departed`` in an event.
* When a member's own membership is lost (session expired, declared lost by
  the master) it gets ``SELF_LOST``, and, once re-joined automatically,
  ``SELF_REJOINED``.  Its old registration must be considered dead.
* While the backend cannot reach its server it reports ``SUSPENDED`` and the
  view must not be trusted; ``RESUMED`` follows when the connection (and the
  session) came back.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

_LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Member:
    """A task in the job.

    Attributes:
      task_type: ``"ps"``, ``"chief"``, ``"worker"`` or ``"evaluator"``.
      task_index: Index within the type.
      address: ``host:port`` of the task's TensorFlow server.
      generation: The master's generation of this registration (0 unknown);
        ZooKeeper uses it as a fencing token between incarnations of a slot.
      incarnation: Set by the backend in views: what identifies this
        membership (the ZooKeeper session owning the znode, the master's
        generation).  A slot whose incarnation changed between two views has
        departed and joined again, even if no view showed the gap.
    """

    task_type: str
    task_index: int
    address: str
    generation: int = 0
    incarnation: str = ""

    @property
    def key(self) -> str:
        """``"<type>:<index>"``, the task id used everywhere."""
        return f"{self.task_type}:{self.task_index}"


class EventKind(str, enum.Enum):
    CHANGED = "changed"            # The view changed (or: the first view).
    SUSPENDED = "suspended"        # Connection lost; the view is not trusted.
    RESUMED = "resumed"            # Connection and session back; view trusted.
    SELF_LOST = "self_lost"        # This process's membership was lost.
    SELF_REJOINED = "self_rejoined"  # ... and has been re-created.


@dataclasses.dataclass(frozen=True)
class MembershipEvent:
    """One change seen by a watcher.

    Attributes:
      kind: What happened.
      members: The view after the change, by key.
      joined: Keys that appeared, changed, or came back as a new incarnation
        since the previous event.
      departed: Keys whose previous incarnation ended since the previous
        event: gone, or replaced by a new incarnation (then also in
        ``joined``).
      departed_members: The ended incarnations, by key.
    """

    kind: EventKind
    members: Mapping[str, Member]
    joined: tuple[str, ...] = ()
    departed: tuple[str, ...] = ()
    departed_members: Mapping[str, Member] = dataclasses.field(default_factory=dict)


WatchCallback = Callable[[MembershipEvent], None]


class MembershipBackend(abc.ABC):
    """Membership of one process in one job; see the module docstring."""

    @abc.abstractmethod
    def join(self, member: Member) -> None:
        """Makes ``member`` (this process) a member, or updates its data.

        Raises:
          MembershipTimeout: the server was not reachable before the deadline.
          MembershipError: the slot is held by a newer incarnation.
        """

    @abc.abstractmethod
    def leave(self) -> None:
        """Removes this process's member at once; a no-op if it is not one.

        Raises:
          MembershipTimeout: the server was not reachable before the deadline.
        """

    @abc.abstractmethod
    def members(self) -> dict[str, Member]:
        """Returns the current members by key, read from the server.

        Raises:
          MembershipTimeout: the server was not reachable before the deadline.
        """

    @abc.abstractmethod
    def watch(self, callback: WatchCallback) -> Callable[[], None]:
        """Subscribes ``callback`` to events; returns a function that unsubscribes."""

    @abc.abstractmethod
    def close(self) -> None:
        """Releases connections and threads without ``leave``.

        For other processes this looks like a crash: the member disappears
        after the backend's liveness deadline (at once for ZooKeeper, whose
        session closes).  Idempotent.
        """

    def __enter__(self) -> MembershipBackend:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


@runtime_checkable
class MasterDirectory(Protocol):
    """A backend that can also advertise where the job master is."""

    def publish_master(self, address: str, details: Mapping[str, Any]) -> None:
        """Advertises this process as the job's master; fails if another is live."""

    def master_address(self) -> str | None:
        """Returns the advertised master address, or ``None``."""


class Dispatcher:
    """Delivers events to watch callbacks on one thread, in order.

    Backends diff successive views with :meth:`publish_view` and hand
    connection events to :meth:`publish`; neither blocks the caller (a
    ZooKeeper state listener, a heartbeat thread).
    """

    def __init__(self, name: str) -> None:
        self._callbacks: list[WatchCallback] = []
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        # (event, its recipients, fixed when queued); ``None`` ends the thread.
        self._queue: list[tuple[MembershipEvent, tuple[WatchCallback, ...]] | None] = []
        self._view: dict[str, Member] | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def view(self) -> dict[str, Member] | None:
        """The last published view, ``None`` before the first."""
        with self._lock:
            return None if self._view is None else dict(self._view)

    def subscribe(self, callback: WatchCallback,
                  current: Mapping[str, Member]) -> Callable[[], None]:
        """Adds ``callback``; it first gets a CHANGED event with the current view.

        ``current`` is used only if no view was published yet.
        """
        with self._lock:
            view = dict(current) if self._view is None else dict(self._view)
            if self._view is None:
                self._view = dict(view)
            first = MembershipEvent(EventKind.CHANGED, view, tuple(sorted(view)), ())
            self._callbacks.append(callback)
            self._queue.append((first, (callback,)))
            self._ready.notify()

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)
        return unsubscribe

    def publish_view(self, view: Mapping[str, Member]) -> None:
        """Publishes ``view`` as a CHANGED event if it differs from the last one."""
        with self._lock:
            old = self._view or {}
            joined = tuple(sorted(k for k, m in view.items() if old.get(k) != m))
            ended = {k: m for k, m in old.items()
                     if k not in view or (m.incarnation and view[k].incarnation
                                          and m.incarnation != view[k].incarnation)}
            self._view = dict(view)
            if joined or ended:
                event = MembershipEvent(EventKind.CHANGED, dict(view), joined,
                                        tuple(sorted(ended)), ended)
                self._queue.append((event, tuple(self._callbacks)))
                self._ready.notify()

    def publish(self, kind: EventKind) -> None:
        """Publishes a connection or self event with the last view."""
        with self._lock:
            self._queue.append((MembershipEvent(kind, dict(self._view or {})),
                                tuple(self._callbacks)))
            self._ready.notify()

    def close(self) -> None:
        """Stops the thread after the queued events; waits for it briefly."""
        with self._lock:
            self._queue.append(None)
            self._ready.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue:
                    self._ready.wait()
                item = self._queue.pop(0)
                if item is None:
                    return
                event, recipients = item
                callbacks = [c for c in recipients if c in self._callbacks]
            for callback in callbacks:
                try:
                    callback(event)
                except Exception:  # a watcher's bug must not end the watch.
                    _LOG.exception("Membership watch callback %r failed on %s", callback,
                                   event.kind.value)
