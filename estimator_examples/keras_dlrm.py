"""DLRM (Naumov et al., 2019) as a Keras model trained by ``model.fit`` under TF2 ParameterServerStrategy.

The model: a bottom MLP over the 13 dense features; the 26 categorical
features' embeddings from one `tf_ecrec.keras.ECEmbeddings` collection
(erasure-coded over the PS tasks, one gather per PS for all features); the
pairwise dot products of the bottom output and the embeddings
(tensorflow-recommenders' ``DotInteraction``); a top MLP; one click logit.

What a TF2 user changes to protect such a model (the rest is stock
``ParameterServerStrategy`` code)::

    tf_ecrec.pss.prepare_process()                                   # before the strategy
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf_ecrec.pss.ECPartitioner())
    protection = tf_ecrec.pss.protect(strategy, "2+1")
    with strategy.scope():
        model = KerasDLRM(params)                                    # ECEmbeddings for the tables
        model.compile(optimizer=protection.optimizer(tf.keras.optimizers.Adagrad(0.05)), loss=...)
    tf_ecrec.pss.fit(model, dataset_creator, epochs=..., steps_per_epoch=...)   # model.fit that survives a PS

The launcher trains it with ``tf-ecrec run --model keras_dlrm --strategy pss
--fault-tolerance ecrec``; its model-module contract under ``--strategy pss``
is ``keras_model(params)`` (an uncompiled model taking ``{"dense": float32
[B, 13], "cat": int64 [B, 26]}`` and returning logits [B]) and, optionally,
``default_params(**flags)`` and ``keras_optimizer(name, learning_rate)``.

Installed, this module is ``tf_ecrec.examples.keras_dlrm``.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

import tf_ecrec.keras
from tf_ecrec.data.schema import NUM_CAT
from tf_ecrec.errors import ConfigError

OPTIMIZERS = ("adagrad", "sgd", "adam", "ftrl")

DEFAULT_PARAMS: dict[str, Any] = {
    "table_sizes": [20000] * NUM_CAT,
    "embedding_dim": 16,
    "bottom_mlp": [64, 16],
    "top_mlp": [64, 32],
    "optimizer": "adagrad",
    "learning_rate": 0.05,
}


def default_params(**overrides: Any) -> dict[str, Any]:
    """The model's params: DEFAULT_PARAMS with the launcher's flags over them (unknown flags are ignored)."""
    params = dict(DEFAULT_PARAMS)
    params.update({k: v for k, v in overrides.items() if k in DEFAULT_PARAMS})
    params["bottom_mlp"] = [*list(params["bottom_mlp"])[:-1], int(params["embedding_dim"])]
    if params["optimizer"] not in OPTIMIZERS:
        raise ConfigError(
            f"optimizer {params['optimizer']!r}: keras_dlrm trains with one of {OPTIMIZERS} (the TF2 Keras "
            "optimizers tf_ecrec.pss applies with parity deltas); source: --optimizer"
        )
    return params


def keras_optimizer(name: str, learning_rate: float) -> tf.keras.optimizers.Optimizer:
    """The TF2 Keras optimizer of `name` (what `PSSProtection.optimizer` wraps)."""
    if name == "adagrad":
        return tf.keras.optimizers.Adagrad(learning_rate, initial_accumulator_value=0.1)
    if name == "sgd":
        return tf.keras.optimizers.SGD(learning_rate)
    if name == "adam":
        return tf.keras.optimizers.Adam(learning_rate * 0.1)
    if name == "ftrl":
        return tf.keras.optimizers.Ftrl(learning_rate)
    raise ConfigError(f"optimizer {name!r} is not one of {OPTIMIZERS}; source: --optimizer")


class KerasDLRM(tf.keras.Model):
    """DLRM over `tf_ecrec.keras.ECEmbeddings` (see the module doc)."""

    def __init__(self, params: dict[str, Any], **kwargs: Any) -> None:
        import tensorflow_recommenders as tfrs  # slow to import: only when a model is made

        super().__init__(**kwargs)
        self.params = dict(params)
        dim = int(params["embedding_dim"])
        self.embeddings = tf_ecrec.keras.ECEmbeddings(
            [(f"C{i}", int(rows)) for i, rows in enumerate(params["table_sizes"])], dim, name="tables")
        self.bottom = [tf.keras.layers.Dense(w, activation="relu") for w in params["bottom_mlp"]]
        self.interaction = tfrs.layers.feature_interaction.DotInteraction(self_interaction=False)
        self.top = [tf.keras.layers.Dense(w, activation="relu") for w in params["top_mlp"]]
        self.logit = tf.keras.layers.Dense(1)

    def call(self, features: dict[str, tf.Tensor]) -> tf.Tensor:
        x = features["dense"]
        for layer in self.bottom:
            x = layer(x)
        n = len(self.params["table_sizes"])  # the first n categoricals (--tables)
        rows = self.embeddings(features["cat"][:, :n])  # [B, n, dim]: one gather per PS
        vectors = [x] + tf.unstack(rows, num=n, axis=1)
        y = tf.concat([x, self.interaction(vectors)], axis=1)
        for layer in self.top:
            y = layer(y)
        return tf.squeeze(self.logit(y), axis=1)

    def get_config(self) -> dict[str, Any]:
        return {"params": self.params}


def keras_model(params: dict[str, Any]) -> tf.keras.Model:
    """The uncompiled model (the launcher compiles it with the protection's optimizer)."""
    return KerasDLRM(params)
