"""Starting and stopping the job master, embedded or standalone.

Embedded (the launcher's default)::

    handle = start_master(state_dir="/tmp/job/master")   # 127.0.0.1, free port
    ...  # tasks use MasterClient(handle.address, ...)
    handle.stop(grace=2.0)

Standalone (``tf-ecrec master`` calls :func:`main`)::

    python -m tf_ecrec.master.server --port 50051 --state-dir /var/lib/job \\
        [--host 0.0.0.0] [--zk zk1:2181,zk2:2181/jobs/ctr] [--token-file token]

It prints ``tf-ecrec master listening on HOST:PORT`` once serving, and stops
gracefully on SIGTERM or SIGINT.  Restarted with the same ``--state-dir`` it
resumes the job where the last snapshot left it.

Liveness: without ``membership`` the master declares a task lost when it has
not heartbeated for ``heartbeat_timeout`` seconds.  With a
:class:`~tf_ecrec.membership.base.MembershipBackend` (``--zk``) it watches the
members instead; a ZooKeeper backend also advertises the master's address
and state dir under the job path, and refuses to start while another master
of the job is live.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import hmac
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from tf_ecrec.errors import AuthenticationError, ConfigError, EcRecError, MasterError
from tf_ecrec.master.proto import master_pb2_grpc as pb_grpc
from tf_ecrec.master.servicer import MasterServicer
from tf_ecrec.master.state.master_state import MasterState
from tf_ecrec.master.state.snapshot import SnapshotStore
from tf_ecrec.master.state.tasks import Liveness
from tf_ecrec.master.wire import ERROR_KEY, TOKEN_KEY
from tf_ecrec.membership.base import EventKind, MasterDirectory, MembershipBackend, MembershipEvent

_LOG = logging.getLogger(__name__)


class _TokenInterceptor(grpc.ServerInterceptor):
    """Refuses calls whose ``x-tf-ecrec-token`` metadata is not the job token."""

    def __init__(self, token: str) -> None:
        self._token = token.encode("utf-8")

        def deny(request: Any, context: grpc.ServicerContext) -> None:
            context.set_trailing_metadata(((ERROR_KEY, AuthenticationError.__name__),))
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          f"metadata {TOKEN_KEY!r} is missing or does not match the job "
                          "token; rule: every task uses the master's --token-file")
        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: Any) -> Any:
        for key, value in handler_call_details.invocation_metadata or ():
            if key == TOKEN_KEY:
                given = value.encode("utf-8") if isinstance(value, str) else value
                if hmac.compare_digest(given, self._token):
                    return continuation(handler_call_details)
        return self._deny


@dataclasses.dataclass
class MasterHandle:
    """A running master.

    Attributes:
      address: ``host:port`` the master serves on.
      state: The master's state, for the launcher's report and for tests.
    """

    address: str
    state: MasterState
    _server: grpc.Server
    _stop_event: threading.Event
    _threads: list[threading.Thread]
    _on_stop: list[Callable[[], None]]
    _stopped: threading.Event = dataclasses.field(default_factory=threading.Event)
    _stop_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    def stop(self, grace: float | None = 1.0) -> None:
        """Stops serving: new calls fail, calls in progress get ``grace`` seconds.

        Barrier waiters are released with UNAVAILABLE (their clients retry
        against a successor).  Idempotent; a second caller waits for the first.
        """
        with self._stop_lock:
            first = not self._stop_event.is_set()
            self._stop_event.set()
        if not first:
            self._stopped.wait()
            return
        stopped = self._server.stop(grace)
        self.state.interrupt_waiters()
        stopped.wait()
        for thread in self._threads:
            thread.join(timeout=5.0)
        for action in self._on_stop:
            try:
                action()
            except Exception:  # shutting down: log and go on.
                _LOG.exception("Error while stopping the master")
        self.state.close()
        self._stopped.set()
        _LOG.info("Master at %s stopped", self.address)

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until :meth:`stop` was called or ``timeout``; True if stopped."""
        return self._stop_event.wait(timeout)

    def __enter__(self) -> MasterHandle:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


def _host_port(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def start_master(host: str = "127.0.0.1", port: int = 0, state_dir: str | None = None,
                 token: str | None = None, membership: MembershipBackend | None = None,
                 *, heartbeat_timeout: float = 10.0, heartbeat_interval: float | None = None,
                 max_workers: int = 32, fsync: bool = True) -> MasterHandle:
    """Starts a master and returns once it serves.

    Args:
      host: Interface to bind; loopback unless told otherwise.
      port: Port to bind; 0 picks a free one (see ``MasterHandle.address``).
      state_dir: Directory for snapshots; ``None`` keeps state in memory (a
        restart then loses the job's progress).
      token: Shared secret every call must carry; ``None`` disables the check.
      membership: Liveness source; ``None`` uses heartbeats to this master.
      heartbeat_timeout: Seconds of silence (or absence from ``membership``)
        after which a task is declared lost.
      heartbeat_interval: Interval the master asks tasks to heartbeat at;
        default a quarter of the timeout.
      max_workers: Server threads; each waiting barrier call holds one.
      fsync: Fsync every snapshot (survives power loss, not only SIGKILL).

    Raises:
      MasterError: the port cannot be bound, the state dir is locked by
        another master or unreadable, or another master of the job is live.
      ConfigError: an argument breaks its rule.
    """
    if heartbeat_timeout <= 0:
        raise ConfigError(f"heartbeat_timeout={heartbeat_timeout}; rule: > 0")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
        raise ConfigError(f"master port {port!r}; rule: 0 (any free port) or 1..65535; "
                          "source: start_master(port=) or --port")
    if token is not None and not token:
        raise ConfigError("the master token is empty; rule: a non-empty string or None")
    interval = heartbeat_interval if heartbeat_interval is not None else heartbeat_timeout / 4
    store = SnapshotStore(state_dir, fsync=fsync) if state_dir else None
    try:
        state = MasterState(store, heartbeat_timeout=heartbeat_timeout,
                            liveness=Liveness.HEARTBEAT if membership is None else Liveness.EXTERNAL)
    except BaseException:
        if store is not None:
            store.close()
        raise
    interceptors = [_TokenInterceptor(token)] if token else []
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(
        max_workers=max_workers, thread_name_prefix="tf-ecrec-master"),
        interceptors=interceptors, options=[("grpc.so_reuseport", 0)])
    pb_grpc.add_MasterServicer_to_server(MasterServicer(state, interval), server)
    try:
        bound = server.add_insecure_port(_host_port(host, port))
    except RuntimeError as exc:
        bound = 0
        cause: BaseException | None = exc
    else:
        cause = None
    if not bound:
        state.close()
        raise MasterError(f"master could not bind {_host_port(host, port)}; rule: a free "
                          "port on a local interface") from cause
    address = _host_port(host, bound)
    stop_event = threading.Event()
    handle = MasterHandle(address, state, server, stop_event, [], [])
    server.start()
    reaper = threading.Thread(target=_reap, args=(state, stop_event),
                              name="tf-ecrec-master-reaper", daemon=True)
    reaper.start()
    handle._threads.append(reaper)
    if membership is not None:
        try:
            _attach_membership(handle, membership, state_dir)
        except BaseException:
            handle.stop(grace=0)
            raise
    _LOG.info("Master serving on %s (state dir %s, liveness %s, token %s)", address,
              state_dir or "none: in memory", state.liveness.value, "on" if token else "off")
    return handle


def _reap(state: MasterState, stop_event: threading.Event) -> None:
    period = min(state.heartbeat_timeout / 4, 1.0)
    while not stop_event.wait(period):
        try:
            state.expire_silent()
        except Exception:  # keep reaping; a bug is logged.
            _LOG.exception("Internal error while expiring silent tasks")


def _attach_membership(handle: MasterHandle, membership: MembershipBackend,
                       state_dir: str | None) -> None:
    state = handle.state

    def on_event(event: MembershipEvent) -> None:
        if event.kind is EventKind.SUSPENDED:
            state.observe_members((), suspended=True)
            return
        if event.kind not in (EventKind.CHANGED, EventKind.RESUMED):
            return
        for task_id, member in event.departed_members.items():
            try:  # Only the generation whose membership ended is lost.
                state.declare_lost(task_id, f"its membership ended ({member.incarnation})",
                                   generation=member.generation)
            except EcRecError as exc:
                _LOG.info("Ignoring the departure of %s: %s", task_id, exc)
        state.observe_members(event.members.keys())

    if isinstance(membership, MasterDirectory):
        membership.publish_master(handle.address, {"state_dir": state_dir or "",
                                                   "pid": os.getpid()})
    unsubscribe = membership.watch(on_event)
    handle._on_stop.append(unsubscribe)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``tf-ecrec master``'s flags (tests check the docs' command lines against it)."""
    parser = argparse.ArgumentParser(prog="tf-ecrec master", description=(
        "Run the tf_ecrec job master: membership, dynamic data sharding, barriers."))
    parser.add_argument("--port", type=int, required=True, help="port to serve on; 0: any")
    parser.add_argument("--host", default="127.0.0.1", help="interface (default loopback)")
    parser.add_argument("--state-dir", help="directory for the persisted job state")
    parser.add_argument("--zk", help="ZooKeeper HOST:PORT[,HOST:PORT...]/job/path for "
                        "membership and master discovery")
    parser.add_argument("--token-file", help="file holding the shared job token")
    parser.add_argument("--heartbeat-timeout", type=float, default=10.0,
                        help="seconds of silence before a task is declared lost")
    parser.add_argument("--grace", type=float, default=5.0,
                        help="seconds calls in progress get on shutdown")
    parser.add_argument("--log-level", default="INFO")
    return parser


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def read_token(path: str, flag: str = "--token-file") -> str:
    """The shared secret in the token file `path` (given by `flag`).

    Raises:
      ConfigError: the file cannot be read, or is empty.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            token = handle.read().strip()
    except OSError as exc:
        raise ConfigError(f"{flag} {path!r} cannot be read ({exc}); source: {flag}") from exc
    if not token:
        raise ConfigError(f"{flag} {path!r} is empty; rule: a non-empty token; source: {flag}")
    return token


def main(argv: Sequence[str] | None = None) -> int:
    """Runs a standalone master until SIGTERM/SIGINT; returns the exit code."""
    args = _parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    membership: MembershipBackend | None = None
    try:
        token = read_token(args.token_file) if args.token_file else None
        if args.zk:
            from tf_ecrec.membership.zookeeper import ZooKeeperMembership  # kazoo is optional.
            membership = ZooKeeperMembership.from_url(args.zk)
        handle = start_master(args.host, args.port, args.state_dir, token, membership,
                              heartbeat_timeout=args.heartbeat_timeout)
    except EcRecError as exc:
        print(f"tf-ecrec master: {exc}", file=sys.stderr)
        if membership is not None:
            membership.close()
        return 2
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: threading.Thread(
            target=handle.stop, args=(args.grace,), daemon=True).start())
    print(f"tf-ecrec master listening on {handle.address}", flush=True)
    handle.wait()
    # stop() runs in a helper thread; wait for the state to close before exit.
    handle.stop(args.grace)
    if membership is not None:
        membership.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
