"""Python objects that belong to a `tf.Graph`, kept beside it rather than in its collections.

TensorFlow writes a graph's collections into the MetaGraph of every checkpoint and logs a warning
("Issue encountered when serializing ...") for each item it cannot serialize. The objects tf_ecrec
attaches to a graph (the code context `ec_model_fn` sets, the protected embedding collections, the
optimizers that protect them) are Python objects, so they live in a `GraphRegistry` instead: keyed
weakly by graph, gone with it, never serialized.
"""

from __future__ import annotations

import weakref
from typing import Generic, TypeVar

import tensorflow as tf

T = TypeVar("T")


class GraphRegistry(Generic[T]):
    """Per-graph lists of objects, in the order they were added (the default graph unless given)."""

    def __init__(self) -> None:
        self._items: weakref.WeakKeyDictionary[tf.Graph, list[T]] = weakref.WeakKeyDictionary()

    def add(self, item: T, graph: tf.Graph | None = None) -> None:
        self._items.setdefault(graph or tf.compat.v1.get_default_graph(), []).append(item)

    def items(self, graph: tf.Graph | None = None) -> list[T]:
        return list(self._items.get(graph or tf.compat.v1.get_default_graph(), ()))
