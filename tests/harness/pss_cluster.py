"""A local TF2 ParameterServerStrategy cluster of real processes, for the `tf_ecrec.pss` tests.

The PS and worker tasks are ``tf.distribute.Server`` processes that load the
op library and reconnect fast (as the launcher's tasks); the test's own
process is the coordinator.  A PS can be killed and restarted at its address
or at a new one (`restart(..., new_port=True)`), which its `resolver()`
then reports, as a cluster resolver backed by a scheduler would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

SERVER = """
import json, sys
from tf_ecrec.config import ClusterConfig
from tf_ecrec.launcher.task import start_server
from tf_ecrec.ops import load_library
load_library()
cluster, job, index = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
server = start_server(ClusterConfig(cluster, job, index))
print("up", flush=True)
server.join()
"""


def free_port() -> int:
    from harness.ports import free_port as pick

    return pick()


class PSSCluster:
    """``num_ps`` PS and ``num_workers`` worker processes; the caller is the chief (coordinator)."""

    def __init__(self, num_ps: int, num_workers: int) -> None:
        self.spec: dict[str, list[str]] = {
            "chief": [f"127.0.0.1:{free_port()}"],
            "worker": [f"127.0.0.1:{free_port()}" for _ in range(num_workers)],
            "ps": [f"127.0.0.1:{free_port()}" for _ in range(num_ps)],
        }
        self.procs: dict[tuple[str, int], subprocess.Popen[str]] = {}
        started = [self._spawn(job, i) for job in ("ps", "worker") for i in range(len(self.spec[job]))]
        for proc in started:
            self._wait_up(proc)

    def _spawn(self, job: str, index: int) -> subprocess.Popen[str]:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        proc = subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(self.spec), job, str(index)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        self.procs[(job, index)] = proc
        return proc

    @staticmethod
    def _wait_up(proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line == "up", f"a server did not start (exit {proc.poll()})"

    def kill(self, job: str, index: int) -> None:
        proc = self.procs[(job, index)]
        proc.kill()
        proc.wait()

    def restart(self, job: str, index: int, new_port: bool = False) -> None:
        """Starts the task again (killed first if alive); at a new address if `new_port`."""
        if self.procs[(job, index)].poll() is None:
            self.kill(job, index)
        if new_port:
            self.spec[job][index] = f"127.0.0.1:{free_port()}"
        self._wait_up(self._spawn(job, index))

    def resolver(self) -> Any:
        return movable_resolver_class()(self)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def fit_started() -> Any:
    """An epoch-level Keras callback whose ``event`` is set once fit runs its first epoch.  A thread that
    reads PS variables while fit trains waits on it first: such a read beside fit's own start (its
    recovery reading the model's bookkeeping variables) crashed the coordinator process of TensorFlow
    2.15 with SIGSEGV in CI (twice in three runs, never here); once epochs run it has not."""
    import tensorflow as tf

    class FitStarted(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.event = threading.Event()

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.event.set()

    return FitStarted()


def movable_resolver_class() -> type:
    import tensorflow as tf

    class _Resolver(tf.distribute.cluster_resolver.ClusterResolver):
        """The coordinator's view of the cluster, read from the harness each time (addresses may move)."""

        def __init__(self, cluster: PSSCluster) -> None:
            self._cluster = cluster
            self.task_type = "chief"
            self.task_id = 0
            self.rpc_layer = "grpc"

        def cluster_spec(self) -> Any:
            return tf.train.ClusterSpec({k: list(v) for k, v in self._cluster.spec.items()})

        def master(self, task_type: Any = None, task_id: Any = None, rpc_layer: Any = None) -> str:
            return ""

        def num_accelerators(self, task_type: Any = None, task_id: Any = None, config_proto: Any = None) -> dict[str, int]:
            return {}

    return _Resolver


def exit_with(case: Callable[[], None]) -> None:
    """Runs `case` and leaves at once (the coordinator's threads would wait on the cluster); 1 on failure.

    The traceback (and, on a crash, every thread's stack) goes to stdout: TensorFlow's teardown floods
    the tail of stderr that the failing test shows.
    """
    import faulthandler

    faulthandler.enable(file=sys.stdout, all_threads=True)
    code = 0
    try:
        case()
    except BaseException:
        traceback.print_exc(file=sys.stdout)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
