"""Training-time overhead as ECRec measures it: the steady cost of each protection plus what a failure costs.

For each configuration, interleaved in one run (A B C A B C ... so that a shared machine's drift falls
on every one alike), on the same model, data, cluster and storage (``--storage collection`` for the
unprotected ones, as in fault_tolerance.py):

- a run without failure: steady samples/s and CPU seconds per 1,000 samples of every task;
- a run with one PS killed (``--kill``, replaced after ``--restart-delay``, 20 s by default as a
  rescheduled pod): the training seconds that failure cost the job (the report's
  ``recovery[0].training_seconds_lost``, `tf_ecrec.launcher.failure_cost`).  ``none`` has no such
  run: without protection a lost PS restarts the job from its initial values.

From the medians, the overhead of a job with one PS failure every H hours against an unprotected job
with no failure (`tf_ecrec.launcher.failure_cost.training_time_overhead`), as a Markdown table for
one failure per hour and per ten hours, and a PNG of overhead against time between failures, one
line per configuration.

    python benchmarks/training_overhead.py --table-rows 20000                 # about 0.1 GB of tables
    python benchmarks/training_overhead.py --table-rows 400000 --steps 4000   # about 1.3 GB

Flags this script does not know go to every ``tf-ecrec run`` as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import fault_tolerance  # benchmarks/, beside this script
import launched_job

from tf_ecrec.launcher.failure_cost import training_time_overhead

PRESETS = {
    **{name: fault_tolerance.PRESETS[name] for name in ("none", "ckpt-100", "ckpt-500", "ecrec-2+1", "ecrec-4+1")},
    "ckpt-2000": ["--fault-tolerance", "checkpoint", "--checkpoint-steps", "2000"],
    "flash": ["--fault-tolerance", "flash", "--flash-checkpoint-steps", "100"],
    "ecrec-2+1-spare": [*fault_tolerance.PRESETS["ecrec-2+1"], "--spare-ps", "1"],
    "ecrec-4+1-spare": [*fault_tolerance.PRESETS["ecrec-4+1"], "--spare-ps", "1"],
}
HOURS = (0.25, 0.5, 1, 2, 5, 10, 20, 50, 100)


def _run(name: str, common: list[str], out: str, tag: str) -> dict:
    flags = PRESETS[name]
    if "ecrec" not in flags:
        flags = [*flags, "--storage", "collection"]
    report = launched_job.run([*common, *flags], os.path.join(out, f"{name}-{tag}"), f"{name} {tag}")
    lost = (report["recovery"] or [{}])[0].get("training_seconds_lost") if "kill" in tag else None
    print(f"  {name} {tag}: {report['samples_per_sec']:,.0f} samples/s"
          + (f", {lost} training seconds lost" if lost is not None else ""), file=sys.stderr)
    return report


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="none,ckpt-100,ckpt-500,ckpt-2000,flash,ecrec-2+1,ecrec-2+1-spare")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--ps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kill", default="ps:1@step=1800", help="the failure of the kill runs")
    parser.add_argument("--restart-delay", default="20", help="seconds until a killed PS is replaced")
    parser.add_argument("--out", default="/tmp/tf_ecrec_overhead")
    args, extra = parser.parse_known_args()
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in PRESETS]
    if unknown or configs[0] != "none":
        raise SystemExit(f"configs must start with none and be among {sorted(PRESETS)}; got {configs}")
    common = ["--ps", str(args.ps), "--workers", str(args.workers), "--steps", str(args.steps),
              "--restart-delay", str(args.restart_delay), *[a for a in extra if a != "--"]]
    os.makedirs(args.out, exist_ok=True)
    steady: dict[str, list[dict]] = {c: [] for c in configs}
    killed: dict[str, list[dict]] = {c: [] for c in configs if c != "none"}
    for i in range(args.repeats):
        for name in configs:
            steady[name].append(_run(name, common, args.out, f"steady{i}"))
            if name != "none":
                killed[name].append(_run(name, [*common, "--kill", args.kill], args.out, f"kill{i}"))
    with open(os.path.join(args.out, "training_overhead.json"), "w", encoding="utf-8") as fh:
        json.dump({"steady": steady, "killed": killed, "command": sys.argv}, fh)

    rate = {c: statistics.median(r["samples_per_sec"] for r in steady[c]) for c in configs}
    cpu = {c: _median([(r.get("cpu") or {}).get("cpu_seconds_per_1000_samples") for r in steady[c]]) for c in configs}
    lost = {c: _median([(r["recovery"] or [{}])[0].get("training_seconds_lost") for r in killed[c]]) for c in killed}
    back = {c: all((r["recovery"] or [{}])[0].get("back") for r in killed[c]) for c in killed}
    curves = {c: [training_time_overhead(rate[c], rate["none"], lost[c], h * 3600) for h in HOURS]
              for c in killed if lost[c] is not None}

    print(f"\ntraining-time overhead: {' '.join(common)}, kill {args.kill}; {args.repeats} interleaved repeats, "
          f"medians; overhead against none with no failure\n")
    print("| config | samples/s | ratio to none | CPU-s per 1,000 samples (ratio) | training s lost per failure | "
          "overhead, 1 failure/h | overhead, 1 failure/10 h |\n|---|---|---|---|---|---|---|")
    for c in configs:
        cpu_cell = f"{cpu[c]:.4f} ({cpu[c] / cpu['none']:.2f}x)" if cpu[c] and cpu["none"] else "n/a"
        if c == "none":
            print(f"| none | {rate[c]:,.0f} | 1.000 | {cpu_cell} | (restarts from scratch) | - | - |")
            continue
        lost_cell = "n/a" if lost[c] is None else f"{lost[c]:.1f}" + ("" if back[c] else " (not back: a bound)")
        hour = curves[c][HOURS.index(1)] if c in curves else None
        ten = curves[c][HOURS.index(10)] if c in curves else None
        fmt = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # noqa: E731
        print(f"| {c} | {rate[c]:,.0f} | {rate[c] / rate['none']:.3f} | {cpu_cell} | {lost_cell} | {fmt(hour)} | "
              f"{fmt(ten)} |")
    plot = os.path.join(args.out, "training_overhead.png")
    _plot(curves, plot, " ".join(common))
    print(f"\nplot: {plot}")
    return 0


def _plot(curves: dict[str, list[float]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, values in curves.items():
        ax.plot(HOURS, [100 * v for v in values], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("hours between PS failures")
    ax.set_ylabel("training-time overhead (%)")
    ax.set_title(title, fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
