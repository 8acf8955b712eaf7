"""A logger wrapper that warns at most once per period and counts what it held back."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class RateLimitedLogger:
    """Logs a warning at most every ``every_secs``, counting the ones suppressed."""

    def __init__(self, logger: logging.Logger, every_secs: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._every = every_secs
        self._clock = clock
        self._last: float | None = None
        self._suppressed = 0
        self._lock = threading.Lock()

    def warning(self, msg: str, *args: object) -> bool:
        """Logs unless one was logged less than ``every_secs`` ago; True if logged."""
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last < self._every:
                self._suppressed += 1
                return False
            suppressed, self._suppressed, self._last = self._suppressed, 0, now
        if suppressed:
            msg += " (%d similar warnings suppressed)"
            args += (suppressed,)
        self._logger.warning(msg, *args)
        return True


class RepeatFilter(logging.Filter):
    """Lets a record whose message starts with one of `prefixes` through at most once every `every_secs`.

    For a loop outside our code that logs every turn (TensorFlow's MonitoredSession logs each failed
    session creation, about 40 a second for a PS that is down): the first record passes, the next ones
    within the period are dropped and counted, and the next one to pass says how many were.  Add it to
    the logger that emits them, and remove it when the loop is over.
    """

    def __init__(self, prefixes: tuple[str, ...], every_secs: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._prefixes = prefixes
        self._every = every_secs
        self._clock = clock
        self._last: float | None = None
        self.dropped = 0
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self._prefixes):
            return True
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last < self._every:
                self.dropped += 1
                return False
            dropped, self.dropped, self._last = self.dropped, 0, now
        if dropped:
            record.msg = f"{record.msg} ({dropped} more like it in the last {self._every:g} s, not shown)"
        return True
