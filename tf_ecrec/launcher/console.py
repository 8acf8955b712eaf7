"""The launcher's console: messages, the live progress line, and the summary of a finished run.

With a terminal (``live``) the progress line is redrawn in place every
half second and messages print above it; otherwise (``--quiet``, a pipe)
the line prints every 5 seconds like any message.
"""

from __future__ import annotations

from typing import Any, TextIO


class Console:
    """Writes to `out`; `live` redraws the progress line in place.  Not thread-safe (the supervisor's loop only)."""

    def __init__(self, out: TextIO, live: bool) -> None:
        self._out = out
        self.live = live

    @property
    def progress_period(self) -> float:
        """Seconds between progress lines."""
        return 0.5 if self.live else 5.0

    def print(self, text: str) -> None:
        """A message on its own line (above the live progress line)."""
        if self.live:
            self._out.write("\r\033[K")
        self._out.write(text + "\n")
        self._out.flush()

    def progress(self, line: str, final: bool = False) -> None:
        """The progress line: redrawn in place when live (printed for good when `final`)."""
        if self.live and not final:
            self._out.write("\r\033[K" + line)
            self._out.flush()
        else:
            self.print(line)


def progress_line(elapsed: float, global_step: int, steps: int, samples_per_sec: float, states: str,
                  data_state: Any = None, master_up: bool | None = None) -> str:
    """``[  12.3s] step 400/3000 | data 1,024/76,800 | 1,234 samples/s | chief:0=up ... master=up``."""
    data = f"data {data_state.records_trained:,}/{data_state.records_total:,} | " if data_state is not None else ""
    master = "" if master_up is None else " master=" + ("up" if master_up else "DOWN")
    return f"[{elapsed:6.1f}s] step {global_step}/{steps} | {data}{samples_per_sec:,.0f} samples/s | {states}{master}"


def summary(report: dict[str, Any], path: str) -> str:
    """The report in a few lines: throughput, each recovery, parity, settlement, data, digest."""
    lines = [
        "",
        f"job done: global step {report['global_step']}, {report['samples_per_sec']:,.0f} samples/s steady state "
        f"({report['effective_samples_per_sec']:,.0f} overall), fault tolerance {report['config']['fault_tolerance']}",
    ]
    for r in report["recovery"]:
        if r["seconds_to_resume"] is None:  # e.g. a task killed as the job ended
            lines.append(f"  {r['task']} killed at step {r['killed_at_step']}: training did not resume after it")
            continue
        regained = "never" if r["seconds_to_regain"] is None else f"after {r['seconds_to_regain']:.1f} s"
        lines.append(
            f"  {r['task']} killed at step {r['killed_at_step']}: resumed from step {r['resumed_from_step']} "
            f"({r['steps_rolled_back']} steps rolled back), resumed after {r['seconds_to_resume']:.1f} s, "
            f"regained step {r['killed_at_step']} {regained}"
        )
        if r.get("training_seconds_lost") is not None:
            back = (f"back to its rate after {r['seconds_to_rate']:.1f} s" if r["back"]
                    else "not back to its rate before the next failure or the end (a lower bound)")
            per = ", ".join(f"{task} {t['samples_per_sec_before'] or 0:,.0f} -> {t['samples_per_sec_after'] or 0:,.0f}"
                            for task, t in sorted((r.get("trainers") or {}).items()))
            lines.append(f"    training lost: {r['training_seconds_lost']:.1f} s of the job's "
                         f"{r['samples_per_sec_before']:,.0f} samples/s, {back}"
                         + (f"; samples/s per trainer before -> after: {per}" if per else ""))
        if r.get("method") == "parity" and r.get("window_seconds") is not None:
            chief = r.get("memory_mb_in_window", {}).get("chief:0")
            rate = r.get("rebuild_gb_per_sec")
            lines.append(
                f"    rebuilt {r['bytes_rebuilt'] / 1e6:,.0f} MB from parity in {r['rebuild_seconds']:.1f} s"
                + (f" ({rate:.2f} GB/s)" if rate else "")
                + f"; throughput in the {r['window_seconds']:.1f} s window: {r['samples_per_sec_in_window']:,.0f} samples/s"
                + (f"; chief peak {chief:,.0f} MB" if chief is not None else "")
            )
    if "parity" in report:
        p = report["parity"]
        lines.append(
            f"  parity: {p['stripes_checked']} stripes / {p['rows_checked']} rows checked, {p['mismatches']} mismatches; "
            f"{p['replicas_checked']} replicas checked, {p['replica_mismatches']} mismatches"
        )
    settlement = report.get("settlement")
    if settlement:
        lines.append(
            f"  steps cut by failures: {settlement['steps_undone']} undone, {settlement['steps_finished']} finished; "
            f"{settlement['folds_rolled_back']} folds of lost variables rolled back"
        )
    data = report.get("data", {})
    if "records_total" in data:
        bound = data.get("records_in_flight_at_failures")
        lines.append(
            f"  data: {data['records_trained']:,} of {data['records_total']:,} records trained"
            f"{'' if data.get('finished') else ' (NOT finished)'}, {data['records_retrained']:,} retrained, "
            f"{data['records_requeued']:,} re-queued" + ("" if bound is None else f"; in flight at failures: {bound:,}")
        )
        if data.get("records_failed"):
            lines.append(
                f"  DROPPED: {data['records_failed']:,} records of {data['shards_failed']:,} shards were given up "
                "after failing more often than the shard failure limit; they were NOT trained"
            )
        if data.get("records_lost_from_model"):
            lines.append(
                f"  NOT IN THE MODEL: at least {data['records_lost_from_model']:,} acknowledged records (the model's "
                f"{report.get('global_step'):,} steps hold at most {data['records_in_model_max']:,})"
            )
    lines.append(f"  variables_sha256 {report['variables_sha256']}")
    lines.append(f"report: {path}" + (f" (plot: {report['plot']})" if report.get("plot") else ""))
    return "\n".join(lines)
