"""Stopping the session cleanly when the parameter servers change: the job master's and membership's views.

Two hooks, one per way of learning about PS changes off the training
thread; both act on them only between steps (the lifecycle is
`tf_ecrec.session.migration.MigrationHook`'s)::

    __init__     validate; remember what the session was built for
    begin        start the poller thread (PsMigrationHook) or subscribe to
                 the watch (MembershipMigrationHook)
    after_run    if a change was seen: request_stop() once, record
                 ``migration`` = (old, new)
    end          stop the poller (or unsubscribe)

After ``Estimator.train`` returns, a non-None ``migration`` says the hook
stopped the session for a PS change: rebuild TF_CONFIG, the Estimator and
the session for the new cluster.  The hook that polls a cluster source (and
follows a move in place) is `tf_ecrec.session.migration.ClusterSourceMigrationHook`,
the one the failover loop (`tf_ecrec.session.failover`) runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tf_ecrec.base.retry import Retry
from tf_ecrec.errors import ConfigError, EcRecError
from tf_ecrec.master.client import MasterClient
from tf_ecrec.membership.base import EventKind, MembershipBackend, MembershipEvent
from tf_ecrec.session.migration import MigrationHook, PollingMigrationHook

_LOG = logging.getLogger(__name__)


class PsMigrationHook(PollingMigrationHook):
    """Polls the job master's ``ps_version``; requests a stop when it changes.

    Args:
      client: A :class:`MasterClient` to poll (an observer client is enough).
      expected_version: The ``ps_version`` the session's cluster was built
        from: a change between building and the first poll is then not
        missed.  Without it the first value the hook sees is the baseline.
      poll_secs: Seconds between polls.
      warn_every_secs: Minimum seconds between "master unreachable" warnings.
    """

    def __init__(self, client: MasterClient, *, expected_version: int | None = None, poll_secs: float = 1.0,
                 warn_every_secs: float = 30.0) -> None:
        if client is None:
            raise ConfigError("PsMigrationHook needs client= (a MasterClient to poll)")
        super().__init__(poll_secs=poll_secs, warn_every_secs=warn_every_secs)
        self._client = client
        self._baseline = expected_version

    def _run_poller(self) -> None:
        once = Retry(max_tries=1, deadline=None)
        while not self._stop.is_set():
            try:
                self._saw(self._client.get_cluster(timeout=self._poll_secs, retry=once).ps_version)
            except EcRecError as exc:
                self._unreachable.warning("PS version not polled: %s", exc)
            if self._changed.is_set():
                return
            self._stop.wait(self._poll_secs)

    def _saw(self, ps_version: int) -> None:
        with self._lock:
            if self._baseline is None:
                self._baseline = ps_version
                return
            if ps_version == self._baseline:
                return
        self._changed_to(ps_version)


class MembershipMigrationHook(MigrationHook):
    """Watches a membership backend; requests a stop when a PS member's address or incarnation changes.

    A PS at the same address but a new incarnation restarted: its state is
    gone, so that is a change too.  The first view seen is the baseline.

    Args:
      membership: A :class:`MembershipBackend` to watch.
    """

    def __init__(self, membership: MembershipBackend) -> None:
        if membership is None:
            raise ConfigError("MembershipMigrationHook needs membership= (a MembershipBackend to watch)")
        super().__init__()
        self._membership = membership
        self._ps_addresses: dict[str, tuple[str, str]] | None = None
        self._unsubscribe: Callable[[], None] | None = None

    def _start_watching(self) -> None:
        self._unsubscribe = self._membership.watch(self._on_event)

    def _stop_watching(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def _on_event(self, event: MembershipEvent) -> None:
        if event.kind is not EventKind.CHANGED:
            return
        ps = {k: (m.address, m.incarnation) for k, m in event.members.items() if m.task_type == "ps"}
        with self._lock:
            if self._ps_addresses is None:
                self._ps_addresses = ps
                return
            if ps == self._ps_addresses:
                return
            _LOG.info("PS members changed from %s to %s", self._ps_addresses, ps)
        self._changed_to()
