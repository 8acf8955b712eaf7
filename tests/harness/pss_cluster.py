"""A local TF2 ParameterServerStrategy cluster of real processes, for the `tf_ecrec.pss` tests.

The PS and worker tasks are ``tf.distribute.Server`` processes that load the
op library and reconnect fast (as the launcher's tasks, `harness.pss_server`);
the test's own process is the coordinator.  They are forked from the test
process's fork server (`harness.zygote`), which imports TensorFlow once for
all of them, every restart and every other cluster: a cluster of 3 PS and 2
workers otherwise spends about 25 s of CPU importing it five times.  A PS can be killed and restarted at its address
or at a new one (`restart(..., new_port=True)`), which its `resolver()`
then reports, as a cluster resolver backed by a scheduler would.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from harness import zygote
from tf_ecrec.launcher.forkserver import start_process


def free_port() -> int:
    from harness.ports import free_port as pick

    return pick()


class ServerForks:
    """Starts TF server processes (`harness.pss_server`) forked from one fork server, and waits for
    each to serve.  ``plain``: a bare ``tf.distribute.Server`` (for facts of TensorFlow itself)."""

    def __init__(self, plain: bool = False) -> None:
        tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.plain = plain
        self._env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
                     "PYTHONPATH": os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH", "")) if p)}
        self._forks = zygote.server()  # None (TF_ECREC_FORKSERVER=0): each task imports on its own

    def spawn(self, spec: dict[str, list[str]], job: str, index: int) -> tuple[Any, Any]:
        """Starts the task; returns its process and the stream its ``up`` line comes on."""
        read, write = os.pipe()
        args = [json.dumps(spec), job, str(index), *(["plain"] if self.plain else [])]
        # TF_ECREC_TEST_TASK_LOGS=DIR keeps each task's stderr (appended, one file per task) for a hang's post-mortem.
        logs = os.environ.get("TF_ECREC_TEST_TASK_LOGS")
        err_path = os.path.join(logs, f"{job}-{index}.log") if logs else os.devnull
        with open(os.devnull, "rb") as null_in, open(err_path, "ab") as err_out:
            try:
                env = {**self._env, "TF_ECREC_TASK": f"{job}:{index}"}  # whom an armed failpoint names
                proc = start_process(self._forks, "harness.pss_server", args, env, null_in, write, err_out,
                                     name=f"{job}:{index}")
            finally:
                os.close(write)
        return proc, os.fdopen(read, encoding="utf-8")

    @staticmethod
    def wait_up(proc: Any, up: Any, what: str) -> None:
        with up:
            line = up.readline().strip()
        assert line == "up", f"{what} did not start (exit {proc.poll()})"

    def start(self, spec: dict[str, list[str]], job: str, index: int) -> Any:
        """`spawn` and `wait_up`: the task's process, serving."""
        proc, up = self.spawn(spec, job, index)
        self.wait_up(proc, up, f"{job}:{index}")
        return proc

    def close(self) -> None:
        """The server is the test process's (`harness.zygote`), shared with every other cluster: it stays up."""


class PSSCluster:
    """``num_ps`` PS and ``num_workers`` worker processes; the caller is the chief (coordinator)."""

    def __init__(self, num_ps: int, num_workers: int) -> None:
        self.spec: dict[str, list[str]] = {
            "chief": [f"127.0.0.1:{free_port()}"],
            "worker": [f"127.0.0.1:{free_port()}" for _ in range(num_workers)],
            "ps": [f"127.0.0.1:{free_port()}" for _ in range(num_ps)],
        }
        self.procs: dict[tuple[str, int], Any] = {}  # subprocess.Popen, or forkserver.ForkedProcess
        self._forks = ServerForks()
        started = {}
        for job in ("ps", "worker"):  # all forked first, then waited for: they start side by side
            for i in range(len(self.spec[job])):
                self.procs[(job, i)], started[(job, i)] = self._forks.spawn(self.spec, job, i)
        for key, up in started.items():
            self._forks.wait_up(self.procs[key], up, f"{key[0]}:{key[1]}")

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
        self.procs[(job, index)] = self._forks.start(self.spec, job, index)

    def resolver(self) -> Any:
        return movable_resolver_class()(self)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._forks.close()


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
