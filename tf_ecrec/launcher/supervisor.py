"""``tf-ecrec run``: a whole PS cluster as local processes, with fault injection and a report.

The supervisor (this process; it never imports TensorFlow):

1. validates the job, picks and checks the ports, writes ``<model_dir>/job.json``;
2. starts every task as ``python -m tf_ecrec.launcher.task job.json`` with its
   own TF_CONFIG, logs to ``<model_dir>/logs/<type>-<index>.log``;
3. follows progress on a loopback status channel (`tf_ecrec.launcher.status`),
   shows it live, and executes each ``--kill TASK@step=N``: SIGKILL when the
   global step reaches N, restart at the same address after
   ``--restart-delay`` seconds, as a pod restart would;
4. when every training worker has finished, reads the variables back from the
   PS tasks for the digest, stops the PS tasks and writes the report.

With the job master (the default; `JobSpec` has the data rules):

- before any task, it starts the master as its own process
  (`tf_ecrec.launcher.master_process`: ``python -m tf_ecrec.master.server``
  on a fixed port, state in ``<model_dir>/master``, a fresh token) and waits
  until it serves (or, with ``--master``, until the given master answers);
  a master or ZooKeeper that cannot be reached ends the run here, with the
  master's log, before training starts;
- tasks get the master's address and token in their environment;
- a task is noticed dead twice over: its process exited (``waitpid``), or
  it left the master's view of live tasks (heartbeats stopped, or its
  ZooKeeper session ended) while its process still runs: then it is killed
  and restarted like a ``--kill`` (event ``lost``, at most `MAX_LOST_RESTARTS`
  times per task);
- every task it kills is reported to the master at once (its leased records
  go back to the queue), tagged with the generation the master gave it;
  the restarted process registers again, which bumps the cluster version;
- ``--kill master@step=N`` SIGKILLs the master and restarts it on the same
  port and state dir after ``--restart-delay``; tasks ride through;
- ``--add-worker step=N`` starts a pre-allocated worker slot at step N;
  ``--remove-worker worker:I@step=N`` sends SIGTERM: the worker finishes its
  step, flushes its progress and leaves (SIGKILL after `LEAVE_TIMEOUT_SECS`);
- the run ends when every training worker has finished, i.e. when the
  dataset is finished; the report's ``data`` comes from the master.

Every child is stopped on a normal exit, on Ctrl-C, on SIGTERM and on
failure; children also get SIGKILL from the kernel if the supervisor dies
(``PR_SET_PDEATHSIG``, requested by the child itself: `tf_ecrec.launcher.child`).

Events (the report's ``events``):

- ``start``/``kill``/``restart``/``exit``: the supervisor's own actions and
  observations on processes (task ``master`` for the job master);
- ``lost``: the master's view lost a task whose process still ran;
- ``add``/``remove``: elastic workers started and asked to leave;
- ``session``: a task (re)created its training session, at ``global_step``;
- ``recovered``: the chief rebuilt lost variables (``method``, ``lost_ps``,
  ``bytes_rebuilt``, ``rebuild_seconds``, ``phases``);
- ``rebuilding``: the chief let trainers resume while it installs the lost
  rows in the background (``lost_ps``, ``seconds``, ``phases``);
- ``resumed``: the first step completed after a kill;
- ``regained``: the global step is back at the step of the kill.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from tf_ecrec.config import ClusterConfig
from tf_ecrec.errors import LaunchError
from tf_ecrec.failover import ENV_CLUSTER_FILE, write_cluster_file
from tf_ecrec.launcher.child import command as child_command
from tf_ecrec.launcher.master_process import MasterProcess, MasterWatch, make_token
from tf_ecrec.launcher.report import Event, build_report, plot_throughput
from tf_ecrec.launcher.spec import ENV_SPARE_ADDRESS, JobSpec, KillSpec
from tf_ecrec.launcher.status import ENV_STATUS_ADDRESS, StatusReceiver
from tf_ecrec.launcher.task_link import DATASET, master_environment
from tf_ecrec.master.server import read_token

_LOG = logging.getLogger(__name__)

STARTUP_TIMEOUT_SECS = 300.0
STALL_TIMEOUT_SECS = 600.0
LOST_GRACE_SECS = 3.0  # a task out of the master's view this long, process alive: restart it
MAX_LOST_RESTARTS = 3
LEAVE_TIMEOUT_SECS = 60.0  # --remove-worker: SIGKILL a worker that has not left by then
FINAL_DATA_TIMEOUT_SECS = 60.0
MEMORY_SAMPLE_SECS = 1.0


def pick_ports(count: int, base_port: int = 0, host: str = "127.0.0.1") -> list[int]:
    """`count` free ports: consecutive from `base_port`, or any free ones when it is 0.

    Raises:
      LaunchError: a requested port is in use (naming it).
    """
    ports: list[int] = []
    holders: list[socket.socket] = []
    try:
        for i in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            holders.append(s)
            port = base_port + i if base_port else 0
            try:
                s.bind((host, port))
            except OSError as exc:
                raise LaunchError(
                    f"port {host}:{port} is in use ({exc.strerror}); the job needs ports "
                    f"{base_port}..{base_port + count - 1}; pick another --base-port or 0 for free ports; "
                    "source: --base-port"
                ) from exc
            ports.append(s.getsockname()[1])
    finally:
        for s in holders:
            s.close()
    return ports


@dataclasses.dataclass
class _Task:
    cluster: ClusterConfig
    process: subprocess.Popen | None = None
    log: TextIO | None = None
    # pending (starts after the chief's session), later (--add-worker), running,
    # killed, leaving (--remove-worker), removed, done, failed
    state: str = "pending"
    exit_code: int | None = None
    started_at: float = 0.0
    member_since: float | None = None  # when the master's view last showed this process
    lost_restarts: int = 0
    leave_deadline: float = 0.0
    training: bool = False  # a trainer whose current process reported a step
    spare_address: str | None = None  # a spare PS standing by at this address (--spare-ps)
    label: str | None = None

    @property
    def killable(self) -> bool:
        """Running, and for a trainer, training: a kill before its first step would hit nothing."""
        return self.state == "running" and (self.training or self.cluster.task_type == "ps")

    @property
    def name(self) -> str:
        return self.label or self.cluster.task


@dataclasses.dataclass
class _PendingKill:
    spec: KillSpec
    killed_at: float | None = None
    killed_at_step: int | None = None
    restart_at: float | None = None
    resumed: bool = False
    regained: bool = False


class Supervisor:
    """Runs one job; see the module docstring.  Use `run()` once."""

    def __init__(self, job: JobSpec, out: TextIO = sys.stderr, live: bool | None = None) -> None:
        self.job = job
        self._out = out
        self._live = out.isatty() if live is None else live
        self._tasks: dict[str, _Task] = {}
        self._events: list[Event] = []
        self._timeline: list[tuple[float, int, int]] = []  # (t, global step, records in datagram)
        self._global_step = 0
        self._records = 0
        self._kills = [_PendingKill(k) for k in sorted(job.kills, key=lambda k: k.step)]
        self._t0 = time.time()
        self._done_reports: dict[str, dict[str, Any]] = {}
        self._errors: list[str] = []
        self._master: MasterProcess | None = None
        self._watch: MasterWatch | None = None
        self._token: str | None = None
        self._suspects: dict[str, float] = {}  # task -> when it left the master's view
        self._failures: list[dict[str, Any]] = []  # per kill/loss: records in flight when it hit
        self._removed: set[str] = set()
        self._data_seen: tuple[float, Any] = (0.0, None)
        self._memory: dict[str, list[tuple[float, float]]] = {}  # task -> [(t since launch, RSS MB)]
        self._memory_sampled = 0.0
        self._spares: list[_Task] = []  # spare PS processes standing by, oldest first
        self._spare_count = 0
        # The cluster trainers follow (tf_ecrec.failover): rewritten when a PS moves (--restart-at new-port).
        self._cluster_file = os.path.join(job.model_dir, "cluster.json")

    # ---- lifecycle ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Runs the job to the end and returns the report (also written to --report).

        Raises:
          LaunchError: a task failed, a port was taken, or the job stalled.
        """
        job = self.job
        os.makedirs(os.path.join(job.model_dir, "logs"), exist_ok=True)
        ports = pick_ports(job.ps + 1 + job.worker_slots + (1 if job.owns_master else 0) + job.spare_ps, job.base_port)
        spare_ports, ports = ports[len(ports) - job.spare_ps :], ports[: len(ports) - job.spare_ps]
        cluster = _cluster(job, ports)
        job_path = os.path.join(job.model_dir, "job.json")
        with open(job_path, "w", encoding="utf-8") as fh:
            json.dump(job.to_json(), fh, indent=1)
        write_cluster_file(self._cluster_file, cluster)
        self._receiver = StatusReceiver()
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        data_state = None
        try:
            if job.uses_master:
                self._start_master(ports[-1])
            for type_, addresses in sorted(cluster.items(), key=lambda kv: kv[0] != "ps"):
                for index in range(len(addresses)):
                    cfg = ClusterConfig(cluster, type_, index)
                    self._tasks[cfg.task] = _Task(cfg)
                    if job.added_at(cfg.task) is not None:
                        self._tasks[cfg.task].state = "later"  # an empty slot until --add-worker
                    # Non-chief workers start once the chief has initialised the model:
                    # started earlier, the stock worker session waits 30 s between checks.
                    elif type_ != "worker":
                        self._start(self._tasks[cfg.task], job_path)
                if type_ == "ps":
                    for port in spare_ports:
                        self._start_spare(f"127.0.0.1:{port}")
            self._loop()
            if self._watch is not None:
                data_state = self._final_data_state()
            digest = self._digest()
        except KeyboardInterrupt:
            self._print("interrupted: stopping every task")
            raise
        finally:
            self._stop_all()
            self._receiver.close()
            signal.signal(signal.SIGTERM, previous)
        report = build_report(
            job=job,
            t0=self._t0,
            events=self._events,
            timeline=self._timeline,
            done_reports=self._done_reports,
            digest=digest,
            data_state=data_state,
            failures=self._failures,
            memory=self._memory,
        )
        self._write_report(report)
        return report

    def _start_master(self, port: int) -> None:
        """Starts the master process (or checks the external one) and the launcher's watch on it."""
        job = self.job
        if job.owns_master:
            state_dir = os.path.join(job.model_dir, "master")
            os.makedirs(state_dir, exist_ok=True)
            token_file = os.path.join(job.model_dir, "master.token")
            self._token = make_token(token_file)
            self._master = MasterProcess(
                port, state_dir, token_file, os.path.join(job.model_dir, "logs", "master.log"), job.zk,
                job.task_timeout,
            )
            self._master.start(wait=True)
            self._event("start", "master")
            address = self._master.address
        else:
            assert job.master_address is not None
            address = job.master_address
            self._token = read_token(job.master_token_file, "--master-token-file") if job.master_token_file else None
        self._watch = MasterWatch(address, self._token, DATASET)
        self._watch.connect()

    def _start(self, task: _Task, job_path: str, kind: str = "start") -> None:
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps(task.cluster.to_tf_config())
        env[ENV_STATUS_ADDRESS] = self._receiver.address
        env[ENV_CLUSTER_FILE] = self._cluster_file
        if task.spare_address is not None:
            env[ENV_SPARE_ADDRESS] = task.spare_address
        if self._watch is not None:
            env.update(master_environment(self._watch.address, self._token))
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        if self.job.deterministic:
            env["TF_DETERMINISTIC_OPS"] = "1"
        log_path = os.path.join(self.job.model_dir, "logs", task.name.replace(":", "-") + ".log")
        task.log = open(log_path, "a", encoding="utf-8")
        task.log.write(f"==== start {task.name} at {time.strftime('%H:%M:%S')} ====\n")
        task.log.flush()
        task.process = subprocess.Popen(
            child_command("tf_ecrec.launcher.task", job_path),  # dies with us; no preexec_fn (see child.py)
            env=env,
            stdout=task.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        task.state = "running"
        task.started_at, task.member_since, task.training = time.time(), None, False
        self._event(kind, task.name)

    def _stop_all(self) -> None:
        # Trainers first (with a master they flush their progress and leave), then the
        # PS tasks, then the master.
        trainers = [t for t in self._tasks.values() if t.cluster.task_type != "ps"]
        for group in (trainers, [t for t in self._tasks.values() if t.cluster.task_type == "ps"] + self._spares):
            for task in group:
                if task.process and task.process.poll() is None:
                    task.process.terminate()
            deadline = time.time() + 10
            for task in group:
                if task.process and task.process.poll() is None:
                    try:
                        task.process.wait(max(0.1, deadline - time.time()))
                    except subprocess.TimeoutExpired:
                        task.process.kill()
                        task.process.wait()
                if task.log:
                    task.log.close()
                    task.log = None
        if self._watch is not None:
            self._watch.close()
        if self._master is not None:
            self._master.stop()

    # ---- the main loop ---------------------------------------------------------------------------

    def _loop(self) -> None:
        trainers = [t for t in self._tasks.values() if t.cluster.task_type != "ps"]
        last_print = 0.0
        last_progress = time.time()
        while True:
            for msg in self._receiver.poll(0.05):
                if self._on_message(msg):
                    last_progress = time.time()
            now = time.time()
            self._check_processes(now)
            self._sample_memory(now)
            self._drive_kills(now)
            if self._watch is not None:
                self._drive_master(now)
            if self._errors:
                raise LaunchError("; ".join(self._errors))
            # Slots still waiting for --add-worker are not waited for: the data is done.
            if all(t.state in ("done", "removed", "later") for t in trainers):
                break
            stalled = now - last_progress
            limit = STARTUP_TIMEOUT_SECS if self._global_step == 0 else STALL_TIMEOUT_SECS
            if stalled > limit and not any(k.killed_at and not k.resumed for k in self._kills):
                raise LaunchError(
                    f"no training progress for {stalled:.0f} s (global step {self._global_step}); "
                    f"see the logs in {os.path.join(self.job.model_dir, 'logs')}"
                )
            if now - last_print >= (0.5 if self._live else 5.0):
                self._print_progress(now)
                last_print = now
        # Drain datagrams still in flight (the workers' final reports).
        for msg in self._receiver.poll(0.2):
            self._on_message(msg)
        self._print_progress(time.time(), final=True)

    def _on_message(self, msg: dict[str, Any]) -> bool:
        kind, task, t = msg.get("kind"), msg.get("task", "?"), float(msg.get("t", time.time()))
        if kind == "step":
            if task in self._tasks and self._tasks[task].state == "running":
                self._tasks[task].training = True
            step = int(msg.get("step", 0))
            records = int(msg.get("records", 0))
            self._timeline.append((t, step, records))
            self._records += records
            if step > self._global_step or self._after_kill(t):
                self._global_step = step
            self._note_progress(t, step)
            return True
        if kind == "session":
            self._event("session", task, int(msg.get("step", 0)), t=t)

            if task == "chief:0":
                for pending in self._tasks.values():
                    if pending.state == "pending":
                        self._start(pending, os.path.join(self.job.model_dir, "job.json"))
            if self._after_kill(t):
                self._global_step = int(msg.get("step", 0))
            return True
        if kind == "done":
            self._done_reports[task] = msg
            return True
        if kind == "recovered":
            extra = {k: msg.get(k) for k in ("method", "lost_ps", "bytes_rebuilt", "rebuild_seconds", "phases", *_SETTLED)}
            self._event("recovered", task, msg.get("step"), t=t, **extra)
            self._print(
                f"{task} recovered lost PS {msg.get('lost_ps')} by {msg.get('method')}: "
                f"{msg.get('bytes_rebuilt', 0):,} bytes in {msg.get('rebuild_seconds')} s"
            )
            return True
        if kind == "rebuilding":
            self._event("rebuilding", task, msg.get("step"), t=t, lost_ps=msg.get("lost_ps"), seconds=msg.get("seconds"),
                        phases=msg.get("phases"))
            self._print(
                f"{task} rebuilds lost PS {msg.get('lost_ps')} while training goes on "
                f"(trainers resumed {msg.get('seconds')} s after the session began)"
            )
            return True
        if kind == "settled":
            self._event("settled", task, msg.get("step"), t=t, **{k: msg.get(k) for k in _SETTLED})
            return True
        if kind == "failover":
            self._event("failover", task, None, t=t, state=msg.get("state"), reason=msg.get("reason"))
            return True
        if kind == "error":
            self._errors.append(f"{task} failed: {msg.get('error')}")
        return False

    def _after_kill(self, t: float) -> bool:
        """Whether a kill happened and the job has not resumed since (the step may go down)."""
        return any(k.killed_at is not None and not k.resumed and t > k.killed_at for k in self._kills)

    def _note_progress(self, t: float, step: int) -> None:
        for k in self._kills:
            if k.killed_at is None or t <= k.killed_at:
                continue
            if not k.resumed:
                k.resumed = True
                self._event("resumed", k.spec.task, step, t=t)
            if k.resumed and not k.regained and step >= (k.killed_at_step or 0):
                k.regained = True
                self._event("regained", k.spec.task, step, t=t)

    def _check_processes(self, now: float) -> None:
        for task in self._tasks.values():
            if task.process is None or task.state not in ("running", "leaving"):
                continue
            code = task.process.poll()
            if code is None:
                continue
            task.exit_code = code
            self._event("exit", task.name, self._global_step, code=code)
            if task.state == "leaving":
                task.state = "removed"
                if code != 0:
                    self._watch_report(task.name, f"exited with code {code} while leaving")
            elif code == 0 and task.cluster.task_type != "ps":
                task.state = "done"
            elif code < 0:
                self._crashed(task, -code)
            else:
                task.state = "failed"
                self._errors.append(
                    f"{task.name} exited with code {code}; last lines of its log:\n" + _tail(task)
                )
        if self._master is not None and not self._master.killed and self._master.poll() is not None:
            self._errors.append(
                f"the job master exited with code {self._master.poll()}; last lines of its log:\n" + self._master.tail()
            )
            self._master.killed = True  # reported once

    def _sample_memory(self, now: float) -> None:
        """Every `MEMORY_SAMPLE_SECS`, the resident memory of every task process (for the report's ``memory``)."""
        if now - self._memory_sampled < MEMORY_SAMPLE_SECS:
            return
        self._memory_sampled = now
        for task in [*self._tasks.values(), *self._spares]:
            if task.process is not None and task.process.poll() is None:
                mb = resident_mb(task.process.pid)
                if mb is not None:
                    self._memory.setdefault(task.name, []).append((round(now - self._t0, 2), mb))

    def _drive_kills(self, now: float) -> None:
        for k in self._kills:
            if k.spec.task_type == "master":
                self._drive_master_kill(k, now)
                continue
            task = self._tasks[k.spec.task]
            if k.killed_at is None and self._global_step >= k.spec.step and task.killable:
                self._kill(task, k, f"killed by --kill {k.spec}")
            if k.restart_at is not None and task.state == "killed" and now >= k.restart_at:
                if task.cluster.task_type == "ps" and self.job.restart_at == "new-port":
                    self._move(task)
                self._start(task, os.path.join(self.job.model_dir, "job.json"), kind="restart")
                self._print(f"restarted {task.name} at {task.cluster.address}")

    def _kill(self, task: _Task, k: _PendingKill, reason: str) -> None:
        """SIGKILL `task` now and schedule its restart; the master hears of it at once."""
        assert task.process is not None
        task.process.send_signal(signal.SIGKILL)
        task.process.wait()
        task.state = "killed"
        k.killed_at, k.killed_at_step = time.time(), self._global_step
        k.restart_at = k.killed_at + self.job.restart_delay
        self._event("kill", task.name, self._global_step)
        self._print(f"killed {task.name} at global step {self._global_step}")
        self._after_ps_loss(task, k)
        if self._watch is not None:
            self._note_failure(task.name)
            self._watch_report(task.name, reason)

    def _start_spare(self, address: str) -> None:
        """Starts a spare PS standing by at `address` (see `tf_ecrec.launcher.task.stand_by`)."""
        ps0 = next(t for t in self._tasks.values() if t.cluster.task_type == "ps")
        spare = _Task(ps0.cluster, spare_address=address, label=f"spare:{self._spare_count}")
        self._spare_count += 1
        self._spares.append(spare)
        self._start(spare, os.path.join(self.job.model_dir, "job.json"), kind="spare")

    def _after_ps_loss(self, task: _Task, k: _PendingKill) -> None:
        """A PS was killed or crashed: a spare takes its role, or a move to a new port lists it as down meanwhile."""
        if task.cluster.task_type != "ps" or self._take_over(task, k):
            return
        if self.job.restart_at == "new-port":
            self._write_cluster_file(down=task.name)

    def _take_over(self, task: _Task, k: _PendingKill) -> bool:
        """Gives a lost PS's role to a running spare at once; False if no spare is running.

        The spare's address replaces the PS's in every task's cluster and in
        the cluster file, which the trainers follow (as after a move) and the
        spare reads to learn its role.  Nothing restarts; a new spare starts
        behind it on a fresh port.
        """
        spare = next((s for s in self._spares if s.process is not None and s.process.poll() is None), None)
        if spare is None:
            return False
        self._spares.remove(spare)
        old, address = task.cluster.address, spare.spare_address
        assert address is not None
        for other in self._tasks.values():
            other.cluster = other.cluster.replace_address(task.cluster.task_type, task.cluster.task_index, address)
        self._write_cluster_file()
        if task.log:
            task.log.close()
        task.process, task.log = spare.process, spare.log
        task.state, task.started_at, task.member_since = "running", time.time(), None
        k.restart_at = None  # the spare is the restart
        self._event("move", task.name, self._global_step, old=old, new=address, spare=spare.name)
        self._print(f"{spare.name} at {address} takes the role of {task.name}")
        host = address.rsplit(":", 1)[0]
        self._start_spare(f"{host}:{pick_ports(1, 0, host)[0]}")
        return True

    def _move(self, task: _Task) -> None:
        """Gives a PS about to restart a fresh port; every task's cluster and the cluster file follow."""
        old = task.cluster.address
        host = old.rsplit(":", 1)[0]
        address = f"{host}:{pick_ports(1, 0, host)[0]}"
        for other in self._tasks.values():
            other.cluster = other.cluster.replace_address(task.cluster.task_type, task.cluster.task_index, address)
        self._write_cluster_file()
        self._event("move", task.name, self._global_step, old=old, new=address)
        self._print(f"{task.name} moves from {old} to {address}")

    def _write_cluster_file(self, down: str | None = None) -> None:
        """The cluster every trainer follows (tf_ecrec.failover.FileClusterSource); `down` listed without address."""
        any_task = next(iter(self._tasks.values()))
        cluster = {k: list(v) for k, v in any_task.cluster.cluster.items()}
        if down is not None:
            task_type, index = down.split(":")
            cluster[task_type][int(index)] = ""
        write_cluster_file(self._cluster_file, cluster)

    def _crashed(self, task: _Task, signum: int) -> None:
        """A task died from a signal (the OOM killer, a failpoint): restart it, as a pod restart would."""
        pending = _PendingKill(KillSpec(task.cluster.task_type, task.cluster.task_index, self._global_step))
        self._kills.append(pending)
        task.state = "killed"
        pending.killed_at, pending.killed_at_step = time.time(), self._global_step
        pending.restart_at = pending.killed_at + self.job.restart_delay
        self._event("crash", task.name, self._global_step, signal=signum)
        self._after_ps_loss(task, pending)
        self._print(f"{task.name} died from signal {signum} at global step {self._global_step}: restarting it")
        if self._watch is not None:
            self._note_failure(task.name)
            self._watch_report(task.name, f"died from signal {signum}")

    def _drive_master_kill(self, k: _PendingKill, now: float) -> None:
        master = self._master
        assert master is not None
        if k.killed_at is None and self._global_step >= k.spec.step and not master.killed:
            self._note_failure("master")  # before: a dead master cannot say
            master.kill()
            k.killed_at, k.killed_at_step = time.time(), self._global_step
            k.restart_at = k.killed_at + self.job.restart_delay
            self._event("kill", "master", self._global_step)
            self._print(f"killed the job master at global step {self._global_step}")
        if k.restart_at is not None and master.killed and master.poll() is not None and now >= k.restart_at:
            master.start(wait=False)  # same port and state dir; clients retry meanwhile
            k.restart_at = None
            self._event("restart", "master")
            self._print(f"restarted the job master at {master.address}")

    # ---- the job master ---------------------------------------------------------------------

    def _drive_master(self, now: float) -> None:
        """Membership, failure reports and elastic workers; see the module docstring."""
        watch = self._watch
        assert watch is not None
        departed, joined = watch.departures()
        for name in joined:
            task = self._tasks.get(name)
            if task is not None and task.state == "running":
                task.member_since = now
            self._suspects.pop(name, None)
        for gone in departed:
            task = self._tasks.get(gone.task)
            # Only a departure of the current process counts (not of one we already killed).
            if task is not None and task.state == "running" and task.member_since is not None:
                self._suspects.setdefault(gone.task, now)
        for name, since in list(self._suspects.items()):
            task = self._tasks[name]
            if task.state != "running":
                del self._suspects[name]
            elif now - since >= LOST_GRACE_SECS:
                del self._suspects[name]
                if task.process is not None and task.process.poll() is None:
                    self._restart_lost(task)
        watch.flush_reports()
        self._drive_elastic(now)

    def _restart_lost(self, task: _Task) -> None:
        task.lost_restarts += 1
        if task.lost_restarts > MAX_LOST_RESTARTS:
            self._errors.append(f"{task.name} was lost by the master {task.lost_restarts} times; giving up")
            return
        self._event("lost", task.name, self._global_step)
        self._print(f"{task.name} left the master's view of live tasks while its process ran: restarting it")
        pending = _PendingKill(KillSpec(task.cluster.task_type, task.cluster.task_index, self._global_step))
        self._kills.append(pending)
        self._kill(task, pending, "lost by the master's membership")

    def _drive_elastic(self, now: float) -> None:
        job_path = os.path.join(self.job.model_dir, "job.json")
        for task in self._tasks.values():
            added_at = self.job.added_at(task.name)
            if task.state == "later" and added_at is not None and self._global_step >= added_at:
                self._start(task, job_path, kind="add")
                self._print(f"added {task.name} at global step {self._global_step}")
        for remove in self.job.removes:
            task = self._tasks[remove.task]
            if remove.task not in self._removed and self._global_step >= remove.step and task.state == "running":
                self._removed.add(remove.task)
                assert task.process is not None
                task.process.terminate()  # finish the step, report progress, leave
                task.state, task.leave_deadline = "leaving", now + LEAVE_TIMEOUT_SECS
                self._event("remove", task.name, self._global_step)
                self._print(f"asked {task.name} to leave at global step {self._global_step}")
        for task in self._tasks.values():
            if task.state == "leaving" and now >= task.leave_deadline and task.process is not None:
                task.process.kill()
                task.process.wait()
                task.state = "removed"
                self._event("exit", task.name, self._global_step, code=task.process.returncode)
                self._watch_report(task.name, f"did not leave within {LEAVE_TIMEOUT_SECS:g}s of SIGTERM")

    def _watch_report(self, name: str, reason: str) -> None:
        if self._watch is not None:
            self._watch.report_failure(name, reason)

    def _note_failure(self, name: str) -> None:
        """Records the records in flight (leased, not acknowledged) as a failure hits."""
        stats = self._watch.data_state() if self._watch is not None else None
        self._failures.append(
            {"task": name, "global_step": self._global_step,
             "records_in_flight": None if stats is None else stats.records_in_flight}
        )

    def _data_state(self, max_age: float = 2.0) -> Any:
        """The master's dataset counters, at most `max_age` seconds old (None if unknown)."""
        at, stats = self._data_seen
        now = time.time()
        if self._watch is not None and now - at >= max_age:
            if not (self._master is not None and self._master.killed):
                stats = self._watch.data_state() or stats
            self._data_seen = (now, stats)
        return stats

    def _final_data_state(self) -> Any:
        """The dataset's final counters (restarting a master still down from a kill)."""
        assert self._watch is not None
        if self._master is not None and self._master.killed:
            self._master.start(wait=True)
            self._event("restart", "master")
        deadline = time.time() + FINAL_DATA_TIMEOUT_SECS
        while True:
            stats = self._watch.data_state()
            if stats is not None:
                return stats
            if time.time() > deadline:
                raise LaunchError(
                    f"could not read the data state from the job master at {self._watch.address} within "
                    f"{FINAL_DATA_TIMEOUT_SECS:g}s after training"
                )
            time.sleep(0.5)

    # ---- the end ---------------------------------------------------------------------------

    def _digest(self) -> dict[str, Any]:
        from tf_ecrec.launcher.task import MANIFEST_FILE

        manifest = os.path.join(self.job.model_dir, MANIFEST_FILE)
        ps = [t.cluster.address for t in self._tasks.values() if t.cluster.task_type == "ps"]
        result = subprocess.run(
            [sys.executable, "-m", "tf_ecrec.live_cluster", manifest, ",".join(ps)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
        if result.returncode != 0:
            raise LaunchError(f"reading the variables back from the PS tasks failed:\n{result.stderr[-2000:]}")
        return json.loads(result.stdout.strip().splitlines()[-1])

    def _write_report(self, report: dict[str, Any]) -> None:
        path = self.job.report or os.path.join(self.job.model_dir, "report.json")
        report["plot"] = plot_throughput(report, os.path.splitext(path)[0] + ".png")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1)
        self._print(_summary(report, path))

    # ---- output ---------------------------------------------------------------------------

    def _event(self, kind: str, task: str, step: int | None = None, t: float | None = None, **extra: Any) -> None:
        self._events.append(
            Event(t=(t or time.time()) - self._t0, kind=kind, task=task, global_step=self._global_step if step is None else step, extra=extra)
        )

    def _print(self, text: str) -> None:
        if self._live:
            self._out.write("\r\033[K")
        self._out.write(text + "\n")
        self._out.flush()

    def _print_progress(self, now: float, final: bool = False) -> None:
        window = [r for (t, _, r) in self._timeline if t >= now - 5.0]
        rate = sum(window) / 5.0
        states = " ".join(f"{name}={_short(t.state)}" for name, t in sorted(self._tasks.items()))
        stats = self._data_state()
        data = f"data {stats.records_trained:,}/{stats.records_total:,} | " if stats is not None else ""
        master = ""
        if self._master is not None:
            master = " master=" + ("DOWN" if self._master.killed else "up")
        line = (
            f"[{now - self._t0:6.1f}s] step {self._global_step}/{self.job.steps} | {data}"
            f"{rate:,.0f} samples/s | {states}{master}"
        )
        if self._live and not final:
            self._out.write("\r\033[K" + line)
            self._out.flush()
        else:
            self._print(line)


def resident_mb(pid: int) -> float | None:
    """Resident memory of a process in MB (VmRSS), or None if it is gone or not on Linux."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024.0, 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cluster(job: JobSpec, ports: Sequence[int]) -> dict[str, tuple[str, ...]]:
    addr = [f"127.0.0.1:{p}" for p in ports]
    cluster = {"ps": tuple(addr[: job.ps]), "chief": (addr[job.ps],)}
    if job.worker_slots:  # --add-worker slots included: empty until their step
        cluster["worker"] = tuple(addr[job.ps + 1 : job.ps + 1 + job.worker_slots])
    return cluster


def _short(state: str) -> str:
    return {
        "running": "up", "killed": "DOWN", "done": "done", "failed": "FAILED", "pending": "...", "later": "-",
        "leaving": "leaving", "removed": "gone",
    }[state]


def _tail(task: _Task, lines: int = 15) -> str:
    if task.log is None:
        return ""
    task.log.flush()
    try:
        with open(task.log.name, encoding="utf-8", errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])
    except OSError:
        return ""


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


_SETTLED = ("steps_undone", "steps_finished", "folds_rolled_back")


def _summary(report: dict[str, Any], path: str) -> str:
    lines = [
        "",
        f"job done: global step {report['global_step']}, {report['samples_per_sec']:,.0f} samples/s steady state "
        f"({report['effective_samples_per_sec']:,.0f} overall), fault tolerance {report['config']['fault_tolerance']}",
    ]
    for r in report["recovery"]:
        if r["seconds_to_resume"] is None:  # e.g. a task killed as the job ended
            lines.append(f"  {r['task']} killed at step {r['killed_at_step']}: training did not resume after it")
            continue
        regained = "never" if r["seconds_to_regain"] is None else f"after {r['seconds_to_regain']:.1f} s"
        lines.append(
            f"  {r['task']} killed at step {r['killed_at_step']}: resumed from step {r['resumed_from_step']} "
            f"({r['steps_rolled_back']} steps rolled back), resumed after {r['seconds_to_resume']:.1f} s, "
            f"regained step {r['killed_at_step']} {regained}"
        )
        if r.get("method") == "parity" and r.get("window_seconds") is not None:
            chief = r.get("memory_mb_in_window", {}).get("chief:0")
            rate = r.get("rebuild_gb_per_sec")
            lines.append(
                f"    rebuilt {r['bytes_rebuilt'] / 1e6:,.0f} MB from parity in {r['rebuild_seconds']:.1f} s"
                + (f" ({rate:.2f} GB/s)" if rate else "")
                + f"; throughput in the {r['window_seconds']:.1f} s window: {r['samples_per_sec_in_window']:,.0f} samples/s"
                + (f"; chief peak {chief:,.0f} MB" if chief is not None else "")
            )
    if "parity" in report:
        p = report["parity"]
        lines.append(
            f"  parity: {p['stripes_checked']} stripes / {p['rows_checked']} rows checked, {p['mismatches']} mismatches; "
            f"{p['replicas_checked']} replicas checked, {p['replica_mismatches']} mismatches"
        )
    settlement = report.get("settlement")
    if settlement:
        lines.append(
            f"  steps cut by failures: {settlement['steps_undone']} undone, {settlement['steps_finished']} finished; "
            f"{settlement['folds_rolled_back']} folds of lost variables rolled back"
        )
    data = report.get("data", {})
    if "records_total" in data:
        bound = data.get("records_in_flight_at_failures")
        lines.append(
            f"  data: {data['records_trained']:,} of {data['records_total']:,} records trained"
            f"{'' if data.get('finished') else ' (NOT finished)'}, {data['records_retrained']:,} retrained, "
            f"{data['records_requeued']:,} re-queued" + ("" if bound is None else f"; in flight at failures: {bound:,}")
        )
        if data.get("records_failed"):
            lines.append(
                f"  DROPPED: {data['records_failed']:,} records of {data['shards_failed']:,} shards were given up "
                "after failing more often than the shard failure limit; they were NOT trained"
            )
    lines.append(f"  variables_sha256 {report['variables_sha256']}")
    lines.append(f"report: {path} (plot: {report.get('plot')})")
    return "\n".join(lines)
