"""What a trainer spends before and beside its steps: its input's generation and its graph's building.

Two measurements, each repeated ``--repeats`` times and reported as medians:

* ``data``: a trainer's share of the synthetic input (`tf_ecrec.data.synthetic`): every other shard
  of ``--shard-batches`` batches of ``--batch`` records, as one of two trainers leases them, read
  with blocks of 4,096 records (before 2026-11-28) and of the current `BLOCK`, interleaved; CPU
  milliseconds per 1,000 records read, and the ratio.
* ``graph``: the chief's ``model_fn`` of the launcher's DLRM under ``--fault-tolerance ecrec``, for
  each ``--ec`` code on K+R PS (``TF_CONFIG`` set for that cluster; no server is started): the ops it
  builds, those of the rebuild (``ec_rebuild``), and its CPU seconds (best of ``--repeats``).  The
  ``model_fn`` runs at a job's start and again at every failover BUILD (a PS moved).

    python benchmarks/startup_cost.py                      # both, 2+1 and 4+1
    python benchmarks/startup_cost.py --only graph --ec 2+2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def data_cost(block: int, batch: int, shard_batches: int, shards: int) -> float:
    """CPU ms per 1,000 records of one of two trainers' reads with blocks of `block` records."""
    from tf_ecrec.data import synthetic

    saved = synthetic.BLOCK
    synthetic.BLOCK = block  # a benchmark's comparison of two block sizes, restored below
    try:
        source = synthetic.SyntheticCriteo([2000] * synthetic.NUM_CAT, 1 << 30)
        shard = batch * shard_batches
        started, records = time.process_time(), 0
        for k in range(0, 2 * shards, 2):
            for b in range(shard_batches):
                lo = k * shard + b * batch
                source.read(lo, lo + batch)
                records += batch
        return (time.process_time() - started) / records * 1e6
    finally:
        synthetic.BLOCK = saved


def graph_cost(ec: str, repeats: int) -> dict:
    k, r = (int(x) for x in ec.split("+"))
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"chief": ["127.0.0.1:1"], "ps": [f"127.0.0.1:{2 + p}" for p in range(k + r)],
                    "worker": ["127.0.0.1:99"]},
        "task": {"type": "chief", "index": 0}})
    import tensorflow as tf

    from tf_ecrec.data.pipeline import StaticShards, make_dataset
    from tf_ecrec.erasure.code import ECConfig
    from tf_ecrec.estimator.model_fn import ec_model_fn
    from tf_ecrec.launcher.job.models import load_model, model_params
    from tf_ecrec.launcher.job.spec import JobSpec
    from tf_ecrec.launcher.task.entry import make_source
    from tf_ecrec.layout.device import ECDeviceFn

    job = JobSpec(fault_tolerance="ecrec", model_dir="/tmp/tf_ecrec_startup_cost", table_rows=2000, embedding_dim=8,
                  ec=ec, ps=k + r)
    module = load_model(job.model)
    params = {**model_params(job, module), "ec": True}
    run_config = tf.estimator.RunConfig(model_dir=job.model_dir)
    run_config = run_config.replace(device_fn=ECDeviceFn.from_run_config(run_config))
    estimator = tf.estimator.Estimator(model_fn=ec_model_fn(module.model_fn, ECConfig.parse(ec)), params=params,
                                       config=run_config)
    source = make_source(job, params)
    shards = StaticShards(source.num_records, job.shard_batches * job.batch_size, 1, 0)
    seconds, ops, rebuild = [], 0, 0
    for _ in range(repeats):
        graph = tf.Graph()
        with graph.as_default(), graph.device(run_config.device_fn):
            dataset = make_dataset(source, shards, job.batch_size, params["table_sizes"])
            features, labels = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
            tf.compat.v1.train.get_or_create_global_step()
            started = time.process_time()
            estimator._call_model_fn(features, labels, tf.estimator.ModeKeys.TRAIN, estimator.config)
            seconds.append(time.process_time() - started)
        ops = len(graph.get_operations())
        rebuild = sum(1 for op in graph.get_operations() if op.name.startswith("ec_rebuild"))
    return {"ec": ec, "ps": k + r, "ops": ops, "rebuild_ops": rebuild, "cpu_seconds_best": round(min(seconds), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["data", "graph"], default=None)
    parser.add_argument("--ec", default="2+1,4+1", help="codes for the graph part, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--shard-batches", type=int, default=8)
    parser.add_argument("--shards", type=int, default=100, help="shards one trainer reads per sample")
    args = parser.parse_args()
    if args.only in (None, "data"):
        from tf_ecrec.data.synthetic import BLOCK

        samples: dict[int, list[float]] = {4096: [], BLOCK: []}
        for _ in range(args.repeats):
            for block in samples:
                samples[block].append(data_cost(block, args.batch, args.shard_batches, args.shards))
        med = {b: statistics.median(v) for b, v in samples.items()}
        print(json.dumps({"part": "data", "cpu_ms_per_1000_records": {str(b): round(v, 2) for b, v in med.items()},
                          "ratio_current_to_4096": round(med[BLOCK] / med[4096], 3)}))
    if args.only in (None, "graph"):
        for ec in args.ec.split(","):
            print(json.dumps({"part": "graph", **graph_cost(ec.strip(), args.repeats)}))


if __name__ == "__main__":
    main()
