"""The rebuild of lost PS tasks that runs while training goes on (docs/rebuild.md).

`tf_ecrec.rebuild.rebuilder.Rebuilder.begin_background` does the T0 part (lost
variables allocated, rows pending, survivors preserving) and returns a
`BackgroundRebuild`, whose loops install every pending row.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from tf_ecrec.base.retry import Retry, retry_on
from tf_ecrec.rebuild.stripes import RebuildStats
from tf_ecrec.step import steplog

if TYPE_CHECKING:
    from tf_ecrec.rebuild.rebuilder import Rebuilder

_LOG = logging.getLogger(__name__)

WALKERS = 2  # slices of a background rebuild in flight together (benchmarks/rebuild_speed.py compares)
WANTED_WAIT_MS = 200
"""How long one round of the background rebuild's wanted-rows loop waits for a lookup to ask."""
RETRY = Retry(max_tries=8, delay=0.5, backoff=2.0, max_delay=10.0, deadline=300.0,
              retry_if=retry_on(tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError))
"""How a loop of the background rebuild retries one call that failed with a transient error (a PS slow to
answer, a call cut by the session's operation timeout) before it gives up until the next session."""


def _pairs(feeds: Any) -> Any:
    """(placeholder, value) pairs of a feed dict or of `steplog.FeedPairs`."""
    return feeds.items() if isinstance(feeds, dict) else feeds


class BackgroundRebuild:
    """The rebuild of lost PS tasks that runs while training goes on; `Rebuilder.begin_background` makes one.

    By the time it exists, the lost variables are allocated (zeros), their
    rows pending on their PS, dense copies done, and every survivor preserves
    the T0 words of the rows the rebuild decodes from (see
    ops/cc/kernels/recovery_view.h and docs/rebuild.md).  Two loops then
    install every pending row, each writing only rows still pending, so they
    may race: `install_wanted` decodes the rows waiting lookups ask for
    (blocking up to `WANTED_WAIT_MS` for one to ask), `install_next_slice`
    walks the lost chunks slice by slice.  When the walk is done every row
    is installed; `finish` then ends the survivors' preservation.

    `start` runs both loops on threads (the chief's); the fault-schedule
    harness calls the steps itself, interleaved with trainers' ops.  A
    loop's call that fails with a transient error is retried (`retry`, a
    bounded `Retry`; the same slice, never skipped); only when that gives up
    does the rebuild stop, and the next session re-creation resumes it.
    """

    retry: Retry = RETRY

    def __init__(self, rebuilder: Rebuilder, lost: Iterable[int]) -> None:
        self.lost = sorted(int(p) for p in lost)
        self._rebuilder = rebuilder
        lost_set = set(self.lost)
        self._slices: list[tuple[list[Any], Any]] = []
        self._wanted: list[Any] = []
        wanted_pairs: list[tuple[Any, Any]] = []
        self._row_bytes: dict[Any, int] = {}
        for table in rebuilder.tables:
            targets = [ch for st in table.layout.stripes for ch in st.chunks if ch.ps in lost_set]
            if not targets:
                continue
            present = {st.index: {ch.index_in_stripe for ch in st.chunks if ch.ps not in lost_set} for st in table.layout.stripes}
            feeds = list(_pairs(table.feeds(targets, present)))
            slice_fetch = [table.installs[(ch.stripe, ch.index_in_stripe)][0] for ch in targets]
            wanted_fetch = [table.installs[(ch.stripe, ch.index_in_stripe)][1] for ch in targets if ch.is_data]
            for t in slice_fetch + wanted_fetch:
                self._row_bytes[id(t)] = table.width * 4
            for lo in range(0, table.rows, table.slice_rows):
                self._slices.append((slice_fetch, steplog.feeds(*feeds, (table.bg_lo, lo))))
            self._wanted.extend(wanted_fetch)
            wanted_pairs.extend(feeds)
        self._wanted_pairs = wanted_pairs
        self._next = 0
        self._lock = threading.Lock()
        self.stats = RebuildStats()
        self.rows_installed = 0
        self.rows_installed_on_demand = 0
        self.started = time.time()
        self.seconds: float | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._finished = threading.Event()

    # ---- steps ---------------------------------------------------------------------------

    @property
    def walked(self) -> bool:
        """Whether every slice was installed (then no row is pending)."""
        with self._lock:
            return self._next >= len(self._slices)

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    @property
    def stopped(self) -> bool:
        """Stopped before the end (`stop`, or a loop's call that failed past its retries)."""
        return self._stop.is_set() and not self.finished

    def install_wanted(self, sess: tf.compat.v1.Session, wait_ms: int | None = None) -> int:
        """One round of the wanted rows: waits up to `wait_ms` for a lookup to ask, installs what is asked."""
        if not self._wanted:
            return 0
        pairs = list(self._wanted_pairs)
        if wait_ms is not None:
            pairs.append((self._rebuilder.wait_ms, int(wait_ms)))
        counts = sess.run(self._wanted, steplog.feeds(*pairs))
        rows = 0
        with self._lock:
            for fetch, n in zip(self._wanted, counts):
                self.rows_installed += int(n)
                self.rows_installed_on_demand += int(n)
                self.stats.bytes += int(n) * self._row_bytes[id(fetch)]
                rows += int(n)
            self.stats.session_calls += 1
        return rows

    def install_next_slice(self, sess: tf.compat.v1.Session, retry: Retry | None = None) -> bool:
        """Installs the next slice of every lost chunk of one table (under `retry`, if given: the same
        slice again); False once the walk is done."""
        with self._lock:
            if self._next >= len(self._slices):
                return False
            fetch, feeds = self._slices[self._next]
            self._next += 1
        counts = sess.run(fetch, feeds) if retry is None else retry(sess.run, fetch, feeds)
        with self._lock:
            for t, n in zip(fetch, counts):
                self.rows_installed += int(n)
                self.stats.bytes += int(n) * self._row_bytes[id(t)]
            self.stats.session_calls += 1
        return True

    def finish(self, sess: tf.compat.v1.Session) -> None:
        """After the walk: checks that nothing is pending on the lost PS, ends every PS's preservation."""
        pending = self._rebuilder.view_stats(sess, self.lost)
        left = {p: int(v[0]) for p, v in pending.items() if int(v[0]) != 0}
        if left:
            raise RuntimeError(f"the background rebuild walked every slice but rows are still pending: {left}")
        # Every PS keeps T0 words during the rebuild: the survivors and the PS rebuilt (docs/rebuild.md).
        self._rebuilder.end_preserve(sess, sorted(self._rebuilder.logs))
        self.seconds = time.time() - self.started
        self._finished.set()

    # ---- threads ---------------------------------------------------------------------------

    def start(self, sess: tf.compat.v1.Session, on_done: Any = None, walkers: int | None = None,
              share: float = 1.0) -> None:
        """Runs the loops on threads: the wanted rows', and `walkers` (default `WALKERS`) walking the slices
        (slices in flight together overlap one's transfer with another's decoding); `on_done(self)` after
        `finish`, from the last walking thread.

        With `share` < 1 each walker pauses after a slice for ``(1 - share) / share`` times as long as the
        slice took, so the walk holds the PS tasks for about `share` of the time and training has the rest;
        the wanted rows' loop never pauses (a lookup waiting for a row is training waiting).
        """
        walkers = WALKERS if walkers is None else int(walkers)
        pause = (1.0 - share) / share
        transient = self.retry.retry_if
        # A stop ends the retries' sleeps and their tries (a new session resumes the rebuild).
        retry = self.retry.replace(sleep_func=self._stop.wait,
                                   retry_if=lambda exc: transient(exc) and not self._stop.is_set())

        def wanted() -> None:
            while not self._stop.is_set() and not self.walked:
                try:
                    retry(self.install_wanted, sess)
                except (tf.errors.OpError, RuntimeError) as exc:
                    self._failed(exc)
                    return

        walking = [walkers]

        def walk() -> None:
            try:
                while not self._stop.is_set():
                    began = time.perf_counter()
                    if not self.install_next_slice(sess, retry):
                        break
                    if pause > 0:
                        self._stop.wait(pause * (time.perf_counter() - began))
                with self._lock:
                    walking[0] -= 1
                    last = walking[0] == 0
                if self._stop.is_set() or not last:
                    return
                retry(self.finish, sess)
            except (tf.errors.OpError, RuntimeError) as exc:
                self._failed(exc)
                return
            _LOG.warning(
                "background rebuild of PS %s done: %d rows (%d asked for by lookups first), %.1f MB in %.2f s",
                self.lost, self.rows_installed, self.rows_installed_on_demand, self.stats.bytes / 1e6, self.seconds,
            )
            if on_done is not None:
                on_done(self)

        self._threads = [threading.Thread(target=wanted, name="ec-rebuild-wanted", daemon=True)] + [
            threading.Thread(target=walk, name=f"ec-rebuild-walk-{i}", daemon=True) for i in range(walkers)
        ]
        for t in self._threads:
            t.start()

    def _failed(self, exc: BaseException) -> None:
        if self._stop.is_set():
            return
        self.error = exc
        self._stop.set()
        message = getattr(exc, "message", str(exc)).splitlines()[0] if str(exc) else type(exc).__name__
        _LOG.warning("background rebuild of PS %s stopped (the next session re-creation resumes it): %s", self.lost, message)

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until the rebuild finished or stopped; whether it finished."""
        deadline = None if timeout is None else time.time() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.time()))
        return self.finished

    def stop(self, timeout: float = 30.0) -> None:
        """Stops the loops (a new session takes over); rows already installed stay installed."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
