"""`ECDeviceFn`: the device function of an erasure-coded job.

    config = tf.estimator.RunConfig(device_fn=tf_ecrec.ECDeviceFn())

It decides where every op of the training graph runs:

1. Storage of the protection, declared by tf_ecrec with `on_ps` while it
   builds it (data chunks of a table, parity chunks, optimizer slots, dense
   replicas, global-step replicas, delta logs), goes to the PS task the
   layout (`tf_ecrec.layout.placement`) names, whatever device scope the user's
   code has around it: rebuilding a lost PS decodes exactly what the layout
   says it held, so the layout cannot be overridden.
2. An op the code pins to a job with `tf.device` keeps that device (ops
   that update a variable are pinned next to it).
3. Any other variable (dense weights, the global step) goes to a PS task in
   round robin, in creation order within each graph, as TensorFlow's stock
   `replica_device_setter` places them; tf_ecrec then puts its ``r``
   replicas on the next ``r`` PS tasks.
4. Everything else runs on the task's own device (``/job:worker/task:i``,
   or ``/job:chief/task:0``).

The PS count and this task's device come from ``TF_CONFIG`` when it is
constructed (as RunConfig reads it), unless given; every task of a job must see the same PS count (they build the
same graph, and round robin depends only on creation order).

`tf_ecrec.ec_model_fn` also applies rule 1 inside the model_fn, so a job
whose RunConfig keeps the stock device function (or a device function of
its own) still places the protection per the layout; `ECDeviceFn` in the
RunConfig extends the same placement to the whole graph (global step, input
pipeline) in one function.  Tables built outside both check where their
variables landed and raise `ConfigError` when not on the layout's PS.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import tensorflow as tf
from tensorflow.python.training import device_setter

from tf_ecrec.errors import ConfigError

# Op types placed on the PS: the stock setter's own list, so dense variables go where it would put them.
VARIABLE_OPS = frozenset(device_setter.STANDARD_PS_OPS)

_requests = threading.local()


def ps_device(task: int) -> str:
    """The device string of PS task `task` (`ps_index` is the inverse)."""
    return f"/job:ps/task:{task}"


def maybe_ps_index(device: str | None) -> int | None:
    """The PS task index of a device string ("/job:ps/task:2/device:CPU:0" -> 2); None if it is not a PS task's."""
    spec = tf.DeviceSpec.from_string(device or "")
    return int(spec.task) if spec.job == "ps" and spec.task is not None else None


def ps_index(device: str | None) -> int:
    """The PS task index of a device string; ConfigError if it is not a PS task's."""
    task = maybe_ps_index(device)
    if task is None:
        raise ConfigError(f"device {device!r} is not a PS task; source: variable placement")
    return task


@contextlib.contextmanager
def on_ps(task: int) -> Iterator[None]:
    """Ops built inside are storage of the protection that the layout puts on PS `task`.

    Inside an `ECDeviceFn` (or `ec_model_fn`), they get ``/job:ps/task:<task>``.
    Under a variable placer (`variable_placer`: TF2 ParameterServerStrategy,
    whose variable creator ignores device scopes), the placer's scope for
    `task` is entered too.
    """
    stack = _request_stack()
    stack.append(int(task))
    try:
        placer = _placer[0]
        with placer(int(task)) if placer is not None else contextlib.nullcontext():
            yield
    finally:
        stack.pop()


# The active variable placer (one per process: Keras lifts variable creation out of the traced
# function, possibly on another thread, so a thread-local would miss it).
_placer: list[Any] = [None]


@contextlib.contextmanager
def variable_placer(placer: Any) -> Iterator[None]:
    """Makes `placer` (task -> context manager) place the storage `on_ps` declares, while inside.

    `tf_ecrec.pss` uses it: under ParameterServerStrategy a device scope does
    not place a variable, colocation with a variable already on the PS does.
    """
    old = _placer[0]
    _placer[0] = placer
    try:
        yield
    finally:
        _placer[0] = old


def variable_name(variable: Any) -> str:
    """A variable's name without the output suffix: its op name in a graph, its given name when eager.

    The protection keys its variables by this name (the manifest, parity
    checks and recovery read it), so it is the same for a variable built by
    an Estimator's graph and one built eagerly under ParameterServerStrategy.
    """
    if getattr(variable, "_in_graph_mode", True):
        return str(variable.op.name)
    name = str(variable.name)
    return name[: -len(":0")] if name.endswith(":0") else name


def initial_value_of(variable: Any) -> Any:
    """What `variable` starts from: its initializer's value in a graph, its value when eager (just created)."""
    if getattr(variable, "_in_graph_mode", True):
        return variable.initial_value
    return variable.read_value()


def requested_task() -> int | None:
    """The PS task `on_ps` asks for at this point of graph construction, if any."""
    stack = _request_stack()
    return stack[-1] if stack else None


def _request_stack() -> list[int]:
    if not hasattr(_requests, "stack"):
        _requests.stack = []
    return _requests.stack


@contextlib.contextmanager
def local_storage() -> Iterator[None]:
    """Tables built inside stay on this process: a task outside the training cluster (an evaluator).

    TensorFlow gives an evaluator no cluster, so ``/job:ps`` devices do not
    exist there (soft placement does not help: it refuses an unknown job);
    its tables are built with the training layout, for the checkpoint's
    variables, on its own device.
    """
    old = getattr(_requests, "local", False)
    _requests.local = True
    try:
        yield
    finally:
        _requests.local = old


def storage_is_local() -> bool:
    """Whether `local_storage` is in effect."""
    return bool(getattr(_requests, "local", False))


def storage_device(task: int) -> Any:
    """The device scope of computation that belongs on PS `task`'s storage (none under `local_storage`)."""
    return contextlib.nullcontext() if storage_is_local() else tf.compat.v1.device(ps_device(task))


def layout_placement(op: Any) -> str:
    """Device function of rule 1 only: places the protection's storage, leaves other ops as they are."""
    task = requested_task()
    if task is None or storage_is_local():
        return op.device
    return _merged(ps_device(task), op.device)


class ECDeviceFn:
    """The device function of an erasure-coded job (see the module doc for its rules).

    Args:
      num_ps: PS tasks of the job; default: from TF_CONFIG.
      worker_device: this task's device for non-variable ops, such as
        "/job:worker/task:1"; default: from TF_CONFIG (none without
        TF_CONFIG: ops stay where the code puts them).
    """

    def __init__(self, num_ps: int | None = None, worker_device: str | None = None) -> None:
        if num_ps is None or worker_device is None:
            from tf_ecrec.cluster.tf_config import ClusterConfig

            cluster = ClusterConfig.from_environment() if os.environ.get("TF_CONFIG") else None
            if num_ps is None:
                num_ps = cluster.num_ps if cluster is not None else 0
            if worker_device is None and cluster is not None:
                worker_device = f"/job:{cluster.task_type}/task:{cluster.task_index}"
        self.num_ps = int(num_ps)
        self.worker_device = worker_device
        # Round robin restarts with every graph: a graph rebuilt in the same process (a new
        # train() call, a failover) places its variables as every other task's graph does.
        self._next_ps: weakref.WeakKeyDictionary[tf.Graph, int] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    @classmethod
    def from_run_config(cls, config: tf.estimator.RunConfig) -> ECDeviceFn:
        """The device function of the task a RunConfig describes."""
        worker = f"/job:{config.task_type}/task:{int(config.task_id or 0)}" if config.task_type else None
        return cls(num_ps=int(config.num_ps_replicas or 0), worker_device=worker)

    def __call__(self, op: Any) -> str:
        task = requested_task()
        if task is not None:
            if not 0 <= task < self.num_ps:
                raise ConfigError(
                    f"the layout puts {op.name!r} on PS task {task}, but the job has {self.num_ps} PS tasks "
                    "(every task must see the same PS count); source: ECDeviceFn / TF_CONFIG"
                )
            return _merged(ps_device(task), op.device)
        current = tf.DeviceSpec.from_string(op.device or "")
        if current.job is not None:
            return op.device
        if op.type in VARIABLE_OPS and self.num_ps > 0:
            with self._lock:
                task = self._next_ps.get(op.graph, 0)
                self._next_ps[op.graph] = (task + 1) % self.num_ps
            return _merged(ps_device(task), op.device)
        if self.worker_device:
            return _merged(self.worker_device, op.device)
        return op.device

    def __deepcopy__(self, memo: dict[int, Any]) -> ECDeviceFn:
        # Estimators deep-copy their RunConfig (model_to_estimator does): a copy places as a new one would.
        return ECDeviceFn(num_ps=self.num_ps, worker_device=self.worker_device)

    def __reduce__(self) -> tuple[Any, ...]:
        return ECDeviceFn, (self.num_ps, self.worker_device)

    def __repr__(self) -> str:
        return f"ECDeviceFn(num_ps={self.num_ps}, worker_device={self.worker_device!r})"


def _merged(base: str, current: str) -> str:
    """`base` with the fields `current` sets (a device type or index the code chose) on top."""
    spec = tf.DeviceSpec.from_string(base)
    now = tf.DeviceSpec.from_string(current or "")
    # The job and task come from `base`; a device type/index chosen by the code stays.
    now = now.replace(job=None, replica=None, task=None)
    return spec.make_merged_spec(now).to_string()


def check_placed(variable: tf.Variable, task: int, what: str) -> None:
    """Raises ConfigError when `variable` is not on PS `task`, where the layout puts it."""
    if maybe_ps_index(variable.device) == task or storage_is_local():
        return
    raise ConfigError(
        f"{what} {variable_name(variable)!r} landed on {variable.device or 'no device'!r}, but the layout puts it on "
        f"{ps_device(task)}: build it under tf_ecrec.ECDeviceFn (RunConfig(device_fn=tf_ecrec.ECDeviceFn())) or "
        "inside a model_fn wrapped with tf_ecrec.ec_model_fn; source: device placement"
    )
