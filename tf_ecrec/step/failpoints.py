"""Failpoints: kill a process at a chosen point of a training step, for tests of invariant 4.

Set ``TF_ECREC_FAILPOINT="<point>@<task>@step=<n>"`` in the environment of
every process of a job (the launcher's children inherit it; each task
process sets ``TF_ECREC_TASK`` to its own "type:index"), e.g.
``ps_after_apply@ps:1@step=80``: in the first step that starts at global step
``n`` or later, the process of ``<task>`` SIGKILLs itself at ``<point>``.  A
marker file in ``TF_ECREC_FAILPOINT_DIR`` (default: the temp dir) makes it
fire once per job, so the restarted process does not die again.  Several
failpoints, comma-separated (``ps_after_apply@ps:1@step=40,
worker_before_commit@chief:0@step=100``), make one job survive a sequence of
cuts; each (point, task) pair fires at most once per job.

The environment is read once per graph, when `ECOptimizer.apply_gradients`
starts building the step (`FailpointPlan.from_environ`); the plan it returns
is what the step's barriers are built from (`after_apply`, `after_fold`,
`after_count`), and with nothing armed they add nothing, so failpoints cost
nothing otherwise.  The C++ op itself reads ``TF_ECREC_FAILPOINT`` and
``TF_ECREC_TASK`` in the process it runs in, to tell whether it is the task
named.

Points, in the order a step reaches them:

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

One point is not in a step: ``chief_after_restore`` kills the chief after a restore (flash snapshot
or checkpoint) brought the model back and before the data rollback it owes reached the master
(`tf_ecrec.hooks.shard_rollback.OwedRollbackHook`, through `fire_in_python`; its step is the
restored one): ``chief_after_restore@chief:0@step=0``.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import re
import signal
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from tf_ecrec.errors import ConfigError

_LOG = logging.getLogger(__name__)

ENV = "TF_ECREC_FAILPOINT"
ENV_DIR = "TF_ECREC_FAILPOINT_DIR"
ENV_TASK = "TF_ECREC_TASK"


class FailPoint(str, enum.Enum):
    """The points of a step where a process can be killed (see the module docstring)."""

    PS_AFTER_APPLY = "ps_after_apply"
    WORKER_AFTER_APPLY = "worker_after_apply"
    PARITY_PS_AFTER_FOLD = "parity_ps_after_fold"
    PS_AFTER_COUNT = "ps_after_count"
    WORKER_BEFORE_COMMIT = "worker_before_commit"
    CHIEF_AFTER_RESTORE = "chief_after_restore"

    def __str__(self) -> str:
        return self.value


POINTS = tuple(p.value for p in FailPoint)
_SPEC = re.compile(r"^(?P<point>[a-z_]+)@(?P<task>(ps|worker|chief):\d+)@step=(?P<step>\d+)$")


@dataclasses.dataclass(frozen=True)
class Armed:
    """One armed failpoint: where, on which task, from which global step.

    Attributes:
      point: the point.
      task: the task that kills itself, e.g. "ps:1".
      step: the first global step at which it fires.
    """

    point: FailPoint
    task: str
    step: int


@dataclasses.dataclass(frozen=True)
class FailpointPlan:
    """The failpoints armed in the environment, in the order given.

    Attributes:
      armed: each armed failpoint.
    """

    armed: tuple[Armed, ...]

    def arms(self, point: FailPoint) -> bool:
        """Whether some task is to be killed at `point` (the step then carries that point's ops)."""
        return any(a.point is point for a in self.armed)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> FailpointPlan | None:
        """The failpoints `ENV` names in `environ` (default: the process's environment), or None.

        Raises:
          ConfigError: a malformed entry or an unknown point.
        """
        text = (os.environ if environ is None else environ).get(ENV)
        if not text:
            return None
        armed = []
        for entry in text.split(","):
            m = _SPEC.match(entry.strip())
            if not m or m["point"] not in POINTS:
                raise ConfigError(
                    f"{ENV}={text!r}: entry {entry!r} is malformed; expected POINT@TASK@step=N (comma-separated "
                    f"for several) with POINT one of {POINTS} and TASK like ps:1 or chief:0; "
                    f"source: environment variable {ENV}"
                )
            armed.append(Armed(FailPoint(m["point"]), m["task"], int(m["step"])))
        return cls(tuple(armed))


def fire_in_python(point: FailPoint, task: str | None = None, step: int = 0,
                   environ: Mapping[str, str] | None = None) -> None:
    """SIGKILLs this process if `point` is armed for `task` (default: ``TF_ECREC_TASK``) at `step` or
    later and has not fired in this job (the marker file the C++ op uses, created exclusively)."""
    environ = os.environ if environ is None else environ
    plan = FailpointPlan.from_environ(environ)
    task = task or environ.get(ENV_TASK)
    if plan is None or not task or not any(a.point is point and a.task == task and step >= a.step for a in plan.armed):
        return
    marker = os.path.join(environ.get(ENV_DIR) or "/tmp", f"tf_ecrec_failpoint_{point.value}_{task}".replace(":", "_"))
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return  # fired already in this job
    os.write(fd, str(step).encode())
    os.close(fd)
    _LOG.warning("failpoint %s: killing %s at global step %d", point.value, task, step)
    os.kill(os.getpid(), signal.SIGKILL)


def _failpoint(plan: FailpointPlan | None, point: FailPoint, device: str, step: tf.Tensor,
               after: Sequence[Any]) -> tf.Tensor | None:
    """A kill switch (`EcRec>Failpoint`) on `device` that runs after `after`; None when `point` is not armed.

    Make the next phase of the step depend on the returned tensor.  The op
    is C++ so that it also works in PS processes (a Python py_func runs only
    in the process that built the graph).
    """
    if plan is None or not plan.arms(point):
        return None
    from tf_ecrec.ops import load_library

    with tf.device(device), tf.control_dependencies(list(after)):
        return load_library().ec_rec_failpoint(tf.cast(step, tf.int64), point=point.value, name=f"failpoint_{point.value}")


def after_apply(plan: FailpointPlan | None, applies: Sequence[tuple[str, tf.Tensor]], step: tf.Tensor) -> list[Any]:
    """What the folds of a step wait for: its applies' deltas and the armed point after them.

    Without an armed failpoint there is no phase barrier (an empty list):
    each fold waits for its own delta only, and the step runs as
    concurrently as TF schedules it.

    Args:
      plan: the armed failpoint, or None.
      applies: (device, delta) of every apply of the step.
      step: the global step the step starts at.
    """
    if plan is None:
        return []
    deps: list[Any] = [delta for _, delta in applies]
    for device in sorted({d for d, _ in applies}):
        fp = _failpoint(plan, FailPoint.PS_AFTER_APPLY, device, step, [delta for d, delta in applies if d == device])
        if fp is not None:
            deps.append(fp)
    fp = _failpoint(plan, FailPoint.WORKER_AFTER_APPLY, "", step, [delta.op for _, delta in applies])
    if fp is not None:
        deps.append(fp)
    return deps


def after_fold(plan: FailpointPlan | None, folds: list[Any], step: tf.Tensor) -> list[Any]:
    """What the count of a step waits for: its fold ops and the armed point after them."""
    deps = list(folds)
    if plan is None:
        return deps
    by_device: dict[str, list[Any]] = {}
    for f in folds:
        for op in (f.control_inputs if isinstance(f, tf.Operation) and f.type == "NoOp" else [f]):
            by_device.setdefault(op.device, []).append(op)
    for device, ops in sorted(by_device.items()):
        if "/job:ps" in device:
            fp = _failpoint(plan, FailPoint.PARITY_PS_AFTER_FOLD, device, step, ops)
            if fp is not None:
                deps.append(fp)
    fp = _failpoint(plan, FailPoint.WORKER_BEFORE_COMMIT, "", step, folds)
    if fp is not None:
        deps.append(fp)
    return deps


def after_count(plan: FailpointPlan | None, counted: list[Any], devices: list[str], step: tf.Tensor) -> list[Any]:
    """What the commit of a step waits for: its count ops and the armed point on its data PS after them."""
    deps = list(counted)
    if plan is None:
        return deps
    for device in devices:
        if "/job:ps" in device:
            fp = _failpoint(plan, FailPoint.PS_AFTER_COUNT, device, step, counted)
            if fp is not None:
                deps.append(fp)
    return deps
