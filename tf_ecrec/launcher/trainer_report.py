"""What each failure cost each trainer: the report's ``recovery[i].trainers``.  Pure functions.

The job's global step moves as long as one trainer steps, so it cannot tell whether every trainer
came back after a failure.  This reads each trainer's own progress (its ``step`` datagrams: records
trained since its previous one) and its ``session`` events, and gives, per failure and per trainer:

``seconds_to_first_step``
    from the kill to the first datagram of records the trainer trained after it (None: it never
    trained again before the next failure or the end);
``records_after``
    records it trained from the kill until the next failure (or the end of the run);
``sessions``
    sessions it created in that span (a trainer that follows a move creates one, two at most when
    its first one predates the chief's recovery; a trainer refused by the cluster creates one per
    refused step);
``samples_per_sec_before`` / ``samples_per_sec_after``
    its records per second over `RATE_SECS` before the kill (from its first step or the end of the
    previous failure's recovery, when later), and over `RATE_SECS` from the chief's report that the model is whole
    again (``recovered``; without one, its own first step after the kill), until the next failure
    or its last step; None for a span shorter than `MIN_RATE_SECS`.

A failure's span ends at the next kill or crash after the job resumed from it (kills at the same
moment share one span, as in `tf_ecrec.launcher.report.recovery_entries`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from tf_ecrec.launcher.events import Event

RATE_SECS = 20.0
MIN_RATE_SECS = 1.0
TRAINER_PREFIXES = ("chief:", "worker:")


def trainer_entries(events: Sequence[Event], steps: Mapping[str, Sequence[tuple[float, int]]], t0: float,
                    end: float | None = None) -> list[dict[str, dict[str, Any]]]:
    """One dict per kill or crash event, in event order (the order of the report's ``recovery``).

    Args:
      events: the run's events (``t`` since `t0`).
      steps: per task, its step datagrams ``[(wall t, records since its previous one)]``.
      t0: the launch's wall time.
      end: the end of the run, seconds since `t0` (default: the last event or datagram).
    """
    own = {task: [(t - t0, r) for t, r in series] for task, series in steps.items() if task.startswith(TRAINER_PREFIXES)}
    last = max([e.t for e in events] + [t for series in own.values() for t, _ in series] + [0.0])
    stop = last if end is None else end
    out = []
    since = 0.0  # the rate before a failure starts after the previous one was over
    for span in failure_spans(events):
        until = min(span.until, stop)
        out.append({task: _trainer(task, series, events, span.kill.t, until, since, span.whole)
                    for task, series in sorted(own.items())})
        since = span.over
    return out


class Span(NamedTuple):
    """A failure's span: its kill or crash, the next failure after the job resumed from it (``until``),
    the chief's report that the model is whole in between (``whole``), and when the failure was over
    (``over``: the latest of the kill, ``whole`` and the killed task's resumption)."""

    kill: Event
    until: float
    whole: float | None
    over: float


def failure_spans(events: Sequence[Event]) -> list[Span]:
    """Each kill or crash event's `Span`, in event order."""
    out = []
    for i, kill in enumerate(events):
        if kill.kind not in ("kill", "crash"):
            continue
        later = events[i + 1 :]
        resumed = next((e.t for e in later if e.kind == "resumed" and e.task == kill.task), None)
        until = next((e.t for e in later if e.kind in ("kill", "crash") and e.t > (resumed or float("inf"))),
                     float("inf"))
        whole = next((e.t for e in later if e.kind == "recovered" and e.t <= until), None)
        out.append(Span(kill, until, whole, max(t for t in (kill.t, whole, resumed) if t is not None)))
    return out


def _trainer(task: str, series: Sequence[tuple[float, int]], events: Sequence[Event], kill: float, until: float,
             since: float, whole: float | None) -> dict[str, Any]:
    trained = [(t, r) for t, r in series if r > 0]
    after = [(t, r) for t, r in trained if kill < t <= until]
    first = after[0][0] if after else None
    sessions = sum(1 for e in events if e.kind == "session" and e.task == task and kill < e.t <= until)
    start = max([kill - RATE_SECS, since] + ([trained[0][0]] if trained else []))
    before = _rate(trained, start, kill)
    settled_from = whole if whole is not None and (first is None or whole >= first) else first
    rate_after = None
    if settled_from is not None and after:
        rate_after = _rate(trained, settled_from, min(settled_from + RATE_SECS, until, after[-1][0]))
    return {
        "seconds_to_first_step": None if first is None else round(first - kill, 3),
        "records_after": sum(r for _, r in after),
        "sessions": sessions,
        "samples_per_sec_before": before,
        "samples_per_sec_after": rate_after,
    }


def _rate(trained: Sequence[tuple[float, int]], start: float, stop: float) -> float | None:
    """Records per second of the datagrams in (start, stop]; None for a span under `MIN_RATE_SECS`."""
    if stop - start < MIN_RATE_SECS:
        return None
    return round(sum(r for t, r in trained if start < t <= stop) / (stop - start), 1)
