"""The supervisor's part that says why tasks end and acts on it: memory limits, OOM, hangs, injections.

- **Memory limits** (``--ps-memory-mb M``): every PS runs in its own memory cgroup
  (`tf_ecrec.launcher.memory_limit`); a PS the kernel kills at its limit is restarted with the limit
  times ``--oom-growth`` (erasure coding rebuilds it from parity), and the report says so.
- **Hangs** (``--hang-secs S``, 0: off): a trainer that reported no step for S seconds while the
  job's global step went on by at least `HANG_MIN_STEPS` (so not a pause of the whole job, such as a
  recovery) is killed and restarted.  Any other report of work (a session created, lost PS recovered
  or being rebuilt, a failover) starts its clock again: a chief rebuilding a PS while the workers
  step on is not hung.  A trainer that holds no lease while nothing is left to lease (a stream
  waiting for its next file or for the rest of a shard, the data's tail) waits for records, which
  is not a hang: its clock starts again when records come.  A trainer that holds a lease stays
  watched: a hung one holding the last records is what leaves nothing to lease.  One frozen while it
  waited is found by the master's membership instead (silent past ``--task-timeout``), and is killed,
  restarted and reported as a hang the same way (`FaultActions.lost`).
- **Silent PS** (``--ps-hang-secs S``, 4 by default, 0: off): a PS that answered the launcher's probe since it
  started (`tf_ecrec.launcher.ps_probe`) and then answered nothing for S seconds (hung, stopped,
  cut off: a live process the trainers would wait on until their session timeout) is killed, and
  then restarted or replaced by a spare as any PS that died, the report naming why; one that spent a
  share of a core meanwhile is busy, not hung, and is given longer (`tf_ecrec.launcher.ps_probe.is_hung`).
- **Injections** (``--inject oom:ps:I@step=N``, ``--inject hang:worker:I@step=N``): at step N the
  launcher makes a PS allocate memory until its limit kills it (SIGUSR1, `consume_memory_on_signal`),
  or freezes a trainer (SIGSTOP): the real failure, for tests and drills.

Every exit is classified (`tf_ecrec.launcher.job.diagnosis.classify`) into an event's ``diagnosis``;
the report lists them under ``exits``.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Collection
from typing import Any

from tf_ecrec.launcher.cpu_usage import busy_seconds
from tf_ecrec.launcher.job.diagnosis import Diagnosis, ExitKind, classify, parse_injection
from tf_ecrec.launcher.memory_limit import CgroupMemoryLimits, MemoryLimits
from tf_ecrec.launcher.process_table import TaskProcess, TaskState
from tf_ecrec.launcher.ps_probe import PsProbe, is_hung

HANG_MIN_STEPS = 10


class ExitWatch:
    """See the module docstring; the supervisor calls it from its loop thread only."""

    def __init__(self, run: Any, limits: MemoryLimits | None = None, probe: PsProbe | None = None) -> None:
        self._run = run
        job = run.job
        self._limits = limits if limits is not None else (CgroupMemoryLimits() if job.ps_memory_mb else None)
        self._limit_mb: dict[str, int] = {}
        self._progress: dict[str, tuple[float, int]] = {}  # trainer -> (its last step report, global step then)
        self._injections = [parse_injection(t) for t in job.injections]
        self._hung: set[str] = set()
        self._silent: dict[str, tuple[float, float | None]] = {}  # a PS killed for silence -> (silent s, CPU share)
        # PS silent past half --ps-hang-secs -> (its last answer, when that was seen, its busy seconds then)
        self._answered: dict[str, tuple[float, float, float | None]] = {}
        self._probe = (probe or PsProbe()) if getattr(job, "ps_hang_secs", 0) else None

    def environment(self, task: TaskProcess) -> dict[str, str]:
        """What `task`'s process needs in its environment (its memory cgroup)."""
        if self._limits is None or task.cluster.task_type != "ps":
            return {}
        limit = self._limit_mb.setdefault(task.name, int(self._run.job.ps_memory_mb))
        return self._limits.environment(task.name, limit)

    def progressed(self, task: str, t: float) -> None:
        self._progress[task] = (t, self._run.global_step)

    def drive(self, now: float, waiting: Collection[str] = ()) -> list[TaskProcess]:
        """Due injections; the trainers found hung, killed (the supervisor restarts them).  `waiting`:
        the trainers that hold no lease while no record is left to lease (see the module docstring)."""
        step = self._run.global_step
        for kind, spec in list(self._injections):
            task = self._run.tasks.get(spec.task)
            if step >= spec.step and task is not None and task.state is TaskState.RUNNING and task.process is not None:
                task.process.send_signal(signal.SIGUSR1 if kind == "oom" else signal.SIGSTOP)
                self._injections.remove((kind, spec))
                self._run.console.print(f"injected {kind} into {task.name} at global step {step}")
        hung = []
        secs = self._run.job.hang_secs
        for task in self._run.table.trainers():
            if not secs or task.state is not TaskState.RUNNING or not task.training or task.process is None:
                continue
            if task.name in waiting:
                self._progress[task.name] = (now, step)
                continue
            t, at = self._progress.get(task.name, (now, step))
            if now - t > secs and step >= at + HANG_MIN_STEPS:
                task.process.send_signal(signal.SIGKILL)
                task.process.wait()
                self._hung.add(task.name)
                self._progress.pop(task.name, None)
                hung.append(task)
        return hung + self._silent_ps(now)

    def _silent_ps(self, now: float) -> list[TaskProcess]:
        """The PS tasks that answered the probe since they started and then not for ``--ps-hang-secs``, killed."""
        if self._probe is None:
            return []
        running = [t for t in self._run.table.ps() if t.state is TaskState.RUNNING and t.process is not None]
        self._probe.watch({t.name: t.cluster.address for t in running})
        silent = []
        for task in running:
            assert task.process is not None  # running
            last = self._probe.last_answer(task.name, task.cluster.address)
            if last is None or last < task.started_at:
                continue
            hang_secs = self._run.job.ps_hang_secs
            if now - last <= hang_secs / 2:  # answering: no CPU read (a PS's threads are a hundred files)
                continue
            seen = self._answered.get(task.name)
            if seen is None or seen[0] != last:  # silent for half the bound: the CPU its silence is weighed against
                seen = self._answered[task.name] = (last, now, busy_seconds(task.process.pid))
            if now - last <= hang_secs:
                continue
            cpu = busy_seconds(task.process.pid)  # run or waited to run: a starved PS is busy too
            share = (cpu - seen[2]) / (now - seen[1]) if cpu is not None and seen[2] is not None and now > seen[1] else None
            if not is_hung(now - last, share, hang_secs):
                continue
            task.process.send_signal(signal.SIGKILL)
            task.process.wait()
            self._silent[task.name] = (now - last, share)
            silent.append(task)
        return silent

    def diagnose(self, task: TaskProcess, code: int) -> Diagnosis:
        """Why `task`'s process ended with `code`."""
        oom_kills = self._limits.oom_kills(task.name) if self._limits is not None and task.name in self._limit_mb else 0
        hung = task.name in self._hung
        self._hung.discard(task.name)
        silent = self._silent.pop(task.name, None)
        if silent is not None:
            busy = "" if silent[1] is None else f", {100 * silent[1]:.0f}% of a core meanwhile"
            return Diagnosis(ExitKind.HANG, code, f"answered nothing for {silent[0]:.2f} s (--ps-hang-secs "
                             f"{self._run.job.ps_hang_secs:g}{busy}); killed by the launcher", silent_seconds=silent[0])
        return classify(code, hung=hung, oom_kills=oom_kills, log_tail=task.tail(40),
                        limit_mb=self._limit_mb.get(task.name))

    def act(self, task: TaskProcess, diagnosis: Diagnosis) -> str:
        """What restarting `task` after `diagnosis` involves (a larger memory limit after an OOM)."""
        old = self._limit_mb.get(task.name)
        if diagnosis.kind is ExitKind.OOM and old is not None and self._limits is not None:
            new = math.ceil(old * self._run.job.oom_growth)
            self._limit_mb[task.name] = new
            return f"restarted with a {new} MB memory limit (was {old} MB)"
        return "restarted"

    def close(self) -> None:
        if self._limits is not None:
            self._limits.close()
        if self._probe is not None:
            self._probe.close()
