"""Membership in ZooKeeper through kazoo: one ephemeral znode per member.

Layout under the job path ``/<job>``::

    /<job>/members/<type>:<index>   ephemeral; JSON {"address", "generation"}
    /<job>/master                   ephemeral; JSON {"address", "state_dir", ...}
    /<job>/master_state             persistent; where the last master kept state

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
(kazoo forbids blocking calls inside listeners).  Operations go through a
bounded :class:`kazoo.retry.KazooRetry` and end in
:class:`~tf_ecrec.errors.MembershipTimeout` at their deadline.  The initial
connect waits at most ``connect_timeout``.

The ``generation`` a member carries (the master's generation of its
registration) is the fencing token between incarnations of one slot: a
newer incarnation replaces a leftover znode of an older one (checked by
znode version); an older one is refused.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import threading
import time
from typing import Any, Callable, Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import (BadVersionError, ConnectionClosedError, ConnectionLoss,
                              KazooException, NodeExistsError, NoNodeError, SessionExpiredError,
                              ZookeeperError)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState
from kazoo.recipe.watchers import ChildrenWatch
from kazoo.retry import KazooRetry, RetryFailedError

from tf_ecrec.errors import ConfigError, MasterError, MembershipError, MembershipTimeout
from tf_ecrec.membership.base import (Dispatcher, EventKind, Member, MembershipBackend,
                                      WatchCallback)

_LOG = logging.getLogger(__name__)

_REFRESH = "refresh"
_WATCH = "watch"
_STOP = "stop"


def parse_zk_url(url: str) -> tuple[str, str]:
    """Splits ``"h1:2181,h2:2181/jobs/ctr"`` into hosts and the job path.

    Raises:
      ConfigError: no hosts or no job path below the root.
    """
    hosts, sep, path = url.partition("/")
    path = "/" + path.strip("/")
    if not hosts or not sep or path == "/":
        raise ConfigError(f"ZooKeeper address {url!r}; rule: HOST:PORT[,HOST:PORT...]/job/path "
                          "with a job path below the root")
    return hosts, path


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
        self._connect_timeout = connect_timeout
        self._op_timeout = op_timeout
        self._session_timeout = session_timeout
        # Retries connection loss and session expiry (kazoo then opens a new
        # session) until the deadline.
        self._retry = KazooRetry(max_tries=40, delay=0.05, backoff=2, max_delay=0.5,
                                 deadline=op_timeout)
        # Reconnects go on for the life of the process (a ZooKeeper restart must
        # not end membership) but never wait more than 1 s between attempts.
        self._client = KazooClient(
            hosts=hosts, timeout=session_timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0),
            command_retry=self._retry)
        self._lock = threading.Lock()
        self._member_lock = threading.Lock()  # Serializes writes of our member znode.
        self._started = False
        self._closing = False  # No new work: closing, or the first connect failed.
        self._closed = False
        self._member: Member | None = None
        self._master: dict[str, Any] | None = None
        self._work: "queue.Queue[Any]" = queue.Queue()
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
                self._client.start(timeout=self._connect_timeout)
            except KazooTimeoutError as exc:
                self._client.stop()
                self._client.close()
                self._closing = True
                raise MembershipTimeout(
                    f"ZooKeeper at {self.hosts} not reachable within "
                    f"{self._connect_timeout:g}s. See inner exception for details.") from exc
            self._client.add_listener(self._on_state)
            self._started = True
            self._worker.start()

    def _on_state(self, state: str) -> None:
        # A kazoo state listener: must not block or call ZooKeeper.  Hand off.
        self._work.put(("state", state))

    def _op(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Runs one ZooKeeper operation under the bounded retry and deadline.

        ``func`` is a synchronous kazoo method; its ``_async`` twin is called
        and awaited with the time left, because kazoo's synchronous calls
        wait without limit while the connection is down.
        ``NoNodeError``, ``NodeExistsError`` and ``BadVersionError`` reach the
        caller; everything else from kazoo is wrapped.
        """
        what = f"{func.__name__} {args[0] if args else ''}"
        call_async = getattr(self._client, f"{func.__name__}_async")
        deadline = time.monotonic() + self._op_timeout

        def attempt() -> Any:
            left = deadline - time.monotonic()
            if left <= 0:
                raise KazooTimeoutError(f"deadline of {self._op_timeout:g}s passed")
            return call_async(*args, **kwargs).get(timeout=left)

        try:
            return self._retry.copy()(attempt)
        except (NoNodeError, NodeExistsError, BadVersionError):
            raise
        except (RetryFailedError, KazooTimeoutError, ConnectionLoss, SessionExpiredError,
                ConnectionClosedError) as exc:
            raise MembershipTimeout(
                f"ZooKeeper at {self.hosts} did not complete {what} within "
                f"{self._op_timeout:g}s. See inner exception for details.") from exc
        except KazooException as exc:
            raise MembershipError(f"ZooKeeper at {self.hosts} refused {what}: "
                                  f"{type(exc).__name__}: {exc}") from exc

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
            if stat.ephemeralOwner == self._client.client_id[0]:
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
        self._work.put(_WATCH)  # kazoo's recipe calls ZooKeeper without a deadline.
        return unsubscribe

    def close(self) -> None:
        """See base class.  The session closes, so our ephemeral znodes go at once."""
        with self._lock:
            if self._closed:
                return
            self._closed = self._closing = True
            started, self._started = self._started, False
        if started:
            self._work.put(_STOP)
            if self._worker is not threading.current_thread():
                self._worker.join(timeout=self._op_timeout + 1.0)
            try:
                self._client.stop()
            finally:
                self._client.close()
        self._dispatcher.close()

    # --- master directory -----------------------------------------------------

    def publish_master(self, address: str, details: Mapping[str, Any]) -> None:
        """Advertises the master; waits out a dead predecessor's znode.

        Raises:
          MasterError: another master's znode outlived the session timeout,
            so another master is live.
        """
        self._ensure_started()
        info = dict(details, address=address, host=socket.gethostname())
        with self._lock:
            self._master = info
        self._op(self._client.ensure_path, self.job_path)
        self._create_master(info)
        self._op(self._client.ensure_path, f"{self.job_path}/master_state")
        self._op(self._client.set, f"{self.job_path}/master_state",
                 json.dumps({k: info[k] for k in info if k != "pid"}).encode())
        _LOG.info("Published master %s at %s/master", address, self.job_path)

    def master_address(self) -> str | None:
        """Returns the live master's address, or ``None``."""
        self._ensure_started()
        try:
            data, _ = self._op(self._client.get, f"{self.job_path}/master")
        except NoNodeError:
            return None
        return json.loads(data.decode()).get("address")

    def _create_master(self, info: dict[str, Any]) -> None:
        path = f"{self.job_path}/master"
        data = json.dumps(info).encode()
        gone = threading.Event()
        wait = self._session_timeout * 1.5 + 1.0
        for _ in range(10):
            try:
                self._op(self._client.create, path, data, ephemeral=True)
                return
            except NodeExistsError:
                pass
            try:
                holder, stat = self._op(self._client.get, path)
            except NoNodeError:
                continue
            if stat.ephemeralOwner == self._client.client_id[0]:
                self._op(self._client.set, path, data)
                return
            gone.clear()
            exists = self._op(self._client.exists, path, watch=lambda event: gone.set())
            if exists is None:
                continue
            _LOG.info("Another master's znode %s exists; waiting up to %.0fs for its session "
                      "to end", path, wait)
            if not gone.wait(wait):
                raise MasterError(
                    f"another master is live: {path} = {holder!r} outlived {wait:.0f}s; "
                    "rule: one master per job")
        raise MasterError(f"could not create {path}: masters kept replacing each other")

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
            if stat.ephemeralOwner == self._client.client_id[0]:
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
        self._work.put(_REFRESH)  # Watch callback: no ZooKeeper calls here.

    def _on_data(self, event: Any) -> None:
        self._work.put(_REFRESH)

    # --- worker thread --------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item == _STOP:
                return
            try:
                if item == _REFRESH:
                    self._refresh()
                elif item == _WATCH:
                    if self._children_watch is None:
                        self._children_watch = ChildrenWatch(self._client, self._members_path,
                                                             func=self._on_children)
                else:
                    self._handle_state(item[1])
            except (KazooException, ZookeeperError, MembershipError) as exc:
                # Disconnected again: the next CONNECTED queues a refresh.
                _LOG.info("ZooKeeper work deferred (%s: %s)", type(exc).__name__, exc)
            except Exception:  # noqa: BLE001 - keep the worker alive; report the bug.
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
                member, master = self._member, self._master
            rejoined = False
            if member is not None:
                path = f"{self._members_path}/{member.key}"
                if self._session_lost or self._op(self._client.exists, path) is None:
                    self._create_member()
                    rejoined = True
            if master is not None and self._session_lost:
                self._create_master(master)
            self._session_lost = False
            if rejoined:
                _LOG.info("Re-created member %s after the session was lost", member)
                self._dispatcher.publish(EventKind.SELF_REJOINED)
            self._dispatcher.publish_view(self._read_members())
            self._dispatcher.publish(EventKind.RESUMED)
