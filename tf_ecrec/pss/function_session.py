"""`FunctionSession`: ``session.run`` over a graph of eager variables, for code written against sessions.

Settlement (`tf_ecrec.step.steplog.Reconciler`) builds its ops once, with
placeholders, and runs them with ``sess.run(fetches, feed_dict)``.  Under
TF2 there is no session: `FunctionSession` builds such code inside
``tf.compat.v1.wrap_function`` (eager variables are captured by handle) and
answers each ``run`` with the pruned function from the fed placeholders to
the fetches, made once per (fetches, feeds) pair and called eagerly: ops
placed on PS devices run there, in the coordinator's distributed context.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np
import tensorflow as tf

T = TypeVar("T")


class FunctionSession:
    """Builds `build()` in a wrapped graph; `run` runs parts of it (see the module doc).

    Attributes:
      built: what `build` returned (e.g. the Reconciler whose ops the graph holds).
    """

    batches_settlement = False
    """Settlement undoes entries one per call here: each distinct (fetches, feeds) is a function pruned and
    traced anew, where a v1 session only registers a graph (`tf_ecrec.step.steplog.Reconciler._undo_together`)."""

    def __init__(self, build: Callable[[], T]) -> None:
        box: list[Any] = []

        def trace() -> None:
            box.append(build())

        self._wrapped = tf.compat.v1.wrap_function(trace, [])
        self.built: Any = box[0]
        self._pruned: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()  # a background rebuild's loops run on several threads

    def run(self, fetches: Any, feed_dict: Any = None, options: Any = None) -> Any:
        """Like ``tf.compat.v1.Session.run``: nested fetches of tensors and ops (ops give None);
        feeds as `tf_ecrec.step.steplog.feeds` makes them (pairs: a function graph's tensors are not hashable)."""
        feeds = list(feed_dict.items() if isinstance(feed_dict, Mapping) else (feed_dict or ()))
        flat = tf.nest.flatten(fetches)
        tensors = [f for f in flat if isinstance(f, tf.Tensor)]
        ops = [f for f in flat if isinstance(f, tf.Operation)]
        key = (tuple(id(f) for f in flat), tuple(id(k) for k, _ in feeds))
        with self._lock:
            fn = self._pruned.get(key)
            if fn is None:
                fn = self._wrapped.prune(feeds=[k for k, _ in feeds], fetches=tensors + ops)
                self._pruned[key] = fn
        args = [tf.convert_to_tensor(np.asarray(v, dtype=k.dtype.as_numpy_dtype)) for k, v in feeds]
        outputs = fn(*args)
        values = iter([o.numpy() for o in tf.nest.flatten(outputs)[: len(tensors)]])
        return tf.nest.pack_sequence_as(fetches, [next(values) if isinstance(f, tf.Tensor) else None for f in flat])
