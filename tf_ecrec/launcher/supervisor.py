"""``tf-ecrec run``: a whole PS cluster as local processes, with fault injection and a report.

The supervisor (this process; it never imports TensorFlow):

1. validates the job, picks and checks the ports, writes ``<model_dir>/job.json``;
2. starts every task as ``python -m tf_ecrec.launcher.task.entry job.json`` with its
   own TF_CONFIG, logs to ``<model_dir>/logs/<type>-<index>.log``;
3. follows progress on a loopback status channel (`tf_ecrec.launcher.job.status`),
   shows it live, and executes each ``--kill TASK@step=N``: SIGKILL when the
   global step reaches N, restart at the same address after
   ``--restart-delay`` seconds, as a pod restart would;
4. when every training worker has finished, reads the variables back from the PS tasks for the
   digest, stops the PS tasks and writes the report.

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
  and restarted like a ``--kill`` (event ``lost``, at most `fault_actions.MAX_LOST_RESTARTS`
  times per task);
- every task it kills is reported to the master at once (its leased records
  go back to the queue), tagged with the generation the master gave it;
  the restarted process registers again, which bumps the cluster version;
- ``--kill master@step=N`` SIGKILLs the master and restarts it on the same
  port and state dir after ``--restart-delay``; tasks ride through;
- ``--add-worker step=N`` starts a pre-allocated worker slot at step N;
  ``--remove-worker worker:I@step=N`` sends SIGTERM: the worker finishes its
  step, flushes its progress and leaves (SIGKILL after `master_driver.LEAVE_TIMEOUT_SECS`);
- the run ends when every training worker has finished, i.e. when the
  dataset is finished; the report's ``data`` comes from the master.

Every child is stopped on a normal exit, on Ctrl-C, on SIGTERM and on
failure; children also get SIGKILL from the kernel if the supervisor dies
(``PR_SET_PDEATHSIG``, requested by the child itself: `tf_ecrec.launcher.child`).

Its parts, each a module of `tf_ecrec.launcher`: ``ports``, ``process_table``
(every task's process and `TaskState`), ``faults`` (the fault schedule) and
``fault_actions`` (kills and restarts, one path for every fault),
``master_driver`` (lost tasks, elastic workers, data counters),
``run_record`` (events and the report), ``console``; ``run_state`` is what
they share.

The report's ``events`` and what each carries: `tf_ecrec.launcher.events`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any, TextIO

from tf_ecrec.cluster.tf_config import ClusterConfig
from tf_ecrec.errors import LaunchError
from tf_ecrec.flash.config import shm_root
from tf_ecrec.launcher.autoscaling import AutoScaling, LocalScaler
from tf_ecrec.launcher.console import Console, progress_line, summary
from tf_ecrec.launcher.digest_reader import DigestReader
from tf_ecrec.launcher.events import EventKind
from tf_ecrec.launcher.exits import ExitWatch
from tf_ecrec.launcher.fault_actions import FaultActions
from tf_ecrec.launcher.faults import FaultSchedule
from tf_ecrec.launcher.forkserver import ForkServer
from tf_ecrec.launcher.job import model_dir
from tf_ecrec.launcher.job.diagnosis import ExitKind, last_traceback
from tf_ecrec.launcher.job.spec import JobSpec, Strategy
from tf_ecrec.launcher.job.status import ENV_STATUS_ADDRESS, StatusKind, StatusReceiver
from tf_ecrec.launcher.master_driver import LEAVE_TIMEOUT_SECS, MasterDriver
from tf_ecrec.launcher.master_process import MasterProcess, MasterWatch, make_token
from tf_ecrec.launcher.ports import pick_ports
from tf_ecrec.launcher.process_table import ProcessTable, TaskState, job_cluster
from tf_ecrec.launcher.report import preload_plotting
from tf_ecrec.launcher.run_record import RunRecord, write_report
from tf_ecrec.launcher.run_state import RunState
from tf_ecrec.launcher.stream_feed import StreamFeed
from tf_ecrec.launcher.task.master_connection import DATASET, master_environment
from tf_ecrec.master.server import read_token
from tf_ecrec.session.cluster_source import ENV_CLUSTER_FILE, write_cluster_file

_LOG = logging.getLogger(__name__)

STARTUP_TIMEOUT_SECS = 300.0
STALL_TIMEOUT_SECS = 600.0
_SETTLED = ("steps_undone", "steps_finished", "folds_rolled_back")
# Messages that show a trainer working though it takes no step: each starts its hang clock again.
_SIGNS_OF_LIFE = frozenset({StatusKind.STEP, StatusKind.SESSION, StatusKind.RECOVERED, StatusKind.REBUILDING,
                            StatusKind.SETTLED, StatusKind.FAILOVER})


class Supervisor:
    """Runs one job; see the module docstring.  Use `run()` once."""

    def __init__(self, job: JobSpec, out: TextIO = sys.stderr, live: bool | None = None) -> None:
        self.job = job
        self._run = RunState(job, Console(out, out.isatty() if live is None else live), ProcessTable(job),
                             RunRecord(time.time()), FaultSchedule(job.kills, job.restart_delay),
                             model_dir.cluster_file(job.model_dir))
        self._actions = FaultActions(self._run)
        self._driver: MasterDriver | None = None
        self._scaling: AutoScaling | None = None
        self._stream: StreamFeed | None = None
        self._token: str | None = None
        self._session_at: dict[str, float] = {}  # each trainer's last session creation (its datagram's t)
        self._reader = DigestReader(model_dir.manifest_file(job.model_dir), model_dir.log_file(job.model_dir, "digest"))

    def run(self) -> dict[str, Any]:
        """Runs the job to the end and returns the report (also written to --report).

        Raises:
          LaunchError: a task failed, a port was taken, or the job stalled.
        """
        job = self.job
        os.makedirs(model_dir.logs_dir(job.model_dir), exist_ok=True)
        ports = pick_ports(job.ps + 1 + job.worker_slots + (1 if job.owns_master else 0) + job.spare_ps, job.base_port)
        spare_ports, ports = ports[len(ports) - job.spare_ps :], ports[: len(ports) - job.spare_ps]
        cluster = job_cluster(job, ports)
        with open(model_dir.job_file(job.model_dir), "w", encoding="utf-8") as fh:
            json.dump(job.to_json(), fh, indent=1)
        write_cluster_file(self._run.cluster_file, cluster, version=0)  # every task starts at TF_CONFIG version 0
        table = self._run.table
        table.forkserver = self._reader.forkserver = ForkServer(table.base_environment(),
                                                                model_dir.log_file(job.model_dir, "forkserver"))
        table.forkserver.start()  # it imports TensorFlow while the master starts
        if job.plot:
            threading.Thread(target=preload_plotting, daemon=True, name="tf-ecrec-preload-plotting").start()
        self._receiver = StatusReceiver()
        self._run.table.environment = {ENV_STATUS_ADDRESS: self._receiver.address, ENV_CLUSTER_FILE: self._run.cluster_file}
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        self._exits = self._run.exit_watch = ExitWatch(self._run)
        data_state = None
        try:
            if job.uses_master:
                self._start_master(ports[-1])
            for type_, addresses in sorted(cluster.items(), key=lambda kv: kv[0] != "ps"):
                for index in range(len(addresses)):
                    task = self._run.table.add(ClusterConfig(cluster, type_, index))
                    # Ours without flash: workers start with the chief (their ready op waits on the PS); else once
                    # it has initialised. --add-worker slots wait for their step; under pss every worker starts.
                    early = type_ != "worker" or job.strategy is Strategy.PSS or (job.fault_tolerance.ours and job.flash is None)
                    if task.state is TaskState.PENDING and early:
                        self._run.start(task)
                if type_ == "ps":
                    for port in spare_ports:
                        self._run.start_spare(f"127.0.0.1:{port}")
            self._loop()
            if self._run.watch is not None:
                assert self._driver is not None  # _start_master made both
                data_state = self._driver.final_data_state()
            digest = self._digest()
        except KeyboardInterrupt:
            self._run.console.print("interrupted: stopping every task")
            raise
        finally:
            self._reader.close()
            self._stop_all()
            table.forkserver.close()
            self._exits.close()
            if job.flash is not None:  # the job's snapshots in shared memory outlive PS tasks, not the job
                shutil.rmtree(shm_root(job.flash, job.model_dir), ignore_errors=True)
            self._receiver.close()
            signal.signal(signal.SIGTERM, previous)
        report = self._run.record.report(job, digest, data_state)
        path = model_dir.report_file(job.model_dir, job.report)
        write_report(report, path, plot=job.plot)
        self._run.console.print(summary(report, path))
        return report

    def _start_master(self, port: int) -> None:
        """Starts the master process (or checks the external one) and the launcher's watch on it."""
        job = self.job
        if job.owns_master:
            state_dir = model_dir.master_state_dir(job.model_dir)
            os.makedirs(state_dir, exist_ok=True)
            token_file = model_dir.master_token_file(job.model_dir)
            self._token = make_token(token_file)
            self._run.master = MasterProcess(port, state_dir, token_file, model_dir.log_file(job.model_dir, "master"),
                                             job.zk, job.task_timeout)
            self._run.master.start(wait=True)
            self._run.event(EventKind.START, "master")
            address = self._run.master.address
        else:
            assert job.master_address is not None
            address = job.master_address
            self._token = read_token(job.master_token_file, "--master-token-file") if job.master_token_file else None
        self._run.watch = MasterWatch(address, self._token, DATASET)
        self._run.watch.connect()
        self._driver = MasterDriver(self._run, self._actions.lost)
        if self.job.stream_dir is not None:
            self._stream = StreamFeed(self.job.stream_dir, self._run.watch, self.job.shard_batches * self.job.batch_size,
                                      self.job.on_corrupt.value)
        scaling = self.job.scaling
        if scaling is not None:
            self._scaling = AutoScaling(self._run, scaling, LocalScaler(self._run, LEAVE_TIMEOUT_SECS))
        self._run.table.environment.update(master_environment(self._run.watch.address, self._token))

    def _stop_all(self) -> None:
        # Trainers first (with a master they flush their progress and leave), then the PS tasks, then the master.
        self._run.table.stop_all()
        if self._run.watch is not None:
            self._run.watch.close()
        if self._run.master is not None:
            self._run.master.stop()

    # ---- the main loop ---------------------------------------------------------------------------

    def _loop(self) -> None:
        trainers = self._run.table.trainers()
        if self.job.strategy is Strategy.PSS:  # the workers serve the chief's steps until it ends
            trainers = [t for t in trainers if t.cluster.task_type == "chief"]
        last_print = 0.0
        last_progress = time.time()
        while True:
            for msg in self._receiver.poll(0.05):
                if self._on_message(msg):
                    last_progress = time.time()
            now = time.time()
            self._check_processes()
            for task in self._exits.drive(now, self._waiting_for_data()):  # hung trainers, killed: restarted like a crash
                code = task.process.returncode if task.process else None
                diagnosis = self._exits.diagnose(task, -9 if code is None else code)
                self._actions.crashed(task, 9, diagnosis.as_dict() | {"action": self._exits.act(task, diagnosis)})
            self._run.record.sample_memory(now, self._run.table.every_process())
            self._run.record.sample_cpu(now, self._run.table.every_process())
            self._actions.drive(now)
            if self._driver is not None:
                self._driver.drive(now)
                if self._scaling is not None:
                    self._scaling.drive(now, self._driver.data_state())
                if self._stream is not None:
                    self._stream.drive(now)
                    if self._stream.idle(self._driver.data_state()):
                        last_progress = now  # waiting for the stream's next file is not a stall
            if self._run.errors:
                raise LaunchError("; ".join(self._run.errors))
            # Slots still waiting for --add-worker are not waited for: the data is done.
            if all(t.state in (TaskState.DONE, TaskState.REMOVED, TaskState.LATER) for t in trainers):
                break
            stalled = now - last_progress
            limit = STARTUP_TIMEOUT_SECS if self._run.global_step == 0 else STALL_TIMEOUT_SECS
            if stalled > limit and not self._run.faults.awaiting_resume():
                raise LaunchError(
                    f"no training progress for {stalled:.0f} s (global step {self._run.global_step}); "
                    f"see the logs in {model_dir.logs_dir(self.job.model_dir)}"
                )
            if now - last_print >= self._run.console.progress_period:
                self._print_progress(now)
                last_print = now
        # Drain datagrams still in flight (the workers' final reports).
        for msg in self._receiver.poll(0.2):
            self._on_message(msg)
        self._print_progress(time.time(), final=True)

    def _waiting_for_data(self) -> set[str]:
        """The trainers that hold no lease while no record is left to lease (a stream waiting for its
        next file or for the rest of a shard, the data's tail): they wait for records, not hung."""
        data = self._driver.data_state() if self._driver is not None else None
        if data is None:
            return set()
        leasable = self._stream.leasable(data) if self._stream is not None else data.records_total
        if data.records_trained + data.records_in_flight < leasable:
            return set()
        return {t.name for t in self._run.table.trainers()} - set(data.lease_holders)

    def _on_message(self, msg: dict[str, Any]) -> bool:
        """One status datagram (`tf_ecrec.launcher.job.status`); True if it shows progress."""
        kind, task, t = _kind(msg), msg.get("task", "?"), float(msg.get("t", time.time()))
        running = task in self._run.tasks and self._run.tasks[task].state is TaskState.RUNNING
        if running and kind in _SIGNS_OF_LIFE:
            # A trainer that (re)creates its session or recovers lost PS reports no step meanwhile while
            # the others may step on: its hang clock starts again (--hang-secs).
            self._exits.progressed(task, time.time())
        if kind is StatusKind.STEP:
            if running:
                self._run.tasks[task].training = True
            step = int(msg.get("step", 0))
            self._run.record.step(t, step, int(msg.get("records", 0)), task=task)
            if step > self._run.global_step or self._run.faults.interrupted(t):
                self._run.global_step = step
            for kind_, fault in self._run.faults.progress(t, step, session_at=self._session_at.get(task)):
                self._run.event(kind_, fault.task, step, t=t)
            return True
        if kind is StatusKind.SESSION:
            self._session_at[task] = t
            self._run.event(EventKind.SESSION, task, int(msg.get("step", 0)), t=t,  # "restored": a chief's backup
                            **({"restored": msg["restored"]} if msg.get("restored") else {}))
            if task == "chief:0":
                if self.job.strategy is not Strategy.PSS:
                    self._reader.start()
                for pending in self._run.tasks.values():
                    if pending.state is TaskState.PENDING:
                        self._run.start(pending)
            if self._run.faults.interrupted(t):
                self._run.global_step = int(msg.get("step", 0))
            return True
        if kind is StatusKind.DONE:
            self._run.record.done_reports[task] = msg
            return True
        if kind is StatusKind.RECOVERED:
            extra = {k: msg.get(k) for k in ("method", "lost_ps", "bytes_rebuilt", "rebuild_seconds", "phases", *_SETTLED)}
            self._run.event(EventKind.RECOVERED, task, msg.get("step"), t=t, **extra)
            self._run.rebuilding = False
            self._run.console.print(f"{task} recovered lost PS {msg.get('lost_ps')} by {msg.get('method')}: "
                                    f"{msg.get('bytes_rebuilt', 0):,} bytes in {msg.get('rebuild_seconds')} s")
            return True
        if kind is StatusKind.REBUILDING:
            self._run.rebuilding = True
            self._run.event(EventKind.REBUILDING, task, msg.get("step"), t=t, **{k: msg.get(k) for k in ("lost_ps", "seconds", "phases", *_SETTLED)})
            self._run.console.print(
                f"{task} rebuilds lost PS {msg.get('lost_ps')} while training goes on "
                f"(trainers resumed {msg.get('seconds')} s after the session began)"
            )
            return True
        if kind is StatusKind.SETTLED:
            self._run.event(EventKind.SETTLED, task, msg.get("step"), t=t, **{k: msg.get(k) for k in _SETTLED})
            return True
        if kind is StatusKind.FAILOVER:
            self._run.event(EventKind.FAILOVER, task, None, t=t, state=msg.get("state"), reason=msg.get("reason"))
            return True
        if kind is StatusKind.ERROR:
            self._run.errors.append(f"{task} failed: {msg.get('error')}")
        return False

    def _check_processes(self) -> None:
        self._actions.check_spares()
        for task in self._run.tasks.values():
            if task.process is None or task.state not in (TaskState.RUNNING, TaskState.LEAVING):
                continue
            code = task.process.poll()
            if code is None:
                continue
            task.exit_code = code
            diagnosis = self._exits.diagnose(task, code)
            if task.state is TaskState.RUNNING and (code < 0 or diagnosis.kind is ExitKind.OOM):
                # died from a signal (the OOM killer, a failpoint) or of an allocation failure: restart it
                self._actions.crashed(task, -code if code < 0 else 0, diagnosis.as_dict() | {"action": self._exits.act(task, diagnosis)})
                continue
            self._run.event(EventKind.EXIT, task.name, code=code, diagnosis=diagnosis.as_dict())
            if task.state is TaskState.LEAVING:
                task.state = TaskState.REMOVED
                if code != 0:
                    self._run.watch_report(task.name, f"exited with code {code} while leaving")
            elif code == 0 and task.cluster.task_type != "ps":
                task.state = TaskState.DONE
            else:
                task.state = TaskState.FAILED
                raised = last_traceback(task.tail(400), max_lines=30)
                if raised:
                    where = f" (its log: {task.log.name})" if task.log is not None else ""
                    self._run.errors.append(f"{task.name} exited with code {code}; it raised{where}:\n{raised}")
                else:
                    self._run.errors.append(f"{task.name} exited with code {code}; last lines of its log:\n" + task.tail())
        if self._run.master is not None and not self._run.master.killed and self._run.master.poll() is not None:
            self._run.errors.append(
                f"the job master exited with code {self._run.master.poll()}; last lines of its log:\n" + self._run.master.tail()
            )
            self._run.master.killed = True  # reported once

    # ---- the end ---------------------------------------------------------------------------

    def _digest(self) -> dict[str, Any]:
        if self.job.strategy is Strategy.PSS:  # written by the chief, the only process that can read its variables
            with open(model_dir.digest_file(self.job.model_dir), encoding="utf-8") as fh:
                return dict(json.load(fh))
        return self._reader.read([t.cluster.address for t in self._run.table.ps()])

    # ---- output ---------------------------------------------------------------------------

    def _print_progress(self, now: float, final: bool = False) -> None:
        states = " ".join(f"{name}={t.state.label}" for name, t in sorted(self._run.tasks.items()))
        run = self._run
        data_state = self._driver.data_state() if self._driver is not None else None
        master_up = None if run.master is None else not run.master.killed
        line = progress_line(now - run.record.t0, run.global_step, self.job.steps, run.record.rate(now), states,
                             data_state, master_up)
        run.console.progress(line, final=final)


def _kind(msg: dict[str, Any]) -> StatusKind | None:
    """The datagram's kind; None for one this launcher does not know (ignored)."""
    try:
        return StatusKind(msg.get("kind"))
    except ValueError:
        return None


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
