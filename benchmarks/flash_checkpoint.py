"""What flash checkpoints cost and how fast they restore, side by side with stock checkpoints.

``cost``: launched jobs (``tf-ecrec run``, ecrec 2+1, 3 PS, chief + worker) interleaved per table size:
no checkpoint, a flash checkpoint every N steps, a stock checkpoint every N steps.  Reports samples/s
and its ratio to the first, and, from the chief's ``flash_stats.json``, the pause of each round
(trainers parked, capture) and the background write, and the pauses' share of the training time.

    python benchmarks/flash_checkpoint.py cost --table-rows 20000,400000 --every 100 --steps 1500

``cost --without-ec``: the same for flash checkpoints on their own (``--fault-tolerance flash``,
stock partitioned tables, strict rounds) beside no protection and a stock checkpoint every N steps.

``restore``: in one process, 3 PS servers holding GB of float variables; capture, write to shared
memory (own + peer) and to disk, restore from the own copy, the peer copy and disk, and the stock
sharded Saver's save and restore of the same variables.

    python benchmarks/flash_checkpoint.py restore --gb 0.25,1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

import launched_job  # benchmarks/, beside this script


def cost(args: argparse.Namespace) -> None:
    if args.without_ec:
        configs = {
            "none": ["--fault-tolerance", "none"],
            f"flash every {args.every}": ["--fault-tolerance", "flash", "--flash-checkpoint-steps", str(args.every)],
            f"checkpoint every {args.every}": ["--fault-tolerance", "checkpoint", "--checkpoint-steps", str(args.every)],
        }
        what = "stock partitioned tables"
    else:
        configs = {
            "ecrec": ["--fault-tolerance", "ecrec", "--ec", "2+1"],
            f"ecrec + flash every {args.every}": ["--fault-tolerance", "ecrec", "--ec", "2+1",
                                                  "--flash-checkpoint-steps", str(args.every)],
            f"ecrec + checkpoint every {args.every}": ["--fault-tolerance", "ecrec", "--ec", "2+1",
                                                       "--checkpoint-steps", str(args.every)],
        }
        what = "ecrec 2+1"
    first = next(iter(configs))
    print(f"\ncost: {what}, 3 PS, --workers {args.workers}, {args.steps} steps, {args.repeats} interleaved repeats\n")
    print("| table rows | config | samples/s | ratio | rounds (skipped) | pause s median / max | write s median | pause share |")
    print("|---|---|---|---|---|---|---|---|")
    for rows in [int(r) for r in args.table_rows.split(",")]:
        results: dict[str, list[dict]] = {name: [] for name in configs}
        for i in range(args.repeats):
            for name, flags in configs.items():
                model_dir = os.path.join(args.out, f"{rows}-{len(results[name])}-{list(configs).index(name)}")
                shutil.rmtree(model_dir, ignore_errors=True)
                common = ["--ps", "3", "--workers", str(args.workers),
                          "--steps", str(args.steps), "--table-rows", str(rows)]
                report = launched_job.run([*common, *flags], model_dir, name)
                stats_file = os.path.join(model_dir, "flash_stats.json")
                if os.path.exists(stats_file):
                    with open(stats_file, encoding="utf-8") as fh:
                        report["flash"] = json.load(fh)
                results[name].append(report)
                print(f"  {rows} {name} #{i}: {report['samples_per_sec']:,.0f} samples/s", file=sys.stderr)
        base = statistics.median(r["samples_per_sec"] for r in results[first])
        for name, reports in results.items():
            rate = statistics.median(r["samples_per_sec"] for r in reports)
            flash = [r["flash"] for r in reports if "flash" in r]
            if flash:
                pauses = [p for f in flash for p in f["pause_seconds"]]
                writes = [w for f in flash for w in f["write_seconds"]]
                # Seconds of training at the steady rate (the pauses are inside it).
                train = statistics.median(r["global_step"] * r["config"]["batch_size"] / r["samples_per_sec"] for r in reports)
                share = sum(pauses) / len(flash) / train if train else 0.0
                extra = (f"{sum(f['rounds'] for f in flash)} ({sum(f['skipped'] for f in flash)}) | "
                         f"{statistics.median(pauses):.3f} / {max(pauses):.3f} | "
                         f"{statistics.median(writes) if writes else 0:.2f} | {share:.2%}")
            else:
                extra = "- | - | - | -"
            print(f"| {rows:,} | {name} | {rate:,.0f} | {rate / base:.3f} | {extra} |")
        with open(os.path.join(args.out, f"cost-{rows}.json"), "w", encoding="utf-8") as fh:
            json.dump(results, fh)


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def restore(args: argparse.Namespace) -> None:
    import numpy as np
    import tensorflow as tf

    from tf_ecrec.flash.config import Choice, Copy, FlashConfig, Manifest, Tier
    from tf_ecrec.flash.snapshots import FlashSnapshots

    tf.compat.v1.disable_eager_execution()
    ports = _ports(4)
    spec = {"ps": [f"127.0.0.1:{p}" for p in ports[:3]], "chief": [f"127.0.0.1:{ports[3]}"]}
    servers = [tf.distribute.Server(spec, job_name="ps", task_index=i) for i in range(3)]
    chief = tf.distribute.Server(spec, job_name="chief", task_index=0)
    print("\nrestore: 3 PS in one process, float32 variables, 8 per PS; seconds (GB/s)\n")
    print("| GB | capture (pause) | write own+peer | write disk | restore own | restore peer | restore disk | "
          "Saver save | Saver restore |")
    print("|---|---|---|---|---|---|---|---|---|")
    for gb in [float(x) for x in args.gb.split(",")]:
        work = tempfile.mkdtemp(prefix="flash_bench_")
        graph = tf.Graph()
        per_var = int(gb * (1 << 30) / 4 / 24)
        rows = max(1, per_var // 64)
        with graph.as_default():
            variables = []
            for p in range(3):
                with tf.device(f"/job:ps/task:{p}"):
                    for i in range(8):
                        variables.append(tf.compat.v1.get_variable(
                            f"t{p}_{i}", [rows, 64], tf.float32, tf.compat.v1.random_uniform_initializer(), use_resource=True))
            snap = FlashSnapshots(FlashConfig(every_steps=1, shm_dir=args.shm_dir), os.path.join(work, "model"), {}, 3, 1,
                                  variables=variables)
            saver = tf.compat.v1.train.Saver(variables, sharded=True)
            init = tf.compat.v1.global_variables_initializer()
            # A sparse update puts each variable in copy-on-read mode, as training's in-place updates do:
            # from then on the capture's read copies the bytes (a fresh variable's read would alias them).
            touch = [tf.raw_ops.ResourceScatterAdd(resource=v.handle, indices=[0], updates=tf.zeros([1, 64])) for v in variables]
        size = sum(snap.bytes.values()) / 1e9
        with tf.compat.v1.Session(chief.target, graph=graph) as sess:
            sess.run(init)
            sess.run(touch)
            t = {}

            def timed(name: str, fn) -> None:
                start = time.perf_counter()
                fn()
                t[name] = time.perf_counter() - start

            timed("capture", lambda: snap.capture(sess))
            timed("write", lambda: snap.write(sess, 1, 0, 0, [Tier.OWN, Tier.PEER]))
            timed("disk", lambda: snap.write(sess, 1, 0, 0, [Tier.DISK]))
            copies = {tier: Choice(1, 0, {p: Copy(tier, 0, Manifest(1, 0, p, 3, snap.names[p])) for p in range(3)})
                      for tier in Tier}
            for tier in Tier:
                timed(f"restore {tier.value}", lambda tier=tier: snap.restore(sess, copies[tier]))
            prefix = os.path.join(work, "saver", "ckpt")
            os.makedirs(os.path.dirname(prefix), exist_ok=True)
            timed("saver save", lambda: saver.save(sess, prefix))
            timed("saver restore", lambda: saver.restore(sess, prefix))
            values = sess.run(variables[0])
            assert np.isfinite(values).all()
        shutil.rmtree(snap.root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        cells = [f"{t[k]:.2f} ({size / t[k]:.2f})" for k in
                 ("capture", "write", "disk", "restore own", "restore peer", "restore disk", "saver save", "saver restore")]
        print(f"| {size:.2f} | " + " | ".join(cells) + " |", flush=True)
    del servers, chief


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("cost", "restore"))
    parser.add_argument("--table-rows", default="20000,400000")
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--without-ec", action="store_true", help="cost: --fault-tolerance flash on its own")
    parser.add_argument("--gb", default="0.25,1")
    parser.add_argument("--shm-dir", default="/dev/shm/tf_ecrec_bench")
    parser.add_argument("--out", default="/tmp/tf_ecrec_flash_bench")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    (cost if args.mode == "cost" else restore)(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
