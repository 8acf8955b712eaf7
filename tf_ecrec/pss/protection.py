"""`PSSProtection`: erasure-coded tables for a TF2 ParameterServerStrategy job.

    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf_ecrec.pss.ECPartitioner())
    protection = tf_ecrec.pss.protect(strategy, ec="2+1")
    with strategy.scope():
        model = MyModel()               # uses tf_ecrec.keras.ECEmbeddings for its tables
        model.compile(optimizer=protection.optimizer(tf.keras.optimizers.Adagrad(0.05)), loss=...)
    model.fit(dataset, epochs=..., steps_per_epoch=...)

`protect` makes the per-PS anchors (`tf_ecrec.pss.anchors`) and
registers the protection with the strategy: an `ECEmbeddings` layer built
under that strategy's scope places its data chunks as the layout says and
joins the protection; the optimizer wrapper (`tf_ecrec.pss.keras_optimizer`)
creates slots, parity and replicas the same way and applies every update
through the delta ops, so parity stays exact under asynchronous workers.
"""

from __future__ import annotations

import weakref
from typing import Any

import tensorflow as tf

from tf_ecrec.erasure.code import ECConfig, default_code
from tf_ecrec.errors import ConfigError
from tf_ecrec.pss.anchors import PSPlacement
from tf_ecrec.step.embedding import EmbeddingCollection

# The protection of each protected strategy (what a layer built under the strategy's scope joins).
_PROTECTIONS: weakref.WeakKeyDictionary[Any, PSSProtection] = weakref.WeakKeyDictionary()


class PSSProtection:
    """The code, the placement and the protected tables of one ParameterServerStrategy.

    Attributes:
      ec: the code of the tables, dense replicas and the iteration count.
      placement: the per-PS anchors (`PSPlacement`).
      collections: the `EmbeddingCollection`s of the layers built under the strategy.
      optimizers: the optimizer wrappers made by `optimizer` (each protects what it updates).
    """

    def __init__(self, strategy: Any, ec: ECConfig | str) -> None:
        self.placement = PSPlacement(strategy)
        self.strategy = strategy
        self.ec = ECConfig.parse(ec, source="tf_ecrec.pss.protect ec=") if isinstance(ec, str) else ec
        self.ec.check_cluster(self.placement.num_ps, source="tf_ecrec.pss.protect (the strategy's ps job)")
        self.collections: list[EmbeddingCollection] = []
        self.optimizers: list[Any] = []
        self.generation = 0  # what an optimizer built from now on binds its step to (raised by a restored backup)

    @property
    def num_ps(self) -> int:
        return self.placement.num_ps

    def add_collection(self, collection: EmbeddingCollection) -> None:
        """Joins a table collection (a layer does it when built under the strategy)."""
        if any(c.name == collection.name for c in self.collections):
            raise ConfigError(
                f"two embedding collections named {collection.name!r} under one strategy; give the layers "
                "distinct names; source: the model"
            )
        self.collections.append(collection)

    def optimizer(self, optimizer: tf.keras.optimizers.Optimizer, name: str = "ECOptimizerV2") -> Any:
        """Wraps a TF2 Keras optimizer (SGD, Adagrad, Adam, Ftrl): see `tf_ecrec.pss.keras_optimizer.ECOptimizerV2`."""
        from tf_ecrec.pss.keras_optimizer import ECOptimizerV2

        return ECOptimizerV2(optimizer, protection=self, name=name)


def protect(strategy: Any, ec: ECConfig | str | None = None) -> PSSProtection:
    """Protects the tables built under `strategy` with code `ec` (default: 1+1 on 2 PS, 2+1 from 3).

    Call once per strategy, before the model is built; a second call returns
    the first protection (a different code is refused).
    """
    from tf_ecrec.pss.anchors import num_ps_of

    if strategy in _PROTECTIONS:
        existing = _PROTECTIONS[strategy]
        if ec is not None and str(ECConfig.parse(ec, source="ec=") if isinstance(ec, str) else ec) != str(existing.ec):
            raise ConfigError(
                f"the strategy is protected with {existing.ec}, not {ec}; source: tf_ecrec.pss.protect"
            )
        return existing
    if ec is None:
        ec = default_code(num_ps_of(strategy))
    protection = PSSProtection(strategy, ec)
    _PROTECTIONS[strategy] = protection
    return protection


def current_protection() -> PSSProtection | None:
    """The protection of the strategy in scope (`tf.distribute.get_strategy()`), if protected."""
    if not tf.distribute.has_strategy():
        return None
    return _PROTECTIONS.get(tf.distribute.get_strategy())
