"""Flash checkpoints on their own, without erasure coding (``--fault-tolerance flash``).

`flash_model_fn` wraps any Estimator model_fn whose variables live on PS tasks (stock
optimizers, partitioned or whole variables).  Training is that of a stock PS job; what changes:

- **rounds** (`tf_ecrec.flash.hooks.FlashCheckpointHook` with ``strict=True``): without delta logs
  a capture cannot tell a step in flight, so the chief captures only once every trainer with a
  session is parked for the round, and keeps the copy only if no trainer wrote its gate slot
  during it (a trainer writes its slot before any step outside the pause: `FlashSnapshots.slots`).
  A trainer that crashed mid-step leaves its slot present and unparked: rounds are skipped until it
  is back;
- **session creation** (`FlashRecovery.prepare`, through the Scaffold: the saver's ``restore`` when
  the model dir has a checkpoint, ``init_fn`` when it has none): every PS has a marker variable
  initialised last; a PS whose marker is missing was lost (or never started).  When one is, every
  variable on every PS is brought back to one global step: from the newest flash snapshot complete
  on every PS (own memory, then the peer's, then the model dir) when it is at least as new as the
  newest checkpoint, else from the checkpoint, else initialised (if the job had trained by then, its data
  progress goes back to the start with the model: `FlashRecovery.prepare`).  The markers are written last and
  the other trainers' ready op waits for them on the PS (our ops: PS tasks load ``tf_ecrec.ops``),
  so no step runs on a half-restored model and none waits longer than the restore.  When no
  marker is missing (the chief alone restarted) nothing is restored: the PS hold the live values,
  newer than any copy.
- A restore rolls training back to the snapshot's step, like a checkpoint but from memory and
  every N steps; the result (method ``memory``, ``disk``, ``checkpoint`` or ``init``) goes to the
  ``recovery_listener``.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import tensorflow as tf

from tf_ecrec.errors import ConfigError
from tf_ecrec.flash.config import FlashConfig
from tf_ecrec.flash.hooks import FlashCheckpointHook, FlashGateHook, trainer_index
from tf_ecrec.flash.snapshots import FlashSnapshots
from tf_ecrec.recovery.deadline_session import LONG_OP_TIMEOUT_MS, LongDeadlineSaver, checkpoints_kept
from tf_ecrec.recovery.graph import checkpoint_step, whole_marker
from tf_ecrec.recovery.owed import owe
from tf_ecrec.recovery.plan import READY_WAIT_SECS, STARTED_MARKER
from tf_ecrec.recovery.result import RecoveryMethod, RecoveryResult
from tf_ecrec.recovery.scaffold import raising_ready_op

ModelFn = Callable[..., tf.estimator.EstimatorSpec]
Listener = Callable[[RecoveryResult], None]


class FlashRecovery:
    """What a chief's session creation does in a flash-checkpointed job (module docstring).

    Build it in the chief's model_fn, after the model's variables and the `FlashSnapshots`.

    Args:
      snapshots: the job's `FlashSnapshots`.
      markers: PS task -> its marker variable (`tf_ecrec.recovery.graph.whole_marker`).
      model_dir: the job's model dir (its newest checkpoint competes with the newest snapshot).
      listener: called with the `RecoveryResult` of every session creation that brought a lost PS
        back (not the job's first start).
    """

    def __init__(self, snapshots: FlashSnapshots, markers: dict[int, tf.Variable], model_dir: str,
                 listener: Listener | None = None) -> None:
        self.snapshots = snapshots
        self._model_dir = model_dir
        self._listener = listener
        self.markers = markers
        self._missing = tf.compat.v1.report_uninitialized_variables(list(self.markers.values()))
        self._init = tf.compat.v1.global_variables_initializer()
        self._mark = tf.group([m.initializer for m in self.markers.values()], name="ec_flash_mark_whole")
        self._step = tf.compat.v1.train.get_global_step()
        self._long = tf.compat.v1.RunOptions(timeout_in_ms=LONG_OP_TIMEOUT_MS)

    def prepare(self, sess: Any, restore: Callable[[], None] | None) -> RecoveryResult | None:
        """Brings every variable back to one global step if a PS was lost; `restore` restores the
        newest checkpoint (None: the model dir has none).  Returns what it did, None if nothing was lost."""
        started = time.perf_counter()
        missing = {n.decode() for n in sess.run(self._missing, options=self._long)}
        lost = sorted(p for p, m in self.markers.items() if m.op.name in missing)
        if not lost:
            return None
        choice = self.snapshots.choose(sess)
        trained = False  # set where it matters: initialised with no copy to go back to
        # A restore owes the data rollback to its step before it writes (tf_ecrec.recovery.owed).
        if choice is not None and (restore is None or choice.global_step >= checkpoint_step(self._model_dir)):
            owe(self._model_dir, choice.global_step, "flash checkpoint")
            self.snapshots.restore(sess, choice, options=self._long)
            method = RecoveryMethod(choice.method)
        elif restore is not None:
            owe(self._model_dir, checkpoint_step(self._model_dir), "checkpoint")
            restore()
            method = RecoveryMethod.CHECKPOINT
        else:
            # No copy to go back to.  If the job had trained (a PS kept its state, or an earlier session
            # initialised the model: the started marker), initialising throws that training away, so the
            # data progress goes back to the start with it (owed first, as any restore's): no record the
            # master counts as trained is missing from the model.  Seen when a PS was lost before the
            # chief's first round (its sessions cut by their deadline on a loaded machine, the other
            # trainers training): 250 steps were dropped while their records stayed counted.
            trained = len(lost) < len(self.markers) or self._started()
            if trained:
                owe(self._model_dir, 0, "initial values (no flash snapshot or checkpoint yet)")
            sess.run(self._init, options=self._long)
            method = RecoveryMethod.INIT
            if not trained:
                self._mark_started()
        self.snapshots.init_gate(sess)  # trainers read the gate with every step
        sess.run(self._mark, options=self._long)  # last: the other trainers' ready op waits for it
        step = int(sess.run(self._step)) if self._step is not None else None
        variables = sum(len(n) for n in self.snapshots.names.values())
        result = RecoveryResult(method, lost, variables if method is not RecoveryMethod.INIT else 0,
                                sum(self.snapshots.bytes.values()) if method is not RecoveryMethod.INIT else 0,
                                time.perf_counter() - started, global_step=step)
        first_start = method is RecoveryMethod.INIT and not trained
        if self._listener is not None and not first_start:
            self._listener(result)
        return result


    def _started(self) -> bool:
        return bool(self._model_dir) and tf.io.gfile.exists(os.path.join(self._model_dir, STARTED_MARKER))

    def _mark_started(self) -> None:
        """The model was initialised for this job: a later loss with no copy to go back to owes the data."""
        if self._model_dir:
            tf.io.gfile.makedirs(self._model_dir)
            with tf.io.gfile.GFile(os.path.join(self._model_dir, STARTED_MARKER), "w") as fh:
                fh.write(f"initialised at {time.time():.0f}\n")


class FlashSaver(LongDeadlineSaver):
    """The stock Saver (long deadlines) whose ``restore`` is `FlashRecovery.prepare`'s decision on the
    chief (`recovery`; None elsewhere: a plain restore)."""

    def __init__(self, recovery: FlashRecovery | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._recovery = recovery

    def restore(self, sess: tf.compat.v1.Session, save_path: str) -> None:  # see class docstring
        if self._recovery is None:
            self._restore(sess, save_path)
        else:
            self._recovery.prepare(sess, restore=lambda: self._restore(sess, save_path))


def flash_scaffold(recovery: FlashRecovery | None, markers: dict[int, tf.Variable],
                   base: tf.compat.v1.train.Scaffold | None = None, config: Any = None) -> tf.compat.v1.train.Scaffold:
    """The Scaffold that routes the chief's session creation through `recovery`, composed with `base`'s fields.

    Ours: the saver (`FlashSaver`), a no-op ``init_op``, an ``init_fn`` running `recovery.prepare` on
    the chief; on the other trainers (`recovery` None) a ready op that also waits for every PS's
    marker.  Kept from `base`: ``local_init_op``, ``summary_op``, ``local_init_feed_dict`` and its
    ``init_fn`` (after ours).
    """
    if recovery is not None:  # the chief's session creation runs prepare, which leaves every variable whole
        ready = tf.constant([], tf.string, name="ec_flash_ready_after_prepare")
    else:
        # Waits on each PS for its marker (the stock ready op is polled every 30 s: a worker would sit
        # out half a minute after every restore), then fails with ABORTED while anything is missing.
        ready = raising_ready_op(SimpleNamespace(
            whole_markers=markers, variables=tf.compat.v1.global_variables() + list(markers.values()),
            ready_wait_secs=READY_WAIT_SECS))
    user_init_fn = base.init_fn if base is not None else None

    def init_fn(scaffold: tf.compat.v1.train.Scaffold, sess: tf.compat.v1.Session) -> None:
        if recovery is not None:
            recovery.prepare(sess, restore=None)
        if user_init_fn is not None:
            user_init_fn(sess)

    kwargs: dict[str, Any] = {}
    if base is not None:
        kwargs = {"local_init_op": base.local_init_op, "summary_op": base.summary_op,
                  "local_init_feed_dict": base.local_init_feed_dict}
    return tf.compat.v1.train.Scaffold(
        init_op=tf.no_op(name="ec_flash_init_op"), init_fn=init_fn, ready_op=ready, ready_for_local_init_op=ready,
        saver=FlashSaver(recovery, sharded=True, save_relative_paths=True, **checkpoints_kept(config)),
        **{k: v for k, v in kwargs.items() if v is not None},
    )


def flash_model_fn(model_fn: ModelFn, flash: FlashConfig, recovery_listener: Listener | None = None,
                   listeners: Sequence[Any] = (), num_ps: int | None = None) -> ModelFn:
    """Wraps an Estimator model_fn with flash checkpoints and restores from them (module docstring).

    Args:
      model_fn: the user's model_fn (stock optimizers; its variables on PS tasks).
      flash: when to snapshot, and where (`FlashConfig`).
      recovery_listener: called with each `RecoveryResult` of a session creation that brought a lost PS back.
      listeners: the chief's `CheckpointSaverListener`s, called with every snapshot
        (`tf_ecrec.flash.hooks.FlashCheckpointHook`).
      num_ps: the PS count for a task whose RunConfig has none (an evaluator builds no snapshots).

    The PS tasks run one of our ops (the other trainers' wait for the markers): they must load
    ``tf_ecrec.ops.load_library()`` before serving, as `tf_ecrec.train_and_evaluate` and the launcher do.

    Raises (when the Estimator calls the model_fn in training):
      ConfigError: no PS cluster, or a variable on a PS that is not a resource variable.
    """
    accepted = set(inspect.signature(model_fn).parameters)

    def wrapped(features: Any, labels: Any, mode: str, params: Any, config: tf.estimator.RunConfig) -> tf.estimator.EstimatorSpec:
        kwargs = {"features": features, "labels": labels, "mode": mode, "params": params, "config": config}
        spec = model_fn(**{k: v for k, v in kwargs.items() if k in accepted})
        if mode != tf.estimator.ModeKeys.TRAIN:
            return spec
        ps = int(config.num_ps_replicas or 0) or int(num_ps or 0)
        if ps < 1:
            raise ConfigError("flash checkpoints snapshot PS tasks: the cluster has none; source: RunConfig / TF_CONFIG")
        trainer, trainers = trainer_index(config)
        snapshots = FlashSnapshots(flash, config.model_dir, {}, ps, trainers)
        markers = {p: whole_marker(p) for p in range(ps)}
        recovery = FlashRecovery(snapshots, markers, config.model_dir, recovery_listener) if config.is_chief else None
        chief_hooks, hooks = list(spec.training_chief_hooks), list(spec.training_hooks)
        if config.is_chief:
            chief_hooks.append(FlashCheckpointHook(snapshots, contextlib.nullcontext, lambda: False, trainer, listeners,
                                                   strict=True))
        else:
            hooks.append(FlashGateHook(snapshots, trainer))
        return spec._replace(scaffold=flash_scaffold(recovery, markers, spec.scaffold, config=config),
                             training_chief_hooks=chief_hooks, training_hooks=hooks)

    return wrapped
