"""Membership in ZooKeeper through kazoo: one ephemeral znode per member.

Layout under the job path ``/<job>``::

    /<job>/members/<type>:<index>   ephemeral; JSON {"address", "generation"}
    /<job>/master, /<job>/master_state   see :mod:`~tf_ecrec.membership.zk_master_directory`

Session states, as kazoo documents them, and what this backend does:

* ``SUSPENDED``: the connection dropped; the session (and our znodes) may
  still be alive.  Report SUSPENDED and trust nothing; do not re-create.
* ``CONNECTED`` after ``SUSPENDED``: the session survived; our znodes are
  intact.  Check them anyway, re-read the members, report RESUMED.
* ``LOST``: the session expired; ZooKeeper deleted our ephemeral znodes and
  the job has seen us depart.  Report SELF_LOST.  kazoo reconnects with a new
  session; on that ``CONNECTED`` re-create our member (and master) znode,
  report SELF_REJOINED, then RESUMED.

The state listener and the watch callbacks only put work on a queue; one
worker thread makes every ZooKeeper call and runs the watchers' callbacks
(kazoo forbids blocking calls inside listeners).  Operations are bounded
(:mod:`~tf_ecrec.membership.zk_connection`) and end in
:class:`~tf_ecrec.errors.MembershipTimeout` at their deadline.  The initial
connect waits at most ``connect_timeout``.

The ``generation`` a member carries (the master's generation of its
registration) is the fencing token between incarnations of one slot: a
newer incarnation replaces a leftover znode of an older one (checked by
znode version); an older one is refused.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError, ZookeeperError
from kazoo.protocol.states import KazooState
from kazoo.recipe.watchers import ChildrenWatch

from tf_ecrec.errors import ConfigError, MembershipError
from tf_ecrec.membership.base import Dispatcher, EventKind, Member, MembershipBackend, WatchCallback
from tf_ecrec.membership.zk_connection import ZkConnection, parse_zk_url
from tf_ecrec.membership.zk_master_directory import ZkMasterDirectory

_LOG = logging.getLogger(__name__)


class _Work(str, enum.Enum):
    """What the worker thread is asked to do."""

    REFRESH = "refresh"  # Re-read the members and publish the view.
    WATCH = "watch"      # Start the children watch.
    STATE = "state"      # Handle a session state change (with the state).
    STOP = "stop"        # End the thread.


class ZooKeeperMembership(MembershipBackend):
    """Membership of one process in ZooKeeper.  Also a master directory.

    Args:
      hosts: ZooKeeper connection string, ``"h1:2181,h2:2181"``.
      job_path: The job's znode, e.g. ``"/tf_ecrec/ctr"``.
      session_timeout: Seconds the session survives without a connection
        (the server clamps it to its min/max).  A crashed member vanishes
        this long after its process died.
      connect_timeout: Seconds the first connect may take.
      op_timeout: Deadline, seconds, of one operation including retries.
    """

    def __init__(self, hosts: str, job_path: str, *, session_timeout: float = 10.0,
                 connect_timeout: float = 5.0, op_timeout: float = 5.0) -> None:
        if not job_path.startswith("/") or job_path.rstrip("/") == "":
            raise ConfigError(f"ZooKeeper job path {job_path!r}; rule: absolute, below the root")
        if min(session_timeout, connect_timeout, op_timeout) <= 0:
            raise ConfigError("ZooKeeper timeouts must be > 0: session_timeout="
                              f"{session_timeout}, connect_timeout={connect_timeout}, "
                              f"op_timeout={op_timeout}")
        self.hosts = hosts
        self.job_path = job_path.rstrip("/")
        self._members_path = f"{self.job_path}/members"
        self._zk = ZkConnection(hosts, session_timeout=session_timeout,
                                connect_timeout=connect_timeout, op_timeout=op_timeout)
        self._client = self._zk.client
        self._op = self._zk.op
        self._directory = ZkMasterDirectory(self._zk, self.job_path)
        self._lock = threading.Lock()
        self._member_lock = threading.Lock()  # Serializes writes of our member znode.
        self._started = False
        self._closing = False  # No new work: closing, or the first connect failed.
        self._closed = False
        self._member: Member | None = None
        self._work: queue.Queue[tuple[_Work, str]] = queue.Queue()
        self._dispatcher = Dispatcher("tf-ecrec-zk-membership-events")
        self._children_watch: ChildrenWatch | None = None
        self._session_lost = False
        self._worker = threading.Thread(target=self._run, name="tf-ecrec-zk-membership",
                                        daemon=True)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> ZooKeeperMembership:
        """Builds a backend from ``HOST:PORT[,HOST:PORT...]/job/path``."""
        hosts, path = parse_zk_url(url)
        return cls(hosts, path, **kwargs)

    @property
    def kazoo_client(self) -> KazooClient:
        """The underlying client (for fault injection in tests)."""
        return self._client

    # --- connection ------------------------------------------------------------

    def _ensure_started(self) -> None:
        with self._lock:
            if self._started:
                return
            if self._closing:
                raise MembershipError("this ZooKeeperMembership is closed")
            try:
                self._zk.start(self._on_state)
            except MembershipError:
                self._closing = True
                raise
            self._started = True
            self._worker.start()

    def _on_state(self, state: str) -> None:
        # A kazoo state listener: must not block or call ZooKeeper.  Hand off.
        self._work.put((_Work.STATE, state))

    # --- MembershipBackend --------------------------------------------------------

    def join(self, member: Member) -> None:
        """See base class."""
        self._ensure_started()
        with self._lock:
            self._member = member
        self._op(self._client.ensure_path, self._members_path)
        self._create_member()
        _LOG.info("Joined %s as %s (%s, generation %d)", self._members_path, member.key,
                  member.address, member.generation)

    def leave(self) -> None:
        """See base class."""
        with self._lock:
            member, self._member = self._member, None
        if member is None or not self._started:
            return
        path = f"{self._members_path}/{member.key}"
        try:
            _, stat = self._op(self._client.get, path)
            if stat.ephemeralOwner == self._zk.session_id:
                self._op(self._client.delete, path, version=stat.version)
        except (NoNodeError, BadVersionError):
            pass

    def members(self) -> dict[str, Member]:
        """See base class."""
        self._ensure_started()
        return self._read_members()

    def watch(self, callback: WatchCallback) -> Callable[[], None]:
        """See base class."""
        self._ensure_started()
        self._op(self._client.ensure_path, self._members_path)
        unsubscribe = self._dispatcher.subscribe(callback, self._read_members())
        self._work.put((_Work.WATCH, ""))  # kazoo's recipe calls ZooKeeper without a deadline.
        return unsubscribe

    def close(self) -> None:
        """See base class.  The session closes, so our ephemeral znodes go at once."""
        with self._lock:
            if self._closed:
                return
            self._closed = self._closing = True
            started, self._started = self._started, False
        if started:
            self._work.put((_Work.STOP, ""))
            if self._worker is not threading.current_thread():
                self._worker.join(timeout=self._zk.op_timeout + 1.0)
            self._zk.stop()
        self._dispatcher.close()

    # --- master directory -----------------------------------------------------

    def publish_master(self, address: str, details: Mapping[str, Any]) -> None:
        """Advertises the master; waits out a dead predecessor's znode.

        Raises:
          MasterError: another master's znode outlived the session timeout,
            so another master is live.
        """
        self._ensure_started()
        self._directory.publish(address, details)

    def master_address(self) -> str | None:
        """Returns the live master's address, or ``None``."""
        self._ensure_started()
        return self._directory.address()

    # --- members ----------------------------------------------------------------

    def _create_member(self) -> None:
        """Creates (or updates) our znode from the latest ``join``; idempotent."""
        with self._member_lock:
            with self._lock:
                member = self._member
            if member is not None:
                self._write_member(member)

    def _write_member(self, member: Member) -> None:
        path = f"{self._members_path}/{member.key}"
        data = json.dumps({"address": member.address, "generation": member.generation,
                           "pid": os.getpid()}).encode()
        for _ in range(10):
            try:
                self._op(self._client.create, path, data, ephemeral=True)
                return
            except NodeExistsError:
                pass
            try:
                raw, stat = self._op(self._client.get, path)
            except NoNodeError:
                continue
            if stat.ephemeralOwner == self._zk.session_id:
                self._op(self._client.set, path, data, version=stat.version)
                return
            held = json.loads(raw.decode()).get("generation", 0)
            if member.generation <= held:
                raise MembershipError(
                    f"{path} is held by session {stat.ephemeralOwner:#x} with generation "
                    f"{held}; ours is {member.generation}; rule: only a newer generation "
                    "replaces a live member")
            try:  # A leftover of an older incarnation: fence by znode version.
                self._op(self._client.delete, path, version=stat.version)
            except (NoNodeError, BadVersionError):
                pass
        raise MembershipError(f"could not create {path}: it kept changing under us")

    def _read_members(self) -> dict[str, Member]:
        try:
            children = self._op(self._client.get_children, self._members_path)
        except NoNodeError:
            return {}
        view = {}
        for key in children:
            try:
                raw, stat = self._op(self._client.get, f"{self._members_path}/{key}",
                                     watch=self._on_data)
            except NoNodeError:
                continue
            try:
                data = json.loads(raw.decode())
                task_type, _, index = key.partition(":")
                view[key] = Member(task_type, int(index), str(data["address"]),
                                   int(data.get("generation", 0)),
                                   incarnation=f"zk-session-{stat.ephemeralOwner:x}")
            except (ValueError, KeyError) as exc:
                _LOG.warning("Ignoring malformed member znode %s/%s: %s", self._members_path,
                             key, exc)
        return view

    def _on_children(self, children: Any) -> None:
        self._work.put((_Work.REFRESH, ""))  # Watch callback: no ZooKeeper calls here.

    def _on_data(self, event: Any) -> None:
        self._work.put((_Work.REFRESH, ""))

    # --- worker thread --------------------------------------------------------

    def _run(self) -> None:
        while True:
            work, state = self._work.get()
            if work is _Work.STOP:
                return
            try:
                if work is _Work.REFRESH:
                    self._refresh()
                elif work is _Work.WATCH:
                    if self._children_watch is None:
                        self._children_watch = ChildrenWatch(self._client, self._members_path,
                                                             func=self._on_children)
                else:
                    self._handle_state(state)
            except (KazooException, ZookeeperError, MembershipError) as exc:
                # Disconnected again: the next CONNECTED queues a refresh.
                _LOG.info("ZooKeeper work deferred (%s: %s)", type(exc).__name__, exc)
            except Exception:  # keep the worker alive; report the bug.
                _LOG.exception("Internal error in the ZooKeeper membership worker")

    def _refresh(self) -> None:
        if self._client.state != KazooState.CONNECTED:
            return
        self._dispatcher.publish_view(self._read_members())

    def _handle_state(self, state: str) -> None:
        if self._closing:
            return
        if state == KazooState.SUSPENDED:
            _LOG.warning("ZooKeeper connection to %s suspended; membership view not trusted",
                         self.hosts)
            self._dispatcher.publish(EventKind.SUSPENDED)
        elif state == KazooState.LOST:
            _LOG.warning("ZooKeeper session to %s lost; our ephemeral znodes are gone",
                         self.hosts)
            self._session_lost = True
            with self._lock:
                joined = self._member is not None
            self._dispatcher.publish(EventKind.SUSPENDED)
            if joined:
                self._dispatcher.publish(EventKind.SELF_LOST)
        elif state == KazooState.CONNECTED:
            with self._lock:
                member = self._member
            rejoined = False
            if member is not None:
                path = f"{self._members_path}/{member.key}"
                if self._session_lost or self._op(self._client.exists, path) is None:
                    self._create_member()
                    rejoined = True
            if self._session_lost:
                self._directory.recreate()
            self._session_lost = False
            if rejoined:
                _LOG.info("Re-created member %s after the session was lost", member)
                self._dispatcher.publish(EventKind.SELF_REJOINED)
            self._dispatcher.publish_view(self._read_members())
            self._dispatcher.publish(EventKind.RESUMED)
