"""What the launcher does with the job master while a job runs: lost tasks, elastic workers, data counters.

- A task is noticed dead twice over: its process exited (the supervisor's
  ``waitpid``), or it left the master's view of live tasks (heartbeats
  stopped, or its ZooKeeper session ended) while its process still runs:
  after `LOST_GRACE_SECS` it is killed and restarted like a ``--kill``
  (`FaultActions.lost`). A trainer that reported "done" (its last step ran)
  leaves the view on purpose and then exits, which can take seconds on a
  loaded machine: it gets `DONE_EXIT_GRACE_SECS` to exit before it counts
  as lost.
- ``--add-worker step=N`` starts a pre-allocated worker slot at step N;
  ``--remove-worker worker:I@step=N`` sends SIGTERM: the worker finishes its
  step, flushes its progress and leaves (SIGKILL after `LEAVE_TIMEOUT_SECS`).
- A trainer still running `FINISHED_GRACE_SECS` after the dataset is
  finished and the chief has ended is asked to leave (SIGTERM, SIGKILL after
  `FINISHED_LEAVE_SECS`): it has nothing left to train, and a worker
  restarted late (after a hang or a crash) can otherwise wait for a chief
  that is gone, holding the run open.
- The dataset's counters, for the progress line and the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tf_ecrec.errors import LaunchError
from tf_ecrec.launcher.events import EventKind
from tf_ecrec.launcher.process_table import TaskProcess, TaskState
from tf_ecrec.launcher.run_state import RunState

LOST_GRACE_SECS = 3.0  # a task out of the master's view this long, process alive: restart it
DONE_EXIT_GRACE_SECS = 30.0  # the same for a trainer that reported "done" and left the view
LEAVE_TIMEOUT_SECS = 60.0  # --remove-worker: SIGKILL a worker that has not left by then
FINAL_DATA_TIMEOUT_SECS = 60.0
FINISHED_GRACE_SECS = 30.0  # a trainer still running this long after the data and the chief are done: leave
FINISHED_LEAVE_SECS = 10.0  # ... and SIGKILL if it has not left this long after SIGTERM


class MasterDriver:
    """Drives the run's job master (`RunState.watch`, and `RunState.master` when the launcher runs it).

    Args:
      run: the run's state; its ``watch`` is set.
      lost: called with a task the master lost while its process ran.
    """

    def __init__(self, run: RunState, lost: Callable[[TaskProcess], None]) -> None:
        self._run = run
        self._lost = lost
        self._suspects: dict[str, float] = {}  # task -> when it left the master's view
        self._removed: set[str] = set()
        self._data_seen: tuple[float, Any] = (0.0, None)
        self._finished_at: float | None = None  # when the data and the chief were first seen done

    def drive(self, now: float) -> None:
        """Membership, failure reports and elastic workers; see the module docstring."""
        watch = self._run.watch
        assert watch is not None
        departed, joined = watch.departures()
        for name in joined:
            task = self._run.tasks.get(name)
            if task is not None and task.state is TaskState.RUNNING:
                task.member_since = now
            self._suspects.pop(name, None)
        for gone in departed:
            task = self._run.tasks.get(gone.task)
            # Only a departure of the current process counts (not of one we already killed).
            if task is not None and task.state is TaskState.RUNNING and task.member_since is not None:
                self._suspects.setdefault(gone.task, now)
        for name, since in list(self._suspects.items()):
            task = self._run.tasks[name]
            if task.state is not TaskState.RUNNING:
                del self._suspects[name]
            elif now - since >= (DONE_EXIT_GRACE_SECS if name in self._run.record.done_reports else LOST_GRACE_SECS):
                del self._suspects[name]
                if task.alive:
                    self._lost(task)
        watch.flush_reports()
        self._drive_elastic(now)
        self._drive_finished(now)

    def _drive_elastic(self, now: float) -> None:
        for task in self._run.tasks.values():
            added_at = self._run.job.added_at(task.name)
            if task.state is TaskState.LATER and added_at is not None and self._run.global_step >= added_at:
                self._run.start(task, kind=EventKind.ADD)
                self._run.console.print(f"added {task.name} at global step {self._run.global_step}")
        for remove in self._run.job.removes:
            task = self._run.tasks[remove.task]
            if remove.task not in self._removed and self._run.global_step >= remove.step and task.state is TaskState.RUNNING:
                self._removed.add(remove.task)
                assert task.process is not None
                task.process.terminate()  # finish the step, report progress, leave
                task.state, task.leave_deadline = TaskState.LEAVING, now + LEAVE_TIMEOUT_SECS
                self._run.event(EventKind.REMOVE, task.name)
                self._run.console.print(f"asked {task.name} to leave at global step {self._run.global_step}")
        for task in self._run.tasks.values():
            # A process that exited is the supervisor's to count (it saw the exit).
            if task.state is TaskState.LEAVING and now >= task.leave_deadline and task.process is not None and task.alive:
                task.process.kill()
                task.process.wait()
                task.state = TaskState.REMOVED
                self._run.event(EventKind.EXIT, task.name, code=task.process.returncode)
                self._run.watch_report(task.name, "did not leave by its deadline after SIGTERM")

    def _drive_finished(self, now: float) -> None:
        chief = self._run.tasks.get("chief:0")
        if chief is None or chief.state is not TaskState.DONE:
            return
        if self._finished_at is None:
            stats = self.data_state(now=now)
            if stats is None or not stats.finished:
                return
            self._finished_at = now
        if now - self._finished_at < FINISHED_GRACE_SECS:
            return
        for task in self._run.table.trainers():
            if task.state is TaskState.RUNNING and task.process is not None:
                task.process.terminate()
                task.state, task.leave_deadline = TaskState.LEAVING, now + FINISHED_LEAVE_SECS
                self._run.event(EventKind.REMOVE, task.name, reason="the data is finished and the chief ended")
                self._run.console.print(
                    f"asked {task.name} to leave: still running {FINISHED_GRACE_SECS:g} s after the data was "
                    "finished and the chief ended"
                )

    def data_state(self, max_age: float = 2.0, now: float | None = None) -> Any:
        """The master's dataset counters, at most `max_age` seconds old at `now` (None if unknown)."""
        at, stats = self._data_seen
        now = time.time() if now is None else now
        if self._run.watch is not None and now - at >= max_age:
            if not (self._run.master is not None and self._run.master.killed):
                stats = self._run.watch.data_state() or stats
            self._data_seen = (now, stats)
        return stats

    def final_data_state(self) -> Any:
        """The dataset's final counters (restarting a master still down from a kill)."""
        assert self._run.watch is not None
        if self._run.master is not None and self._run.master.killed:
            self._run.master.start(wait=True)
            self._run.event(EventKind.RESTART, "master")
        deadline = time.time() + FINAL_DATA_TIMEOUT_SECS
        while True:
            stats = self._run.watch.data_state()
            if stats is not None:
                return stats
            if time.time() > deadline:
                raise LaunchError(
                    f"could not read the data state from the job master at {self._run.watch.address} within "
                    f"{FINAL_DATA_TIMEOUT_SECS:g}s after training"
                )
            time.sleep(0.5)
