"""The launcher's faults in action: kill, crash, loss, restart (at the same address, a new port, or a spare).

`tf_ecrec.launcher.faults.FaultSchedule` keeps the books; `FaultActions`
does what they say, on the supervisor's loop, for every kind of fault the
same way::

    --kill TASK@step=N at step N      -> SIGKILL   -> hit -> restart after --restart-delay
    a task dies from a signal (crash) ->              hit -> restart after --restart-delay
    the master's view lost a task     -> SIGKILL   -> hit -> restart after --restart-delay
    --kill master@step=N              -> SIGKILL   -> hit -> restart (same port, same state dir)

A PS that is hit gives its role to a running spare at once (``--spare-ps``;
no restart then), or, with ``--restart-at new-port``, is listed as down in
the cluster file until it restarts at a fresh port.  Every task fault is
reported to the job master at once, with the records in flight.
"""

from __future__ import annotations

import signal
import time
from typing import Any

from tf_ecrec.launcher.events import EventKind
from tf_ecrec.launcher.faults import Fault
from tf_ecrec.launcher.job.diagnosis import Diagnosis, ExitKind, classify
from tf_ecrec.launcher.job.spec import RestartAt
from tf_ecrec.launcher.ports import pick_ports
from tf_ecrec.launcher.process_table import TaskProcess, TaskState
from tf_ecrec.launcher.run_state import RunState

MAX_LOST_RESTARTS = 3


class FaultActions:
    """Acts on the run's fault schedule; see the module docstring."""

    def __init__(self, run: RunState) -> None:
        self._run = run

    def drive(self, now: float) -> None:
        """Kills what is due at the current global step and restarts what is due at `now`."""
        for fault in self._run.faults.due_kills(self._run.global_step, self._run.rebuilding):
            if fault.spec.task_type == "spare":
                self._kill_spare(fault)
            elif fault.on_master:
                assert self._run.master is not None  # a master fault needs the master (JobSpec checks it)
                if not self._run.master.killed:
                    self._kill_master(fault)
            elif self._run.tasks[fault.task].killable:
                self._kill(self._run.tasks[fault.task], fault, f"killed by --kill {fault.spec}")
        for fault in self._run.faults.due_restarts(now):
            if fault.on_master:
                assert self._run.master is not None  # a master fault needs the master (JobSpec checks it)
                if self._run.master.killed and self._run.master.poll() is not None:
                    self._run.master.start(wait=False)  # same port and state dir; clients retry meanwhile
                    self._run.faults.restarted(fault)
                    self._run.event(EventKind.RESTART, "master")
                    self._run.console.print(f"restarted the job master at {self._run.master.address}")
                continue
            task = self._run.tasks[fault.task]
            if task.state is TaskState.KILLED:
                if task.cluster.task_type == "ps" and self._run.job.restart_at is RestartAt.NEW_PORT:
                    self._move(task)
                self._run.start(task, kind=EventKind.RESTART)
                if task.cluster.task_type == "ps" and self._run.job.restart_at is RestartAt.SAME:
                    self._run.write_cluster_file()  # alive again, at its old address
                self._run.faults.restarted(fault)
                self._run.console.print(f"restarted {task.name} at {task.cluster.address}")

    def _kill(self, task: TaskProcess, fault: Fault, reason: str, diagnosis: Diagnosis | None = None) -> None:
        """SIGKILL `task` now and schedule its restart; the master hears of it at once.  `diagnosis`: why, if
        not for ``--kill``."""
        assert task.process is not None
        task.process.send_signal(signal.SIGKILL)
        task.process.wait()
        why = diagnosis or classify(-9, injected=True)
        self._hit(task, fault, EventKind.KILL, f"killed {task.name} at global step {self._run.global_step}",
                  diagnosis=why.as_dict() | {"action": "restarted"})
        if self._run.watch is not None:
            self._run.note_failure(task.name)
            self._run.watch_report(task.name, reason)

    def crashed(self, task: TaskProcess, signum: int, diagnosis: dict[str, Any] | None = None) -> None:
        """A task died (a signal, the OOM killer, a failpoint, a hang): restart it, as a pod restart would.
        `diagnosis`: why (`tf_ecrec.launcher.job.diagnosis`), with the ``action`` taken."""
        fault = self._run.faults.unplanned(task.cluster.task_type, task.cluster.task_index, self._run.global_step)
        why = diagnosis["detail"] if diagnosis else f"died from signal {signum}"
        action = diagnosis.get("action", "restarted") if diagnosis else "restarted"
        self._hit(task, fault, EventKind.CRASH, f"{task.name} {why} at global step {self._run.global_step}: {action}",
                  signal=signum, diagnosis=diagnosis)
        if self._run.watch is not None:
            self._run.note_failure(task.name)
            self._run.watch_report(task.name, f"died from signal {signum}")

    def _hit(self, task: TaskProcess, fault: Fault, kind: EventKind, message: str, **extra: Any) -> None:
        """`task` is down from `fault`: its restart is scheduled, or a spare takes its role at once."""
        task.state = TaskState.KILLED
        self._run.faults.hit(fault, self._run.global_step)
        self._run.event(kind, task.name, **extra)
        self._run.console.print(message)
        if task.cluster.task_type == "ps" and not self._take_over(task, fault):
            # Listed as down until it restarts (at its old address or a new one): trainers say which PS they
            # wait for, and give up after --ps-wait if it never comes (--restart-delay inf).
            self._run.write_cluster_file(down=task.name)

    def _kill_spare(self, fault: Fault) -> None:
        """``--kill spare:I``: SIGKILL that spare while it stands by; one that took a PS role by then is left."""
        self._run.faults.hit(fault, self._run.global_step)
        self._run.faults.restarted(fault)  # nothing to restart: spare_lost starts a new spare
        fault.resumed = fault.regained = True  # training never stopped for it: no resumption to report
        spare = next((s for s in self._run.table.spares if s.name == fault.task), None)
        if spare is None or spare.process is None:
            self._run.console.print(f"--kill {fault.spec}: {fault.task} is not standing by (it took a PS role); "
                                    "nothing killed")
            return
        spare.process.send_signal(signal.SIGKILL)
        self.spare_lost(spare, spare.process.wait(), f"killed by --kill {fault.spec}")

    def check_spares(self) -> None:
        """Replaces every standing-by spare whose process has exited."""
        for spare in list(self._run.table.spares):
            code = spare.process.poll() if spare.process is not None else None
            if code is not None:
                self.spare_lost(spare, code, f"exited with code {code}")

    def spare_lost(self, spare: TaskProcess, code: int, why: str) -> None:
        """A standing-by spare is gone (killed, or its process exited): another starts at once on a fresh port,
        so the next PS failure still finds one (a spare holds no state: nothing to recover)."""
        self._run.table.spares.remove(spare)
        if spare.log:
            spare.log.close()
        self._run.event(EventKind.SPARE_LOST, spare.name, code=code, reason=why)
        address = spare.spare_address
        assert address is not None
        host = address.rsplit(":", 1)[0]
        self._run.console.print(f"{spare.name} at {address} is gone ({why}); a new spare replaces it")
        self._run.start_spare(f"{host}:{pick_ports(1, 0, host)[0]}")

    def _kill_master(self, fault: Fault) -> None:
        assert self._run.master is not None
        self._run.note_failure("master")  # before: a dead master cannot say
        self._run.master.kill()
        self._run.faults.hit(fault, self._run.global_step)
        self._run.event(EventKind.KILL, "master")
        self._run.console.print(f"killed the job master at global step {self._run.global_step}")

    def _take_over(self, task: TaskProcess, fault: Fault) -> bool:
        """Gives a lost PS's role to a running spare at once; False if no spare is running.

        The spare's address replaces the PS's in every task's cluster and in
        the cluster file, which the trainers follow (as after a move) and the
        spare reads to learn its role.  Nothing restarts; a new spare starts
        behind it on a fresh port.
        """
        spare = next((s for s in self._run.table.spares if s.alive), None)
        if spare is None:
            return False
        self._run.table.spares.remove(spare)
        address = spare.spare_address
        assert address is not None
        old = self._run.table.move(task, address)
        self._run.write_cluster_file()
        if task.log:
            task.log.close()
        task.process, task.log = spare.process, spare.log
        task.state, task.started_at, task.member_since = TaskState.RUNNING, time.time(), None
        self._run.faults.restarted(fault)  # the spare is the restart
        self._run.event(EventKind.MOVE, task.name, old=old, new=address, spare=spare.name)
        self._run.console.print(f"{spare.name} at {address} takes the role of {task.name}")
        host = address.rsplit(":", 1)[0]
        self._run.start_spare(f"{host}:{pick_ports(1, 0, host)[0]}")
        return True

    def _move(self, task: TaskProcess) -> None:
        """Gives a PS about to restart a fresh port; every task's cluster and the cluster file follow."""
        host = task.cluster.address.rsplit(":", 1)[0]
        address = f"{host}:{pick_ports(1, 0, host)[0]}"
        old = self._run.table.move(task, address)
        self._run.write_cluster_file()
        self._run.event(EventKind.MOVE, task.name, old=old, new=address)
        self._run.console.print(f"{task.name} moves from {old} to {address}")

    def lost(self, task: TaskProcess) -> None:
        """`task` left the master's view while its process ran: kill and restart it (at most MAX_LOST_RESTARTS times)."""
        task.lost_restarts += 1
        if task.lost_restarts > MAX_LOST_RESTARTS:
            self._run.errors.append(f"{task.name} was lost by the master {task.lost_restarts} times; giving up")
            return
        self._run.event(EventKind.LOST, task.name)
        self._run.console.print(f"{task.name} left the master's view of live tasks while its process ran: restarting it")
        fault = self._run.faults.unplanned(task.cluster.task_type, task.cluster.task_index, self._run.global_step)
        # Alive to waitpid and silent to the master: hung (stopped, deadlocked) or cut off, whether or not it held
        # a lease (a trainer waiting for records is exempt from the launcher's own progress clock, not from this).
        self._kill(task, fault, "lost by the master's membership", Diagnosis(
            ExitKind.HANG, -9, "silent to the job master's membership while its process ran (hung or cut off); "
            "killed by the launcher"))
