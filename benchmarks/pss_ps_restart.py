"""What TensorFlow 2.15's ParameterServerStrategy does when a PS is killed and restarted under a live coordinator.

    python benchmarks/pss_ps_restart.py

Starts 2 PS and 1 worker as `tf.distribute.Server` processes and a coordinator here; `v0` on PS 0 and
`v1` on PS 1 (placed with `colocate_vars_with`); schedules a step that adds 1 to both; kills PS 1,
restarts it at its address, and prints what the survivor's and the lost PS's variables do before
and after `update_server_def` (docs/pss.md, "Measured"). The seed of the TF2 recovery design.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from tf_ecrec.cluster.tf_config import with_tf_environment

os.environ.update(with_tf_environment(os.environ))

SERVER = """
import json, sys
import tensorflow as tf
spec, job, index = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job, task_index=index, protocol="grpc", start=True)
print("up", flush=True)
server.join()
"""


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def _try(what: str, fn: Callable[[], Any]) -> None:
    try:
        print(f"{what}: {fn()}")
    except Exception as exc:
        print(f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")


def main() -> int:
    import tensorflow as tf
    from tensorflow.python.eager import context

    spec = {"worker": [f"localhost:{_port()}"], "ps": [f"localhost:{_port()}" for _ in range(2)],
            "chief": [f"localhost:{_port()}"]}
    procs: dict[tuple[str, int], subprocess.Popen[str]] = {}

    def start(job: str, index: int) -> None:
        proc = subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(spec), job, str(index)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        proc.stdout.readline()
        procs[(job, index)] = proc

    for job, count in (("worker", 1), ("ps", 2)):
        for index in range(count):
            start(job, index)
    try:
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            anchors = [tf.Variable(0, name=f"anchor{i}") for i in range(2)]
            with strategy.extended.colocate_vars_with(anchors[0]):
                v0 = tf.Variable(tf.ones([4]), name="v0")
            with strategy.extended.colocate_vars_with(anchors[1]):
                v1 = tf.Variable(tf.ones([4]) * 2, name="v1")
        print("devices:", v0.device, v1.device)

        @tf.function
        def step() -> Any:
            v0.assign_add(tf.ones([4]))
            v1.assign_add(tf.ones([4]))
            return v0.read_value()[0]

        def run_step() -> str:
            coordinator.schedule(step)
            coordinator.join()
            return "ok"

        for _ in range(3):
            run_step()
        print("after 3 steps:", v0.numpy(), v1.numpy())
        procs[("ps", 1)].kill()
        procs[("ps", 1)].wait()
        _try("a step after PS 1 was killed", run_step)
        start("ps", 1)
        print("PS 1 restarted at its address")
        _try("read v0", lambda: v0.numpy())
        _try("read v1", lambda: v1.numpy())
        _try("update_server_def", lambda: context.context().update_server_def(context.context()._server_def))
        _try("read v0", lambda: v0.numpy())
        _try("read v1", lambda: v1.numpy())
        _try("assign v1", lambda: v1.assign(tf.zeros([4])).numpy())
        _try("a step after the restart", run_step)
    finally:
        for proc in procs.values():
            proc.kill()
    sys.stdout.flush()
    os._exit(0)  # the coordinator's threads would wait on the dead cluster


if __name__ == "__main__":
    raise SystemExit(main())
