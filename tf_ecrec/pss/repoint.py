"""Puts the variables a recovery re-created wherever a Keras model and its protection held the old ones.

A `tf.Variable` whose PS restarted is dead for good, so `tf_ecrec.pss.recovery` makes new ones on
the restarted PS; every reference to an old one must then lead to its replacement: the tables'
chunks, the protector's slots, replicas, parity and targets, the optimizer's iteration count and
variable list, the model's bookkeeping counters, and each layer's and metric's weights and
attributes (a tracked attribute is tracked again under its name, so checkpoints keep finding it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf


def repoint(model: tf.keras.Model, protection: Any, bookkeeping: Iterable[str], new: dict[int, tf.Variable]) -> None:
    """Replaces every reference to a variable whose ``id`` is a key of `new` by its value.

    Args:
      model: the Keras model (compiled with the protection's optimizer).
      protection: its `tf_ecrec.pss.PSSProtection`.
      bookkeeping: names of the model's own counters held as attributes (``_train_counter`` ...).
      new: id(old variable) -> the variable replacing it.
    """

    def swap(v: Any) -> Any:
        return new.get(id(v), v)

    def swap_in(items: Any) -> None:  # item by item: a tracked list (ListWrapper) compares on slices
        for i, v in enumerate(list(items)):
            if id(v) in new:
                items[i] = new[id(v)]

    optimizer = model.optimizer
    protector = optimizer.protector
    pv = protector.variables
    for coll in protection.collections:
        for p in list(coll.data):
            coll.data[p] = swap(coll.data[p])
    for mapping in (pv.slots, pv.replicas):
        for items in mapping.values():
            swap_in(items)
    for parity in pv.parity.values():
        for q in list(parity):
            parity[q] = swap(parity[q])
    for name in list(pv.protected):
        pv.protected[name] = swap(pv.protected[name])
    for target in protector.targets.values():
        swap_in(target.variables)
    optimizer._iterations = swap(optimizer._iterations)
    optimizer._variables = [swap(v) for v in optimizer._variables]  # a fresh tracked list (see the layers' below)
    for name in bookkeeping:
        object.__setattr__(model, name, swap(getattr(model, name)))
    modules = [model, *model.submodules]
    for metric in model.metrics:
        modules += [metric, *metric.submodules]
    for layer in modules:
        if not isinstance(layer, tf.keras.layers.Layer):
            continue
        for attr in ("_trainable_weights", "_non_trainable_weights"):
            weights = getattr(layer, attr, None)
            if weights is not None:
                swap_in(weights)
        for key, value in list(vars(layer).items()):
            if isinstance(value, tf.Variable) and id(value) in new:
                object.__setattr__(layer, key, new[id(value)])
                layer._track_trackable(new[id(value)], name=key, overwrite=True)
            elif isinstance(value, list) and any(id(v) in new for v in value):
                # A fresh list, tracked anew under its name: a tracked list (ListWrapper) whose item was
                # replaced refuses every later save ("A list element was replaced"): Keras' checkpoints.
                setattr(layer, key, [swap(v) for v in value])
