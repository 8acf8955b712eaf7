"""Failpoints: kill a process at a chosen point of a training step, for tests of invariant 4.

Set ``TF_ECREC_FAILPOINT="<point>@<task>@step=<n>"`` in the environment of
every process of a job (the launcher's children inherit it; each task
process sets ``TF_ECREC_TASK`` to its own "type:index"), e.g.
``ps_after_apply@ps:1@step=80``: in the first step that starts at global step
``n`` or later, the process of ``<task>`` SIGKILLs itself at ``<point>``.  A
marker file in ``TF_ECREC_FAILPOINT_DIR`` (default: the temp dir) makes it
fire once per job, so the restarted process does not die again.

Points, in the order a step reaches them (`ECOptimizer` builds them only when
the variable is set when the graph is built, so they cost nothing otherwise):

``ps_after_apply``
    on a data PS, after its sparse apply wrote data and slots, before any
    parity fold of the step: the data PS dies with its update applied.
``worker_after_apply``
    on the worker (or chief), after the data applies, before the folds: the
    step is cut between data and parity.
``parity_ps_after_fold``
    on a parity PS, after it folded a delta, before the step's global step
    increment and commit.
``ps_after_count``
    on a data PS, once the step is counted (every copy of the global step)
    and before its commit: the data PS dies with the whole step done but not
    committed.
``worker_before_commit``
    on the worker, after every update of the step, before its commit.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_ecrec.errors import ConfigError

_LOG = logging.getLogger(__name__)

ENV = "TF_ECREC_FAILPOINT"
ENV_DIR = "TF_ECREC_FAILPOINT_DIR"
POINTS = ("ps_after_apply", "worker_after_apply", "parity_ps_after_fold", "ps_after_count", "worker_before_commit")
_SPEC = re.compile(r"^(?P<point>[a-z_]+)@(?P<task>(ps|worker|chief):\d+)@step=(?P<step>\d+)$")


def armed(environ: Any = None) -> dict[str, Any] | None:
    """The failpoint the environment names, or None.

    Raises:
      ConfigError: a malformed value or an unknown point.
    """
    text = (environ or os.environ).get(ENV)
    if not text:
        return None
    m = _SPEC.match(text)
    if not m or m["point"] not in POINTS:
        raise ConfigError(
            f"{ENV}={text!r} is malformed; expected POINT@TASK@step=N with POINT one of {POINTS} "
            f"and TASK like ps:1 or chief:0; source: environment variable {ENV}"
        )
    return {"point": m["point"], "task": m["task"], "step": int(m["step"])}


ENV_TASK = "TF_ECREC_TASK"


def failpoint(point: str, device: str, step: tf.Tensor, after: Sequence[Any]) -> tf.Tensor | None:
    """A kill switch (`EcRec>Failpoint`) on `device` that runs after `after`; None when `point` is not armed.

    Make the next phase of the step depend on the returned tensor.  The op
    is C++ so that it also works in PS processes (a Python py_func runs only
    in the process that built the graph).
    """
    spec = armed()
    if spec is None or spec["point"] != point:
        return None
    from tf_ecrec.ops import load_library

    with tf.device(device), tf.control_dependencies(list(after)):
        return load_library().ec_rec_failpoint(tf.cast(step, tf.int64), point=point, name=f"failpoint_{point}")
