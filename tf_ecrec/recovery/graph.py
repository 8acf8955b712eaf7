"""Graph pieces a `tf_ecrec.recovery.plan.RecoveryPlan` builds before the graph is finalized.

One *whole marker* per PS (`whole_marker`): initialised last by an
initialisation, restore or rebuild, so a PS without it counts as lost and no
worker steps on it; and the initialisers of a fresh start, in batches of at
most `INIT_BATCH_BYTES` (`initialiser_batches`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tf_ecrec.device import check_placed, on_ps, ps_device

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
