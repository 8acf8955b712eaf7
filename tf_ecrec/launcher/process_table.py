"""The process table of a launched job: every task's process, its state, its log, and the spare PS.

A task's state (`TaskState`)::

    PENDING  -> RUNNING      a non-chief worker starts once the chief has a session
    LATER    -> RUNNING      an --add-worker slot starts at its step
    RUNNING  -> KILLED       SIGKILL (--kill, lost by the master) or died from a signal
    KILLED   -> RUNNING      restarted (same or new address), or a spare took its role
    RUNNING  -> LEAVING      --remove-worker: SIGTERM
    LEAVING  -> REMOVED      it left (or was killed after the leave timeout)
    RUNNING  -> DONE         a trainer exited 0 (its data is finished)
    RUNNING  -> FAILED       exited with an error code: the run fails

Every process runs ``python -m tf_ecrec.launcher.task.entry job.json``: forked
from the launcher's fork server, TensorFlow already loaded
(`tf_ecrec.launcher.forkserver`), or, without one, started through
`tf_ecrec.launcher.child`; either way it dies with the launcher and has its
own TF_CONFIG and the environment every task shares, its output appended to
``<model_dir>/logs/<type>-<index>.log``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from typing import TextIO

from tf_ecrec.cluster.tf_config import ClusterConfig, with_tf_environment
from tf_ecrec.cluster.threads import ENV_TASKS_PER_HOST
from tf_ecrec.launcher.forkserver import ForkedProcess, ForkServer, start_process
from tf_ecrec.launcher.job.model_dir import job_file, log_file
from tf_ecrec.launcher.job.spec import ENV_SPARE_ADDRESS, JobSpec


class TaskState(str, enum.Enum):
    """Where a task's process stands (values as the launcher has always named them)."""

    PENDING = "pending"  # starts after the chief's session
    LATER = "later"  # an empty --add-worker slot
    RUNNING = "running"
    KILLED = "killed"
    LEAVING = "leaving"  # --remove-worker: asked to leave
    REMOVED = "removed"
    DONE = "done"
    FAILED = "failed"

    @property
    def label(self) -> str:
        """The state as the live progress line shows it."""
        return _LABELS[self]


_LABELS = {
    TaskState.RUNNING: "up", TaskState.KILLED: "DOWN", TaskState.DONE: "done", TaskState.FAILED: "FAILED",
    TaskState.PENDING: "...", TaskState.LATER: "-", TaskState.LEAVING: "leaving", TaskState.REMOVED: "gone",
}


@dataclasses.dataclass
class TaskProcess:
    """One task of the job and its current process (None before its first start)."""

    cluster: ClusterConfig
    process: subprocess.Popen | ForkedProcess | None = None
    log: TextIO | None = None
    state: TaskState = TaskState.PENDING
    exit_code: int | None = None
    started_at: float = 0.0
    member_since: float | None = None  # when the master's view last showed this process
    lost_restarts: int = 0
    leave_deadline: float = 0.0
    training: bool = False  # a trainer whose current process reported a step
    spare_address: str | None = None  # a spare PS standing by at this address (--spare-ps)
    label: str | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # what its process gets besides the job's

    @property
    def killable(self) -> bool:
        """Running, and for a trainer, training: a kill before its first step would hit nothing."""
        return self.state is TaskState.RUNNING and (self.training or self.cluster.task_type == "ps")

    @property
    def name(self) -> str:
        return self.label or self.cluster.task

    @property
    def alive(self) -> bool:
        """Its process runs now."""
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 15) -> str:
        """The last lines of its log."""
        if self.log is None:
            return ""
        self.log.flush()
        try:
            with open(self.log.name, encoding="utf-8", errors="replace") as fh:
                return "".join(fh.readlines()[-lines:])
        except OSError:
            return ""


def job_cluster(job: JobSpec, ports: Sequence[int]) -> dict[str, tuple[str, ...]]:
    """The job's cluster on loopback: PS, the chief, then every worker slot (--add-worker slots included)."""
    addr = [f"127.0.0.1:{p}" for p in ports]
    cluster = {"ps": tuple(addr[: job.ps]), "chief": (addr[job.ps],)}
    if job.worker_slots:  # --add-worker slots included: empty until their step
        cluster["worker"] = tuple(addr[job.ps + 1 : job.ps + 1 + job.worker_slots])
    return cluster


class ProcessTable:
    """The job's tasks by name, PS first, and the spare PS standing by (oldest first).

    Args:
      job: the job.

    Attributes:
      environment: what every task's environment adds to this process's
        (status channel, cluster file, master address); set before `launch`.
      forkserver: when set, task processes are forked from it (TensorFlow loaded once,
        `tf_ecrec.launcher.forkserver`); else (or when it cannot) each is started on its own.
    """

    def __init__(self, job: JobSpec) -> None:
        self.job = job
        self.tasks: dict[str, TaskProcess] = {}
        self.spares: list[TaskProcess] = []
        self.environment: dict[str, str] = {}
        self.forkserver: ForkServer | None = None
        self._spare_count = 0

    def add(self, cluster: ClusterConfig) -> TaskProcess:
        """Adds the task `cluster` names, not started (PENDING, or LATER for a slot beyond the initial workers:
        --add-worker, automatic scaling)."""
        task = TaskProcess(cluster)
        if cluster.task_type == "worker" and cluster.task_index >= self.job.workers - 1:
            task.state = TaskState.LATER
        self.tasks[cluster.task] = task
        return task

    def add_spare(self, address: str) -> TaskProcess:
        """A spare PS that will stand by at `address` (see `tf_ecrec.launcher.task.entry.stand_by`); not started."""
        ps0 = next(t for t in self.tasks.values() if t.cluster.task_type == "ps")
        spare = TaskProcess(ps0.cluster, spare_address=address, label=f"spare:{self._spare_count}")
        self._spare_count += 1
        self.spares.append(spare)
        return spare

    def trainers(self) -> list[TaskProcess]:
        return [t for t in self.tasks.values() if t.cluster.task_type != "ps"]

    def ps(self) -> list[TaskProcess]:
        return [t for t in self.tasks.values() if t.cluster.task_type == "ps"]

    def every_process(self) -> Iterator[TaskProcess]:
        """Tasks and spares."""
        yield from self.tasks.values()
        yield from self.spares

    def tasks_on_host(self) -> int:
        """The TensorFlow tasks this launcher starts with, from the job (tasks are launched while others are still
        being added): its PS, its first trainers and its spares."""
        return self.job.ps + self.job.workers + self.job.spare_ps

    def base_environment(self) -> dict[str, str]:
        """What every task's environment starts from (the fork server's too)."""
        env = with_tf_environment(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        if self.job.deterministic:
            env["TF_DETERMINISTIC_OPS"] = "1"
        return env

    def launch(self, task: TaskProcess, now: float) -> None:
        """Starts `task`'s process (again): RUNNING, not yet a member, not yet training."""
        env = self.base_environment()
        env["TF_CONFIG"] = json.dumps(task.cluster.to_tf_config())  # the child's own, not this process's
        env.update(self.environment)
        env.update(task.env)
        # The tasks and spares share this host's CPUs: a PS sizes its thread pools to its share (tf_ecrec.cluster.threads).
        env.setdefault(ENV_TASKS_PER_HOST, str(self.tasks_on_host()))
        if task.spare_address is not None:
            env[ENV_SPARE_ADDRESS] = task.spare_address
        task.log = open(log_file(self.job.model_dir, task.name), "a", encoding="utf-8")
        task.log.write(f"==== start {task.name} at {time.strftime('%H:%M:%S')} ====\n")
        task.log.flush()
        with open(os.devnull, "rb") as devnull:
            task.process = start_process(self.forkserver, "tf_ecrec.launcher.task.entry", [job_file(self.job.model_dir)], env,
                                         devnull, task.log, task.log, name=task.name)
        task.state = TaskState.RUNNING
        task.started_at, task.member_since, task.training = now, None, False

    def move(self, task: TaskProcess, address: str) -> str:
        """Every task's cluster names `task` at `address` from now on; returns its old address."""
        old = task.cluster.address
        for other in self.tasks.values():
            other.cluster = other.cluster.replace_address(task.cluster.task_type, task.cluster.task_index, address)
        return old

    def version(self) -> int:
        """The cluster version: every task's TF_CONFIG ``version``, raised by each `move`."""
        return next(iter(self.tasks.values())).cluster.version

    def cluster(self, down: str | None = None) -> dict[str, list[str]]:
        """The cluster as it stands, `down` ("type:index") listed without address."""
        any_task = next(iter(self.tasks.values()))
        cluster = {k: list(v) for k, v in any_task.cluster.cluster.items()}
        if down is not None:
            task_type, index = down.split(":")
            cluster[task_type][int(index)] = ""
        return cluster

    def stop_all(self, grace_secs: float = 10.0) -> None:
        """Stops every process: trainers first (with a master they flush their progress and leave), then the PS."""
        for group in (self.trainers(), self.ps() + self.spares):
            for task in group:
                if task.alive:
                    assert task.process is not None  # alive: it has a process
                    task.process.terminate()
            deadline = time.time() + grace_secs
            for task in group:
                if task.alive:
                    assert task.process is not None  # alive: it has a process
                    try:
                        task.process.wait(max(0.1, deadline - time.time()))
                    except subprocess.TimeoutExpired:
                        task.process.kill()
                        task.process.wait()
                if task.log:
                    task.log.close()
                    task.log = None
