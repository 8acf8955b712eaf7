"""What a failure cost the job in training time: the report's ``recovery[i].training_seconds_lost``.  Pure.

One figure per failure that compares every protection mode alike (a checkpoint's rollback, a flash
restore, a parity rebuild with or without a spare): the samples the job did not train because of
the failure, in seconds of its own pre-failure training.

The failure's moment is its kill or crash event, or for a PS the launcher killed because it answered
nothing (``--ps-hang-secs``), its last answer (the diagnosis's ``silent_seconds`` before the kill).

``samples_per_sec_before``
    the job's rate (every trainer's ``step`` datagrams summed) over `RATE_SECS` before the kill,
    from the end of the previous failure's recovery when that is later;
``seconds_to_rate``
    from the kill to the start of the first `BACK_WINDOW_SECS` window whose rate is within
    `TOLERANCE` of that rate (None: not back before the next failure or the end of the run);
``samples_lost``
    the rate times those seconds, less what the job trained in them, plus the samples of the
    steps the failure took back (``steps_rolled_back`` + ``steps_undone``, times the batch);
``training_seconds_lost``
    ``samples_lost / samples_per_sec_before``.  When the rate never came back, it is computed up to
    the end of the span and is a lower bound (``back`` is False).

The window and tolerance are the issue's definition ("throughput back within 5%"); a rate that
fluctuates by more than 5% in steady state makes the figure an over-estimate, never an
under-estimate of the time lost before the window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tf_ecrec.launcher.events import Event
from tf_ecrec.launcher.trainer_report import MIN_RATE_SECS, RATE_SECS, TRAINER_PREFIXES, failure_spans

BACK_WINDOW_SECS = 5.0
TOLERANCE = 0.05


def failure_costs(events: Sequence[Event], steps: Mapping[str, Sequence[tuple[float, int]]], t0: float,
                  taken_back: Sequence[int], batch_size: int, end: float | None = None) -> list[dict[str, Any]]:
    """One dict per kill or crash event, in event order (module docstring).

    Args:
      events: the run's events (``t`` since `t0`).
      steps: per task, its step datagrams ``[(wall t, records since its previous one)]``.
      t0: the launch's wall time.
      taken_back: per failure, the steps it rolled back or undid (the report's entries, same order).
      batch_size: records per step.
      end: the end of the run, seconds since `t0` (default: the last event or datagram).
    """
    trained = sorted((t - t0, r) for task, series in steps.items() if task.startswith(TRAINER_PREFIXES)
                     for t, r in series if r > 0)
    last = max([e.t for e in events] + [t for t, _ in trained] + [0.0])
    stop = last if end is None else end
    out = []
    since = 0.0
    for span, back in zip(failure_spans(events), taken_back):
        # A PS killed for its silence failed when it stopped answering, not when the launcher killed it.
        kill = span.kill.t - float((span.kill.extra.get("diagnosis") or {}).get("silent_seconds") or 0.0)
        start = max([kill - RATE_SECS, since] + ([trained[0][0]] if trained else []))
        rate = _rate(trained, start, kill)
        out.append(_cost(trained, kill, min(span.until, stop), rate, int(back or 0) * int(batch_size)))
        since = span.over
    return out


def _cost(trained: Sequence[tuple[float, int]], kill: float, until: float, rate: float | None,
          taken_back: int) -> dict[str, Any]:
    if not rate:
        return {"samples_per_sec_before": rate, "seconds_to_rate": None, "samples_lost": None,
                "training_seconds_lost": None, "back": False}
    floor = (1.0 - TOLERANCE) * rate
    back_at = None
    for t in [kill] + [t for t, _ in trained if kill < t]:
        if t + BACK_WINDOW_SECS > until:
            break
        if sum(r for s, r in trained if t < s <= t + BACK_WINDOW_SECS) >= floor * BACK_WINDOW_SECS:
            back_at = t
            break
    upto = until if back_at is None else back_at
    done = sum(r for s, r in trained if kill < s <= upto)
    lost = max(0.0, rate * (upto - kill) - done) + taken_back
    return {
        "samples_per_sec_before": round(rate, 1),
        "seconds_to_rate": None if back_at is None else round(back_at - kill, 3),
        "samples_lost": round(lost),
        "training_seconds_lost": round(lost / rate, 3),
        "back": back_at is not None,
    }


def _rate(trained: Sequence[tuple[float, int]], start: float, stop: float) -> float | None:
    if stop - start < MIN_RATE_SECS:
        return None
    return sum(r for t, r in trained if start < t <= stop) / (stop - start)


def training_time_overhead(rate: float, base_rate: float, seconds_lost: float, seconds_between_failures: float) -> float:
    """The extra training time of a job, as a fraction of an unprotected job's with no failure.

    A job that trains at `rate` and loses `seconds_lost` of that rate at each failure, one failure every
    `seconds_between_failures`, trains N samples in ``T = (N / rate) / (1 - seconds_lost / between)``;
    the unprotected job with no failure in ``N / base_rate``.  The overhead is ``T / (N / base_rate) - 1``
    (ECRec's "training-time overhead"); infinite when the job loses as much as it trains.
    """
    if rate <= 0 or base_rate <= 0 or seconds_between_failures <= 0:
        raise ValueError(f"rates {rate}, {base_rate} and {seconds_between_failures} s between failures must be > 0")
    kept = 1.0 - max(0.0, seconds_lost) / seconds_between_failures
    return float("inf") if kept <= 0 else (base_rate / rate) / kept - 1.0
