"""The flags ``tf-ecrec run --strategy pss`` refuses (`tf_ecrec.launcher.task.pss_job` says why), checked with the spec."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tf_ecrec.errors import ConfigError
from tf_ecrec.launcher.job.choices import FaultTolerance, RestartAt

if TYPE_CHECKING:
    from tf_ecrec.launcher.job.spec import JobSpec


def validate(job: JobSpec) -> None:
    """Raises ConfigError for a flag ``--strategy pss`` does not support (see the module doc)."""
    rules = [
        (job.fault_tolerance is FaultTolerance.ECREC,
         f"--fault-tolerance {job.fault_tolerance.value}: --strategy pss trains with --fault-tolerance ecrec"),
        (job.data == "synthetic", f"--data {job.data}: --strategy pss reads --data synthetic only"),
        (job.master_address is None and job.zk is None,
         "--master/--zk: --strategy pss has no job master (its coordinator schedules the steps)"),
        (not job.add_workers and not job.removes, "--add-worker/--remove-worker: not with --strategy pss"),
        (job.spare_ps == 0, "--spare-ps: not with --strategy pss"),
        (job.restart_at is RestartAt.SAME,
         "--restart-at new-port: under --strategy pss a recovered PS keeps its address (docs/pss.md)"),
        (not job.deterministic, "--deterministic: --strategy pss trains asynchronously"),
    ]
    for ok, message in rules:
        if not ok:
            raise ConfigError(f"{message}; source: --strategy")
