"""The cost of erasure-coded protection alone: the same tables, the same storage, with and without it.

`benchmarks/fault_tolerance.py throughput` compares the launcher's stock DLRM
(26 tables, each partitioned over the PS tasks) with the protected one (all
tables of a width in one variable per PS, `tf_ecrec.EmbeddingCollection`):
two storage layouts as well as the protection.  This benchmark holds the
storage fixed and varies only the optimizer:

* ``stock``: `EmbeddingCollection` storage trained by the stock v1 Adagrad
  (`ResourceSparseApplyAdagrad` on each PS variable; no parity, no replicas);
* ``ecrec K+R [batched N]``: the same storage under `tf_ecrec.ECOptimizer`
  (apply with delta, parity folds, dense and global-step replicas, delta
  logs) as Estimator jobs run it: a step of applies and a count, its folds
  and commit in a fold round every N steps (default 8; `tf_ecrec.step.batched_commit`);
* ``ecrec K+R carried``: each step's folds in its run, its commit carried by
  the next step's run (`tf_ecrec.step.carried_commit`);
* ``ecrec K+R in-step``: folds and commit in the step's own run (TF2
  ParameterServerStrategy steps, and Estimator steps before 2026-11-28).

Method.  One process runs, for each configuration, its own PS tasks and one
worker as in-process TensorFlow servers on loopback (gRPC between them, as
in a job; own servers, because the configurations' variables share names);
the model is
DLRM-shaped: 26 tables of ``--rows`` rows of width ``--dim`` (one
collection), a 2-layer MLP (``--mlp dlrm``: the launcher's five layers with biases) over the concatenated rows, batch ``--batch``, ids
Zipf-distributed.  Batches are precomputed and fed; every configuration sees
the same batches.  Each timed sample runs ``--steps`` steps after a warm-up;
samples are interleaved (stock, 2+1, 4+1, stock, ...) so that drift on a
shared machine falls on all alike.  Reported: median steps/s and the median
of the per-round ratios to ``stock`` (higher is better), and the CPU time of the
whole process (every server and the client) per step with its ratio to
``stock``: on a machine whose cores the servers share, the protection's own
cost apart from waiting.  Nothing asserts on timings.

    python benchmarks/protection_cost.py                   # 5 PS, ~2-4 min
    python benchmarks/protection_cost.py --ps 5 --rounds 7 --steps 300
    python benchmarks/protection_cost.py --profile 20      # + where a step's time goes
    python benchmarks/protection_cost.py --cuts            # the step run up to each phase

``--cuts`` runs, beside ``stock``, the ``ecrec 2+1 in-step`` step run up to each
of its phases (its applies; then its folds; its count; its commit, the whole
step): what each phase adds, in time and in CPU.

``--profile N`` traces N steps of each configuration after the timed rounds
and prints, per kind of op (lookups, the stock or delta-logging apply,
parity folds, the global-step count, the commit rounds, transfers), the
median of when its first op starts and its last op ends within the step
(ms from the step's first op) and its summed op time: the step's critical
path, phase by phase.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from tf_ecrec.cluster.tf_config import with_tf_environment

os.environ.update(with_tf_environment(os.environ))

import numpy as np
import tensorflow as tf

import tf_ecrec
from tf_ecrec.cluster.threads import ENV_TASKS_PER_HOST, ps_thread_pools
from tf_ecrec.layout.device import ECDeviceFn

TABLES = 26


def _servers(num_ps: int) -> tuple[dict[str, list[str]], list[tf.distribute.Server]]:
    socks = [socket.socket() for _ in range(num_ps + 1)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    spec = {"ps": [f"127.0.0.1:{p}" for p in ports[:num_ps]], "worker": [f"127.0.0.1:{ports[-1]}"]}
    # The PS servers' thread pools sized as a launched job's are (tf_ecrec.cluster.threads): here num_ps + 1
    # servers share this host.  TF_ECREC_PS_THREADS=default keeps TensorFlow's sizing.
    pools = ps_thread_pools({**os.environ, ENV_TASKS_PER_HOST: str(num_ps + 1)})
    servers = [tf.distribute.Server(spec, job_name="ps", task_index=i, config=pools.config() if pools else None)
               for i in range(num_ps)]
    servers.append(tf.distribute.Server(spec, job_name="worker", task_index=0))
    return spec, servers


MLP = {"small": (64, 1), "dlrm": (64, 16, 64, 32, 1)}
"""`--mlp`: the dense layers' widths; "dlrm" (with biases: ten dense variables) is the launcher's DLRM's."""


def _graph(config: str, num_ps: int, rows: int, dim: int, mlp: str = "small") -> tuple[tf.Graph, object, object, object, object]:
    """(graph, ids placeholder, train op, init op, carried commit or None) of one configuration."""
    ec = tf_ecrec.ECConfig(2, 1) if config == "stock" else tf_ecrec.ECConfig.parse(config.split()[1])
    commit = "in_step" if "in-step" in config else "carried" if "carried" in config else "batched"
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device(ECDeviceFn(num_ps=num_ps, worker_device="/job:worker/task:0")):
        tf.compat.v1.set_random_seed(1)
        step = tf.compat.v1.train.get_or_create_global_step()
        coll = tf_ecrec.EmbeddingCollection("emb", [(f"C{i}", rows) for i in range(TABLES)], dim, ec=ec, num_ps=num_ps)
        ids = tf.compat.v1.placeholder(tf.int64, [None, TABLES])
        x = tf.reshape(coll.lookup_all(ids), [-1, TABLES * dim])
        init = tf.compat.v1.glorot_uniform_initializer(seed=2)
        for i, width in enumerate(MLP[mlp]):
            kernel = tf.compat.v1.get_variable(f"dense{i}", [int(x.shape[1]), width], initializer=init, use_resource=True)
            x = tf.matmul(x, kernel)
            if mlp == "dlrm":
                x += tf.compat.v1.get_variable(f"bias{i}", [width], initializer=tf.zeros_initializer(), use_resource=True)
            x = tf.nn.relu(x) if width > 1 else x
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.ones_like(x), logits=x))
        base = tf.compat.v1.train.AdagradOptimizer(0.05)
        opt = base if config == "stock" else tf_ecrec.ECOptimizer(base, ec=ec, commit=commit)
        train = opt.minimize(loss, global_step=step)
        init_op = tf.compat.v1.global_variables_initializer()
    graph.finalize()
    return graph, ids, train, init_op, getattr(opt, "carried_commit", None)


class _Runner:
    """Runs a configuration's step: plainly, or through its carried commit."""

    def __init__(self, sess, train, carried) -> None:
        self.sess, self.train, self.carried = sess, train, carried

    def __call__(self, feed, **kwargs):
        if self.carried is None:
            return self.sess.run(self.train, feed, **kwargs)
        return self.carried.run(self.sess, self.train, feed, **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=20000, help="rows of each of the 26 tables")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--mlp", choices=sorted(MLP), default="small",
                        help="the dense layers: small (2 kernels) or dlrm (5 layers with biases, as the launcher's DLRM)")
    parser.add_argument("--steps", type=int, default=200, help="steps per timed sample")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved samples per configuration")
    parser.add_argument("--configs", default="stock,ecrec 2+1,ecrec 2+1 in-step,ecrec 4+1,ecrec 4+1 in-step")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="trace N steps of each configuration")
    parser.add_argument("--cuts", action="store_true",
                        help="instead: ecrec 2+1 in-step run up to each phase (apply, fold, count, commit), beside stock")
    args = parser.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",")]
    if args.cuts:
        configs = ["stock", *(f"{CUT_CONFIG} to {phase}" for phase in CUTS)]
    rng = np.random.default_rng(0)
    batches = [np.minimum(rng.zipf(1.2, (args.batch, TABLES)) - 1, args.rows - 1) for _ in range(64)]
    sessions = {}
    servers = []
    for name in configs:
        _, own = _servers(args.ps)
        servers += own
        config, _, cut = name.partition(" to ")
        graph, ids, train, init_op, carried = _graph(config, args.ps, args.rows, args.dim, args.mlp)
        if cut and cut != "commit":
            # A bound, not a protocol: the step stops after `cut` (its later phases never run, so the
            # delta logs keep every step's entries; a few hundred steps of them fit in memory).
            (optimizer,) = tf_ecrec.step.optimizer.protectors(graph)
            train = optimizer.phases[cut]
        if "batched" in config and config.split("batched")[1].strip():  # "ecrec 2+1 batched 16": a round every 16 steps
            carried.every = int(config.split("batched")[1].split()[0])
            carried.bound = max(carried.bound, 4 * carried.every)
        sess = tf.compat.v1.Session(own[-1].target, graph=graph)
        sess.run(init_op)
        step = _Runner(sess, train, carried)
        for b in batches[:20]:  # warm-up
            step({ids: b})
        sessions[name] = (sess, ids, step)
    rates: dict[str, list[float]] = {name: [] for name in configs}
    cpus: dict[str, list[float]] = {name: [] for name in configs}  # CPU-seconds per step, every server and the client
    for r in range(args.rounds):
        order = configs[r % len(configs):] + configs[: r % len(configs)]
        for name in order:
            sess, ids, step = sessions[name]
            start, cpu = time.perf_counter(), time.process_time()
            for i in range(args.steps):
                step({ids: batches[i % len(batches)]})
            rates[name].append(args.steps / (time.perf_counter() - start))
            cpus[name].append((time.process_time() - cpu) / args.steps)
    print(f"\nprotection cost: {args.ps} PS in process, 26 tables x {args.rows} rows x {args.dim}, batch {args.batch}, "
          f"{args.rounds} interleaved samples of {args.steps} steps, medians\n")
    print(f"| config | steps/s | samples/s | ratio to {configs[0]} | CPU ms per step | CPU ratio to {configs[0]} |\n"
          "|---|---|---|---|---|---|")
    for name in configs:
        ratio = statistics.median(a / b for a, b in zip(rates[name], rates[configs[0]]))
        cpu_ratio = statistics.median(a / b for a, b in zip(cpus[name], cpus[configs[0]]))
        rate = statistics.median(rates[name])
        print(f"| {name} | {rate:,.1f} | {rate * args.batch:,.0f} | {ratio:.3f} | "
              f"{statistics.median(cpus[name]) * 1e3:.2f} | {cpu_ratio:.2f} |")
    if args.profile:
        print(f"\nwhere a step's time goes: median over {args.profile} traced steps, ms from the step's first op "
              "(first start / last end / summed op time)\n")
        for name in configs:
            sess, ids, step = sessions[name]
            rows = profile(step, ids, batches, args.profile)
            print(f"{name}:\n\n| ops | first start | last end | op time |\n|---|---|---|---|")
            for kind, (first, last, busy) in rows:
                print(f"| {kind} | {first:.2f} | {last:.2f} | {busy:.2f} |")
            print()
    for sess, _, _ in sessions.values():
        sess.close()
    return 0


CUT_CONFIG = "ecrec 2+1 in-step"
CUTS = ("apply", "fold", "count", "commit")

KINDS = (
    # (kind, predicate on the op type), first match wins
    ("commit, round 1", lambda t: t == "EcRec>DeltaLogCommitInOrder"),
    ("commit, round 2", lambda t: t == "EcRec>DeltaLogCommit"),
    ("parity and replica folds", lambda t: t.startswith("EcRec>ParityUpdate") or t == "EcRec>XorRows"),
    ("apply (+ delta)", lambda t: "Apply" in t),
    ("global step count", lambda t: t.startswith("EcRec>AssignAdd") or t == "AssignAddVariableOp"),
    ("lookups", lambda t: t in ("ResourceGather", "GatherV2", "EcRec>AwaitRebuiltRows", "DynamicStitch", "DynamicPartition")),
    ("transfers (send/recv)", lambda t: t in ("_Send", "_Recv", "_HostSend", "_HostRecv", "RecvTensor")),
)


def profile(step, ids, batches, steps: int) -> list[tuple[str, tuple[float, float, float]]]:
    """Per kind of op: medians over `steps` traced steps of (first start, last end, summed op time), in ms."""
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    samples: dict[str, list[tuple[float, float, float]]] = {}
    for i in range(steps):
        meta = tf.compat.v1.RunMetadata()
        step({ids: batches[i % len(batches)]}, options=options, run_metadata=meta)
        nodes = [n for d in meta.step_stats.dev_stats for n in d.node_stats if n.node_name not in ("_SOURCE", "_SINK")]
        t0 = min(n.all_start_micros for n in nodes)
        spans: dict[str, list[tuple[float, float]]] = {}
        for n in nodes:
            label = n.timeline_label.split(" = ", 1)[-1]
            op_type = label.split("(", 1)[0] if "(" in label else n.node_name.rsplit("/", 1)[-1]
            kind = next((k for k, test in KINDS if test(op_type)), "other")
            start = (n.all_start_micros - t0) / 1e3
            spans.setdefault(kind, []).append((start, start + n.all_end_rel_micros / 1e3))
        spans["whole step"] = [(0.0, max(e for v in spans.values() for _, e in v))]
        for kind, v in spans.items():
            samples.setdefault(kind, []).append(
                (min(s for s, _ in v), max(e for _, e in v), sum(e - s for s, e in v) if kind != "whole step" else 0.0)
            )
    order = [k for k, _ in KINDS] + ["other", "whole step"]
    return [
        (kind, tuple(statistics.median(x[j] for x in samples[kind]) for j in range(3)))  # type: ignore[misc]
        for kind in order if kind in samples
    ]


if __name__ == "__main__":
    sys.exit(main())
