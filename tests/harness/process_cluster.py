"""A TF_CONFIG cluster of local processes, started the way a cluster launcher starts pods.

Each task is ``command`` run with its own TF_CONFIG (the cluster and the task,
as a Kubeflow TFJob operator injects it; the evaluator is not in the cluster),
its output in ``<log_dir>/<type>-<index>.log``.  Tests kill and restart tasks
(a pod restarted behind its stable name: same address) and wait for the
trainers to finish.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any


def free_port() -> int:
    from harness.ports import free_port as pick

    return pick()


def tf_config(cluster: dict[str, list[str]], task_type: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


class ProcessCluster:
    """Processes of one job; ``tasks`` maps ``type:index`` to its Popen.

    Args:
      command: the argv every task runs (the same script for all, as in a TFJob).
      jobs: task counts by type, e.g. ``{"chief": 1, "worker": 1, "ps": 2, "evaluator": 1}``.
      log_dir: where each task's log goes.
      env: extra environment for every task.
      host: the address tasks listen on.
      fork: start each task forked from the test process's fork server (`harness.zygote`: TensorFlow
        imported once, about 5 CPU-s fewer per task) instead of as a new interpreter; a test of what
        happens at a process's start (the kernels' loading) keeps the default.
    """

    def __init__(self, command: Sequence[str], jobs: dict[str, int], log_dir: str,
                 env: dict[str, str] | None = None, host: str = "localhost",
                 env_of: Callable[[str, int], dict[str, str]] | None = None, fork: bool = False) -> None:
        self.command = list(command)
        self.fork = fork
        self.log_dir = log_dir
        os.makedirs(log_dir, exist_ok=True)
        self.cluster = {t: [f"{host}:{free_port()}" for _ in range(n)]
                        for t, n in jobs.items() if t != "evaluator" and n > 0}
        self.jobs = dict(jobs)
        self.env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        self.env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", **(env or {})})
        self._env_of = env_of
        self.tasks: dict[str, Any] = {}  # subprocess.Popen, or a process forked by `harness.zygote`

    def log(self, task: str) -> str:
        path = os.path.join(self.log_dir, task.replace(":", "-") + ".log")
        if not os.path.exists(path):
            return ""
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def start(self, task: str) -> None:
        task_type, index = task.split(":")
        env = {**self.env, "TF_CONFIG": tf_config(self.cluster, task_type, int(index))}
        if self._env_of is not None:
            env.update(self._env_of(task_type, int(index)))
        out = open(os.path.join(self.log_dir, task.replace(":", "-") + ".log"), "ab")
        if self.fork:
            from harness import zygote  # pylint: disable=import-outside-toplevel

            self.tasks[task] = zygote.popen(self.command, env=env, stdout=out, stderr=subprocess.STDOUT, name=task)
        else:
            self.tasks[task] = subprocess.Popen(self.command, env=env, stdout=out, stderr=subprocess.STDOUT)
        out.close()

    def start_all(self) -> None:
        for task_type in ("ps", "chief", "worker", "evaluator"):
            for index in range(self.jobs.get(task_type, 0)):
                self.start(f"{task_type}:{index}")

    def kill(self, task: str) -> None:
        proc = self.tasks[task]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def last_step(self, task: str = "chief:0") -> int:
        """The last global step the Estimator logged in `task`'s log ("loss = ..., step = N"), -1 before any."""
        steps = re.findall(r"step = (\d+)", self.log(task))
        return int(steps[-1]) if steps else -1

    def wait_for_step(self, step: int, timeout: float = 300, task: str = "chief:0") -> int:
        deadline = time.time() + timeout
        while time.time() < deadline:
            seen = self.last_step(task)
            if seen >= step:
                return seen
            proc = self.tasks[task]
            if proc.poll() is not None:
                raise AssertionError(f"{task} exited with {proc.returncode}:\n{self.log(task)[-4000:]}")
            time.sleep(0.2)
        raise AssertionError(f"{task} did not reach step {step} in {timeout} s:\n{self.log(task)[-4000:]}")

    def wait(self, tasks: Sequence[str], timeout: float = 600) -> dict[str, int]:
        """Waits for `tasks` to exit; returns their exit codes (AssertionError with the logs on timeout)."""
        deadline = time.time() + timeout
        codes: dict[str, int] = {}
        for task in tasks:
            try:
                codes[task] = self.tasks[task].wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{task} still running after {timeout} s:\n{self.log(task)[-4000:]}") from None
        return codes

    def stop(self) -> None:
        for proc in self.tasks.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.tasks.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
