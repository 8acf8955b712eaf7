"""Wide and deep as TensorFlow's canned estimator over the Criteo layout: ``tf-ecrec run --model wide_deep_canned``.

The model_fn is `tf.compat.v1.estimator.DNNLinearCombinedClassifier`'s own, built for each graph from feature
columns over the launcher's features (``{"dense": float32[B, 13], "cat": int64[B, 26]}``, each column its own
feature): the linear part reads every categorical table's identity column and one crossed column of the first two
(FTRL, the canned default); the deep part reads the 13 dense features and an embedding column per table
(``--optimizer``, Adagrad by default, with ``--learning-rate``). With ``params["ec"]`` (``--fault-tolerance
ecrec``) the embedding columns are `tf_ecrec.feature_column.embedding_column` (each table a collection striped
with parity), the linear part's weights `tf_ecrec.feature_column.linear` (striped too), the deep optimizer an
`ECOptimizer` and the linear one its part (`ECOptimizer.part`): one protected step of both. It is the canned estimator a user keeps, so it makes one collection
per column where ``--model dlrm`` makes one for all tables: slower per step at 26 tables (``--tables`` reads fewer).

Installed, this module is ``tf_ecrec.examples.wide_deep_canned``.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_ecrec.data.schema import NUM_CAT, NUM_DENSE
from tf_ecrec.examples.dlrm import make_optimizer

DEFAULT_PARAMS: dict[str, Any] = {"table_sizes": [20000] * NUM_CAT, "embedding_dim": 16, "dnn_hidden_units": [64, 32],
                                  "optimizer": "adagrad", "learning_rate": 0.05, "crossed_buckets": 10000}


def default_params(**overrides: Any) -> dict[str, Any]:
    """The canned model's params, the launcher's flags (`tf_ecrec.launcher.job.models.model_params`) over them."""
    return {**DEFAULT_PARAMS, **{k: v for k, v in overrides.items() if k in DEFAULT_PARAMS}}


def columns(params: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """(wide, deep) feature columns over features named ``I0..I12`` and ``C0..``; tf_ecrec's embedding columns
    with ``params["ec"]``."""
    cats = [tf.feature_column.categorical_column_with_identity(f"C{i}", int(n))
            for i, n in enumerate(params["table_sizes"])]
    wide = list(cats)
    if len(cats) > 1:
        wide.append(tf.feature_column.crossed_column(["C0", "C1"], int(params["crossed_buckets"])))
    if params.get("ec"):
        import tf_ecrec.feature_column

        embed = tf_ecrec.feature_column.embedding_column
    else:
        embed = tf.feature_column.embedding_column
    deep = [tf.feature_column.numeric_column(f"I{i}") for i in range(NUM_DENSE)]
    if params.get("ec"):
        wide = tf_ecrec.feature_column.linear(wide)
    return wide, deep + [embed(c, int(params["embedding_dim"]), combiner="sum") for c in cats]


def model_fn(features: dict[str, tf.Tensor], labels: tf.Tensor, mode: str, params: dict[str, Any],
             config: tf.estimator.RunConfig) -> tf.estimator.EstimatorSpec:
    """The canned DNNLinearCombinedClassifier's model_fn over the launcher's features (see the module doc)."""
    named = {f"I{i}": features["dense"][:, i:i + 1] for i in range(NUM_DENSE)}
    named.update({f"C{i}": features["cat"][:, i:i + 1] for i in range(len(params["table_sizes"]))})
    dnn: Any = make_optimizer(params["optimizer"], params["learning_rate"])
    linear: Any = tf.compat.v1.train.FtrlOptimizer(min(0.2, len(params["table_sizes"]) ** -0.5))
    if params.get("ec"):
        import tf_ecrec

        dnn = tf_ecrec.ECOptimizer(dnn)
        linear = dnn.part(linear)
    wide, deep = columns(params)
    canned = tf.compat.v1.estimator.DNNLinearCombinedClassifier(
        linear_feature_columns=wide, dnn_feature_columns=deep, dnn_hidden_units=list(params["dnn_hidden_units"]),
        linear_optimizer=linear, dnn_optimizer=dnn, loss_reduction=tf.compat.v1.losses.Reduction.SUM_OVER_BATCH_SIZE,
        config=config)
    return canned.model_fn(named, tf.reshape(labels, [-1, 1]), mode, config)
