"""A ZooKeeper connection with bounded operations, through kazoo.

:class:`ZkConnection` owns one :class:`kazoo.client.KazooClient`.  Its
first connect waits at most ``connect_timeout``; every operation goes
through a bounded :class:`kazoo.retry.KazooRetry` and ends in
:class:`~tf_ecrec.errors.MembershipTimeout` at its deadline (kazoo's own
synchronous calls wait without limit while the connection is down).
Reconnects go on for the life of the process: a ZooKeeper restart must not
end membership.

Call order: construct, :meth:`ZkConnection.start` once (with the state
listener), :meth:`ZkConnection.op` any number of times, :meth:`ZkConnection.stop`.
The recipes built on it (members, master directory) live in
:mod:`tf_ecrec.membership.zookeeper` and :mod:`tf_ecrec.membership.zk_master_directory`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry, RetryFailedError

from tf_ecrec.errors import ConfigError, MembershipError, MembershipTimeout


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


class ZkConnection:
    """One ZooKeeper session (renewed by kazoo after expiry) with bounded operations.

    Args:
      hosts: ZooKeeper connection string, ``"h1:2181,h2:2181"``.
      session_timeout: Seconds the session survives without a connection.
      connect_timeout: Seconds the first connect may take.
      op_timeout: Deadline, seconds, of one operation including retries.
    """

    def __init__(self, hosts: str, *, session_timeout: float, connect_timeout: float,
                 op_timeout: float) -> None:
        self.hosts = hosts
        self.session_timeout = session_timeout
        self.op_timeout = op_timeout
        self._connect_timeout = connect_timeout
        # Retries connection loss and session expiry (kazoo then opens a new
        # session) until the deadline.
        self._retry = KazooRetry(max_tries=40, delay=0.05, backoff=2, max_delay=0.5,
                                 deadline=op_timeout)
        # Reconnects go on for the life of the process (a ZooKeeper restart must
        # not end membership) but never wait more than 1 s between attempts.
        self.client = KazooClient(
            hosts=hosts, timeout=session_timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0),
            command_retry=self._retry)

    def start(self, listener: Callable[[str], None]) -> None:
        """Connects, then adds the kazoo state ``listener``.

        Raises:
          MembershipTimeout: no connection within ``connect_timeout``; the
            client is then stopped and closed.
        """
        try:
            self.client.start(timeout=self._connect_timeout)
        except KazooTimeoutError as exc:
            self.stop()
            raise MembershipTimeout(
                f"ZooKeeper at {self.hosts} not reachable within "
                f"{self._connect_timeout:g}s. See inner exception for details.") from exc
        self.client.add_listener(listener)

    @property
    def session_id(self) -> int:
        """The id of the current session (the owner of our ephemeral znodes)."""
        return self.client.client_id[0]

    def op(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Runs one ZooKeeper operation under the bounded retry and deadline.

        ``func`` is a synchronous kazoo method; its ``_async`` twin is called
        and awaited with the time left, because kazoo's synchronous calls
        wait without limit while the connection is down.
        ``NoNodeError``, ``NodeExistsError`` and ``BadVersionError`` reach the
        caller; everything else from kazoo is wrapped.

        Raises:
          MembershipTimeout: the deadline passed (connection or session lost).
          MembershipError: ZooKeeper refused the operation.
        """
        what = f"{func.__name__} {args[0] if args else ''}"
        call_async = getattr(self.client, f"{func.__name__}_async")
        deadline = time.monotonic() + self.op_timeout

        def attempt() -> Any:
            left = deadline - time.monotonic()
            if left <= 0:
                raise KazooTimeoutError(f"deadline of {self.op_timeout:g}s passed")
            return call_async(*args, **kwargs).get(timeout=left)

        try:
            return self._retry.copy()(attempt)
        except (NoNodeError, NodeExistsError, BadVersionError):
            raise
        except (RetryFailedError, KazooTimeoutError, ConnectionLoss, SessionExpiredError,
                ConnectionClosedError) as exc:
            raise MembershipTimeout(
                f"ZooKeeper at {self.hosts} did not complete {what} within "
                f"{self.op_timeout:g}s. See inner exception for details.") from exc
        except KazooException as exc:
            raise MembershipError(f"ZooKeeper at {self.hosts} refused {what}: "
                                  f"{type(exc).__name__}: {exc}") from exc

    def stop(self) -> None:
        """Ends the session (our ephemeral znodes go at once) and closes the client."""
        try:
            self.client.stop()
        finally:
            self.client.close()
