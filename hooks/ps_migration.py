"""Stopping the session cleanly when the parameter servers change.

:class:`PsMigrationHook` learns about PS changes off the training thread,
by polling the master's ``ps_version``, by polling a cluster source
(`tf_ecrec.failover.ClusterSource`) for the PS addresses, or from a
membership watch, and acts on them only between steps::

    __init__     validate; remember the PS version the session was built for
    begin        start the poller thread (or subscribe to the watch)
    after_create_session  remember which retarget the session was created after
    before_run   nothing to fetch
    after_run    if a change was seen (or this session predates a retarget):
                 request_stop() once, record old/new
    end          stop the poller (or unsubscribe)

The failover loop then calls :meth:`PsMigrationHook.raise_if_migrated`,
which raises :class:`~tf_ecrec.errors.ParameterServerMigrated`, and rebuilds
TF_CONFIG, the Estimator and the session for the new cluster.

Pass ``expected_version``, the ``ps_version`` the session's cluster was
built from: a change between building and the first poll is then not
missed.  Without it the first value the hook sees is the baseline.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import tensorflow as tf

from tf_ecrec.errors import ConfigError, EcRecError, ParameterServerMigrated
from tf_ecrec.master.client import MasterClient
from tf_ecrec.master.rate_limited_log import RateLimitedLogger
from tf_ecrec.membership.base import EventKind, MembershipBackend, MembershipEvent
from tf_ecrec.retry import Retry

_LOG = logging.getLogger(__name__)


class PsMigrationHook(tf.compat.v1.train.SessionRunHook):
    """Requests a stop when the PS set changes.

    Args:
      client: A :class:`MasterClient` to poll (``ps_version``); or
      membership: a :class:`MembershipBackend` to watch (the PS members'
        addresses); or
      source: a `tf_ecrec.failover.ClusterSource` to poll: a change is
        every PS task alive at addresses other than ``expected_ps`` (a PS
        that is down is not a change yet; one back at its old address is
        none).  Exactly one of the three.
      expected_version: The ``ps_version`` the session was built for
        (client mode only).
      expected_ps: The PS addresses the session was built for (source mode,
        required).
      poll_secs: Seconds between polls (client mode).
      warn_every_secs: Minimum seconds between "master unreachable" warnings.
      retarget: source mode only: ``retarget(addresses)`` points the sessions
        TensorFlow creates from now on at the PS `addresses` (the failover
        loop writes them into the live session ConfigProto).  With it a move
        is followed in place: the poller retargets and keeps watching, and only
        a session created before the move is stopped (one created after it
        already reaches the new addresses).  The source must publish a new
        address only once the task at the old one is gone (a replacement
        after a failure, as the launcher and a Kubernetes controller do).
    """

    def __init__(self, client: Optional[MasterClient] = None, *,
                 membership: Optional[MembershipBackend] = None,
                 source: Any = None, expected_ps: Optional[Sequence[str]] = None,
                 expected_version: Optional[int] = None, poll_secs: float = 1.0,
                 warn_every_secs: float = 30.0,
                 retarget: Optional[Callable[[Sequence[str]], None]] = None) -> None:
        if sum(x is not None for x in (client, membership, source)) != 1:
            raise ConfigError("PsMigrationHook needs exactly one of client=, membership= or source=")
        if (source is None) != (expected_ps is None):
            raise ConfigError("PsMigrationHook source= needs expected_ps= (the PS addresses the session uses)")
        if poll_secs <= 0:
            raise ConfigError(f"PsMigrationHook poll_secs={poll_secs}; rule: > 0")
        if membership is not None and expected_version is not None:
            raise ConfigError("PsMigrationHook expected_version applies to client= only")
        if retarget is not None and source is None:
            raise ConfigError("PsMigrationHook retarget= applies to source= only")
        self._client = client
        self._membership = membership
        self._source = source
        self._expected_ps = list(expected_ps) if expected_ps is not None else None
        self._baseline = expected_version
        self._poll_secs = poll_secs
        self._unreachable = RateLimitedLogger(_LOG, warn_every_secs)
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._new: Optional[int] = None
        self._ps_addresses: Optional[Dict[str, Tuple[str, str]]] = None
        self._thread: Optional[threading.Thread] = None
        self._unsubscribe: Optional[Callable[[], None]] = None
        self._stop_requested = False
        self._retarget = retarget
        self._target_gen = 0  # retargets so far
        self._session_gen = 0  # retargets before the current session was created
        self.retargets = 0
        self.migration: Optional[Tuple[int, int]] = None
        self.steps_seen = 0  # steps completed under this hook (the failover loop's progress signal)

    # --- hook contract -----------------------------------------------------------

    def begin(self) -> None:
        self._stop.clear()
        if self._membership is not None:
            self._unsubscribe = self._membership.watch(self._on_event)
        else:
            poll = self._poll_source if self._source is not None else self._poll
            self._thread = threading.Thread(target=poll, daemon=True,
                                            name="tf-ecrec-ps-migration-poller")
            self._thread.start()

    def after_create_session(self, session: Any, coord: Any) -> None:
        with self._lock:
            self._session_gen = self._target_gen

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self.steps_seen += 1
        with self._lock:
            stale = self._session_gen != self._target_gen  # a session of the cluster before a retarget
        if stale and not self._stop_requested:
            self._changed.set()
        if not self._changed.is_set() or self._stop_requested:
            return
        with self._lock:
            old, new = self._baseline, self._new
        self.migration = (-1 if old is None else old, -1 if new is None else new)
        self._stop_requested = True
        _LOG.info("Parameter servers changed (version %s -> %s); stopping the session for "
                  "migration", *self.migration)
        run_context.request_stop()

    def end(self, session: Any) -> None:
        self._stop.set()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._thread is not None:
            self._thread.join(timeout=self._poll_secs + 5.0)
            self._thread = None

    # --- for the failover loop -------------------------------------------------

    def raise_if_migrated(self) -> None:
        """Raises ``ParameterServerMigrated`` if this hook stopped the session."""
        if self.migration is not None:
            old, new = self.migration
            raise ParameterServerMigrated(
                f"the parameter servers changed (ps_version {old} -> {new}); rebuild the "
                "cluster and the session", old_version=old, new_version=new)

    # --- background ---------------------------------------------------------------

    def _poll(self) -> None:
        once = Retry(max_tries=1, deadline=None)
        assert self._client is not None
        while not self._stop.is_set():
            try:
                self._saw(self._client.get_cluster(timeout=self._poll_secs,
                                                   retry=once).ps_version)
            except EcRecError as exc:
                self._unreachable.warning("PS version not polled: %s", exc)
            if self._changed.is_set():
                return
            self._stop.wait(self._poll_secs)

    def _poll_source(self) -> None:
        while not self._stop.is_set():
            try:
                now = self._source.ps_addresses()
            except EcRecError as exc:
                self._unreachable.warning("PS addresses not polled: %s", exc)
            else:
                if all(now) and list(now) != self._expected_ps:
                    _LOG.info("PS tasks moved from %s to %s", self._expected_ps, now)
                    if self._retarget is None or not self._retarget_to(list(now)):
                        self._changed.set()
                        return
            self._stop.wait(self._poll_secs)

    def _retarget_to(self, addresses: list) -> bool:
        """Points new sessions at `addresses`; False if that failed (then the session is stopped)."""
        try:
            assert self._retarget is not None
            self._retarget(addresses)
        except Exception:  # noqa: BLE001 - fall back to stopping the session, which rebuilds everything
            _LOG.exception("retargeting the sessions at %s failed; stopping the session instead", addresses)
            return False
        with self._lock:
            self._expected_ps = addresses
            self._target_gen += 1
            self.retargets += 1
        return True

    def _saw(self, ps_version: int) -> None:
        with self._lock:
            if self._baseline is None:
                self._baseline = ps_version
            elif ps_version != self._baseline:
                self._new = ps_version
                self._changed.set()

    def _on_event(self, event: MembershipEvent) -> None:
        if event.kind is not EventKind.CHANGED:
            return
        # A PS at the same address but a new incarnation restarted: its state is gone.
        ps = {k: (m.address, m.incarnation) for k, m in event.members.items()
              if m.task_type == "ps"}
        with self._lock:
            if self._ps_addresses is None:
                self._ps_addresses = ps
            elif ps != self._ps_addresses:
                _LOG.info("PS members changed from %s to %s", self._ps_addresses, ps)
                self._changed.set()
