"""A hook that saves one checkpoint when training ends, for a job that saves none on the way.

A job protected by parity alone (``tf-ecrec run --fault-tolerance ecrec`` with no checkpoint
interval) never writes a checkpoint while it trains, and stock Estimator with no interval writes
none at the end either: the trained model would live only in the PS tasks' memory and end with
them. This hook, on the chief, saves every global variable (``<model_dir>/model.ckpt-<step>``,
sharded per device as Estimator's own saver) in ``end``, which MonitoredSession calls only when
training ended normally, after the chief's own hooks (the settlement at the end among them).
`tf_ecrec.offline_estimator` (and `tf-ecrec export`) read it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_ecrec.recovery.deadline_session import LongDeadlineSaver

_LOG = logging.getLogger(__name__)


class FinalCheckpointHook(tf.compat.v1.train.SessionRunHook):
    """Saves the model to `model_dir` when the session ends normally and `final()` says training is over.

    A session also ends normally when a hook stops it to follow a moved PS (`tf_ecrec.session.failover.FailoverLoop`
    rebuilds the Estimator and trains on): `final` tells the two apart (default: every end is final).
    """

    def __init__(self, model_dir: str, final: Callable[[], bool] = lambda: True) -> None:
        self._prefix = os.path.join(model_dir, "model.ckpt")
        self._final = final
        self._saver: Any = None
        self._step: Any = None

    def begin(self) -> None:
        self._step = tf.compat.v1.train.get_global_step()
        # The session's operation timeout ends waits on a dead task; a save of large tables outlasts it.
        self._saver = LongDeadlineSaver(sharded=True, max_to_keep=3, allow_empty=True)

    def end(self, session: Any) -> None:
        if not self._final():
            return
        step = int(session.run(self._step))
        path = self._saver.save(session, self._prefix, global_step=step, write_meta_graph=False)
        _LOG.info("the trained model at step %d saved to %s", step, path)
