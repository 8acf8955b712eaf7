"""Throughput-driven scaling of a job's trainers: a pure policy, observations in, decisions out.

The job's rate (records trained per second, job-wide, as the master counts them) is measured over a
window at each trainer count.  The policy grows one trainer at a time while each addition pays,
and takes the last one back when it did not:

- below ``min_workers``: add one (whatever the rates);
- after a window at n trainers (n > 1 measured before at n - 1): if the rate grew by less than
  ``min_gain`` (a fraction of the rate at n - 1, 10 % by default), the job is bound elsewhere (the
  PS tasks, the machine): remove one and never grow past n - 1 again;
- otherwise, if n < ``max_workers`` and the data left would take longer than ``tail_secs`` at the
  current rate (two windows by default), add one (a trainer started for the last seconds of the
  data only costs its start);
- a window starts when the trainer count the launcher reports has been stable (every trainer
  counted has trained a step), so a trainer's start-up is never measured.

The launcher acts on the decisions (`tf_ecrec.launcher.autoscaling`): it starts a worker slot, or
asks the newest worker to leave (it finishes its step, its leases go back to the queue: nothing is
lost).  Straggler mitigation is dynamic sharding's own: a worker leases one shard at a time, so a
slow one simply trains fewer; a hung one is replaced by the launcher (``--hang-secs``).
"""

from __future__ import annotations

import dataclasses

from tf_ecrec.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ScalingConfig:
    """The bounds and the thresholds of `AutoScaler` (trainers count the chief)."""

    min_workers: int
    max_workers: int
    window_secs: float = 15.0
    min_gain: float = 0.10
    tail_secs: float | None = None  # None: two windows (a trainer added later would barely be measured)

    def __post_init__(self) -> None:
        if self.tail_secs is None:
            object.__setattr__(self, "tail_secs", 2 * self.window_secs)
        source = "--min-workers/--max-workers/--autoscale-window"
        if not 1 <= self.min_workers <= self.max_workers:
            raise ConfigError(f"min_workers={self.min_workers}, max_workers={self.max_workers}; rule: "
                              f"1 <= min <= max; source: {source}")
        if not self.window_secs > 0 or not self.min_gain >= 0 or not float(self.tail_secs or 0) >= 0:
            raise ConfigError(f"window_secs={self.window_secs}, min_gain={self.min_gain}, tail_secs={self.tail_secs}; "
                              f"rule: window > 0, gain >= 0, tail >= 0; source: {source}")


@dataclasses.dataclass(frozen=True)
class Decision:
    """Add (+1) or remove (-1) one trainer, and why (with the rates measured)."""

    delta: int
    workers: int
    reason: str
    rates: dict[int, float]


class AutoScaler:
    """See the module docstring; feed it `observe` every few seconds."""

    def __init__(self, config: ScalingConfig) -> None:
        self.config = config
        self.rates: dict[int, float] = {}  # trainers -> records/s measured with that many
        self.ceiling = config.max_workers
        self._window: tuple[float, int, int] | None = None  # (t, records, trainers) at its start
        self.decisions: list[Decision] = []

    def observe(self, t: float, records: int, workers: int, remaining: int | None = None) -> Decision | None:
        """One observation: `records` trained so far job-wide, `workers` trainers training now, `remaining`
        records left (None: unbounded).  Returns a decision, or None."""
        cfg = self.config
        if workers < cfg.min_workers:
            self._window = None
            return self._decide(+1, workers, f"{workers} trainers is below the minimum {cfg.min_workers}")
        if self._window is None or self._window[2] != workers:
            self._window = (t, records, workers)  # a new count: measure from now
            return None
        t0, r0, _ = self._window
        if t - t0 < cfg.window_secs:
            return None
        rate = (records - r0) / (t - t0)
        self.rates[workers] = rate
        self._window = (t, records, workers)
        below = self.rates.get(workers - 1)
        if below is not None and workers > cfg.min_workers and rate < below * (1 + cfg.min_gain):
            self.ceiling = workers - 1
            return self._decide(-1, workers, f"{workers} trainers train {rate:,.0f} records/s, {workers - 1} trained "
                                f"{below:,.0f}: the last one gained less than {cfg.min_gain:.0%}")
        if workers >= min(self.ceiling, cfg.max_workers):
            return None
        if remaining is not None and rate > 0 and remaining / rate < float(cfg.tail_secs or 0):
            return None
        return self._decide(+1, workers, f"{workers} trainers train {rate:,.0f} records/s; trying {workers + 1}")

    def _decide(self, delta: int, workers: int, reason: str) -> Decision:
        decision = Decision(delta, workers, reason, dict(self.rates))
        self.decisions.append(decision)
        self._window = None
        return decision
