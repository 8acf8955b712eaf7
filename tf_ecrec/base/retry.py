"""A bounded, injectable retry policy: every wait in tf_ecrec ends.

:class:`Retry` is a frozen value.  Calling it runs a function until it
succeeds, raises an error the policy does not retry, runs out of tries, or
runs out of time; in the last two cases the last error is re-raised unchanged
so that the caller can wrap it in its own typed error (``MasterUnavailable``,
``MembershipTimeout``) at the boundary::

    retry = Retry(max_tries=5, delay=0.1, deadline=10.0,
                  retry_if=lambda exc: isinstance(exc, ConnectionError))
    value = retry(fetch, key)                 # fetch(key), retried
    value = retry.run(lambda left: fetch(key, timeout=left))  # per-try budget

Time is read from ``clock`` and spent in ``sleep_func``; tests pass fakes and
never wait.  There is no "retry forever": ``max_tries`` is always finite.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from tf_ecrec.errors import ConfigError

_LOG = logging.getLogger(__name__)

T = TypeVar("T")


def _retry_connection_errors(exc: BaseException) -> bool:
    return isinstance(exc, (ConnectionError, TimeoutError))


@dataclasses.dataclass(frozen=True)
class Retry:
    """Retries a call with exponential backoff under a try count and a deadline.

    Attributes:
      max_tries: Attempts in total, >= 1.
      delay: Sleep before the second attempt, seconds.
      backoff: Factor applied to the sleep after each failure, >= 1.
      max_delay: Cap on one sleep, seconds.
      max_jitter: Each sleep is stretched by up to this fraction at random.
      deadline: Seconds from the first attempt after which no new attempt
        starts (``None``: only ``max_tries`` bounds the call).  A sleep never
        runs past the deadline.
      retry_if: Decides whether an exception is transient.  Anything else is
        re-raised at once.
      sleep_func: Sleeps; injected by tests.
      clock: Monotonic seconds; injected by tests.
      jitter_func: Returns a float in [0, 1); injected by tests.
    """

    max_tries: int = 5
    delay: float = 0.1
    backoff: float = 2.0
    max_delay: float = 2.0
    max_jitter: float = 0.2
    deadline: float | None = 10.0
    retry_if: Callable[[BaseException], bool] = _retry_connection_errors
    sleep_func: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    jitter_func: Callable[[], float] = random.random

    def __post_init__(self) -> None:
        if not isinstance(self.max_tries, int) or self.max_tries < 1:
            raise ConfigError(f"Retry max_tries={self.max_tries!r} must be an int >= 1")
        if self.delay < 0 or self.max_delay < 0 or self.max_jitter < 0:
            raise ConfigError(
                f"Retry delay={self.delay}, max_delay={self.max_delay} and "
                f"max_jitter={self.max_jitter} must be >= 0")
        if self.backoff < 1:
            raise ConfigError(f"Retry backoff={self.backoff} must be >= 1")
        if self.deadline is not None and self.deadline <= 0:
            raise ConfigError(f"Retry deadline={self.deadline} must be > 0 or None")

    def replace(self, **changes: object) -> Retry:
        """Returns a copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def __call__(self, func: Callable[..., T], *args: object, **kwargs: object) -> T:
        """Calls ``func(*args, **kwargs)`` under this policy.

        Returns:
          The first successful result.

        Raises:
          The last exception from ``func`` when it is not retryable, or when
          the tries or the deadline are used up.
        """
        return self.run(lambda _remaining: func(*args, **kwargs))

    def run(self, func: Callable[[float | None], T]) -> T:
        """Like ``__call__``, but passes each attempt the seconds left.

        ``func(remaining)`` gets the time until the deadline (``None`` without
        one), so that it can bound its own blocking call, e.g. a gRPC timeout.
        """
        start = self.clock()
        sleep = self.delay
        for attempt in range(1, self.max_tries + 1):
            remaining = self._remaining(start)
            try:
                return func(remaining)
            except Exception as exc:  # filtered by retry_if.
                if not self.retry_if(exc) or attempt == self.max_tries:
                    raise
                pause = min(sleep, self.max_delay) * (1.0 + self.max_jitter * self.jitter_func())
                remaining = self._remaining(start)
                if remaining is not None and remaining <= pause:
                    raise
                _LOG.debug("Attempt %d of %d failed (%s); retrying in %.2fs",
                           attempt, self.max_tries, exc, pause)
                self.sleep_func(pause)
                sleep *= self.backoff
        raise AssertionError("Internal error: Retry.run left its loop")  # pragma: no cover

    def _remaining(self, start: float) -> float | None:
        if self.deadline is None:
            return None
        return self.deadline - (self.clock() - start)


def retry_on(*types: type[BaseException]) -> Callable[[BaseException], bool]:
    """Returns a ``retry_if`` predicate accepting instances of ``types``."""
    classes: tuple[type[BaseException], ...] = tuple(types)
    return lambda exc: isinstance(exc, classes)


def duplicate_request(exc: BaseException) -> bool:
    """True for TensorFlow's refusal of a gRPC call its transport retried after delivering it once.

    A worker refuses a RunGraph whose request id it has seen (``AbortedError``, "The same RunGraph
    (Worker) request was received twice"): the client retried a call that failed UNAVAILABLE in
    transit although the worker had got it.  Under load this happens on loopback too.  Running the
    same fetches again is then safe for idempotent ones only (reads, assigns of a fed value); the
    callers that retry on it say so.
    """
    return type(exc).__name__ == "AbortedError" and "request was received twice" in str(exc)
