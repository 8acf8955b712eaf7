"""``tf-ecrec export``: a launched job's trained model as a SavedModel that serves without tf_ecrec.

The job's model (``job.json``: the model module, its params, the code and the PS count) is built
by `tf_ecrec.offline_estimator` on this process and exported from the job's latest checkpoint (a
job with no checkpoint interval saves one at its end: `tf_ecrec.hooks.final_checkpoint`). The
serving signature takes the model contract's features (`tf_ecrec.launcher.job.models.load_model`) as
raw tensors, ``dense`` float32 [batch, 13] and ``cat`` int64 [batch, 26], and returns the model's
predictions; the SavedModel holds TensorFlow's own ops only, and of the protection only the tables'
data chunks.
"""

from __future__ import annotations

import os
from typing import Any

from tf_ecrec.data.schema import NUM_CAT, NUM_DENSE
from tf_ecrec.erasure.code import ECConfig
from tf_ecrec.errors import ConfigError
from tf_ecrec.launcher.job.model_dir import job_file
from tf_ecrec.launcher.job.models import load_model, model_params
from tf_ecrec.launcher.job.spec import FaultTolerance, JobSpec, Strategy


def serving_input_receiver_fn() -> Any:
    """Raw ``dense`` and ``cat`` inputs (placeholders named apart from the model's own layers)."""
    import tensorflow as tf

    features = {"dense": tf.compat.v1.placeholder(tf.float32, [None, NUM_DENSE], name="serving_input_dense"),
                "cat": tf.compat.v1.placeholder(tf.int64, [None, NUM_CAT], name="serving_input_cat")}
    return tf.estimator.export.ServingInputReceiver(features, features)


def job_estimator(model_dir: str) -> Any:
    """The launched job's model in `model_dir` as an Estimator of this process (`tf_ecrec.offline_estimator`).

    Raises:
      ConfigError: the model dir has no job, or its job is not an ecrec Estimator job.
    """
    import tensorflow as tf

    from tf_ecrec.estimator.offline import offline_estimator

    path = job_file(model_dir)
    if not os.path.exists(path):
        raise ConfigError(f"{model_dir!r} has no {os.path.basename(path)}; rule: the --model-dir of a tf-ecrec run; "
                          "source: --model-dir")
    job = JobSpec.load(path)
    if job.strategy is not Strategy.ESTIMATOR or job.fault_tolerance is not FaultTolerance.ECREC:
        raise ConfigError(f"the job in {model_dir!r} ran --strategy {job.strategy.value} --fault-tolerance "
                          f"{job.fault_tolerance.value}; rule: tf-ecrec export reads an ecrec Estimator job (a --strategy pss "
                          "model saves itself with model.save; other modes' checkpoints are stock); source: " + path)
    module = load_model(job.model)
    params = {**model_params(job, module), "ec": True}
    estimator = tf.estimator.Estimator(module.model_fn, model_dir=job.model_dir, params=params)
    return offline_estimator(estimator, ec=ECConfig.parse(job.ec, source=path), num_ps=job.ps)


def export(model_dir: str, export_dir: str | None = None) -> str:
    """Exports the job's latest checkpoint under `export_dir` (default ``<model_dir>/export``); returns its path.

    Raises:
      ConfigError: as `job_estimator`, or the model dir holds no checkpoint.
    """
    import tensorflow as tf

    estimator = job_estimator(model_dir)
    checkpoint = tf.train.latest_checkpoint(model_dir)
    if checkpoint is None:
        raise ConfigError(f"{model_dir!r} holds no checkpoint; rule: a job that ended (it saves its model at the end) "
                          "or one with a checkpoint interval; source: --model-dir")
    path = estimator.export_saved_model(export_dir or os.path.join(model_dir, "export"), serving_input_receiver_fn,
                                        checkpoint_path=checkpoint)
    return path.decode() if isinstance(path, bytes) else str(path)
