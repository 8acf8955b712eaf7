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
