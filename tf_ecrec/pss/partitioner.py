"""`ECPartitioner`: the variable partitioner of a protected ParameterServerStrategy job.

    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf_ecrec.pss.ECPartitioner())

A partitioner of TensorFlow 2.15 returns shard counts, and shards go to PS
tasks by a creation counter: it cannot place.  The erasure-coded tables are
striped by the layout and placed by colocation (`tf_ecrec.pss.anchors`),
so the partitioner never sees them.  Every other variable (the dense
weights, the optimizer's iteration count) stays whole: the protection
replicates each dense variable, with its slots, on the ``r`` PS tasks after
its own and rebuilds it from a replica, and a variable cut into shards would
be several variables with several replicas for nothing.  The same object is
a v1 partitioner (``partitioner=`` of ``tf.compat.v1.get_variable``), with
the same answer.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class ECPartitioner:
    """Keeps every variable the partitioner is asked about in one shard (see the module doc)."""

    def __call__(self, shape: Any, dtype: Any = None, axis: int = 0) -> list[int]:
        rank = len(tf.TensorShape(shape))
        return [1] * max(rank, 1)

    def __repr__(self) -> str:
        return "ECPartitioner()"
