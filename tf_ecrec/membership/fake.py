"""An in-memory membership backend for tests.  Same contract, no server.

One :class:`FakeMembershipServer` stands for the service; each
:class:`FakeMembership` is one process's backend on it.  Faults are injected
on the server: :meth:`FakeMembershipServer.expire` ends a member's session
(the member re-joins, as the real backends do), ``reachable = False`` makes
every call time out at once.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from tf_ecrec.errors import MembershipError, MembershipTimeout
from tf_ecrec.membership.base import Dispatcher, EventKind, Member, MembershipBackend, WatchCallback


class FakeMembershipServer:
    """The shared member registry."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.members: dict[str, Member] = {}
        self.owners: dict[str, FakeMembership] = {}
        self.backends: list[FakeMembership] = []
        self.reachable = True

    def check(self) -> None:
        if not self.reachable:
            raise MembershipTimeout("fake membership server is unreachable")

    def publish(self) -> None:
        with self.lock:
            view = dict(self.members)
            backends = list(self.backends)
        for backend in backends:
            backend._dispatcher.publish_view(view)

    def expire(self, key: str) -> None:
        """Ends the session of the member ``key``; its backend re-joins."""
        with self.lock:
            owner = self.owners.pop(key, None)
            self.members.pop(key, None)
        self.publish()
        if owner is not None:
            owner._session_expired()


class FakeMembership(MembershipBackend):
    """One process's membership on a :class:`FakeMembershipServer`."""

    def __init__(self, server: FakeMembershipServer) -> None:
        self._server = server
        self._dispatcher = Dispatcher("tf-ecrec-fake-membership-events")
        self._member: Member | None = None
        self._closed = False
        self._session = 0
        with server.lock:
            server.backends.append(self)

    def join(self, member: Member) -> None:
        """See base class."""
        self._server.check()
        with self._server.lock:
            held = self._server.members.get(member.key)
            owner = self._server.owners.get(member.key)
            if held is not None and owner is not self and member.generation <= held.generation:
                raise MembershipError(f"{member.key} is held with generation {held.generation}")
            self._server.members[member.key] = dataclasses.replace(
                member, incarnation=f"fake-{id(self):x}-{self._session}")
            self._server.owners[member.key] = self
            self._member = member
        self._server.publish()

    def leave(self) -> None:
        """See base class."""
        self._server.check()
        with self._server.lock:
            member, self._member = self._member, None
            if member is not None and self._server.owners.get(member.key) is self:
                del self._server.members[member.key]
                del self._server.owners[member.key]
        self._server.publish()

    def members(self) -> dict[str, Member]:
        """See base class."""
        self._server.check()
        with self._server.lock:
            return dict(self._server.members)

    def watch(self, callback: WatchCallback) -> Callable[[], None]:
        """See base class."""
        return self._dispatcher.subscribe(callback, self.members())

    def close(self) -> None:
        """See base class.  Like a closed ZooKeeper session: the member goes at once."""
        if self._closed:
            return
        self._closed = True
        with self._server.lock:
            if self in self._server.backends:
                self._server.backends.remove(self)
            for key in [k for k, owner in self._server.owners.items() if owner is self]:
                del self._server.members[key]
                del self._server.owners[key]
        self._server.publish()
        self._dispatcher.close()

    def _session_expired(self) -> None:
        self._session += 1
        self._dispatcher.publish(EventKind.SELF_LOST)
        member = self._member
        if member is not None and not self._closed:
            self.join(member)
            self._dispatcher.publish(EventKind.SELF_REJOINED)
