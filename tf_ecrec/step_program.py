"""The ops of a protected step, phase by phase, as `ECOptimizer.apply_gradients` builds them.

A step is: the applies (one per updated variable, each with its bitwise
delta), the folds of each delta into parity or replicas, the count (the
global step and its replicas), and the two commit rounds (`tf_ecrec.steplog`).
Every op of a later phase reads a *gate* (`gate`): a tensor on its own PS
that carries the op's predecessors as control dependencies, so feeding the
gate runs the op alone; the fault-schedule harness drives steps that way.
"""

from __future__ import annotations

import dataclasses
import enum
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import tensorflow as tf

GENERATION_SHIFT = 48
MAX_GENERATION = (1 << 14) - 1


def new_step_id(generation: int = 0, in_graph: bool = False) -> tf.Tensor:
    """A fresh random step id per session.run, ``generation`` in its top bits.

    By default the id comes from Python (the process running the step is the
    one that built it).  ``in_graph`` draws it with a random op seeded from the
    operating system (seeds 0, 0: never the graph or global seed, so two
    workers running the same function draw different ids), for a step traced
    on one process and run on another (a TF2 function scheduled on a worker).
    """
    if not 0 <= generation <= MAX_GENERATION:
        raise ValueError(f"generation must be in [0, {MAX_GENERATION}], got {generation}")
    high = np.int64(generation) << np.int64(GENERATION_SHIFT)
    if in_graph:
        bits = tf.raw_ops.RandomUniformInt(
            shape=tf.constant([], tf.int32), minval=tf.constant(0, tf.int64),
            maxval=tf.constant(1 << GENERATION_SHIFT, tf.int64), seed=0, seed2=0, name="ec_step_id",
        )
        return tf.bitwise.bitwise_or(bits, tf.constant(high, tf.int64))
    sid = tf.numpy_function(
        lambda: np.int64(high | np.int64(secrets.randbits(GENERATION_SHIFT))), [], tf.int64, stateful=True, name="ec_step_id"
    )
    sid.set_shape([])
    return sid


if TYPE_CHECKING:
    from tf_ecrec.embedding import EmbeddingCollection


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


def gate(value: tf.Tensor, device: str, after: list[Any]) -> tf.Tensor:
    """`value` on `device` once `after` ran: what an op of a later phase reads (see apply_gradients)."""
    with tf.device(device), tf.control_dependencies(after):
        return tf.identity(value, name="gate")


def read_step(variable: Any) -> tf.Tensor:
    return tf.cast(variable.read_value() if hasattr(variable, "read_value") else variable, tf.int64)


def dedup(grad: Any, var: tf.Variable) -> tuple[tf.Tensor, tf.Tensor]:
    """(unique row indices, summed gradient rows), as TensorFlow's optimizers deduplicate."""
    if isinstance(grad, tf.IndexedSlices):
        unique, positions = tf.unique(tf.cast(grad.indices, tf.int64))
        summed = tf.math.unsorted_segment_sum(grad.values, positions, tf.shape(unique)[0])
        return unique, summed
    rows = int(var.shape[0])
    return tf.range(rows, dtype=tf.int64), tf.convert_to_tensor(grad)


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
