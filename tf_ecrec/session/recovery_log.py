"""The chief's record of every recovery: one JSON line per recovery in ``<model_dir>/recovery.jsonl``.

`RecoveryLog` is the recovery listener the protected Estimator job (`tf_ecrec.estimator.job`) and the
launcher's task entry give the chief; `StepWatch` notes the global step before a failure, so that an entry
says how many steps a restore rolled back; `read_recovery_log` reads the file back (the launcher's report).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

_LOG = logging.getLogger(__name__)

RECOVERY_FILE = "recovery.jsonl"


class RecoveryLog:
    """The chief's recovery listener that appends one JSON line per recovery to ``<model_dir>/recovery.jsonl``.

    ``step_before`` is the global step the chief last saw before the
    failure (`StepWatch`); with other workers training it may lag the true
    step by their steps in flight, so ``steps_rolled_back`` is a lower bound
    of what a checkpoint restore lost, and 0 for a rebuild from parity.
    ``steps_undone`` are the steps settlement took back (returned, not durable:
    their records are trained again); they are not counted as rolled back.
    """

    def __init__(self, path: str, task: str, watch: StepWatch,
                 then: Callable[[Any], None] | None = None) -> None:
        self.path = path
        self._task = task
        self._watch = watch
        self._then = then
        self._lock = threading.Lock()

    def __call__(self, result: Any) -> None:
        before = self._watch.last_step
        entry = {
            "time": round(time.time(), 3), "task": self._task, "method": str(result.method),
            "lost_ps": list(result.lost_ps), "background": bool(result.background),
            "step_before": before, "global_step": result.global_step,
            "steps_rolled_back": (max(0, before - result.global_step - int(result.steps_undone))
                                  if before is not None and result.global_step is not None else None),
            "bytes_rebuilt": int(result.bytes_rebuilt), "seconds": round(float(result.seconds), 3),
            "steps_undone": int(result.steps_undone), "steps_finished": int(result.steps_finished),
        }
        with self._lock:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry) + "\n")
        _LOG.info("recovery: %s", entry)
        if self._then is not None:
            self._then(result)


def read_recovery_log(model_dir: str) -> list[dict[str, Any]]:
    """The entries `RecoveryLog` wrote in `model_dir` (empty if none)."""
    path = os.path.join(model_dir, RECOVERY_FILE)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


class StepWatch(tf.compat.v1.train.SessionRunHook):
    """A hook noting the global step after each of this trainer's steps (fetched with the step: no extra call)."""

    def __init__(self) -> None:
        self.last_step: int | None = None
        self._step: Any = None

    def begin(self) -> None:
        self._step = tf.compat.v1.train.get_global_step()

    def before_run(self, run_context: Any) -> Any:
        return tf.compat.v1.train.SessionRunArgs(self._step) if self._step is not None else None

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if run_values.results is not None:
            self.last_step = int(run_values.results)
