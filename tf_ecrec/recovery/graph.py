"""Graph pieces a `tf_ecrec.recovery.plan.RecoveryPlan` builds before the graph is finalized.

One *whole marker* per PS (`whole_marker`): initialised last by an
initialisation, restore or rebuild, so a PS without it counts as lost and no
worker steps on it; and the initialisers of a fresh start, in batches of at
most `INIT_BATCH_BYTES` (`initialiser_batches`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_ecrec.layout.device import check_placed, on_ps, ps_device, ps_index

INIT_BATCH_BYTES = 256 << 20
"""Bytes of variables initialised per session call at a fresh start: a PS computes initial values for at
most this much (plus the largest single variable) at once, not for its whole share."""
WHOLE_MARKERS = "tf_ecrec_whole_markers"
"""Graph collection of the per-PS markers that a PS's state is whole (`RecoveryPlan`)."""


def initialiser_batches(derived: set[str], variables: Sequence[tf.Variable]) -> list[tuple[tf.Operation, list[str]]]:
    """The initialisers of every variable that is not derived from others, in calls of <= INIT_BATCH_BYTES.

    Parity and replicas are derived: a fresh start allocates them and
    encodes them from the initialised data with the rebuild's sliced
    walk (`RecoveryPlan`), so no PS holds its whole share of initial
    values, their encodings and the variables at once.
    """
    batches: list[list[tf.Variable]] = [[]]
    size = 0
    for v in variables:
        if v.op.name in derived:
            continue
        nbytes = int(np.prod(v.shape.as_list(), dtype=np.int64)) * v.dtype.base_dtype.size
        if batches[-1] and size + nbytes > INIT_BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(v)
        size += nbytes
    return [
        (tf.group(*[v.initializer for v in vs], name=f"init_model_{i}"), [v.op.name for v in vs])
        for i, vs in enumerate(batches) if vs
    ]


def whole_marker(task: int) -> tf.Variable:
    """PS `task`'s marker that its state is whole: initialised last, by initialisation, restore or rebuild.

    A PS whose marker is missing counts as lost whatever else it holds (a
    rebuild or restore cut mid-way leaves allocated, partly written
    variables), and the workers' ready op waits for every marker, so no
    step runs on a PS before its state is whole.  Not in GLOBAL_VARIABLES:
    checkpoints do not hold it.
    """
    with on_ps(task), tf.compat.v1.device(ps_device(task)):  # under an ECDeviceFn or not
        marker = tf.compat.v1.Variable(
            True, name=f"ps{task}_whole", trainable=False, use_resource=True, collections=[WHOLE_MARKERS]
        )
    check_placed(marker, task, "the whole-state marker of a PS")
    return marker


def protected_names(opt: Any, colls: Sequence[Any]) -> set[str]:
    """Names of every variable parity or a replica covers, and of those parity and replica variables."""
    names = set()
    for coll in colls:
        for _p, var in coll.data.items():
            names.add(var.op.name)
            names.update(s.op.name for s in opt.slots_of(var))
        names.update(v.op.name for v in opt.parity[coll.name].values())
    for name, reps in opt.replicas.items():
        names.add(name)
        names.update(r.op.name for r in reps)
        names.update(s.op.name for s in opt.slots_of(opt.protected[name]))
    return names


def replica_tasks(opt: Any) -> dict[str, list[int]]:
    """Replicated variable name -> the PS tasks of its primary and of each replica."""
    return {name: [ps_index(c.device) for c in [opt.protected[name], *reps]] for name, reps in opt.replicas.items()}


def checkpoint_step(model_dir: str | None) -> int:
    """The global step of the newest checkpoint in `model_dir` (-1 without one)."""
    path = tf.train.latest_checkpoint(model_dir) if model_dir else None
    match = re.search(r"-(\d+)$", path or "")
    return int(match.group(1)) if match else -1
