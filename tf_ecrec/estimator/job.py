"""Running a user's own Estimator protected, from any TF_CONFIG launcher: `train_and_evaluate`, `train`.

A stock script ends with::

    estimator = tf.estimator.Estimator(model_fn, params=params, config=run_config)
    tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)

The protected one (its model_fn building `tf_ecrec.EmbeddingTable` or
`tf_ecrec.EmbeddingCollection` tables and wrapping its optimizer in
`tf_ecrec.ECOptimizer`) ends with::

    tf_ecrec.train_and_evaluate(estimator, train_spec, eval_spec, ec=tf_ecrec.ECConfig(1, 1))

Every process of the job runs the same script, with the TF_CONFIG its
launcher gives it (a Kubeflow TFJob, a StatefulSet's entrypoint, ``tf-ecrec
run``, a shell loop).  By the task type:

- ``ps``: registers the op kernels (a PS executes the protection's ops) and
  serves until it is stopped;
- ``chief`` / ``worker``: trains.  The Estimator is rebuilt from the user's
  one (its public ``model_fn``, ``config`` and ``params``; warm starting is
  passed as ``warm_start_from``) with the model_fn wrapped by
  `tf_ecrec.ec_model_fn`, the RunConfig's settings kept and its ``device_fn``
  set to `tf_ecrec.ECDeviceFn` unless the user set one.  A PS that dies and
  comes back at the same address (a restarted pod behind a stable name) is
  rebuilt from parity by the chief's next session, with no checkpoint read.
  With a cluster source (``cluster_source=``, or the environment of
  ``tf-ecrec run``: ``TF_ECREC_CLUSTER_FILE``), a PS may also come back at
  a new address: the trainer runs under `tf_ecrec.session.failover.FailoverLoop`
  with sessions that time out after ``session_timeout_secs``;
- ``evaluator``: evaluates checkpoints as stock ``train_and_evaluate`` does,
  the tables built with the training cluster's layout (its PS count read
  from TF_CONFIG) so the checkpoint's variables match.

On the chief it also writes, in the model dir:

- ``variables.json``, the variable manifest (with the PS addresses) that
  ``tf-ecrec verify --model-dir DIR`` needs to check parity on the live PS;
- ``recovery.jsonl``, one JSON object per recovery (`RecoveryLog`): the
  method (``parity``, ``checkpoint``, ``rebuilt`` ...), the lost PS, the
  global step the chief last saw before the failure and the step training
  went on from, hence ``steps_rolled_back``.

The code: ``ec`` defaults to `default_code` of the PS count (1+1 on 2 PS,
2+1 from 3 PS on).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tf_ecrec.cluster.tf_config import ClusterConfig
from tf_ecrec.erasure.code import ECConfig, default_code
from tf_ecrec.errors import ConfigError
from tf_ecrec.launcher.job.model_dir import manifest_file
from tf_ecrec.session.cluster_source import ENV_CLUSTER_FILE, ClusterSource, FileClusterSource
from tf_ecrec.session.recovery_log import RECOVERY_FILE, RecoveryLog, StepWatch

_LOG = logging.getLogger(__name__)

# The RunConfig settings a rebuilt Estimator keeps (RunConfig.replace accepts exactly these).
_KEPT = ("model_dir", "tf_random_seed", "save_summary_steps", "save_checkpoints_steps", "save_checkpoints_secs",
         "session_config", "keep_checkpoint_max", "keep_checkpoint_every_n_hours", "log_step_count_steps",
         "device_fn", "session_creation_timeout_secs", "checkpoint_save_graph_def")


def _raw_tf_config() -> dict[str, Any]:
    text = os.environ.get("TF_CONFIG", "")
    if not text:
        raise ConfigError("TF_CONFIG is not set; protected training needs a cluster with a 'ps' job; "
                          "source: environment variable TF_CONFIG")
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"TF_CONFIG is not JSON ({exc}); source: environment variable TF_CONFIG") from exc
    if not isinstance(parsed, dict):
        raise ConfigError(f"TF_CONFIG must be a JSON object, got {parsed!r}; source: environment variable TF_CONFIG")
    return parsed


class _Job:
    """What one trainer or evaluator process runs; built by `train` and `train_and_evaluate`."""

    def __init__(self, estimator: Any, ec: ECConfig | None, *, cluster_source: ClusterSource | None,
                 session_timeout_secs: float, wait_secs: float, warm_start_from: Any,
                 recovery_listener: Callable[[Any], None] | None, rebuild_slice_mb: float, rebuild_share: float) -> None:
        _check_estimator(estimator)
        raw = _raw_tf_config()
        task = raw.get("task") or {}
        self.task_type = str(task.get("type", ""))
        self.num_ps = len((raw.get("cluster") or {}).get("ps") or [])
        self.ec = ec or default_code(self.num_ps)
        self.ec.check_cluster(self.num_ps, source="TF_CONFIG ps job")
        self.user = estimator
        self.source = cluster_source
        self.session_timeout_secs = session_timeout_secs
        self.wait_secs = wait_secs
        self.warm_start_from = warm_start_from
        self.rebuild_slice_bytes = max(1, int(rebuild_slice_mb * (1 << 20)))
        self.rebuild_share = rebuild_share
        self.cluster = ClusterConfig.from_environment() if self.task_type != "evaluator" else None
        self.watch = StepWatch()
        listener = recovery_listener
        if self.cluster is not None and self.cluster.is_chief:
            listener = RecoveryLog(os.path.join(estimator.model_dir, RECOVERY_FILE), self.cluster.task, self.watch,
                                   then=recovery_listener)
        from tf_ecrec.estimator.model_fn import ec_model_fn

        self.model_fn = ec_model_fn(estimator.model_fn, self.ec, recovery_listener=listener,
                                    rebuild_slice_bytes=self.rebuild_slice_bytes, rebuild_share=rebuild_share,
                                    num_ps=self.num_ps)

    def estimator(self, session_config: Any = None) -> Any:
        """An Estimator of the user's settings for the TF_CONFIG now set, with the protected model_fn."""
        from tf_ecrec.layout.device import ECDeviceFn

        base = self.user.config
        config = tf.estimator.RunConfig().replace(**{k: getattr(base, k) for k in _KEPT})
        if session_config is not None:
            config = config.replace(session_config=session_config)
        if config.device_fn is None and self.task_type != "evaluator":
            config = config.replace(device_fn=ECDeviceFn.from_run_config(config))
        return tf.estimator.Estimator(self.model_fn, config=config, warm_start_from=self.warm_start_from)

    def serve(self) -> None:
        """A PS: serve until stopped."""
        from tf_ecrec.cluster.ps_session import cluster_server
        from tf_ecrec.ops import load_library

        load_library()
        assert self.cluster is not None
        server = cluster_server(self.cluster)
        _LOG.info("%s serving at %s", self.cluster.task, self.cluster.address)
        server.join()

    def train(self, input_fn: Callable[[], Any], *, max_steps: int | None, hooks: Sequence[Any],
              saving_listeners: Sequence[Any] | None) -> None:
        """A chief or worker: train, failing over when the PS tasks come back."""
        from tf_ecrec.hooks.manifest import VariableManifestHook
        from tf_ecrec.ops import load_library

        load_library()
        cluster = self.cluster
        if cluster is None or cluster.task_type not in ("chief", "worker", "master"):
            raise ConfigError(f"TF_CONFIG task type {self.task_type!r} does not train; rule: chief or worker; "
                              "source: environment variable TF_CONFIG")
        all_hooks = [*hooks, self.watch]
        if cluster.is_chief:
            all_hooks.append(VariableManifestHook(manifest_file(self.user.model_dir),
                                                  ps=list(cluster.ps_addresses)))
        source = self.source
        if source is None and os.environ.get(ENV_CLUSTER_FILE):
            source = FileClusterSource(os.environ[ENV_CLUSTER_FILE], cluster.num_ps)
        if source is None:
            from tf_ecrec.cluster.ps_session import cluster_server

            cluster_server(cluster)
            self.estimator().train(input_fn, max_steps=max_steps, hooks=all_hooks, saving_listeners=saving_listeners)
            return
        from tf_ecrec.cluster.ps_session import own_server
        from tf_ecrec.session.failover import FailoverLoop

        own_server(cluster.address)
        loop = FailoverLoop(cluster, lambda _at, config: self.estimator(config), source,
                            session_timeout_secs=self.session_timeout_secs, wait_secs=self.wait_secs)
        loop.train(input_fn, max_steps=max_steps, hooks=all_hooks, saving_listeners=saving_listeners)


def _job(estimator: Any, ec: ECConfig | None, kwargs: dict[str, Any]) -> _Job:
    return _Job(estimator, ec, cluster_source=kwargs.pop("cluster_source", None),
                session_timeout_secs=kwargs.pop("session_timeout_secs", 30.0),
                wait_secs=kwargs.pop("wait_secs", 120.0), warm_start_from=kwargs.pop("warm_start_from", None),
                recovery_listener=kwargs.pop("recovery_listener", None),
                rebuild_slice_mb=kwargs.pop("rebuild_slice_mb", 16.0), rebuild_share=kwargs.pop("rebuild_share", 1.0))


def train(estimator: Any, input_fn: Callable[[], Any], *, max_steps: int | None = None, hooks: Sequence[Any] = (),
          saving_listeners: Sequence[Any] | None = None, ec: ECConfig | None = None, **options: Any) -> None:
    """``estimator.train(input_fn, ...)`` protected, for this process's TF_CONFIG task (see the module doc).

    A PS serves (this call does not return); a chief or worker trains.

    Options: ``cluster_source`` (a `tf_ecrec.session.cluster_source.ClusterSource`:
    PS tasks may come back at new addresses), ``session_timeout_secs``
    (30; the operation timeout of sessions under a cluster source),
    ``wait_secs`` (120; how long a trainer waits for a lost PS),
    ``warm_start_from``, ``recovery_listener`` (called with every
    `tf_ecrec.recovery.result.RecoveryResult` on the chief),
    ``rebuild_slice_mb`` (16) and ``rebuild_share`` (1.0) of a background rebuild.

    Raises:
      ConfigError: no TF_CONFIG cluster with enough PS tasks for `ec`, an
        unknown option, an evaluator task.
    """
    job = _job(estimator, ec, options)
    _no_more(options)
    if job.task_type == "ps":
        job.serve()
        return
    job.train(input_fn, max_steps=max_steps, hooks=hooks, saving_listeners=saving_listeners)


def _check_estimator(estimator: Any) -> None:
    """An Estimator (TF2 or ``tf.compat.v1``, canned v1 classes included); a TF2 canned class named at start."""
    kind = type(estimator)
    name = f"{kind.__module__}.{kind.__name__}"
    if ".canned." in kind.__module__ and kind.__name__.endswith("V2"):  # tf.estimator.DNNClassifier, ... (TF2 classes)
        raise ConfigError(
            f"estimator is a canned {kind.__name__} ({name}), TensorFlow 2's class; rule: its optimizer must be a Keras "
            "optimizer, which tf_ecrec.ECOptimizer does not wrap: use the tf.compat.v1.estimator class of the same name "
            "with optimizer=tf_ecrec.ECOptimizer(a tf.compat.v1.train optimizer) and tf_ecrec.feature_column."
            "embedding_column for its embedding columns (docs/adoption.md); source: tf_ecrec.train")
    if not isinstance(estimator, (tf.estimator.Estimator, tf.compat.v1.estimator.Estimator)):
        raise ConfigError(f"estimator={estimator!r} ({name}); rule: a tf.estimator.Estimator or tf.compat.v1.estimator."
                          "Estimator; source: tf_ecrec.train")


def train_and_evaluate(estimator: Any, train_spec: Any, eval_spec: Any, *, ec: ECConfig | None = None,
                       **options: Any) -> Any:
    """``tf.estimator.train_and_evaluate`` protected (see the module doc; options as for `train`).

    Returns what the stock call returns on an evaluator (the last
    evaluation's metrics and export results), None elsewhere.
    """
    job = _job(estimator, ec, options)
    _no_more(options)
    if job.task_type == "ps":
        job.serve()
        return None
    if job.task_type == "evaluator":
        from tf_ecrec.ops import load_library

        load_library()
        return tf.estimator.train_and_evaluate(job.estimator(), train_spec, eval_spec)
    job.train(train_spec.input_fn, max_steps=train_spec.max_steps, hooks=list(train_spec.hooks),
              saving_listeners=list(getattr(train_spec, "saving_listeners", ()) or ()) or None)
    return None


def _no_more(options: dict[str, Any]) -> None:
    if options:
        raise ConfigError(f"unknown options {sorted(options)}; rule: cluster_source, session_timeout_secs, wait_secs, "
                          "warm_start_from, recovery_listener, rebuild_slice_mb, rebuild_share; source: tf_ecrec.train")
