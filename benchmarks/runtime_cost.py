"""What TensorFlow's distributed runtime costs per session call: per PS a call touches, per cross-task transfer.

A fold round's cost was measured to be mostly TensorFlow's runtime, not its work (docs/benchmarks.md, "The step,
the round's fixed cost and its bytes, apart"): an empty round cost about 11 ms of CPU on 3 PS.  This measures the
two unit prices that make it up, on in-process servers over loopback gRPC (as `protection_cost.py` runs them):

* ``worker only``: a call that runs one op on the client's own task (the floor of a call);
* ``one op on each PS``: a call that runs a tiny op on every PS (one graph partition per PS, no tensor moved);
* ``each PS -> worker``: the same, each PS's value fetched back to the worker (one transfer per PS);
* ``every PS -> every other PS``: a tiny tensor from every PS to every other (``ps * (ps - 1)`` transfers).

Reported per call: wall ms and CPU ms of the whole process (every server and the client), medians of
interleaved samples, and the derived CPU per PS partition and per PS-to-PS transfer.  Nothing asserts on timings.

    python benchmarks/runtime_cost.py                # 5 PS, about 30 s
    python benchmarks/runtime_cost.py --ps 3 --calls 1000
    python benchmarks/runtime_cost.py --pools auto   # every server sized as a launched PS (tf_ecrec.cluster.threads)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

from tf_ecrec.cluster.threads import ENV_PS_THREADS, ENV_TASKS_PER_HOST, ps_thread_pools
from tf_ecrec.launcher.ports import pick_ports


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _graph(num_ps: int) -> tuple[tf.Graph, dict[str, object], object]:
    graph = tf.Graph()
    with graph.as_default():
        values = []
        for i in range(num_ps):
            with tf.device(f"/job:ps/task:{i}"):
                values.append(tf.Variable(tf.zeros([4]), name=f"v{i}"))
        with tf.device("/job:worker/task:0"):
            local = tf.Variable(0.0, name="local")
        calls: dict[str, object] = {"worker only": local.assign_add(1.0).op}
        bumps = []
        for i, v in enumerate(values):
            with tf.device(f"/job:ps/task:{i}"):
                bumps.append(v.assign_add(tf.ones([4])).op)
        calls["one op on each PS"] = tf.group(*bumps)
        with tf.device("/job:worker/task:0"):
            calls["each PS -> worker"] = tf.add_n([tf.identity(v.read_value()) for v in values])
        outs = []
        for i in range(num_ps):
            for j in range(num_ps):
                if i != j:
                    with tf.device(f"/job:ps/task:{i}"):
                        x = values[i].read_value() * 2.0
                    with tf.device(f"/job:ps/task:{j}"):
                        outs.append(x + 1.0)
        calls["every PS -> every other PS"] = tf.group(*outs)
        init = tf.compat.v1.global_variables_initializer()
    return graph, calls, init


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ps", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300, help="calls per timed sample")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved samples per kind of call")
    parser.add_argument("--pools", default="default", metavar="INTRA,INTER",
                        help="every server's thread pools (TF_ECREC_PS_THREADS's forms; default: TensorFlow's sizing)")
    args = parser.parse_args()
    tf.compat.v1.disable_eager_execution()
    ports = pick_ports(args.ps + 1)
    spec = tf.train.ClusterSpec({"ps": [f"127.0.0.1:{p}" for p in ports[:-1]], "worker": [f"127.0.0.1:{ports[-1]}"]})
    pools = ps_thread_pools({ENV_PS_THREADS: args.pools, ENV_TASKS_PER_HOST: str(args.ps + 1)})
    config = pools.config() if pools else None
    servers = [tf.distribute.Server(spec, job_name="ps", task_index=i, config=config) for i in range(args.ps)]
    worker = tf.distribute.Server(spec, job_name="worker", task_index=0, config=config)
    graph, calls, init = _graph(args.ps)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
    with tf.compat.v1.Session(worker.target, graph=graph) as sess:
        sess.run(init)
        for op in calls.values():
            for _ in range(30):
                sess.run(op)
        for _ in range(args.rounds):
            for name, op in calls.items():
                cpu, wall = _cpu(), time.perf_counter()
                for _ in range(args.calls):
                    sess.run(op)
                samples[name].append(((time.perf_counter() - wall) / args.calls * 1e3, (_cpu() - cpu) / args.calls * 1e3))
    print(f"\nTensorFlow's runtime per session call: {args.ps} PS and a worker in process, loopback gRPC, "
          f"medians of {args.rounds} samples of {args.calls} calls, thread pools {pools or 'TensorFlow sized'}\n")
    print("| call | wall ms | CPU ms |\n|---|---|---|")
    med = {name: (statistics.median(w for w, _ in s), statistics.median(c for _, c in s)) for name, s in samples.items()}
    for name, (wall, cpu) in med.items():
        print(f"| {name} | {wall:.2f} | {cpu:.2f} |")
    partition = (med["one op on each PS"][1] - med["worker only"][1]) / args.ps
    transfer = (med["every PS -> every other PS"][1] - med["one op on each PS"][1]) / (args.ps * (args.ps - 1))
    print(f"\nCPU per PS partition a call runs: {partition:.2f} ms; per PS-to-PS transfer: {transfer:.2f} ms")
    del servers


if __name__ == "__main__":
    main()
