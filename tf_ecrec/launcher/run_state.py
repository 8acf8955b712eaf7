"""What the supervisor and its parts share while a job runs: the process table, the record, the master, the step.

`tf_ecrec.launcher.supervisor.Supervisor` owns one `RunState` and hands it
to its parts (`tf_ecrec.launcher.fault_actions`, `tf_ecrec.launcher.master_driver`);
all of them run on the supervisor's loop thread only.
"""

from __future__ import annotations

import time
from typing import Any

from tf_ecrec.launcher.console import Console
from tf_ecrec.launcher.events import EventKind
from tf_ecrec.launcher.faults import FaultSchedule
from tf_ecrec.launcher.job.spec import JobSpec
from tf_ecrec.launcher.master_process import MasterProcess, MasterWatch
from tf_ecrec.launcher.process_table import ProcessTable, TaskProcess
from tf_ecrec.launcher.run_record import RunRecord
from tf_ecrec.session.cluster_source import write_cluster_file


class RunState:
    """The state of one run.

    Attributes:
      job, console, table, record, faults: the run's parts.
      tasks: ``table.tasks``, by name.
      cluster_file: the cluster file trainers follow (`tf_ecrec.session.cluster_source`).
      global_step: the newest global step the status channel showed (it goes
        down after a fault, to the step training resumed from).
      errors: failures that end the run (raised by the supervisor's loop).
      master: the master process the launcher runs, if any.
      watch: the launcher's watch on the job master, if the job has one.
      rebuilding: the chief reported a background rebuild begun and not yet its end (``--kill TASK@rebuild``).
    """

    def __init__(self, job: JobSpec, console: Console, table: ProcessTable, record: RunRecord, faults: FaultSchedule,
                 cluster_file: str) -> None:
        self.job = job
        self.console = console
        self.table = table
        self.tasks = table.tasks
        self.record = record
        self.faults = faults
        self.cluster_file = cluster_file
        self.global_step = 0
        self.exit_watch: Any = None  # tf_ecrec.launcher.exits.ExitWatch, set by the supervisor
        self.errors: list[str] = []
        self.master: MasterProcess | None = None
        self.watch: MasterWatch | None = None
        self.rebuilding = False

    def event(self, kind: EventKind, task: str, step: int | None = None, t: float | None = None, **extra: Any) -> None:
        """Records an event at `step` (default: the current global step) and `t` (default: now)."""
        self.record.event(kind, task, self.global_step if step is None else step, t=t, **extra)

    def start(self, task: TaskProcess, kind: EventKind = EventKind.START) -> None:
        """Starts `task`'s process and records it (`kind`: start, restart, add, spare)."""
        if self.exit_watch is not None:
            task.env = self.exit_watch.environment(task)
        self.table.launch(task, time.time())
        self.event(kind, task.name)

    def start_spare(self, address: str) -> None:
        """Starts a spare PS standing by at `address` (see `tf_ecrec.launcher.task.entry.stand_by`)."""
        self.start(self.table.add_spare(address), kind=EventKind.SPARE)

    def write_cluster_file(self, down: str | None = None) -> None:
        """The cluster every trainer follows (`FileClusterSource`) and its version; `down` listed without address."""
        write_cluster_file(self.cluster_file, self.table.cluster(down), version=self.table.version())

    def watch_report(self, name: str, reason: str) -> None:
        """Tells the job master (if any) that task `name` failed."""
        if self.watch is not None:
            self.watch.report_failure(name, reason)

    def note_failure(self, name: str) -> None:
        """Records the records in flight (leased, not acknowledged) as a failure hits."""
        stats = self.watch.data_state() if self.watch is not None else None
        self.record.failure(name, self.global_step, None if stats is None else stats.records_in_flight)
