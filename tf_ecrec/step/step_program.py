"""The ops of a protected step, phase by phase, as `ECOptimizer.apply_gradients` builds them.

A step is: the applies (one per updated variable, each with its bitwise
delta), the folds of each delta into parity or replicas, the count (the
global step and its replicas), and the two commit rounds (`tf_ecrec.step.steplog`).
Every op of a later phase reads a *gate* (`gate`): a tensor on its own PS
that carries the op's predecessors as control dependencies, so feeding the
gate runs the op alone; the fault-schedule harness drives steps that way.
"""

from __future__ import annotations

import dataclasses
import enum
import secrets
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import tensorflow as tf

from tf_ecrec import ops as ec_ops
from tf_ecrec.layout.table_layout import route_rows

GENERATION_SHIFT = 48
MAX_GENERATION = (1 << 14) - 1


class StepGeneration:
    """The generation a trainer's steps carry, kept per graph: its session's, not the graph's build.

    A trainer builds its graph once and may follow a moved PS in place (`tf_ecrec.session.failover`):
    its sessions created after the move reach the new cluster, and their steps must carry the
    new cluster's version, which the PS admit after the chief's recovery raised them to it.
    Two values, both only raised:

    - ``target``: the version of the cluster the trainer follows now (TF_CONFIG's at build; the
      failover loop raises it, `follow`, when it points new sessions at moved PS); the chief's
      recovery raises the PS logs to it;
    - ``value``: what step ids carry.  Set when a session is created (`start_session`), to the
      target or, if higher, the generation the PS logs admit then: a session's steps never carry
      a generation the cluster already refuses, however the trainer learned of the moves; a
      session created before a raise keeps its older value, so its steps stay fenced.

    Thread-safe: the failover loop's poller raises the target while steps read the value.
    """

    def __init__(self, version: int = 0) -> None:
        _check_generation(version)
        self._lock = threading.Lock()
        self._target = self._value = int(version)

    @property
    def target(self) -> int:
        with self._lock:
            return self._target

    @property
    def value(self) -> int:
        with self._lock:
            return self._value

    def follow(self, version: int) -> None:
        """The trainer follows a cluster of `version` from now on (lower versions are ignored)."""
        _check_generation(min(int(version), MAX_GENERATION))
        with self._lock:
            self._target = max(self._target, min(int(version), MAX_GENERATION))

    def start_session(self, admitted: int = 0) -> int:
        """A session was created: its steps carry the target, or `admitted` (the highest minimum
        generation the PS logs admit now) if that is higher; returns the new value."""
        with self._lock:
            self._value = max(self._value, self._target, min(int(admitted), MAX_GENERATION))
            return self._value


def _check_generation(generation: int) -> None:
    if not 0 <= generation <= MAX_GENERATION:
        raise ValueError(f"generation must be in [0, {MAX_GENERATION}], got {generation}")


def new_step_id(generation: int | StepGeneration = 0, in_graph: bool = False) -> tf.Tensor:
    """A fresh random step id per session.run, the generation in its top bits.

    By default the id comes from Python (the process running the step is the
    one that built it), and `generation` may be a `StepGeneration`, read at
    each step.  ``in_graph`` draws it with a random op seeded from the
    operating system (seeds 0, 0: never the graph or global seed, so two
    workers running the same function draw different ids), for a step traced
    on one process and run on another (a TF2 function scheduled on a worker);
    its `generation` is a fixed int.
    """
    if in_graph:
        if isinstance(generation, StepGeneration):
            raise ValueError("a step id drawn in the graph carries a fixed generation (an int), not a StepGeneration")
        _check_generation(generation)
        high = np.int64(generation) << np.int64(GENERATION_SHIFT)
        bits = tf.raw_ops.RandomUniformInt(
            shape=tf.constant([], tf.int32), minval=tf.constant(0, tf.int64),
            maxval=tf.constant(1 << GENERATION_SHIFT, tf.int64), seed=0, seed2=0, name="ec_step_id",
        )
        return tf.bitwise.bitwise_or(bits, tf.constant(high, tf.int64))
    cell = generation if isinstance(generation, StepGeneration) else StepGeneration(generation)

    def draw() -> np.int64:
        high = np.int64(cell.value) << np.int64(GENERATION_SHIFT)
        return np.int64(high | np.int64(secrets.randbits(GENERATION_SHIFT)))

    sid = tf.numpy_function(draw, [], tf.int64, stateful=True, name="ec_step_id")
    sid.set_shape([])
    return sid


if TYPE_CHECKING:
    from tf_ecrec.step.embedding import EmbeddingCollection


class TargetKind(str, enum.Enum):
    """What a logged variable group is."""

    DATA = "data"  # a variable and its slots, updated by the optimizer
    PARITY = "parity"  # a parity variable, folded into
    REPLICA = "replica"  # a replica of a dense variable, folded into
    COUNTER = "counter"  # the global step or one of its replicas

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass
class Target:
    """A logged variable group: the variables one log entry's delta covers, in order."""

    tid: int
    ps: int
    variables: list[tf.Variable]
    kind: TargetKind
    source: int = -1  # the data target a parity/replica folds from
    ordered: bool = True


@dataclasses.dataclass(frozen=True)
class ParityFolds:
    """How a table's data deltas fold: into the parity its PS's routes name (`TableLayout.fold_routes`)."""

    coll: EmbeddingCollection
    ps: int


@dataclasses.dataclass(frozen=True)
class ReplicaFolds:
    """How a dense variable's deltas fold: whole, into each of its replicas (by target id)."""

    targets: tuple[int, ...]


def planned_folds(plan: ParityFolds | ReplicaFolds, parity_tid: Callable[[str, int], int], rows: np.ndarray,
                  delta: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray, int]]:
    """The folds of a data update on `rows` under `plan`: (target id, rows, delta, coef) each, as the fold ops make
    them (`parity_tid(collection name, PS)`: the target id of that PS's parity of the collection)."""
    if isinstance(plan, ReplicaFolds):
        return [(rep_tid, rows, delta, 1) for rep_tid in plan.targets]
    coll = plan.coll
    routes = coll.table_layout.fold_routes(plan.ps, coll.code)
    bases = np.stack([route.parity_base for route in routes])
    return [(parity_tid(coll.name, route.ps), prow, delta[at], route.coef)
            for route, (at, prow) in zip(routes, route_rows(rows, bases, coll.chunk_rows)) if at.size]


class Apply(NamedTuple):
    """An apply of a step: its row indices, its delta and its seq in the log (feed them to run a fold alone)."""

    indices: tf.Tensor
    delta: tf.Tensor
    seq: tf.Tensor


class Gated(NamedTuple):
    """An op of a later phase and the gate it reads: feed the gate to run the op alone."""

    gate: tf.Tensor
    op: tf.Operation


@dataclasses.dataclass(frozen=True)
class StepProgram:
    """A protected step's ops, phase by phase, each runnable alone by feeding its inputs.

    Attributes:
      sid: the step id (a placeholder with a fresh random default).
      applies: data target id -> its `Apply`.
      folds: data target id -> its fold ops (inputs: that apply's indices,
        delta and seq, fed to run a fold alone).
      counts: counter target id -> (gate, increment op): the gate is the 1 it
        adds; feed it to run the increment alone. Empty without a global step.
      round1, round2: PS task -> (gate, that round's commit op): the gate is
        the sid as the op reads it; feed it to run the op alone.
    """

    sid: tf.Tensor
    applies: dict[int, Apply]
    folds: dict[int, list[tf.Operation]]
    counts: dict[int, Gated]
    round1: dict[int, Gated]
    round2: dict[int, Gated]


def gate_after(value: tf.Tensor, device: str, after: list[Any]) -> tf.Tensor:
    """`value` on `device` once `after` ran: what an op of a later phase reads (see apply_gradients)."""
    with tf.device(device), tf.control_dependencies(after):
        return tf.identity(value, name="gate")


def barrier(ops: list[Any], consumers: int, device: str, name: str) -> list[Any]:
    """What `consumers` ops on other tasks wait for, instead of every op of `ops`: one op on `device`
    that waits for them all, when that makes fewer cross-task edges (each is a transfer of its own)."""
    if len(ops) <= 1 or consumers <= 1:
        return list(ops)
    with tf.device(device):
        return [tf.group(*ops, name=name)]


def commit_rounds(sid: tf.Tensor, logs: dict[int, tf.Tensor], data_ps: list[int], after: list[Any],
                  timeout_ms: int) -> tuple[dict[int, Gated], dict[int, Gated]]:
    """Round 1 of step `sid` on its `data_ps` logs once `after` ran, then round 2 on every log."""
    round1 = {}
    hub = logs[data_ps[0]].device if data_ps else None
    after = barrier(after, len(data_ps), hub, "counted") if hub else after
    for p in data_ps:
        g = gate_after(sid, logs[p].device, after)
        with tf.device(logs[p].device):  # where it runs anyway: a barrier after it then stays on the PS
            round1[p] = Gated(g, ec_ops.delta_log_commit_in_order(logs[p], g, timeout_ms=timeout_ms))
    round2 = {}
    done = barrier([r.op for r in round1.values()], len(logs), hub, "round1_done") if hub else []
    for p, log in sorted(logs.items()):
        g = gate_after(sid, log.device, done)
        with tf.device(log.device):
            round2[p] = Gated(g, ec_ops.delta_log_commit(log, g))
    return round1, round2


def read_step(variable: Any) -> tf.Tensor:
    return tf.cast(variable.read_value() if hasattr(variable, "read_value") else variable, tf.int64)


def dedup(grad: Any, var: tf.Variable) -> tuple[tf.Tensor, tf.Tensor]:
    """(unique row indices, summed gradient rows), as TensorFlow's optimizers deduplicate, on the
    variable's PS (as theirs): the ids are there already for the lookup, so no second copy crosses."""
    with tf.device(var.device):
        if isinstance(grad, tf.IndexedSlices):
            unique, positions = tf.unique(tf.cast(grad.indices, tf.int64))
            summed = tf.math.unsorted_segment_sum(grad.values, positions, tf.shape(unique)[0])
            return unique, summed
        return all_rows(var, var.device), tf.convert_to_tensor(grad)


def all_rows(var: tf.Variable, device: str) -> tf.Tensor:
    """The row ids of a dense variable's update, made on `device` (a constant range: nothing to send)."""
    with tf.device(device):
        return tf.range(int(var.shape[0]), dtype=tf.int64)


@dataclasses.dataclass(frozen=True)
class AppliedUpdate:
    """One variable's update of a step: its delta, where it was applied, how to fold it."""

    delta: tf.Tensor
    device: str
    fold: Callable[[], list[tf.Operation]]
    tid: int
    seq: tf.Tensor
    indices: tf.Tensor


@dataclasses.dataclass(frozen=True)
class Binding:
    """What `ECOptimizer.bind` gives instead of the graph's registries: the tables, PS count and generation."""

    collections: tuple[EmbeddingCollection, ...]
    num_ps: int
    generation: int
