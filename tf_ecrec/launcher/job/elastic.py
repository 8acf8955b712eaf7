"""Elastic workers of a `JobSpec`: ``--add-worker``, ``--remove-worker`` and ``--min-workers/--max-workers``
(automatic scaling, `tf_ecrec.launcher.autoscaling`), checked, and the worker slots they need.

Every slot a worker may ever run in is in every task's TF_CONFIG from the start (TensorFlow's
cluster spec is fixed): the initial workers, one per ``--add-worker`` step, and with automatic
scaling up to ``--max-workers`` trainers (the chief counts).  Slots not started yet stay empty.
"""

from __future__ import annotations

from typing import Any

from tf_ecrec.errors import ConfigError
from tf_ecrec.launcher.job.choices import Strategy


def _check(ok: bool, message: str, source: str) -> None:
    if not ok:
        raise ConfigError(f"{message}; source: {source}")


def validate(job: Any) -> None:
    """Raises ConfigError for elastic flags the job cannot take."""
    for step in job.add_workers:
        _check(0 < step < job.steps, f"--add-worker step={step} must be inside the run, 0 < step < --steps {job.steps}",
               "--add-worker")
    removed: set[str] = set()
    for remove in job.removes:
        _check(remove.task_type == "worker",
               f"--remove-worker {remove}: only non-chief workers (worker:I) can leave a running job", "--remove-worker")
        job.check_task_exists(remove, "--remove-worker")
        _check(0 < remove.step < job.steps,
               f"--remove-worker {remove}: step {remove.step} must be inside the run, 0 < step < --steps {job.steps}",
               "--remove-worker")
        _check(remove.task not in removed, f"--remove-worker {remove}: {remove.task} is removed twice", "--remove-worker")
        removed.add(remove.task)
    if job.min_workers is None and job.max_workers is None:
        return
    source = "--min-workers/--max-workers"
    _check(job.min_workers is not None and job.max_workers is not None,
           "automatic scaling takes both --min-workers and --max-workers", source)
    scaling_config(job)  # the bounds themselves
    _check(job.min_workers <= job.workers <= job.max_workers,
           f"--workers {job.workers} (where the job starts) must be within --min-workers {job.min_workers} and "
           f"--max-workers {job.max_workers}", source)
    _check(job.uses_master and job.strategy is Strategy.ESTIMATOR and not job.add_workers and not job.removes,
           "automatic scaling needs the job master's dynamic sharding and Estimator trainers, without "
           "--add-worker/--remove-worker/--no-master/--deterministic/--strategy pss", source)


def scaling_config(job: Any) -> Any:
    """The job's `tf_ecrec.master.autoscale.ScalingConfig`, None without automatic scaling."""
    if job.max_workers is None:
        return None
    from tf_ecrec.master.autoscale import ScalingConfig

    return ScalingConfig(int(job.min_workers), int(job.max_workers), window_secs=job.autoscale_window)


def worker_slots(job: Any) -> int:
    """Non-chief worker slots in TF_CONFIG: the initial ones, one per --add-worker, up to --max-workers - 1."""
    return max(job.workers - 1 + len(job.add_workers), (job.max_workers or 0) - 1)


def added_at(job: Any, task: str) -> int | None:
    """The --add-worker step of an added slot ("worker:I"), None for the initial tasks."""
    first = job.workers - 1
    for i, step in enumerate(job.add_workers):
        if task == f"worker:{first + i}":
            return step
    return None
