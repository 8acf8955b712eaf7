"""A protected Estimator outside its training cluster: predict, evaluate and export from its checkpoints.

    estimator = tf.estimator.Estimator(model_fn, model_dir=model_dir, params=params)  # the training script's
    served = tf_ecrec.offline_estimator(estimator)
    served.export_saved_model(export_dir, serving_input_receiver_fn)   # or .predict(input_fn), .evaluate(...)

The model_fn is the training one, wrapped with `tf_ecrec.ec_model_fn` for a process with no PS: its
tables are built with the training layout (the code and the PS count the chief wrote in the model dir's
variable manifest, ``variables.json``, or ``ec=`` and ``num_ps=``) as variables of this process, and
read with TensorFlow's own gathers. So an exported SavedModel holds only stock ops, and of the
protection only the data chunks (no parity, replicas or optimizer state): ``tf.saved_model.load`` or
TF Serving serves it without tf_ecrec. `tf-ecrec export` does this for a launched job's model.

The returned Estimator's RunConfig keeps the model dir and the random seed of the user's and has no
cluster, whatever TF_CONFIG says (a chief or an evaluator may export once training is over).
"""

from __future__ import annotations

import tensorflow as tf

from tf_ecrec.check.live_cluster import read_manifest
from tf_ecrec.cluster.tf_config import tf_config_env
from tf_ecrec.erasure.code import ECConfig
from tf_ecrec.errors import ConfigError
from tf_ecrec.launcher.job.model_dir import manifest_file
from tf_ecrec.layout.placement import Layout


def offline_estimator(estimator: tf.estimator.Estimator, *, ec: ECConfig | None = None,
                      num_ps: int | None = None) -> tf.estimator.Estimator:
    """`estimator` (a protected model's, as trained by `tf_ecrec.train` or `tf-ecrec run`) for a process with no PS.

    Args:
      estimator: the Estimator of the training script: its model_fn (bound to its params) and model dir.
      ec, num_ps: the training job's code and PS count; default: read from ``<model_dir>/variables.json``.

    Raises:
      ConfigError: no code or PS count given and the manifest cannot be read or has none (a model dir
        not trained with protection), or a code that does not fit the PS count.
    """
    from tf_ecrec.estimator.model_fn import ec_model_fn

    if not isinstance(estimator, (tf.estimator.Estimator, tf.compat.v1.estimator.Estimator)):  # canned v1 classes too
        raise ConfigError(f"estimator={estimator!r}; rule: a tf.estimator.Estimator or tf.compat.v1.estimator.Estimator; "
                          "source: offline_estimator")
    if ec is None or num_ps is None:
        found_ec, found_ps = training_layout(estimator.model_dir)
        ec, num_ps = ec or found_ec, num_ps or found_ps
    ec.check_cluster(num_ps, source="offline_estimator num_ps")
    return tf.estimator.Estimator(ec_model_fn(estimator.model_fn, ec, num_ps=num_ps),
                                  config=local_run_config(estimator.config))


def training_layout(model_dir: str) -> tuple[ECConfig, int]:
    """The code and PS count a protected job trained `model_dir` with: those of its tables' layouts (the ones the
    checkpoint's chunks were cut for), as its chief's variable manifest records them."""
    path = manifest_file(model_dir)
    meta = read_manifest(path).get("ec") or {}
    found = {(lay.k, lay.r, lay.num_ps) for lay in (Layout.from_json(c["layout"], source=path)
                                                    for c in meta.get("collections", ()) if "layout" in c)}
    if len(found) != 1:
        raise ConfigError(f"variable manifest {path!r} has tables laid out as (k, r, PS) {sorted(found)}; rule: one layout, "
                          "of a model dir trained with erasure-coded protection, or pass ec= and num_ps=; source: " + path)
    k, r, num_ps = found.pop()
    return ECConfig(k, r), num_ps


def local_run_config(config: tf.estimator.RunConfig) -> tf.estimator.RunConfig:
    """`config`'s model dir and seed in a RunConfig of no cluster (RunConfig reads TF_CONFIG as it is made)."""
    with tf_config_env(None):
        return tf.estimator.RunConfig(model_dir=config.model_dir, tf_random_seed=config.tf_random_seed)
