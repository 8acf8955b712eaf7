"""Recovery against table size: checkpoint restore vs erasure-coded rebuild, side by side in one run.

Each row of the table is one ``tf-ecrec run`` of the DLRM example (26 tables,
Adagrad, 3 PS, 2 workers) with ps:1 killed at ``--kill-step``; runs of one
size are interleaved across configurations, so drift on a shared machine
falls on each alike.  Table sizes are given as rows per table; the bytes
column counts values and Adagrad slots of all 26 tables (parity excluded).

    python benchmarks/recovery_scale.py                       # 30k, 300k, 1.2M rows per table
    python benchmarks/recovery_scale.py --rows 30000,300000 --configs ckpt-500,ecrec-2+1 --out /tmp/rs

Columns (from each run's report, `tf_ecrec.launcher.report`): seconds from the
kill to the first step after it and to the pre-failure step, steps rolled
back, samples/s in the recovery window (from the kill to the last rebuilt row, or
to the first step after a restore) as a fraction of steady state, the
rebuild's GB/s, the chief's resident memory before the kill and its peak in
the window, and the PS' peak.  Writes ``recovery_scale.json`` and
``recovery_scale.png`` (seconds to resume against size, one line per
configuration) to ``--out``; prints a Markdown table.  And what the failure cost in training
time: ``training_seconds_lost`` (samples not trained against the pre-failure rate from the kill
until the rate is back within 5%, plus rolled-back samples, over that rate), and per trainer its
seconds to its first step, its sessions and its rate after the rebuild over its rate before.  The
killed PS's replacement starts ``--restart-delay`` seconds later (20 by default: a rescheduled pod),
which a spare makes irrelevant and every other configuration waits for.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import launched_job  # benchmarks/, beside this script

CONFIGS = {
    "ckpt-500": ["--fault-tolerance", "checkpoint", "--checkpoint-steps", "500"],
    "ckpt-200": ["--fault-tolerance", "checkpoint", "--checkpoint-steps", "200"],
    "ecrec-2+1": ["--fault-tolerance", "ecrec", "--ec", "2+1"],
    "ecrec-2+1-spare": ["--fault-tolerance", "ecrec", "--ec", "2+1", "--spare-ps", "1"],
    # The rebuild walks 30% of the time and leaves the rest to training: a longer rebuild, more throughput in it.
    "ecrec-2+1-spare-share0.3": ["--fault-tolerance", "ecrec", "--ec", "2+1", "--spare-ps", "1", "--rebuild-share", "0.3"],
    "flash-100": ["--fault-tolerance", "flash", "--flash-checkpoint-steps", "100"],
}
TABLES, DIM, SLOTS = 26, 16, 1  # the DLRM example; Adagrad keeps one slot per value


def table_gb(rows: int) -> float:
    return TABLES * rows * DIM * 4 * (1 + SLOTS) / 1e9


def run_one(config: str, rows: int, args: argparse.Namespace) -> dict:
    model_dir = os.path.join(args.out, f"{config}-{rows}")
    shutil.rmtree(model_dir, ignore_errors=True)
    flags = [
        "--ps", str(args.ps), "--workers", str(args.workers), "--steps", str(args.steps),
        "--table-rows", str(rows), "--kill", f"ps:1@step={args.kill_step}", "--restart-delay", str(args.restart_delay),
        *CONFIGS[config], *args.extra,
    ]
    report = launched_job.run(flags, model_dir, f"{config} at {rows} rows")
    rec = report["recovery"][0]
    memory = report.get("memory", {})
    row = {
        "config": config,
        "rows_per_table": rows,
        "table_gb": round(table_gb(rows), 3),
        "wall_seconds": round(report["wall_seconds"], 1),
        "samples_per_sec": report["samples_per_sec"],
        "steps_rolled_back": rec["steps_rolled_back"],
        "seconds_to_resume": rec["seconds_to_resume"],
        "seconds_to_regain": rec["seconds_to_regain"],
        "method": rec["method"],
        "samples_per_sec_in_window": rec.get("samples_per_sec_in_window"),
        "throughput_in_window": (round(rec["samples_per_sec_in_window"] / report["samples_per_sec"], 2)
                                 if rec.get("samples_per_sec_in_window") is not None and report.get("samples_per_sec")
                                 else None),
        "window_seconds": rec.get("window_seconds"),
        "while_rebuilding": rec.get("while_rebuilding"),
        "throughput_while_rebuilding": (round(rec["while_rebuilding"]["samples_per_sec"] / report["samples_per_sec"], 2)
                                        if rec.get("while_rebuilding") and report.get("samples_per_sec") else None),
        "recovery_phases": rec.get("recovery_phases") or {},
        "rebuilt_in_background": rec.get("rebuilt_in_background"),
        "bytes_rebuilt": rec["bytes_rebuilt"],
        "rebuild_seconds": rec["rebuild_seconds"],
        "rebuild_gb_per_sec": rec.get("rebuild_gb_per_sec"),
        "chief_mb_before": rec.get("memory_mb_before", {}).get("chief:0"),
        "chief_mb_in_window": rec.get("memory_mb_in_window", {}).get("chief:0"),
        "ps_peak_mb": {t: m["peak_mb"] for t, m in memory.items() if t.startswith("ps:")},
        "parity_mismatches": report.get("parity", {}).get("mismatches"),
        # What the failure cost in training time (issue 33's measure, `tf_ecrec.launcher.failure_cost`),
        # and each trainer's own return: sessions it made, its rate after the rebuild over before.
        "training_seconds_lost": rec.get("training_seconds_lost"),
        "seconds_to_rate": rec.get("seconds_to_rate"),
        "back": rec.get("back"),
        "trainers": {t: {"sessions": v.get("sessions"), "seconds_to_first_step": v.get("seconds_to_first_step"),
                         "rate_after_over_before": (round(v["samples_per_sec_after"] / v["samples_per_sec_before"], 3)
                                                    if v.get("samples_per_sec_after") and v.get("samples_per_sec_before")
                                                    else None)}
                     for t, v in (rec.get("trainers") or {}).items()},
    }
    print(f"  {config} @ {rows:,} rows: resumed after {row['seconds_to_resume']} s, "
          f"{row['steps_rolled_back']} steps rolled back ({row['wall_seconds']} s run)", file=sys.stderr)
    return row


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = sorted((r for r in rows if r["config"] == config), key=lambda r: r["table_gb"])
        ax.plot([r["table_gb"] for r in mine], [r["seconds_to_resume"] or 0 for r in mine], marker="o", label=f"{config}: to first step")
        ax.plot([r["table_gb"] for r in mine], [r["seconds_to_regain"] or 0 for r in mine], marker="x", ls="--",
                label=f"{config}: to pre-failure step")
    ax.set_xscale("log")
    ax.set_xlabel("tables (values + Adagrad slots), GB")
    ax.set_ylabel("seconds after the kill of ps:1")
    ax.set_title("recovery time against table size", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="30000,300000,1200000", help="rows per table, comma-separated")
    parser.add_argument("--configs", default="ckpt-500,ecrec-2+1,ecrec-2+1-spare,ecrec-2+1-spare-share0.3")
    parser.add_argument("--ps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--kill-step", type=int, default=900)
    parser.add_argument("--restart-delay", type=float, default=20.0,
                        help="seconds before the killed PS's replacement starts (a rescheduled pod: tens of seconds)")
    parser.add_argument("--out", default="/tmp/tf_ecrec_recovery_scale")
    args, extra = parser.parse_known_args()
    args.extra = [a for a in extra if a != "--"]
    configs = args.configs.split(",")
    for name in configs:
        if name not in CONFIGS:
            raise SystemExit(f"unknown config {name!r}; known: {sorted(CONFIGS)}")
    os.makedirs(args.out, exist_ok=True)
    rows: list[dict] = []
    for size in (int(r) for r in args.rows.split(",")):
        for config in configs:
            rows.append(run_one(config, size, args))
            with open(os.path.join(args.out, "recovery_scale.json"), "w", encoding="utf-8") as fh:
                json.dump(rows, fh, indent=1)
    plot(rows, os.path.join(args.out, "recovery_scale.png"))
    print(f"\nps:1 killed at step {args.kill_step}, its replacement after {args.restart_delay:g} s; {args.ps} PS, "
          f"{args.workers} workers, {args.steps} steps\n")
    print("| config | GB | training s lost | s to rate | back | per trainer: s to first step, sessions, rate after / before |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        per = "; ".join(f"{t} {v['seconds_to_first_step']} s, {v['sessions']}, {v['rate_after_over_before']}"
                        for t, v in r["trainers"].items())
        print(f"| {r['config']} | {r['table_gb']:.2f} | {r['training_seconds_lost']} | {r['seconds_to_rate']} | "
              f"{r['back']} | {per} |")
    print()
    print("| config | GB | s to first step | s to regain | steps rolled back | window s | throughput in window | "
          "s rebuilding after resuming / throughput then | rebuild GB/s | chief MB before / in window | PS peak MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ps_peak = max(r["ps_peak_mb"].values(), default=0)
        wr = r.get("while_rebuilding")
        after = f"{wr['seconds']} / {r['throughput_while_rebuilding']}" if wr else "-"
        print(
            f"| {r['config']} | {r['table_gb']:.2f} | {r['seconds_to_resume']} | {r['seconds_to_regain']} | "
            f"{r['steps_rolled_back']} | {r['window_seconds']} | {r['throughput_in_window']} | {after} | "
            f"{r['rebuild_gb_per_sec'] or '-'} | {r['chief_mb_before']} / {r['chief_mb_in_window']} | {ps_peak:,.0f} |"
        )
    # Where the chief's part of the time to resume went (RecoveryResult.phases).
    phased = [r for r in rows if r.get("recovery_phases")]
    if phased:
        names = list(dict.fromkeys(n for r in phased for n in r["recovery_phases"]))
        print("\nchief's recovery until trainers may resume, seconds per phase:\n")
        print("| config | GB | " + " | ".join(names) + " |")
        print("|---|---|" + "---|" * len(names))
        for r in phased:
            cells = " | ".join(f"{r['recovery_phases'].get(n, 0):.2f}" for n in names)
            print(f"| {r['config']} | {r['table_gb']:.2f} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
