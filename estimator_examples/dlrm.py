"""DLRM (Naumov et al., 2019) as a plain `tf.estimator` model_fn, on Criteo-format data.

The model: a bottom MLP over the 13 dense features, 26 embedding tables over
the categorical features, the pairwise dot interaction of the 27 resulting
vectors (tensorflow-recommenders' `DotInteraction`) and a top MLP producing
the click logit.  Embedding tables are partitioned over the PS tasks; the
MLPs are small dense variables.

Run it as users run their Estimator scripts, under an external TF_CONFIG (one
process per task; PS tasks serve, the chief and workers train)::

    TF_CONFIG='{"cluster": {...}, "task": {"type": "chief", "index": 0}}' \\
        python estimator_examples/dlrm.py --data synthetic --steps 2000 --model-dir /tmp/dlrm

or let ``tf-ecrec run --model dlrm ...`` launch a whole local cluster.
Installed, this module is ``tf_ecrec.examples.dlrm``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tf_ecrec.data.schema import NUM_CAT
from tf_ecrec.errors import ConfigError

_LOG = logging.getLogger(__name__)

OPTIMIZERS = ("adagrad", "sgd", "adam", "ftrl", "momentum", "rmsprop")

DEFAULT_PARAMS: dict[str, Any] = {
    "table_sizes": [20000] * NUM_CAT,
    "embedding_dim": 16,
    "bottom_mlp": [64, 16],  # the last width must equal embedding_dim
    "top_mlp": [64, 32],
    "optimizer": "adagrad",
    "learning_rate": 0.05,
    # Without "ec": "partitioned" tables (stock), or "collection": the variables and layout
    # (by storage_code) that ecrec protects, unprotected: the like-for-like baseline.
    "storage": "partitioned",
    "storage_code": "2+1",
}


def default_params(**overrides: Any) -> dict[str, Any]:
    """DEFAULT_PARAMS with `overrides`, validated."""
    params = {**DEFAULT_PARAMS, **{k: v for k, v in overrides.items() if v is not None}}
    if not 1 <= len(params["table_sizes"]) <= NUM_CAT:
        raise ConfigError(f"DLRM needs 1 to {NUM_CAT} table sizes (one per categorical it reads), got "
                          f"{len(params['table_sizes'])}; source: table_sizes")
    if params["bottom_mlp"][-1] != params["embedding_dim"]:
        raise ConfigError(
            f"the bottom MLP's last width {params['bottom_mlp'][-1]} must equal embedding_dim "
            f"{params['embedding_dim']} for the dot interaction; source: params"
        )
    if params["optimizer"] not in OPTIMIZERS:
        raise ConfigError(f"optimizer {params['optimizer']!r} is not one of {OPTIMIZERS}; source: --optimizer")
    if params["storage"] not in ("partitioned", "collection"):
        raise ConfigError(f"storage {params['storage']!r} is not partitioned or collection; source: params['storage']")
    return params


def make_optimizer(name: str, learning_rate: float) -> tf.compat.v1.train.Optimizer:
    """The v1 optimizer the Estimator applies (sparse updates for embeddings)."""
    if name == "adagrad":
        return tf.compat.v1.train.AdagradOptimizer(learning_rate, initial_accumulator_value=0.1)
    if name == "sgd":
        return tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
    if name == "adam":
        return tf.compat.v1.train.AdamOptimizer(learning_rate * 0.1)
    if name == "ftrl":
        return tf.compat.v1.train.FtrlOptimizer(learning_rate)
    if name == "momentum":  # momentum 0.9 multiplies the step by 10 in the long run: the rate of sgd
        return tf.compat.v1.train.MomentumOptimizer(learning_rate * 0.1, momentum=0.9)
    if name == "rmsprop":  # steps of about the rate per coordinate, as adam's
        return tf.compat.v1.train.RMSPropOptimizer(learning_rate * 0.1)
    raise ConfigError(f"optimizer {name!r} is not one of {OPTIMIZERS}; source: --optimizer")


def embedding_tables(params: dict[str, Any], num_ps: int) -> list[tf.Variable]:
    """The tables (one per categorical read), each partitioned over the PS tasks (row-wise)."""
    tables = []
    for i, rows in enumerate(params["table_sizes"]):
        tables.append(
            tf.compat.v1.get_variable(
                f"embedding_{i}",
                shape=[rows, params["embedding_dim"]],
                initializer=tf.compat.v1.random_uniform_initializer(-0.05, 0.05),
                partitioner=tf.compat.v1.fixed_size_partitioner(max(1, min(num_ps, rows))),
            )
        )
    return tables


def dlrm_logits(
    features: dict[str, tf.Tensor],
    params: dict[str, Any],
    lookup: Callable[[int, tf.Tensor], tf.Tensor],
) -> tf.Tensor:
    """The DLRM forward pass; `lookup(i, ids)` returns table i's rows for ids."""
    import tensorflow_recommenders as tfrs  # imported late: it is slow to import

    x = features["dense"]
    for width in params["bottom_mlp"]:
        x = _dense(width, "relu")(x)
    vectors = [x] + [lookup(i, features["cat"][:, i]) for i in range(len(params["table_sizes"]))]
    interactions = tfrs.layers.feature_interaction.DotInteraction(self_interaction=False)(vectors)
    y = tf.concat([x, interactions], axis=1)
    for width in params["top_mlp"]:
        y = _dense(width, "relu")(y)
    return tf.squeeze(_dense(1, None)(y), axis=1)


def _dense(width: int, activation: str | None) -> tf.keras.layers.Dense:
    # Keras' default initializers ignore the graph-level seed (RunConfig.tf_random_seed);
    # the v1 initializers derive their seed from it, so a seeded run starts from the same bytes.
    return tf.keras.layers.Dense(
        width, activation=activation, kernel_initializer=tf.compat.v1.glorot_uniform_initializer()
    )


def model_fn(
    features: dict[str, tf.Tensor],
    labels: tf.Tensor,
    mode: str,
    params: dict[str, Any],
    config: tf.estimator.RunConfig,
) -> tf.estimator.EstimatorSpec:
    """The Estimator model_fn of DLRM.

    With ``params["ec"]`` the tables and the optimizer are tf_ecrec's
    erasure-coded ones (wrap the model_fn with `tf_ecrec.ec_model_fn`); the
    rest of the model does not change.
    """
    if params.get("ec") or params.get("storage") == "collection":
        import tf_ecrec
        from tf_ecrec.layout.device import layout_placement

        specs = [(f"C{i + 1}", rows) for i, rows in enumerate(params["table_sizes"])]
        if params.get("ec"):
            tables = tf_ecrec.EmbeddingCollection("dlrm", specs, params["embedding_dim"])
        else:  # the same storage, unprotected
            with tf.compat.v1.device(layout_placement):
                tables = tf_ecrec.EmbeddingCollection(
                    "dlrm", specs, params["embedding_dim"], ec=tf_ecrec.ECConfig.parse(params["storage_code"]),
                    num_ps=config.num_ps_replicas, protected=False,
                )
        rows = tf.unstack(tables.lookup_all(features["cat"][:, : len(specs)]), axis=1)
        lookup: Callable[[int, tf.Tensor], tf.Tensor] = lambda i, ids: rows[i]  # noqa: E731
    else:
        partitioned = embedding_tables(params, config.num_ps_replicas)
        lookup = lambda i, ids: tf.nn.embedding_lookup(partitioned[i], ids)  # noqa: E731
    logits = dlrm_logits(features, params, lookup)
    probabilities = tf.sigmoid(logits)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"probability": probabilities})
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == tf.estimator.ModeKeys.EVAL:
        auc = tf.compat.v1.metrics.auc(labels, probabilities)
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={"auc": auc})
    optimizer = make_optimizer(params["optimizer"], params["learning_rate"])
    if params.get("ec"):
        optimizer = tf_ecrec.ECOptimizer(optimizer)
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


# ---------------------------------------------------------------------------------------------
# A plain Estimator script: one process of a TF_CONFIG cluster.
# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    from tf_ecrec.examples import script

    args = script.parser("Train DLRM with tf.estimator under TF_CONFIG.", OPTIMIZERS).parse_args(argv)
    run_config = script.run_config(args)
    position = script.serve_or_position(run_config)
    if position is None:  # a PS, stopped
        return 0
    params = default_params(optimizer=args.optimizer)
    estimator = tf.estimator.Estimator(model_fn=model_fn, params=params, config=run_config)
    estimator.train(script.input_fn(args, params["table_sizes"], *position), max_steps=args.steps)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main())
