"""The generation of a trainer's steps, taken from the cluster each time a session is created.

A PS log refuses steps of a generation below the minimum it admits; the chief's recovery raises
that minimum to the version of the cluster it follows when a PS moved (`tf_ecrec.recovery.plan`),
so that steps of sessions created before the move can no longer write.  A trainer's own steps
carry its graph's `tf_ecrec.step.step_program.StepGeneration`; this hook sets it per session::

    __init__               validate: the graph's StepGeneration and the PS logs
    begin                  one op per PS log that reads the minimum generation it admits
    after_create_session   read them; the session's steps carry the trainer's target
                           (the version of the cluster it follows) or, if higher, what the
                           logs admit now
    (steps)                each step id reads the value (`new_step_id`)

So a trainer that followed a move in place, or was restarted with a cluster version that
counts moves differently, is never refused by the cluster it now reaches; a session created
before the chief's raise keeps its older value and stays fenced (its steps fail, the session
is re-created, and the next one is admitted).  A read that fails (a PS still down) leaves the
target: the session's first step fails on that PS anyway.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from tf_ecrec import ops as ec_ops
from tf_ecrec.errors import ConfigError
from tf_ecrec.step.step_program import StepGeneration

_LOG = logging.getLogger(__name__)


class SessionGenerationHook(tf.compat.v1.train.SessionRunHook):
    """Sets a trainer's step generation from the cluster when a session is created (module doc).

    Args:
      steps: the graph's `StepGeneration` (`tf_ecrec.step.embedding.ECContext.steps`).
      logs: the PS task -> delta log handle of the graph's `ECOptimizer`.

    Attributes:
      sessions: ``(target, admitted, value)`` of each session created so far (reports, tests).
    """

    def __init__(self, steps: StepGeneration, logs: Mapping[int, tf.Tensor]) -> None:
        if steps is None or not logs:
            raise ConfigError("SessionGenerationHook needs the graph's StepGeneration and at least one PS log; "
                              "source: ec_model_fn")
        self._steps = steps
        self._logs = dict(logs)
        self._admitted: dict[int, tf.Tensor] = {}
        self.sessions: list[tuple[int, int, int]] = []

    def begin(self) -> None:
        with tf.name_scope("ec_session_generation"):
            for p, log in sorted(self._logs.items()):
                with tf.device(log.device):
                    self._admitted[p] = ec_ops.delta_log_read(log, name=f"admitted_ps{p}").generation

    def after_create_session(self, session: tf.compat.v1.Session, coord: Any) -> None:
        target = self._steps.target
        started = time.monotonic()
        try:
            admitted = max(int(v) for v in session.run(self._admitted).values())
        except tf.errors.OpError as exc:
            _LOG.debug("the PS logs' generations were not read (%s); the session's steps carry %d",
                       exc.message.splitlines()[0] if exc.message else type(exc).__name__, target)
            admitted = 0
        before = self._steps.value
        value = self._steps.start_session(admitted)
        self.sessions.append((target, admitted, value))
        if value != before:
            _LOG.info("steps of this session carry generation %d (was %d; the cluster's version %d, the PS admit %d; "
                      "read in %.2f s)", value, before, target, admitted, time.monotonic() - started)
