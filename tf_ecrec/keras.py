"""Erasure-coded embeddings for Keras models trained as Estimators (`model_to_estimator`).

A Keras model gets protected tables from one layer and one optimizer::

    class Model(tf.keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.embeddings = tf_ecrec.keras.ECEmbeddings(
                [(f"C{i}", 20000) for i in range(26)], 16, ec=tf_ecrec.ECConfig(2, 1), num_ps=3)
            ...
        def call(self, features):
            rows = self.embeddings(features["cat"])         # [B, 26, 16], one gather per PS
            ...
        def get_config(self):
            return {...}                                    # model_to_estimator clones from it

    model = Model()
    model.compile(optimizer=tf_ecrec.keras.ECKerasOptimizer(tf.compat.v1.train.AdagradOptimizer(0.05)),
                  loss=...)
    run_config = tf.estimator.RunConfig(device_fn=tf_ecrec.ECDeviceFn(), ...)  # places tables per the layout
    estimator = tf.keras.estimator.model_to_estimator(model, config=run_config, checkpoint_format="saver")

`ECEmbeddings` builds one `tf_ecrec.EmbeddingCollection` for all its tables
and exposes the collection's per-PS data variables as its trainable weights,
so Keras computes their gradients (as `IndexedSlices`, through the gather)
and hands them to the optimizer.  `ECEmbedding` is the one-table form with
the signature of `tf.keras.layers.Embedding`.

The layer places its variables on the PS tasks of the graph being built, so
it is built in the Estimator's graph, never eagerly: use it in a subclassed
model with ``get_config``, which model_to_estimator builds only in the
Estimator's graphs (a functional model is built eagerly when it is defined,
and model_to_estimator would also warm-start its tables from a first
checkpoint after their parity was computed).  The RunConfig's
``device_fn=tf_ecrec.ECDeviceFn()`` puts data chunks, parity, slots and
replicas on the PS tasks the layout names (the layer refuses to build
otherwise: `tf_ecrec.layout.device`).  ``checkpoint_format="saver"``
makes the Estimator's checkpoints hold every variable, parity, replicas and
slots included (the object-based format saves only what Keras tracks).

The code and the PS count are resolved when the layer is built, in this
order: the layer's arguments; the defaults of `tf_ecrec.ec_model_fn` when the
layer is built inside a wrapped model_fn; for the PS count only, the ``ps``
job of the process's TF_CONFIG (what `RunConfig` reads).

model_to_estimator clones the compiled model into every graph the Estimator
builds (each train() and evaluate() call) and hands each clone the same
optimizer object, wrapped in Keras' `TFOptimizer` with the Estimator's
global step as its iteration counter.  `ECKerasOptimizer` gives every graph
its own `ECOptimizer` over the same stock optimizer (an `ECOptimizer` makes
its parity, slot and replica variables anew in each graph it builds).  `TFOptimizer` calls
``apply_gradients(grads, global_step=<the Estimator's global step>)``, which
applies every update through the delta ops and increments the global step
and its replicas once per step.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_ecrec.cluster.tf_config import ClusterConfig
from tf_ecrec.erasure.code import ECConfig
from tf_ecrec.errors import ConfigError
from tf_ecrec.pss.protection import current_protection
from tf_ecrec.step.embedding import EmbeddingCollection, current_context
from tf_ecrec.step.optimizer import ECOptimizer
from tf_ecrec.step.update_rule import UpdateRule


def _resolve_code(ec: ECConfig | str | None, num_ps: int | None, what: str) -> tuple[ECConfig, int]:
    """The code and PS count a table built now uses (see the module docstring for the order).

    Raises:
      ConfigError: neither is known, or the code does not fit the PS count.
    """
    ctx = current_context()
    if isinstance(ec, str):
        ec = ECConfig.parse(ec, source=f"{what} ec=")
    code = ec or (ctx.ec if ctx else None)
    if code is None:
        raise ConfigError(
            f"{what} needs an erasure code: pass ec=tf_ecrec.ECConfig(k, r), or build the model inside a "
            "model_fn wrapped with tf_ecrec.ec_model_fn; source: the layer's arguments"
        )
    source = "the layer's num_ps argument"
    if not num_ps and ctx is not None:
        num_ps, source = ctx.num_ps, "tf_ecrec.ec_model_fn (the RunConfig's PS count)"
    if not num_ps:
        try:
            num_ps, source = ClusterConfig.from_environment().num_ps, "the ps job of TF_CONFIG"
        except ConfigError as exc:
            raise ConfigError(
                f"{what} needs the PS count: pass num_ps=, build the model inside a model_fn wrapped with "
                f"tf_ecrec.ec_model_fn, or run the process under a TF_CONFIG with a ps job ({exc})"
            ) from exc
        if not num_ps:
            raise ConfigError(
                f"{what} needs PS tasks to store its tables, but TF_CONFIG has no ps job; pass num_ps= or add "
                "a ps job; source: environment variable TF_CONFIG"
            )
    code.check_cluster(int(num_ps), source=f"{what} ({source})")
    return code, int(num_ps)


class ECEmbeddings(tf.keras.layers.Layer):
    """Several embedding tables of one width, erasure-coded over the PS tasks.

    ``call(ids)`` takes ids of shape [batch, tables] (column ``t`` indexes
    table ``t``; ids must lie in [0, rows of the table)) and returns
    [batch, tables, output_dim].

    Args:
      tables: (table name, rows) pairs, in column order.
      output_dim: values per row.
      ec: the code (an `ECConfig` or "k+r"); default: see the module docstring.
      num_ps: PS tasks; default: see the module docstring.
      embeddings_initializer: initializer of the real rows, called with a
        shape [rows, output_dim]; default uniform in [-0.05, 0.05], seeded
        by the graph seed (RunConfig.tf_random_seed).
      collection: the `EmbeddingCollection`'s name (variables
        ``ec/<collection>/ps<p>/data``); default: the layer's name.
      **kwargs: `tf.keras.layers.Layer` arguments (name, ...).

    Raises (in `build`):
      ConfigError: no code or PS count, a code the PS count cannot place, or
        an eager build (outside a graph).
    """

    def __init__(
        self,
        tables: Sequence[tuple[str, int]],
        output_dim: int,
        ec: ECConfig | str | None = None,
        num_ps: int | None = None,
        embeddings_initializer: Any = None,
        collection: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.tables = [(str(name), int(rows)) for name, rows in tables]
        if not self.tables:
            raise ConfigError(f"layer {self.name!r} has no tables; source: the layer's tables argument")
        self.output_dim = int(output_dim)
        self.ec = ECConfig.parse(ec, source=f"layer {self.name!r} ec=") if isinstance(ec, str) else ec
        self.num_ps = int(num_ps) if num_ps else None
        self.embeddings_initializer = (
            tf.keras.initializers.get(embeddings_initializer) if embeddings_initializer is not None else None
        )
        self.collection_name = collection or self.name
        self.collection: EmbeddingCollection | None = None

    def build(self, input_shape: Any) -> None:
        protection = current_protection()
        if tf.executing_eagerly() and protection is None:
            raise ConfigError(
                f"layer {self.name!r} stores its tables on the PS tasks of the graph being built and cannot be built "
                "eagerly; with model_to_estimator, use it in a subclassed tf.keras.Model with get_config (a "
                "functional model is built eagerly when defined), which the Estimator builds in its own graph; "
                "source: the model definition (under TF2 ParameterServerStrategy: build it in the scope of a "
                "strategy protected with tf_ecrec.pss.protect)"
            )
        if protection is not None:  # TF2 ParameterServerStrategy: the protection's code, PS count and placement
            ec, num_ps = _resolve_code(self.ec or protection.ec, self.num_ps or protection.num_ps, f"layer {self.name!r}")
            # Keras may build the layer in the first trace of the step (replica context); the tables are
            # created outside it, eagerly, in the strategy's scope, as Keras lifts its own weights.
            self.collection = protection.placement.create(lambda: self._collection(ec, num_ps))
            protection.add_collection(self.collection)
        else:
            ec, num_ps = _resolve_code(self.ec, self.num_ps, f"layer {self.name!r}")
            self.collection = self._collection(ec, num_ps)
        # A list of variables assigned to an attribute is tracked: these become the
        # layer's trainable weights, which Keras differentiates and hands to the optimizer.
        self.ps_variables = [self.collection.data[p] for p in sorted(self.collection.data)]
        super().build(input_shape)

    def _collection(self, ec: ECConfig, num_ps: int) -> EmbeddingCollection:
        return EmbeddingCollection(
            self.collection_name, self.tables, self.output_dim, ec=ec, num_ps=num_ps,
            initializer=self.embeddings_initializer,
        )

    def call(self, ids: tf.Tensor) -> tf.Tensor:
        assert self.collection is not None  # built by __call__
        rows = self.collection.lookup_all(ids)
        rows.set_shape(ids.shape.concatenate([self.output_dim]))
        return rows

    def compute_output_shape(self, input_shape: Any) -> tf.TensorShape:
        return tf.TensorShape(input_shape).concatenate([self.output_dim])

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            {
                "tables": [list(t) for t in self.tables],
                "output_dim": self.output_dim,
                "ec": str(self.ec) if self.ec else None,
                "num_ps": self.num_ps,
                "embeddings_initializer": (
                    tf.keras.initializers.serialize(self.embeddings_initializer)
                    if self.embeddings_initializer is not None
                    else None
                ),
                "collection": self.collection_name,
            }
        )
        return config


class ECEmbedding(ECEmbeddings):
    """One erasure-coded table; `tf.keras.layers.Embedding`'s signature.

    ``call(ids)``: ids of any shape, each in [0, input_dim) -> ``ids.shape + [output_dim]``.
    """

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        ec: ECConfig | str | None = None,
        num_ps: int | None = None,
        embeddings_initializer: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            [("table", int(input_dim))], output_dim, ec=ec, num_ps=num_ps,
            embeddings_initializer=embeddings_initializer, **kwargs,
        )
        self.input_dim = int(input_dim)

    def call(self, ids: tf.Tensor) -> tf.Tensor:
        assert self.collection is not None
        rows = self.collection.lookup(0, ids)
        rows.set_shape(ids.shape.concatenate([self.output_dim]))
        return rows

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        del config["tables"]
        config["input_dim"] = self.input_dim
        return config


class ECKerasOptimizer(tf.compat.v1.train.Optimizer):
    """The optimizer to `compile` a Keras model with: an `ECOptimizer` per graph.

    Keras wraps it in a `TFOptimizer`; every graph the Estimator builds gets a
    fresh `ECOptimizer(optimizer, ec)`, made when the graph first computes or
    applies gradients.  `ec_optimizer()` returns the one of the current graph.

    Args:
      optimizer: a stock tf.compat.v1.train optimizer (see `tf_ecrec.step.update_rule.UpdateRule`).
      ec: the code of the dense replicas and the global step; default: as `ECOptimizer`.
      name: name prefix of the ops.

    Raises:
      ConfigError: an optimizer `ECOptimizer` cannot apply.
    """

    def __init__(
        self, optimizer: tf.compat.v1.train.Optimizer, ec: ECConfig | None = None, name: str = "ECOptimizer"
    ) -> None:
        super().__init__(use_locking=True, name=name)
        UpdateRule.of(optimizer)  # an optimizer the delta ops cannot apply fails here, not at the first step
        self._base = optimizer
        self._ec = ec
        self._per_graph: weakref.WeakKeyDictionary[tf.Graph, ECOptimizer] = weakref.WeakKeyDictionary()

    def ec_optimizer(self) -> ECOptimizer:
        """The `ECOptimizer` of the current default graph (made on first use)."""
        graph = tf.compat.v1.get_default_graph()
        if graph not in self._per_graph:
            self._per_graph[graph] = ECOptimizer(self._base, ec=self._ec, name=self._name)
        return self._per_graph[graph]

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, tf.Variable]]:
        return self.ec_optimizer().compute_gradients(*args, **kwargs)

    def apply_gradients(
        self, grads_and_vars: Any, global_step: tf.Variable | None = None, name: str | None = None
    ) -> tf.Operation:
        return self.ec_optimizer().apply_gradients(grads_and_vars, global_step=global_step, name=name)

    def get_slot_names(self) -> list[str]:
        return self.ec_optimizer().get_slot_names()
