"""The checkpoint intervals of a `JobSpec`: stock checkpoints and flash checkpoints, checked and turned into configs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tf_ecrec.errors import ConfigError
from tf_ecrec.flash.config import FlashConfig
from tf_ecrec.launcher.job.choices import FaultTolerance, Strategy


def _check(ok: bool, message: str, source: str) -> None:
    if not ok:
        raise ConfigError(f"{message}; source: {source}")


def validate(job: Any) -> None:
    """Raises ConfigError for a checkpoint or flash checkpoint interval the job cannot take."""
    _check(job.checkpoint_steps is None or job.checkpoint_secs is None,
           "--checkpoint-steps and --checkpoint-secs were both given; choose one interval",
           "--checkpoint-steps/--checkpoint-secs")
    if job.fault_tolerance is FaultTolerance.NONE and (job.checkpoint_steps or job.checkpoint_secs):
        raise ConfigError(
            "a checkpoint interval was given with --fault-tolerance none; intervals apply to checkpoint "
            "(the only protection) and ecrec (the fallback beyond r lost PS); source: --checkpoint-steps/--checkpoint-secs"
        )
    if job.checkpoint_steps is not None:
        _check(job.checkpoint_steps >= 1, f"--checkpoint-steps {job.checkpoint_steps} must be >= 1", "--checkpoint-steps")
    if job.checkpoint_secs is not None:
        _check(job.checkpoint_secs > 0, f"--checkpoint-secs {job.checkpoint_secs} must be > 0", "--checkpoint-secs")
    if job.flash_checkpoint_steps is None and job.flash_checkpoint_secs is None:
        _check(job.fault_tolerance is not FaultTolerance.FLASH or job.strategy is Strategy.ESTIMATOR,
               f"--fault-tolerance flash --strategy {job.strategy.value}: flash checkpoints protect Estimator jobs",
               "--fault-tolerance/--strategy")
        return
    source = "--flash-checkpoint-steps/--flash-checkpoint-secs"
    _check(job.flash_checkpoint_steps is None or job.flash_checkpoint_secs is None,
           "--flash-checkpoint-steps and --flash-checkpoint-secs were both given; choose one interval", source)
    _check((job.fault_tolerance.ours and job.strategy is Strategy.ESTIMATOR)
           or (job.fault_tolerance is FaultTolerance.ECREC and job.strategy is Strategy.PSS),
           f"a flash checkpoint interval with --fault-tolerance {job.fault_tolerance.value} --strategy "
           f"{job.strategy.value}: flash checkpoints protect --fault-tolerance ecrec or flash Estimator jobs and "
           "--fault-tolerance ecrec --strategy pss jobs", source)
    flash_config(job)  # FlashConfig checks the interval itself


def checkpoint_interval(job: Any) -> dict[str, Any]:
    """RunConfig's checkpoint arguments for the job."""
    if job.checkpoint_secs is not None:
        return {"save_checkpoints_secs": job.checkpoint_secs, "save_checkpoints_steps": None}
    if job.checkpoint_steps is not None:
        return {"save_checkpoints_steps": job.checkpoint_steps, "save_checkpoints_secs": None}
    if job.fault_tolerance is FaultTolerance.CHECKPOINT:
        return {"save_checkpoints_steps": 1000, "save_checkpoints_secs": None}
    # ecrec without an interval: no checkpoints, so no fallback beyond r lost PS; flash: its snapshots
    # (every persist_every-th one also on disk) are the checkpoints.
    return {"save_checkpoints_steps": None, "save_checkpoints_secs": None}


def final_checkpoint_hooks(job: Any, final: Callable[[], bool]) -> list[Any]:
    """The chief's hook that saves the trained model at the end when no interval saves it on the way.

    A job with no checkpoint interval (``none``, ``ecrec`` without one) would otherwise end with its model
    only in the PS tasks' memory; flash jobs persist their own snapshots. `final` says whether a session's
    end is training's (not a stop to follow a moved PS).
    """
    interval = checkpoint_interval(job)
    if job.fault_tolerance is FaultTolerance.FLASH or interval["save_checkpoints_steps"] or interval["save_checkpoints_secs"]:
        return []
    from tf_ecrec.hooks.final_checkpoint import FinalCheckpointHook

    return [FinalCheckpointHook(job.model_dir, final)]


DEFAULT_FLASH_STEPS = 100
"""``--fault-tolerance flash`` without an interval snapshots every this many global steps."""


def flash_config(job: Any) -> FlashConfig | None:
    """The job's `FlashConfig`, or None without a flash checkpoint interval (``--fault-tolerance flash``
    always has one: `DEFAULT_FLASH_STEPS` when none is given)."""
    if job.flash_checkpoint_steps is None and job.flash_checkpoint_secs is None:
        return FlashConfig(every_steps=DEFAULT_FLASH_STEPS) if job.fault_tolerance is FaultTolerance.FLASH else None
    return FlashConfig(every_steps=job.flash_checkpoint_steps or 0, every_secs=job.flash_checkpoint_secs or 0.0)
