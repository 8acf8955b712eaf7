"""DCN-v2 (Wang et al., 2020) as a Keras model, trained as an Estimator with `model_to_estimator`.

The model: the 26 categorical features' embeddings, flattened and
concatenated with the 13 dense features into ``x0``; a stack of
tensorflow-recommenders ``Cross`` layers (``x_{i+1} = x0 * (W x_i + b) + x_i``);
a small deep tower on the last cross output; one click logit.

With ``params["ec"]`` the 26 tables are one `tf_ecrec.keras.ECEmbeddings`
collection (erasure-coded over the PS tasks, one gather per PS for all
features) and the model is compiled with `tf_ecrec.keras.ECKerasOptimizer`;
without it, 26 plain `tf.keras.layers.Embedding` tables and the stock v1
optimizer.  Either way the Keras model is converted with
`tf.keras.estimator.model_to_estimator`.

The model is a subclassed `tf.keras.Model` with `get_config`, so
model_to_estimator builds it only inside the Estimator's graphs, where the
tables can be placed on the PS tasks, and neither writes a first Keras
checkpoint nor warm-starts from one (a warm start would overwrite the tables
after their parity was computed from their initial values).  Checkpoints use
the name-based Saver (``checkpoint_format="saver"``) so parity, replicas and
optimizer slots are saved with the weights.

The Estimator's model_fn is the one model_to_estimator makes (`model_fn`,
which converts a freshly compiled model for every graph); `make_estimator`
wraps it in `tf_ecrec.ec_model_fn` when the tables are protected, as the
launcher does for ``tf-ecrec run --model dcn --fault-tolerance ecrec``: the
wrapper supplies the code and the PS count, checks that the tables are
updated by an ECOptimizer and owns the Scaffold that rebuilds a lost PS from
parity.

Features are those of `tf_ecrec.data.pipeline.make_dataset`:
``{"dense": float32[B, 13], "cat": int64[B, 26]}``; the model reads these two
keys of the features dict and ignores any other (such as the pipeline's
corrupt-record count).  Run it under an external TF_CONFIG like dlrm.py::

    TF_CONFIG='{"cluster": {...}, "task": {"type": "chief", "index": 0}}' \\
        python estimator_examples/dcn.py --ec 2+1 --steps 2000 --model-dir /tmp/dcn

Installed, this module is ``tf_ecrec.examples.dcn``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_ecrec.data.schema import NUM_CAT
from tf_ecrec.erasure.code import ECConfig
from tf_ecrec.errors import ConfigError
from tf_ecrec.examples.dlrm import OPTIMIZERS, make_optimizer

_LOG = logging.getLogger(__name__)

DEFAULT_PARAMS: dict[str, Any] = {
    "table_sizes": [20000] * NUM_CAT,
    "embedding_dim": 16,
    "cross_layers": 3,
    "projection_dim": 64,  # rank of the cross kernels (W = U V); 0: full rank
    "deep_mlp": [128, 64],
    "optimizer": "adagrad",
    "learning_rate": 0.05,
    "ec": None,  # None/False: plain tables; "K+R" or an ECConfig; True: the code of tf_ecrec.ec_model_fn
}
# Parameters other models take that launchers pass to every model; DCN has no use for them (its
# tables are partitioned, or ECEmbeddings under "ec": the launcher allows nothing else for DCN).
_IGNORED = ("bottom_mlp", "top_mlp", "storage", "storage_code")


def default_params(**overrides: Any) -> dict[str, Any]:
    """DEFAULT_PARAMS with `overrides` (None values ignored), validated.

    Raises:
      ConfigError: an unknown parameter or a value breaking a rule.
    """
    unknown = sorted(set(overrides) - set(DEFAULT_PARAMS) - set(_IGNORED))
    if unknown:
        raise ConfigError(f"DCN has no parameters {unknown}; known: {sorted(DEFAULT_PARAMS)}; source: params")
    params = {**DEFAULT_PARAMS, **{k: v for k, v in overrides.items() if v is not None and k not in _IGNORED}}
    if not 1 <= len(params["table_sizes"]) <= NUM_CAT:
        raise ConfigError(f"DCN needs 1 to {NUM_CAT} table sizes (one per categorical it reads), got "
                          f"{len(params['table_sizes'])}; source: table_sizes")
    if params["optimizer"] not in OPTIMIZERS:
        raise ConfigError(f"optimizer {params['optimizer']!r} is not one of {OPTIMIZERS}; source: --optimizer")
    if int(params["cross_layers"]) < 1:
        raise ConfigError(f"DCN needs >= 1 cross layer, got {params['cross_layers']}; source: cross_layers")
    if isinstance(params["ec"], str):
        params["ec"] = str(ECConfig.parse(params["ec"], source="params['ec']"))
    elif isinstance(params["ec"], ECConfig):
        params["ec"] = str(params["ec"])
    return params


class DCN(tf.keras.Model):
    """The DCN-v2 click model: ``call(features)`` -> logits [batch].

    Args:
      table_sizes: rows of the table of each categorical read (the first len(table_sizes) of 26).
      embedding_dim: values per embedding row.
      cross_layers: Cross layers in the stack.
      projection_dim: rank of the cross kernels (None: full rank).
      deep_mlp: widths of the deep tower's hidden layers.
      ec: protection of the tables: None/False for plain Keras embeddings, a
        code ("K+R"), or True for the code of `tf_ecrec.ec_model_fn`.
      num_ps: PS tasks of the protected tables (default: `ECEmbeddings`').
      **kwargs: `tf.keras.Model` arguments (name).
    """

    def __init__(
        self,
        table_sizes: Sequence[int],
        embedding_dim: int,
        cross_layers: int = 3,
        projection_dim: int | None = None,
        deep_mlp: Sequence[int] = (128, 64),
        ec: str | bool | None = None,
        num_ps: int | None = None,
        **kwargs: Any,
    ) -> None:
        import tensorflow_recommenders as tfrs  # imported late: it is slow to import

        super().__init__(**kwargs)
        self.table_sizes = [int(n) for n in table_sizes]
        self.embedding_dim = int(embedding_dim)
        self.cross_layers = int(cross_layers)
        self.projection_dim = projection_dim
        self.deep_mlp = [int(w) for w in deep_mlp]
        self.ec = ec
        self.num_ps = num_ps
        # Keras' default initializers ignore the graph-level seed (RunConfig.tf_random_seed);
        # the v1 initializers derive their seed from it, so a seeded run starts from the same bytes.
        uniform = tf.compat.v1.random_uniform_initializer(-0.05, 0.05)
        if ec:
            from tf_ecrec.keras import ECEmbeddings

            self.embeddings: Any = ECEmbeddings(
                [(f"C{i + 1}", rows) for i, rows in enumerate(self.table_sizes)],
                self.embedding_dim,
                ec=None if ec is True else ec,
                num_ps=num_ps,
                name="embeddings",
                collection="dcn",
            )
        else:
            self.embeddings = [
                tf.keras.layers.Embedding(
                    rows, self.embedding_dim, embeddings_initializer=uniform, name=f"embedding_{i}"
                )
                for i, rows in enumerate(self.table_sizes)
            ]
        self.cross = [
            tfrs.layers.dcn.Cross(
                projection_dim=projection_dim,
                kernel_initializer=tf.compat.v1.glorot_uniform_initializer(),
                name=f"cross_{i}",
            )
            for i in range(self.cross_layers)
        ]
        self.deep = [_dense(width, "relu", f"deep_{i}") for i, width in enumerate(self.deep_mlp)]
        self.logit = _dense(1, None, "logit")

    def call(self, features: dict[str, tf.Tensor]) -> tf.Tensor:
        cat = features["cat"][:, : len(self.table_sizes)]
        if isinstance(self.embeddings, list):
            rows = tf.stack([table(cat[:, i]) for i, table in enumerate(self.embeddings)], axis=1)
        else:
            rows = self.embeddings(cat)  # [B, tables, d], one gather per PS
        x0 = tf.concat([features["dense"], tf.reshape(rows, [-1, len(self.table_sizes) * self.embedding_dim])], axis=1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        for layer in self.deep:
            x = layer(x)
        return tf.squeeze(self.logit(x), axis=1)

    def get_config(self) -> dict[str, Any]:
        return {
            "table_sizes": self.table_sizes,
            "embedding_dim": self.embedding_dim,
            "cross_layers": self.cross_layers,
            "projection_dim": self.projection_dim,
            "deep_mlp": self.deep_mlp,
            "ec": self.ec,
            "num_ps": self.num_ps,
            "name": self.name,
        }


def _dense(width: int, activation: str | None, name: str) -> tf.keras.layers.Dense:
    return tf.keras.layers.Dense(
        width, activation=activation, kernel_initializer=tf.compat.v1.glorot_uniform_initializer(), name=name
    )


def keras_model(params: dict[str, Any], num_ps: int | None = None) -> DCN:
    """The compiled, not yet built, DCN of `params` (what model_to_estimator converts).

    With protection the optimizer is `tf_ecrec.keras.ECKerasOptimizer` around
    the stock one; the code is ``params["ec"]`` ("K+R"), or for True the one
    of `tf_ecrec.ec_model_fn`.
    """
    ec = params["ec"] or None
    model = DCN(
        params["table_sizes"],
        params["embedding_dim"],
        cross_layers=params["cross_layers"],
        projection_dim=params["projection_dim"] or None,
        deep_mlp=params["deep_mlp"],
        ec=ec,
        num_ps=num_ps if ec else None,
        name="dcn",
    )
    optimizer: Any = make_optimizer(params["optimizer"], params["learning_rate"])
    if ec:
        from tf_ecrec.keras import ECKerasOptimizer

        optimizer = ECKerasOptimizer(optimizer, ec=None if ec is True else ECConfig.parse(ec, source="params['ec']"))
    model.compile(optimizer=optimizer, loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def model_fn(
    features: dict[str, tf.Tensor],
    labels: tf.Tensor,
    mode: str,
    params: dict[str, Any],
    config: tf.estimator.RunConfig,
) -> tf.estimator.EstimatorSpec:
    """The model_fn `model_to_estimator` makes of `keras_model(params)`.

    Called by the Estimator once per graph it builds: compiles a fresh model
    and converts it in a scratch graph (model_to_estimator wants a compiled
    model from outside the Estimator's graph; compiling it here would leave
    an unused optimizer variable on a PS), then calls the converted
    Estimator's model_fn, which clones the model into this graph.  With
    ``params["ec"] = True`` wrap it in `tf_ecrec.ec_model_fn`; with a code
    ("K+R") it also runs unwrapped, without the recovery Scaffold.
    """
    with tf.Graph().as_default():
        converted = tf.keras.estimator.model_to_estimator(
            keras_model=keras_model(params, num_ps=config.num_ps_replicas or None),
            config=config,
            checkpoint_format="saver",
        )
    return converted.model_fn(features, labels, mode, config)


def make_estimator(run_config: tf.estimator.RunConfig, params: dict[str, Any]) -> tf.estimator.Estimator:
    """The DCN Estimator: `model_fn`, wrapped in `tf_ecrec.ec_model_fn` when ``params["ec"]`` is a code.

    The wrapper gives the tables' code and PS count to the model, checks that
    they are updated by an ECOptimizer, and owns the Scaffold that rebuilds
    a lost PS from parity (`tf_ecrec.recovery`).

    Raises:
      ConfigError: ``params["ec"]`` is True rather than a code (when the
        Estimator builds its graph: no PS cluster, or too few PS tasks).
    """
    fn: Any = model_fn
    if params["ec"]:
        if params["ec"] is True:
            raise ConfigError(
                "make_estimator needs the erasure code itself in params['ec'] (e.g. '2+1'); True means 'the code "
                "of an outer tf_ecrec.ec_model_fn'; source: params['ec']"
            )
        from tf_ecrec.estimator.model_fn import ec_model_fn

        fn = ec_model_fn(model_fn, ECConfig.parse(params["ec"], source="params['ec']"))
    return tf.estimator.Estimator(model_fn=fn, params=params, config=run_config)


# ---------------------------------------------------------------------------------------------
# A plain Estimator script: one process of a TF_CONFIG cluster.
# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    from tf_ecrec.examples import script

    parser = script.parser("Train a Keras DCN with model_to_estimator under TF_CONFIG.", OPTIMIZERS)
    parser.add_argument("--ec", default=None, help="erasure-code the tables with K+R (e.g. 2+1); default: plain tables")
    parser.add_argument("--table-rows", type=int, default=None, help="rows of every table (default 20000)")
    args = parser.parse_args(argv)
    params = default_params(
        optimizer=args.optimizer, ec=args.ec, table_sizes=[args.table_rows] * NUM_CAT if args.table_rows else None
    )
    if args.ec:
        # Every process that executes our ops needs their kernels registered:
        # the PS tasks run the delta and parity ops of the training graph.
        from tf_ecrec.ops import load_library

        load_library()
    run_config = script.run_config(args)
    position = script.serve_or_position(run_config)
    if position is None:  # a PS, stopped
        return 0
    make_estimator(run_config, params).train(script.input_fn(args, params["table_sizes"], *position), max_steps=args.steps)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main())
