"""The run report: what happened, how fast, what each failure cost.  Pure functions plus a plot.

Field names are stable (other tools read them):

``config``
    every flag of the run (`JobSpec.to_json`).
``global_step``
    the global step at the end.
``samples_per_sec``
    steady-state training throughput: records trained per second after
    start-up (from the moment the global step first reaches `warmup_step`)
    with the windows from each kill until training resumed left out.
``effective_samples_per_sec``
    the same after start-up, failure windows included.
``events``
    ``[{t, kind, task, global_step, ...}]``, ``t`` in seconds since launch.
``recovery``
    one entry per kill: ``task``, ``killed_at_step`` (the launcher's trigger), ``reached_step`` (the highest
    step a trainer reported sending before the kill: at least the trigger, more when the launcher read late), ``resumed_from_step``
    (the lowest global step seen after the kill, i.e. the step the job went
    on from: the restored checkpoint's step under checkpointing; with several
    workers it may read up to workers - 1 steps high), ``steps_rolled_back``
    (completed steps lost: ``reached_step - resumed_from_step`` less
    ``steps_undone``; the trigger's step would undercount a kill read late), ``steps_undone`` (for "parity": steps the failure cut
    mid-step that settlement undid; their global-step increments go with
    them, their records are retrained), ``seconds_to_resume`` (kill
    until the first step after it completed), ``seconds_to_regain`` (kill
    until the global step was back at ``killed_at_step``), ``method``
    ("parity": rebuilt from parity and replicas; "checkpoint": every variable
    restored from the checkpoint; "init": re-initialised, no protection;
    "none": nothing was lost, e.g. a worker), ``bytes_rebuilt`` and
    ``rebuild_seconds`` (the chief's decision and rebuild), ``address``
    (where the task came back: its old one, or a new port with
    ``--restart-at new-port``) and ``failovers`` (trainers' rebuilds of
    TF_CONFIG, RunConfig, Estimator and session for it, `tf_ecrec.session.failover`),
    ``recovery_phases`` (the chief's seconds per part of its recovery until
    trainers could resume: settlement, allocation, views, ...; the profile
    behind ``seconds_to_resume``).
    The *recovery window* runs from the kill to the chief's report that
    the model is whole again (``recovered``; without one, to
    ``resumed``): ``window_seconds``, ``samples_per_sec_in_window``
    (records trained in it per second) and ``throughput_in_window`` (that
    over ``samples_per_sec``: 0 when training stops while a PS is rebuilt),
    ``while_rebuilding`` (when the rows were installed after training
    resumed: ``seconds`` from the first step after the kill to the end of
    the rebuild and ``samples_per_sec`` in them, the throughput of training
    alongside the background rebuild),
    ``rebuild_gb_per_sec`` (``bytes_rebuilt`` over ``rebuild_seconds``),
    and per task ``memory_mb_before`` (peak resident MB in the 30 s before
    the kill) and ``memory_mb_in_window`` (peak in the window, +2 s);
    ``trainers``: per trainer, what the failure cost it (`tf_ecrec.launcher.trainer_report`);
    ``training_seconds_lost``, ``samples_lost``, ``seconds_to_rate``, ``back``, ``samples_per_sec_before``:
    what it cost the job in seconds of its pre-failure training (`tf_ecrec.launcher.failure_cost`).
``settlement``
    over the run, the steps a failure cut that settlement undid
    (``steps_undone``: their updates removed, their records retrained) or
    finished (``steps_finished``: kept whole), and ``folds_rolled_back``: folds
    of a lost PS's variables beyond their committed prefix (docs/settlement.md).
``finish_seconds``
    seconds from the last trained step to the chief's exit (final
    checkpoint, settlement, sessions closed).
``variables_sha256``
    digest of every variable's bytes read from the PS tasks at the end
    (`tf_ecrec.check.live_cluster`).
``parity``
    (``--fault-tolerance ecrec``) ``stripes_checked``, ``rows_checked``,
    ``mismatches`` (and the same for replicas): every stripe's parity
    compared with the code of its data and slots, read from the live PS
    tasks after training (`tf_ecrec.check.verify`); mismatches must be 0.
``data``
    ``corrupt_records`` skipped, and, without a job master (``--no-master``,
    ``--deterministic``), ``records_trained`` by all workers (re-done work
    included).  With a job master the counters are the master's, for the
    run's dataset (see `tf_ecrec.master.sharding`):

    - ``records_total``: records in the dataset (all epochs);
    - ``records_trained``: records acknowledged as trained, each
      acknowledgement counted (``>= records_total`` when ``finished``);
    - ``records_retrained``: acknowledged records acknowledged before: a
      checkpoint restore rolled their acknowledgement back;
    - ``records_requeued``: records leased, not acknowledged and handed out
      again (a killed or removed worker's); a killed worker may have
      trained some of them, so this bounds the re-training the master
      cannot see;
    - ``records_failed``/``shards_failed``: records given up after a shard
      failed too often (0 in a healthy run);
    - ``finished``: every shard is done;
    - ``failures``: per kill or loss, ``task``, ``global_step`` and
      ``records_in_flight`` (leased and not acknowledged, all workers) when
      it hit (null if the master did not answer), and their sum
      ``records_in_flight_at_failures``: the bound on records trained twice
      by worker, chief and master failures.  A checkpoint restore (a
      ``recovery`` entry with ``steps_rolled_back`` > 0) re-trains, besides,
      the records acknowledged since that checkpoint, by design: the model
      lost them.  For a task the master's membership lost, the count is read
      when the launcher notices, after the master re-queued that task's
      records;
    - ``records_in_model_max`` and ``records_lost_from_model``: the model's side
      (`tf_ecrec.launcher.data_report`): at most ``global_step * batch_size``
      records are in the model, so at least ``records_total`` less that were
      acknowledged and are in no model; 0 in a correct run.
``throughput``
    ``[[t, samples_per_sec], ...]`` per second, for plotting.
``memory``
    per task, ``peak_mb`` (resident) over the run and ``samples``
    ``[[t, mb], ...]``, about one per second while the task's process ran.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from tf_ecrec.launcher.autoscaling import scaling_entries
from tf_ecrec.launcher.data_report import data_section
from tf_ecrec.launcher.events import Event
from tf_ecrec.launcher.job.diagnosis import exit_entries

_LOG = logging.getLogger(__name__)

MEMORY_BEFORE_SECS = 30.0


def recovery_entries(
    events: Sequence[Event],
    fault_tolerance: str = "checkpoint",
    timeline: Sequence[tuple[float, int, int]] = (),
    t0: float = 0.0,
    memory: Mapping[str, Sequence[tuple[float, float]]] | None = None,
) -> list[dict[str, Any]]:
    """One entry per kill event, from the events that follow it (`timeline` and `memory` add the window's figures)."""
    out = []
    for i, kill in enumerate(events):
        if kill.kind not in ("kill", "crash"):
            continue
        later = events[i + 1 :]
        resumed = next((e for e in later if e.kind == "resumed" and e.task == kill.task), None)
        regained = next((e for e in later if e.kind == "regained" and e.task == kill.task), None)
        # The chief's report that the model is whole again: before training resumed, or after it
        # when the rows were rebuilt in the background ("rebuilding" came first), before the next kill.
        # (kills at the same moment share one recovery: only a kill after this one's resumption bounds it)
        after = resumed.t if resumed is not None else float("inf")
        upto_next = next((e.t for e in later if e.kind in ("kill", "crash") and e.t > after), float("inf"))
        background = next((e for e in later if e.kind == "rebuilding" and e.t <= upto_next), None)
        recovered = next(
            (e for e in later if e.kind == "recovered" and e.t <= upto_next
             and (resumed is None or e.t <= resumed.t or background is not None)),
            None,
        )
        if recovered is not None:
            method = recovered.extra.get("method")
        elif kill.task.startswith("ps:"):
            method = {"checkpoint": "checkpoint", "none": "init"}.get(fault_tolerance, "unknown")
        else:  # a worker or the chief: no state to rebuild, but a restarted Keras chief resumes from its backup
            method = next((e.extra["restored"] for e in later if e.kind == "session" and e.task == kill.task
                           and e.extra.get("restored")), "none")
        # The lowest global step seen after the kill: a new session's first read, or the step of the first completed
        # step (with several workers, up to workers - 1 steps above the true restore point).
        seen = [
            e.global_step
            for e in later
            if e.kind == "session" and (resumed is None or e.t <= resumed.t)
        ]
        if resumed is not None:
            seen.append(resumed.global_step)
        # The highest step sent before the kill (read late or not), after any earlier recovery's settlement: not its
        # own; with no step sent since (a PS lost inside another's rebuild), the step that settlement left.
        prior = max((e for e in events[:i] if e.kind in ("resumed", "rebuilding", "recovered")), key=lambda e: e.t, default=None)
        since = [s for t, s, _ in timeline if (prior.t if prior else -math.inf) < t - t0 <= kill.t]
        reached = max([kill.global_step if prior is None or since else prior.global_step] + since)
        resumed_from = min(min(seen), reached) if seen else None
        upto = resumed.t if resumed is not None else float("inf")
        moved = next((e for e in later if e.kind == "move" and e.task == kill.task and e.t <= upto), None)
        failovers = [e for e in later if e.kind == "failover" and e.extra.get("state") in ("build", "retarget") and e.t <= upto]
        phases_event = background or recovered
        # Steps a failure cut that settlement undid (their increment goes with them, their records are retrained:
        # not a rollback, docs/settlement.md); a background rebuild reports T0's at "rebuilding", the rest at its end.
        undone = sum(int(e.extra.get("steps_undone") or 0) for e in (background, recovered) if e and method == "parity")
        out.append(
            {
                "task": kill.task,
                "killed_at_step": kill.global_step,
                "reached_step": reached,
                "resumed_from_step": resumed_from,
                "steps_rolled_back": None if resumed_from is None else max(0, reached - resumed_from - undone),
                "steps_undone": undone,
                "seconds_to_resume": None if resumed is None else round(resumed.t - kill.t, 3),
                "seconds_to_regain": None if regained is None else round(regained.t - kill.t, 3),
                "method": method,
                "rebuilt_in_background": background is not None,
                "bytes_rebuilt": int(recovered.extra.get("bytes_rebuilt") or 0) if recovered else 0,
                "rebuild_seconds": float(recovered.extra.get("rebuild_seconds") or 0.0) if recovered else 0.0,
                "address": moved.extra.get("new") if moved is not None else "same",
                "failovers": len(failovers),  # and the chief's profile of the recovery up to the resumption:
                "recovery_phases": (phases_event.extra.get("phases") or {}) if phases_event else {},
                **_window(kill, recovered or resumed, timeline, t0, memory or {}, resumed=resumed),
            }
        )
    return out


def _window(kill: Event, end: Event | None, timeline: Sequence[tuple[float, int, int]], t0: float,
            memory: Mapping[str, Sequence[tuple[float, float]]], resumed: Event | None = None) -> dict[str, Any]:
    """The recovery window's figures (see the module docstring); None where the window never ended."""
    if end is None:
        return {"window_seconds": None, "samples_per_sec_in_window": None}
    a, b = kill.t, end.t
    records = sum(r for t, _, r in timeline if a < t - t0 <= b)
    seconds = max(1e-9, b - a)
    # Training that went on while the rows were still being installed: from the first step after the
    # kill to the end of the rebuild (only when the rebuild outlasted the resumption).
    rebuilding = None
    if resumed is not None and end.kind == "recovered" and resumed.t < b:
        done = sum(r for t, _, r in timeline if resumed.t < t - t0 <= b)
        rebuilding = {"seconds": round(b - resumed.t, 3), "samples_per_sec": round(done / (b - resumed.t), 1)}
    before = {
        task: max((mb for t, mb in samples if a - MEMORY_BEFORE_SECS <= t <= a), default=None)
        for task, samples in memory.items()
    }
    during = {task: max((mb for t, mb in samples if a <= t <= b + 2.0), default=None) for task, samples in memory.items()}
    rebuild = float(end.extra.get("rebuild_seconds") or 0.0) if end.kind == "recovered" else 0.0
    rebuilt = int(end.extra.get("bytes_rebuilt") or 0) if end.kind == "recovered" else 0
    return {
        "window_seconds": round(b - a, 3),
        "samples_per_sec_in_window": round(records / seconds, 1),
        "while_rebuilding": rebuilding,
        "rebuild_gb_per_sec": round(rebuilt / rebuild / 1e9, 3) if rebuild > 0 and rebuilt else None,
        "memory_mb_before": {t: v for t, v in before.items() if v is not None},
        "memory_mb_in_window": {t: v for t, v in during.items() if v is not None},
    }


def settlement_totals(events: Sequence[Event]) -> dict[str, int]:
    """Steps cut by failures that settlement undid or finished, and folds it rolled back, over the run."""
    keys = ("steps_undone", "steps_finished", "folds_rolled_back")
    return {
        k: int(sum(int(e.extra.get(k) or 0) for e in events if e.kind in ("recovered", "settled")))
        for k in keys
    }


def throughput_series(timeline: Sequence[tuple[float, int, int]], t0: float, bin_secs: float = 1.0) -> list[list[float]]:
    """Records per second in consecutive bins since `t0`."""
    if not timeline:
        return []
    end = max(t for t, _, _ in timeline)
    bins = [0.0] * (int((end - t0) / bin_secs) + 1)
    for t, _, records in timeline:
        bins[max(0, int((t - t0) / bin_secs))] += records
    return [[round(i * bin_secs, 3), round(r / bin_secs, 1)] for i, r in enumerate(bins)]


def warmup_step(steps: int) -> int:
    """The global step from which a run of `steps` steps is in its steady state (its first tenth, at
    most 200 steps, is warm-up)."""
    return max(1, min(200, steps // 10))


def steady_window(timeline: Sequence[tuple[float, int, int]], warmup_step: int) -> tuple[float, float] | None:
    """(first datagram at or past `warmup_step`, last datagram): the window of the steady-state figures."""
    start = next((t for t, step, _ in sorted(timeline) if step >= warmup_step), None)
    return None if start is None else (start, max(t for t, _, _ in timeline))


def steady_rates(
    timeline: Sequence[tuple[float, int, int]], events: Sequence[Event], t0: float, warmup_step: int,
) -> tuple[float, float]:
    """(steady-state, effective) records per second after warm-up; see the module docstring."""
    window = steady_window(timeline, warmup_step)
    if window is None:
        return 0.0, 0.0
    start, end = window
    records = sum(r for t, _, r in timeline if t > start)
    gaps = []
    for kill in (e for e in events if e.kind in ("kill", "crash")):
        resumed = next((e for e in events if e.kind == "resumed" and e.task == kill.task and e.t >= kill.t), None)
        gaps.append((t0 + kill.t, t0 + resumed.t if resumed else end))
    lost, reach = 0.0, start  # the union of the gaps (a failure during another's recovery overlaps it)
    for a, b in sorted(gaps):
        lost, reach = lost + max(0.0, min(b, end) - max(a, reach)), max(reach, min(b, end))
    busy = max(1e-9, end - start - lost)
    effective = records / max(1e-9, end - start)
    return records / busy, effective


def build_report(
    job: Any,
    t0: float,
    events: Sequence[Event],
    timeline: Sequence[tuple[float, int, int]],
    done_reports: Mapping[str, Mapping[str, Any]],
    digest: Mapping[str, Any],
    data_state: Any = None,
    failures: Sequence[Mapping[str, Any]] = (),
    memory: Mapping[str, Sequence[tuple[float, float]]] | None = None,
) -> dict[str, Any]:
    """The report dictionary (see the module docstring for the fields).

    Args:
      data_state: the master's `DataStats` of the dataset at the end (any
        object with its attributes), or None without a master.
      failures: per kill or loss, ``{"task", "global_step", "records_in_flight"}``.
      memory: per task, ``[(t since launch, resident MB)]`` samples.
    """
    steady, effective = steady_rates(timeline, events, t0, warmup_step(job.steps))
    final_step = max([int(r.get("step", 0)) for r in done_reports.values()] + [0])
    recovery = recovery_entries(events, job.fault_tolerance.value, timeline, t0, memory)
    for entry in recovery:
        rate = entry.get("samples_per_sec_in_window")
        entry["throughput_in_window"] = None if rate is None or steady <= 0 else round(rate / steady, 3)
    return {
        "config": job.to_json(),
        "global_step": final_step,
        "samples_per_sec": round(steady, 1),
        "effective_samples_per_sec": round(effective, 1),
        "events": [e.to_json() for e in events],
        "recovery": recovery,
        "settlement": settlement_totals(events),
        "exits": exit_entries(events),
        "scaling": scaling_entries(events),
        "variables_sha256": digest.get("variables_sha256"),
        "variables": {"count": digest.get("variables"), "bytes": digest.get("bytes")},
        **({"parity": digest["parity"]} if "parity" in digest else {}),
        "data": data_section(done_reports, data_state, failures, global_step=final_step, batch_size=job.batch_size),
        "throughput": throughput_series(timeline, t0),
        "finish_seconds": finish_seconds(events, timeline, t0),
        "memory": {
            task: {"peak_mb": max(mb for _, mb in samples), "samples": [[t, mb] for t, mb in samples]}
            for task, samples in sorted((memory or {}).items())
            if samples
        },
    }


def finish_seconds(events: Sequence[Event], timeline: Sequence[tuple[float, int, int]], t0: float) -> float | None:
    """Seconds from the last trained step (any trainer's last progress report) to the chief's exit.

    What the end of a run costs after training: the final checkpoint, the
    settlement of steps left behind, the sessions' close.  None if the chief
    did not exit or nothing trained.
    """
    exits = [e.t for e in events if e.kind == "exit" and e.task == "chief:0"]
    steps = [t - t0 for t, _, records in timeline if records > 0]
    if not exits or not steps:
        return None
    return round(max(0.0, exits[-1] - max(steps)), 3)


def preload_plotting() -> Any:
    """matplotlib's pyplot with the Agg backend (None without matplotlib).  Its import takes half a
    second: the launcher calls this on a thread while the job trains, so the report's plot need not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        return None
    return plt


def plot_throughput(report: Mapping[str, Any], path: str) -> str | None:
    """Writes a PNG of throughput over time with kills, restarts and resumptions marked."""
    if (plt := preload_plotting()) is None:  # pragma: no cover
        _LOG.warning("matplotlib is not installed; no throughput plot")
        return None
    series = report.get("throughput") or []
    fig, ax = plt.subplots(figsize=(9, 3.6))
    if series:
        ax.plot([t for t, _ in series], [r for _, r in series], lw=1.2, color="tab:blue", label="samples/s")
    styles = {"kill": ("tab:red", "-"), "restart": ("tab:orange", ":"), "resumed": ("tab:green", "--")}
    seen = set()
    for e in report.get("events", []):
        if e["kind"] in styles:
            color, ls = styles[e["kind"]]
            label = e["kind"] if e["kind"] not in seen else None
            seen.add(e["kind"])
            ax.axvline(e["t"], color=color, ls=ls, lw=1, label=label)
            if e["kind"] == "kill":
                ax.text(e["t"], ax.get_ylim()[1] * 0.95, f" {e['task']}", color=color, fontsize=8, va="top")
    cfg = report.get("config", {})
    ax.set_title(
        f"{cfg.get('model')} | ps={cfg.get('ps')} workers={cfg.get('workers')} | "
        f"fault tolerance: {cfg.get('fault_tolerance')}",
        fontsize=10,
    )
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("samples / s")
    ax.set_ylim(bottom=0)
    if not math.isfinite(ax.get_ylim()[1]):
        ax.set_ylim(0, 1)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
