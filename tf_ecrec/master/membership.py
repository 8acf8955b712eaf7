"""The embedded membership backend: membership kept by the job master itself.

Heartbeats go in, cluster versions come out.  This is the backend of
:mod:`tf_ecrec.membership.base` that talks to the gRPC master, so it lives on
the master's side (the membership package never imports the master).

The master is the authority: a task that has not heartbeated for the
master's ``heartbeat_timeout`` is declared LOST there (its shards re-queued,
the cluster version bumped).  This backend runs one background thread per
process that

* heartbeats, when this process has joined, every ``heartbeat_interval``;
* reads the cluster whenever the version in the heartbeat reply changed
  (or, for a process that only watches, polls it every interval);
* turns what it sees into events::

      heartbeat ok, version changed  -> CHANGED (diff of ALIVE tasks)
      master unreachable             -> SUSPENDED (once), RESUMED when back
      MembershipLost / stale reply   -> SELF_LOST, then register again
                                        (new generation) -> SELF_REJOINED;
                                        refused (another process replaced this
                                        one) -> no more heartbeats

Nothing here blocks longer than the client's per-call deadline.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from tf_ecrec.base.retry import Retry
from tf_ecrec.errors import MasterUnavailable, MembershipLost, MembershipTimeout, StaleGenerationError
from tf_ecrec.master.client import MasterClient
from tf_ecrec.master.replies import Cluster
from tf_ecrec.master.state.tasks import TaskStatus
from tf_ecrec.membership.base import Dispatcher, EventKind, Member, MembershipBackend, WatchCallback

_LOG = logging.getLogger(__name__)


def _members_of(cluster: Cluster) -> dict[str, Member]:
    return {t.task_id: Member(t.task_type, t.task_index, t.address, t.generation,
                              incarnation=f"generation-{t.generation}")
            for t in cluster.tasks if t.status == TaskStatus.ALIVE}


class EmbeddedMembership(MembershipBackend):
    """Membership of one process, kept by heartbeats to the job master.

    Args:
      master_address: ``host:port`` of the master.
      token: The job token, if any.
      heartbeat_interval: Seconds between heartbeats (and cluster polls when
        only watching); default what the master asks for at ``join``, else 1 s.
      timeout: Deadline, seconds, of every call made on the caller's thread
        (``join``, ``leave``, ``members``).
    """

    def __init__(self, master_address: str, *, token: str | None = None,
                 heartbeat_interval: float | None = None, timeout: float = 5.0) -> None:
        if heartbeat_interval is not None and heartbeat_interval <= 0:
            raise ValueError(f"heartbeat_interval={heartbeat_interval}; rule: > 0")
        self._address = master_address
        self._token = token
        self._interval = heartbeat_interval
        self._timeout = timeout
        self._retry = Retry(max_tries=20, delay=0.05, max_delay=0.5, deadline=timeout)
        self._observer = MasterClient(master_address, None, token=token,
                                      timeout=min(timeout, 2.0), retry=self._retry)
        self._client: MasterClient | None = None
        self._member: Member | None = None
        self._lock = threading.Lock()
        self._dispatcher = Dispatcher("tf-ecrec-embedded-membership-events")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._suspended = False
        self._version = -1

    # --- MembershipBackend --------------------------------------------------------

    def join(self, member: Member) -> None:
        """See base class."""
        with self._lock:
            if self._client is None or (self._client.task_type, self._client.task_index) != (
                    member.task_type, member.task_index):
                if self._client is not None:
                    self._client.close()
                self._client = MasterClient(self._address, member.task_type, member.task_index,
                                            token=self._token, timeout=min(self._timeout, 2.0),
                                            retry=self._retry)
            client = self._client
        try:
            client.register(member.address)
        except MasterUnavailable as exc:
            raise MembershipTimeout(
                f"could not join {member.key} at master {self._address} within "
                f"{self._timeout:g}s. See inner exception for details.") from exc
        with self._lock:
            self._member = Member(member.task_type, member.task_index, member.address,
                                  client.generation)
        _LOG.info("Joined as %s generation %d through master %s", member.key,
                  client.generation, self._address)
        self._ensure_thread()

    def leave(self) -> None:
        """See base class."""
        with self._lock:
            client, self._member = self._client, None
        if client is None or not client.generation:
            return
        try:
            client.deregister()
        except MembershipLost:
            pass  # Already gone.
        except MasterUnavailable as exc:
            raise MembershipTimeout(f"could not leave through master {self._address} within "
                                    f"{self._timeout:g}s") from exc

    def members(self) -> dict[str, Member]:
        """See base class."""
        try:
            return _members_of(self._observer.get_cluster())
        except MasterUnavailable as exc:
            raise MembershipTimeout(f"could not read members from master {self._address} "
                                    f"within {self._timeout:g}s") from exc

    def watch(self, callback: WatchCallback) -> Callable[[], None]:
        """See base class."""
        unsubscribe = self._dispatcher.subscribe(callback, self.members())
        self._ensure_thread()
        return unsubscribe

    def close(self) -> None:
        """See base class.  Heartbeats stop; the master declares the task lost later."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self._timeout + 1.0)
        self._dispatcher.close()
        with self._lock:
            if self._client is not None:
                self._client.close()
        self._observer.close()

    @property
    def client(self) -> MasterClient | None:
        """The task's client after ``join``; share it for data calls and hooks.

        Its generation follows re-registrations, so leases of a lost
        generation are refused by the master (``StaleGenerationError``).
        """
        with self._lock:
            return self._client

    @property
    def member(self) -> Member | None:
        """This process's member with its current generation, if joined."""
        with self._lock:
            return self._member

    # --- background thread ----------------------------------------------------

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="tf-ecrec-embedded-membership")
                self._thread.start()

    def _interval_s(self) -> float:
        if self._interval is not None:
            return self._interval
        with self._lock:
            asked = self._client.heartbeat_interval if self._client else 0.0
        return asked or 1.0

    def _call_timeout(self) -> float:
        # Generous against a busy master; a slow call only delays the next tick.
        return min(max(2 * self._interval_s(), 1.0), self._timeout)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s()):
            try:
                self._tick()
            except Exception:  # the thread must outlive bugs; report them.
                _LOG.exception("Internal error in the membership thread")

    def _tick(self) -> None:
        once = Retry(max_tries=1, deadline=None)
        with self._lock:
            member, client = self._member, self._client
        try:
            version = -2
            if member is not None and client is not None:
                try:
                    version, _ = client.heartbeat(timeout=self._call_timeout(), retry=once)
                except (MembershipLost, StaleGenerationError) as exc:
                    self._rejoin(member, client, exc)
            if version != self._version or member is None:
                cluster = self._observer.get_cluster(timeout=self._call_timeout(), retry=once)
                self._version = cluster.version
                self._set_suspended(False)
                self._dispatcher.publish_view(_members_of(cluster))
            else:
                self._set_suspended(False)
        except MasterUnavailable as exc:
            if not self._suspended:
                _LOG.warning("Master %s unreachable (%s); membership view suspended",
                             self._address, exc)
            self._set_suspended(True)

    def _set_suspended(self, suspended: bool) -> None:
        if suspended != self._suspended:
            self._suspended = suspended
            self._dispatcher.publish(EventKind.SUSPENDED if suspended else EventKind.RESUMED)

    def _rejoin(self, member: Member, client: MasterClient, cause: Exception) -> None:
        _LOG.warning("Membership of %s generation %d lost (%s); registering again",
                     member.key, member.generation, cause)
        self._dispatcher.publish(EventKind.SELF_LOST)
        try:
            client.register(member.address)  # MasterUnavailable: retried next tick.
        except StaleGenerationError as exc:  # another process of the task replaced this one: it stays lost
            _LOG.warning("%s: %s; this process stops heartbeating", member.key, exc)
            with self._lock:
                self._member = None
            return
        with self._lock:
            if self._member is None:  # left meanwhile
                return
            self._member = Member(member.task_type, member.task_index, member.address,
                                  client.generation)
        self._version = -1
        self._dispatcher.publish(EventKind.SELF_REJOINED)
