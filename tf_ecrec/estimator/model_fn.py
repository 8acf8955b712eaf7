"""`ec_model_fn`: the model_fn wrapper that turns erasure-coded protection on for a model.

    estimator = tf.estimator.Estimator(
        model_fn=tf_ecrec.ec_model_fn(model_fn, tf_ecrec.ECConfig(k=2, r=1)), config=run_config)

Inside the wrapped model_fn, `tf_ecrec.EmbeddingCollection` tables and
`tf_ecrec.ECOptimizer` pick up the code and the PS count of the RunConfig,
and their storage is placed per the layout (`tf_ecrec.layout.device`), whichever
device function the RunConfig has; ``RunConfig(device_fn=tf_ecrec.ECDeviceFn())``
places the rest of the graph by the same rules.
After the user's model_fn returns, the wrapper checks (training mode) that
every protected table is updated by an `ECOptimizer`: a table updated by a
plain optimizer would silently lose its parity, so that is an error.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tf_ecrec.cluster.tf_config import ClusterConfig
from tf_ecrec.erasure.code import ECConfig
from tf_ecrec.errors import ConfigError
from tf_ecrec.flash.config import FlashConfig
from tf_ecrec.flash.hooks import FlashCheckpointHook, FlashGateHook, trainer_index
from tf_ecrec.flash.snapshots import FlashSnapshots
from tf_ecrec.layout.device import layout_placement, local_storage, variable_name
from tf_ecrec.rebuild.rebuilder import DEFAULT_SLICE_BYTES
from tf_ecrec.recovery.generation import SessionGenerationHook
from tf_ecrec.recovery.plan import READY_WAIT_SECS, RecoveryPlan
from tf_ecrec.recovery.result import Listener
from tf_ecrec.recovery.scaffold import InitialiserHook, SettleAtEndHook, StaleStepSettlerHook, scaffold_for
from tf_ecrec.recovery.task_wait import TASK_WAIT_SECS, TaskWaitHook, run_config_targets
from tf_ecrec.step import optimizer
from tf_ecrec.step.carried_commit import CarriedCommitHook, commit_mode_from_environ
from tf_ecrec.step.embedding import ECContext, collections, set_context
from tf_ecrec.step.optimizer import ECOptimizer
from tf_ecrec.step.optimizer_parts import finish_pending
from tf_ecrec.step.step_program import MAX_GENERATION

ModelFn = Callable[..., tf.estimator.EstimatorSpec]
_nesting = threading.local()  # whether an ec_model_fn is building a graph on this thread


def ec_model_fn(model_fn: ModelFn, ec: ECConfig, recovery_listener: Listener | None = None, *,
                rebuild_slice_bytes: int = DEFAULT_SLICE_BYTES, rebuild_share: float = 1.0,
                num_ps: int | None = None, flash: FlashConfig | None = None,
                flash_listeners: Sequence[Any] = (), task_wait_secs: float = TASK_WAIT_SECS) -> ModelFn:
    """Wraps `model_fn` so its tables and optimizer are protected by `ec`.

    In training mode the wrapper also owns the EstimatorSpec's Scaffold
    (saver, init op and function, ready ops): that is where a lost PS is
    rebuilt when the chief re-creates its session (`tf_ecrec.recovery`).
    `recovery_listener` is called with every `RecoveryResult`;
    `rebuild_slice_bytes` is the bytes of a lost chunk a rebuild moves per
    session call (`tf_ecrec.rebuild`); `rebuild_share` the fraction of the
    time a background rebuild walks its slices (`RecoveryPlan`).
    `flash` turns flash checkpoints on (`tf_ecrec.flash`): every PS's variables
    copied into shared memory at one global step, restored before any disk
    checkpoint when more PS are lost than the code covers; `flash_listeners`
    (`CheckpointSaverListener`s) are called with every snapshot on the chief
    (`tf_ecrec.flash.hooks.FlashCheckpointHook`).
    `num_ps` is the training cluster's PS count for a task whose RunConfig
    has none: an evaluator (TensorFlow gives it an empty cluster) builds the
    tables with the training layout so the checkpoint's variables match.
    `task_wait_secs` bounds a worker's wait, before its session, for each task
    the session reaches (`tf_ecrec.recovery.task_wait`: TensorFlow's is unbounded).

    An ec_model_fn called inside another (an Estimator whose model_fn is already wrapped, given to
    `tf_ecrec.offline_estimator` or `tf_ecrec.train`) calls its model_fn as it is: the outer one decides.

    Raises (when the Estimator calls the model_fn):
      ConfigError: the cluster has fewer than k + r PS tasks, or a protected
        table is not updated by an ECOptimizer.
    """
    accepted = set(inspect.signature(model_fn).parameters)
    training_ps = num_ps

    def wrapped(features: Any, labels: Any, mode: str, params: Any, config: tf.estimator.RunConfig) -> tf.estimator.EstimatorSpec:
        kwargs = {"features": features, "labels": labels, "mode": mode, "params": params, "config": config}
        if getattr(_nesting, "active", False):
            # Inside another ec_model_fn (tf_ecrec.offline_estimator's or tf_ecrec.train's around an Estimator whose
            # model_fn is already wrapped): the outer one's code, PS count, storage and scaffold apply.
            return model_fn(**{k: v for k, v in kwargs.items() if k in accepted})
        _nesting.active = True
        try:
            return build(kwargs)
        finally:
            _nesting.active = False

    def build(kwargs: dict[str, Any]) -> tf.estimator.EstimatorSpec:
        mode, config = kwargs["mode"], kwargs["config"]
        num_ps: int = int(config.num_ps_replicas or 0) or int(training_ps or 0)
        if num_ps < 1:
            raise ConfigError(
                "erasure-coded protection needs a PS cluster (TF_CONFIG with a 'ps' job); "
                "source: RunConfig / TF_CONFIG"
            )
        ec.check_cluster(num_ps, source="TF_CONFIG ps job")
        # A training step is its applies and count, folded and committed by the trainer's fold rounds
        # (docs/settlement.md, "Folds batched over steps"); TF_ECREC_COMMIT chooses another mode.
        training = mode == tf.estimator.ModeKeys.TRAIN
        context = ECContext(ec, num_ps, _generation(), commit=(commit_mode_from_environ() or "batched") if training else "in_step")
        set_context(context)
        # A task outside the training cluster (an evaluator) builds the tables with the layout, locally.
        local = not config.num_ps_replicas and mode != tf.estimator.ModeKeys.TRAIN
        with local_storage() if local else tf.compat.v1.device(layout_placement):
            spec = model_fn(**{k: v for k, v in kwargs.items() if k in accepted})
            deferred = finish_pending() if training else None  # an ECOptimizer with parts: one step of all updates
            if deferred is not None:  # built where the model_fn's ops were (its placement)
                spec = spec._replace(train_op=deferred.finish(spec.train_op))
        if mode == tf.estimator.ModeKeys.TRAIN:
            optimizer = _check_protected()
            timeout_ms = getattr(config.session_config, "operation_timeout_in_ms", 0) if config.session_config else 0
            plan = RecoveryPlan(optimizer, recovery_listener, model_dir=config.model_dir,
                                slice_bytes=rebuild_slice_bytes, rebuild_share=rebuild_share,
                                ready_wait_secs=min(READY_WAIT_SECS, 0.4 * timeout_ms / 1000) if timeout_ms > 0 else READY_WAIT_SECS,
                                chief=bool(config.is_chief))
            chief_hooks = [*spec.training_chief_hooks, InitialiserHook(plan), StaleStepSettlerHook(plan), SettleAtEndHook(plan)]
            # The carried commit first: later hooks' fetches then run in a step that carries it.
            hooks = [CarriedCommitHook(), *spec.training_hooks, SessionGenerationHook(context.steps, optimizer.logs)]
            if not config.is_chief and config.cluster_spec:  # a dead chief or PS must not hold it in CreateSession
                hooks.append(TaskWaitHook(*run_config_targets(config), task_wait_secs))
            if flash is not None:
                chief_hooks, hooks = _with_flash(flash, plan, optimizer, config, num_ps, chief_hooks, hooks, flash_listeners)
            spec = spec._replace(
                scaffold=scaffold_for(plan, spec.scaffold, chief=bool(config.is_chief), config=config),
                training_chief_hooks=chief_hooks,
                training_hooks=hooks,
            )
        return spec

    return wrapped


def _with_flash(flash: FlashConfig, plan: RecoveryPlan, opt: ECOptimizer, config: Any, num_ps: int,
                chief_hooks: list[Any], hooks: list[Any], listeners: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """The flash checkpoint's ops (the plan restores from them) and hooks: rounds on the chief, the gate elsewhere."""
    trainer, trainers = trainer_index(config)
    snapshots = FlashSnapshots(flash, config.model_dir, opt.logs, num_ps, trainers)
    plan.flash = snapshots
    if config.is_chief:
        busy = lambda: plan.job is not None and not plan.job.finished  # noqa: E731 - no round during a rebuild
        return chief_hooks + [FlashCheckpointHook(snapshots, plan.reconciler.exclusive, busy, trainer, listeners)], hooks
    return chief_hooks, hooks + [FlashGateHook(snapshots, trainer)]


def _generation() -> int:
    """The cluster version the graph is built for (TF_CONFIG's ``version``, 0 without one)."""
    if not os.environ.get("TF_CONFIG"):
        return 0
    try:
        return min(ClusterConfig.from_environment().version, MAX_GENERATION)
    except ConfigError:
        return 0  # RunConfig validates TF_CONFIG itself


def _check_protected() -> ECOptimizer:
    protectors = optimizer.protectors()
    if not protectors:
        raise ConfigError(
            "the model_fn built no tf_ecrec.ECOptimizer: without it nothing keeps parity and replicas; wrap the "
            "optimizer: tf_ecrec.ECOptimizer(your_optimizer); source: the model_fn"
        )
    if len(protectors) > 1:
        # Two step programs in one graph would share each PS's delta log with overlapping target ids, and
        # recovery knows one manifest: refused here rather than a corrupt settlement or a silent fallback to
        # the checkpoint at the first failure (a canned estimator's two optimizers, a second minimize).
        distinct = len({id(p) for p in protectors})
        raise ConfigError(
            f"the model_fn applied gradients through tf_ecrec.ECOptimizer {len(protectors)} times "
            f"({distinct} optimizer object{'s' if distinct > 1 else ''}); rule: one ECOptimizer, one "
            "apply_gradients/minimize per model_fn, updating every variable (give all variables to one optimizer, or "
            "other optimizers as its parts: ECOptimizer.part); "
            "source: the model_fn"
        )
    updated = {name for opt in protectors for c in opt.parity for name in [c]}
    for coll in collections():
        if coll.name not in updated:
            raise ConfigError(
                f"embedding collection {coll.name!r} is not updated by a tf_ecrec.ECOptimizer: its parity would "
                "go stale; wrap the optimizer: tf_ecrec.ECOptimizer(your_optimizer); source: the model_fn"
            )
    # A trainable variable another optimizer updates has neither parity nor replicas: its PS's loss would fall back
    # to the checkpoint at the first failure (a canned wide-and-deep's linear part under its stock FTRL).
    opt = protectors[-1]
    covered = set(opt.protected) | {variable_name(v) for c in collections() for v in c.data.values()}
    loose = sorted(n for n in (variable_name(v) for v in tf.compat.v1.trainable_variables()) if n not in covered)
    if loose:
        raise ConfigError(
            f"trainable variables {loose[:8]}{' ...' if len(loose) > 8 else ''} ({len(loose)}) are not updated by the "
            "tf_ecrec.ECOptimizer, so nothing protects them; rule: one ECOptimizer updates every trainable variable "
            "(a canned DNNLinearCombined estimator's linear optimizer: give it as ECOptimizer.part(FtrlOptimizer(...))); "
            "source: the model_fn")
    return opt
