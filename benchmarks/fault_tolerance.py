"""Throughput and recovery of the fault-tolerance modes, side by side in one run.

Each configuration is a ``tf-ecrec run`` of the same model, data, cluster and
steps; only the fault-tolerance flags differ.  Runs are interleaved (A B C A B
C ...) so that drift in a shared, noisy machine falls on every configuration
alike, and results are reported as medians and as ratios to the first
configuration of the table.

    python benchmarks/fault_tolerance.py throughput --configs none,ckpt-100,ckpt-500
    python benchmarks/fault_tolerance.py recovery --configs ckpt-100,ckpt-500 --kill ps:1@step=1200
    python benchmarks/fault_tolerance.py recovery --configs ckpt-100-moved,ecrec-2+1-moved --kill ps:1@step=800

Unprotected configurations (``none``, ``ckpt-*``) store their tables as ecrec
does (``--storage collection``: the same variables, layout and lookups, no
parity), so that a ratio to ``none`` is the cost of the protection alone;
``--storage partitioned`` runs them on stock partitioned variables instead.

The throughput table also lists, per run, the seconds from the last trained
step to the chief's exit (the report's ``finish_seconds``).

Flags this script does not know go to every ``tf-ecrec run`` as they are
(``... recovery --configs ecrec-2+1-moved --session-timeout 4``).
Prints a Markdown table and writes the raw reports to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys

import launched_job  # benchmarks/, beside this script

PRESETS = {
    "none": ["--fault-tolerance", "none"],
    "ckpt-100": ["--fault-tolerance", "checkpoint", "--checkpoint-steps", "100"],
    "ckpt-500": ["--fault-tolerance", "checkpoint", "--checkpoint-steps", "500"],
    "ckpt-1000": ["--fault-tolerance", "checkpoint", "--checkpoint-steps", "1000"],
    "ckpt-30s": ["--fault-tolerance", "checkpoint", "--checkpoint-secs", "30"],
    # The default: folds batched over steps (a step is its applies and count; the trainer's fold round
    # every few steps folds and commits them, tf_ecrec.step.batched_commit).
    "ecrec-2+1": ["--fault-tolerance", "ecrec", "--ec", "2+1"],
    "ecrec-4+1": ["--fault-tolerance", "ecrec", "--ec", "4+1"],
    "ecrec-2+1-batched-8": ["--fault-tolerance", "ecrec", "--ec", "2+1"],  # a round every 8 steps (0.5 s at most)
    "ecrec-2+1-batched-16": ["--fault-tolerance", "ecrec", "--ec", "2+1"],  # every 16 steps (1 s at most)
    "ecrec-2+1-batched-32": ["--fault-tolerance", "ecrec", "--ec", "2+1"],  # every 32 steps (2 s at most)
    "ecrec-4+1-batched-64": ["--fault-tolerance", "ecrec", "--ec", "4+1"],  # every 64 steps (4 s at most)
    # The other commit modes (TF_ECREC_COMMIT): in the step's own run (the default before 2026-11-28),
    # and carried by the trainer's next run.
    "ecrec-2+1-in-step": ["--fault-tolerance", "ecrec", "--ec", "2+1"],
    "ecrec-4+1-in-step": ["--fault-tolerance", "ecrec", "--ec", "4+1"],
    "ecrec-2+1-carried": ["--fault-tolerance", "ecrec", "--ec", "2+1"],
    # TensorFlow's own thread pools on every PS (TF_ECREC_PS_THREADS=default), where the launcher sizes them to
    # each PS's share of the host's CPUs (tf_ecrec.cluster.threads; since 2026-12-02).
    "none-tf-threads": ["--fault-tolerance", "none"],
    "ecrec-2+1-tf-threads": ["--fault-tolerance", "ecrec", "--ec", "2+1"],
    "ecrec-4+1-tf-threads": ["--fault-tolerance", "ecrec", "--ec", "4+1"],
    # The killed PS comes back at a new port; the trainers fail over to it (tf_ecrec.session.failover).
    "ckpt-100-moved": ["--fault-tolerance", "checkpoint", "--checkpoint-steps", "100", "--restart-at", "new-port"],
    "ecrec-2+1-moved": ["--fault-tolerance", "ecrec", "--ec", "2+1", "--restart-at", "new-port"],
}


def _preset_env(name: str) -> dict | None:
    """What a preset adds to the environment: ...-tf-threads, TensorFlow's thread pools on every PS; else
    `_commit_env`'s."""
    if name.endswith("-tf-threads"):
        return {"TF_ECREC_PS_THREADS": "default"}
    return _commit_env(name)


def _commit_env(name: str) -> dict | None:
    """TF_ECREC_COMMIT for a preset named ...-in-step, ...-carried or ...-batched (None: the default commit);
    ...-batched-N folds every N steps of a trainer (a returned step waiting at most N / 16 s)."""
    base, _, every = name.rpartition("-") if name.rpartition("-")[2].isdigit() else (name, "", "")
    for mode in ("in-step", "carried", "batched"):
        if base.endswith(f"-{mode}"):
            env = {"TF_ECREC_COMMIT": mode.replace("-", "_")}
            if every:
                env.update({"TF_ECREC_FOLD_EVERY": every, "TF_ECREC_FOLD_DELAY_SECS": str(int(every) / 16)})
            return env
    return None


def run_one(name: str, common: list[str], out_dir: str, index: int, storage: str = "collection") -> dict:
    model_dir = os.path.join(out_dir, f"{name}-{index}")
    # A model dir left by an earlier run holds its checkpoints, which a new run would resume from.
    shutil.rmtree(model_dir, ignore_errors=True)
    flags = PRESETS[name]
    if "ecrec" not in flags:
        flags = [*flags, "--storage", storage]
    report = launched_job.run([*common, *flags], model_dir, name,
                              env=_preset_env(name))
    print(f"  {name} #{index}: {report['samples_per_sec']:,.0f} samples/s", file=sys.stderr)
    return report


def _median_cpu(reports: list[dict], roles: tuple[str, ...] | None = None) -> float | None:
    """The median over `reports` of CPU seconds per 1,000 samples (of `roles` only, if given)."""
    values = []
    for report in reports:
        cpu = report.get("cpu") or {}
        if roles is None:
            value = cpu.get("cpu_seconds_per_1000_samples")
        else:
            by_role = cpu.get("cpu_seconds_per_1000_samples_by_role")
            value = None if by_role is None else sum(by_role.get(role, 0.0) for role in roles)
        if value is not None:
            values.append(value)
    return statistics.median(values) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("throughput", "recovery"))
    parser.add_argument("--configs", default="none,ckpt-100,ckpt-500")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--ps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kill", default="ps:1@step=1200")
    parser.add_argument("--out", default="/tmp/tf_ecrec_bench")
    parser.add_argument("--storage", default="collection", choices=("collection", "partitioned"),
                        help="tables of the unprotected configurations (ecrec always uses the collection)")
    # Any other flag goes to every `tf-ecrec run` as is (e.g. --session-timeout 4).
    args, extra = parser.parse_known_args()
    args.extra = [a for a in extra if a != "--"]
    configs = args.configs.split(",")
    for name in configs:
        if name not in PRESETS:
            raise SystemExit(f"unknown config {name!r}; known: {sorted(PRESETS)}")
    common = ["--ps", str(args.ps), "--workers", str(args.workers), "--steps", str(args.steps), *args.extra]
    if args.mode == "recovery":
        common += ["--kill", args.kill]
    os.makedirs(args.out, exist_ok=True)
    results: dict[str, list[dict]] = {name: [] for name in configs}
    for i in range(args.repeats):
        for name in configs:
            results[name].append(run_one(name, common, args.out, i, args.storage))
    with open(os.path.join(args.out, f"{args.mode}.json"), "w", encoding="utf-8") as fh:
        json.dump(results, fh)

    base = statistics.median(r["samples_per_sec"] for r in results[configs[0]])
    print(f"\n{args.mode}: {' '.join(common)}; unprotected tables: {args.storage}; "
          f"{args.repeats} interleaved repeats, medians\n")
    if args.mode == "throughput":
        # CPU seconds of every task per 1,000 samples in the steady window (tf_ecrec.launcher.cpu_usage):
        # the protection's own cost, apart from how the shared cores were divided.
        base_cpu = _median_cpu(results[configs[0]])
        print(f"| config | samples/s | ratio to {configs[0]} | CPU-s per 1,000 samples (PS / trainers) | CPU ratio to "
              f"{configs[0]} | seconds to finish (each run) |\n|---|---|---|---|---|---|")
        for name in configs:
            rate = statistics.median(r["samples_per_sec"] for r in results[name])
            finish = ", ".join(f"{r.get('finish_seconds') or 0:.1f}" for r in results[name])
            cpu = _median_cpu(results[name])
            ps = _median_cpu(results[name], ("ps",))
            trainers = _median_cpu(results[name], ("chief", "worker"))
            cpu_cells = (f"{cpu:.4f} ({ps:.4f} / {trainers:.4f}) | {cpu / base_cpu:.3f}" if cpu and base_cpu
                         else "n/a | n/a")
            print(f"| {name} | {rate:,.0f} | {rate / base:.3f} | {cpu_cells} | {finish} |")
    else:
        print("| config | steps rolled back | seconds to resume | seconds to regain | samples/s (overall) |")
        print("|---|---|---|---|---|")
        for name in configs:
            recs = [r["recovery"][0] for r in results[name] if r["recovery"]]
            med = lambda key: statistics.median(x[key] for x in recs if x[key] is not None)  # noqa: E731
            eff = statistics.median(r["effective_samples_per_sec"] for r in results[name])
            print(
                f"| {name} | {med('steps_rolled_back'):.0f} | {med('seconds_to_resume'):.1f} | "
                f"{med('seconds_to_regain'):.1f} | {eff:,.0f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
