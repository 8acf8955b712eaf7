"""How fast a lost PS is rebuilt, with nothing else running: the PS-side rebuild alone, and where its time goes.

Each PS is its own process (a `tf.distribute.Server`); this process is the
chief.  The graph is the DLRM example's storage: one `EmbeddingCollection` of
26 tables x ``--rows`` x 16, Adagrad, a code over ``--ps`` PS.  For each slice
size it initialises the tables, destroys every resource of ps:1 (what a
restart at the same address leaves) and times the chief's recovery:

- ``sync``: `RecoveryPlan(background=False)`: settle, decode and write every
  lost row before returning (what trainers would wait for);
- ``background xN``: T0 (`begin_background`), then the chief's loops
  installing every row with no lookup asking (trainers would run meanwhile),
  N slices in flight (``--walkers``).

Both figures are bytes of the rebuilt PS's rows (values, slots, parity) per
second from the start of the recovery to its last write.  ``--trace`` also
prints where one slice's time goes (per op type and device, from a traced
session call).

    python benchmarks/rebuild_speed.py                          # 300,000 rows per table (1 GB of tables), 3 PS
    python benchmarks/rebuild_speed.py --rows 100000 --slice-mb 1,8,32 --trace
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

from tf_ecrec.cluster.tf_config import with_tf_environment
from tf_ecrec.launcher.ports import pick_ports

TABLES, DIM = 26, 16
# The PS processes and this one start TensorFlow as the launcher's tasks do (before it is imported).
os.environ.update(with_tf_environment(os.environ))


def start_ps(spec: dict, index: int) -> subprocess.Popen:
    code = (
        "import json, sys, tensorflow as tf\n"
        "from tf_ecrec.ops import load_library\n"
        "load_library()\n"
        f"spec = json.loads({json.dumps(json.dumps(spec))})\n"
        f"tf.distribute.Server(spec, job_name='ps', task_index={index}, start=True).join()\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def build(rows: int, num_ps: int, k: int, r: int, slice_bytes: int, background: bool):
    import tensorflow as tf

    import tf_ecrec
    from tf_ecrec.layout.device import ps_index
    from tf_ecrec.recovery.graph import WHOLE_MARKERS
    from tf_ecrec.recovery.plan import RecoveryPlan
    from tf_ecrec.step.embedding import ECContext, set_context

    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device(tf_ecrec.ECDeviceFn(num_ps=num_ps, worker_device="/job:chief")):
        step = tf.compat.v1.train.get_or_create_global_step()
        set_context(ECContext(tf_ecrec.ECConfig(k, r), num_ps))
        coll = tf_ecrec.EmbeddingCollection("t", [(f"t{i}", rows) for i in range(TABLES)], DIM)
        ids = tf.compat.v1.placeholder(tf.int64, [None, TABLES])
        loss = tf.reduce_sum(coll.lookup_all(ids))
        opt = tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1), commit_timeout_ms=0)
        opt.minimize(loss, global_step=step)
        plan = RecoveryPlan(opt, background=background, slice_bytes=slice_bytes)
        markers = tf.compat.v1.get_collection(WHOLE_MARKERS)
        init = tf.group(tf.compat.v1.global_variables_initializer(), *[m.initializer for m in markers])
        lost_vars = [v for v in [*tf.compat.v1.global_variables(), *markers] if ps_index(v.device) == 1]
        destroy = [tf.raw_ops.DestroyResourceOp(resource=v.handle, ignore_lookup_error=True) for v in lost_vars]
        with tf.device(opt.logs[1].device):
            destroy.append(tf.raw_ops.DestroyResourceOp(resource=opt.logs[1], ignore_lookup_error=True))
        destroy_op = tf.group(*destroy)
        lost_bytes = sum(v.shape.num_elements() * v.dtype.size for v in lost_vars
                         if v.shape.rank == 2 and v.shape[0] > 1000)  # table rows: data, slots, parity
    graph.finalize()
    return graph, plan, init, destroy_op, lost_bytes


def profile(sess, plan, lost: list[int]) -> list[tuple[str, float, int]]:
    """(op type @ device, ms, count) of one traced walk slice, largest first."""
    import tensorflow as tf

    job = plan.rebuilder.begin_background(sess, lost)
    fetch, feeds = job._slices[0]
    meta = tf.compat.v1.RunMetadata()
    sess.run(fetch, feeds, options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
             run_metadata=meta)
    spent: dict[str, list[float]] = collections.defaultdict(list)
    for dev in meta.step_stats.dev_stats:
        where = dev.device.split("/")[1] if "/" in dev.device else dev.device
        for node in dev.node_stats:
            kind = node.timeline_label.split("=")[-1].split("(")[0].strip() or node.node_name
            spent[f"{kind} @ {where}"].append((node.all_end_rel_micros) / 1000)
    return sorted(((k, sum(v), len(v)) for k, v in spent.items()), key=lambda x: -x[1])[:15]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300_000, help="rows per table")
    parser.add_argument("--ps", type=int, default=3)
    parser.add_argument("--ec", default="2+1")
    parser.add_argument("--slice-mb", default="8,32", help="slice sizes to compare, MB, comma-separated")
    parser.add_argument("--walkers", default="1,2", help="background walking threads to compare, comma-separated")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--out", default="/tmp/tf_ecrec_rebuild_speed.json")
    args = parser.parse_args()
    k, r = (int(x) for x in args.ec.split("+"))

    import tensorflow as tf

    ports = pick_ports(args.ps + 1)
    spec = {"ps": [f"127.0.0.1:{p}" for p in ports[: args.ps]], "chief": [f"127.0.0.1:{ports[-1]}"]}
    procs = [start_ps(spec, i) for i in range(args.ps)]
    chief = tf.distribute.Server(spec, job_name="chief", task_index=0, start=True)
    results = []
    try:
        from tf_ecrec.rebuild import background as background_rebuild

        modes = [("sync", 1)] + [("background", int(w)) for w in args.walkers.split(",")]
        for slice_mb in (int(x) for x in args.slice_mb.split(",")):
            for mode, walkers in modes:
                background_rebuild.WALKERS = walkers
                graph, plan, init, destroy, lost_bytes = build(args.rows, args.ps, k, r, slice_mb << 20,
                                                               background=mode == "background")
                with tf.compat.v1.Session(chief.target, graph=graph) as sess:
                    tf.compat.v1.Session.reset(chief.target)
                    sess.run(init)
                    for _ in range(args.repeat):
                        sess.run(destroy)
                        started = time.time()
                        result = plan.prepare(sess, restore=None)
                        resumed = time.time() - started
                        if mode == "background":
                            plan.wait_background()
                            job = plan.job
                            rows_installed = job.rows_installed
                        else:
                            rows_installed = None
                        seconds = time.time() - started
                        row = {"slice_mb": slice_mb, "mode": mode if mode == "sync" else f"background x{walkers}", "rows_per_table": args.rows, "ps": args.ps,
                               "ec": args.ec, "lost_bytes": lost_bytes, "method": result.method,
                               "seconds_to_resume": round(resumed, 3), "seconds": round(seconds, 3),
                               "gb_per_sec": round(lost_bytes / seconds / 1e9, 3), "rows_installed": rows_installed}
                        results.append(row)
                        print(json.dumps(row), file=sys.stderr)
                    if args.trace and mode == "background" and walkers == 1:
                        sess.run(destroy)
                        plan.prepare(sess, restore=None)
                        plan.stop_background()
                        sess.run(destroy)
                        for name, ms, n in profile(sess, plan, [1]):
                            print(f"    {ms:9.1f} ms  {n:4d} x  {name}", file=sys.stderr)
    finally:
        for p in procs:
            p.kill()
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1)
    gb = TABLES * args.rows * DIM * 4 * 2 / 1e9
    print(f"\n{TABLES} tables x {args.rows:,} rows x {DIM} (values + Adagrad slots: {gb:.2f} GB), {args.ps} PS, "
          f"ec {args.ec}, ps:1 destroyed; nothing else running\n")
    print("| slice | mode | bytes of ps:1 rebuilt | s until trainers may step | s to the last row | GB/s |")
    print("|---|---|---|---|---|---|")
    for row in results:
        print(f"| {row['slice_mb']} MB | {row['mode']} | {row['lost_bytes'] / 1e6:,.0f} MB | {row['seconds_to_resume']} | "
              f"{row['seconds']} | {row['gb_per_sec']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
