"""What `ec_model_fn` attaches to a training EstimatorSpec: the Scaffold, its saver and ready op, and the chief's hooks.

Session creation runs `RecoveryPlan.prepare` through the Scaffold
(`scaffold_for`): its ``init_fn`` when there is no checkpoint, its saver's
``restore`` (`ECSaver`) when there is one; on the chief, a `PSKernelsCheck`
first names a PS that serves without the op library.  Workers wait with
`raising_ready_op`.  On the chief, `StaleStepSettlerHook` settles a dead
task's steps while training goes on and `SettleAtEndHook` settles what is
left at the end.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np
import tensorflow as tf

from tf_ecrec.errors import RecoveryError
from tf_ecrec.recovery.deadline_session import LONG_OP_TIMEOUT_MS, LongDeadlineSaver, checkpoints_kept
from tf_ecrec.recovery.kernels import PSKernelsCheck
from tf_ecrec.recovery.plan import READY_DEADLINE_SECS, READY_RETRY_SECS, RecoveryPlan
from tf_ecrec.recovery.result import RecoveryMethod, RecoveryResult
from tf_ecrec.step.carried_commit import CarriedCommit, carried_commits
from tf_ecrec.step.steplog import STALE_SECS

_LOG = logging.getLogger(__name__)


class ECSaver(LongDeadlineSaver):
    """A Saver whose restore() rebuilds from parity when it can, and restores the checkpoint only when it must.

    Saving is the stock Saver's, under the long deadline (`LongDeadlineSaver`).
    `SessionManager` calls ``restore`` when the model dir has a checkpoint;
    the decision is `RecoveryPlan.prepare`'s.
    """

    def __init__(self, plan: RecoveryPlan, kernels: PSKernelsCheck | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._plan = plan
        self._kernels = kernels

    def save(self, sess: Any, *args: Any, **kwargs: Any) -> Any:  # see class docstring
        # Rows still pending on a PS being rebuilt read as zeros: a checkpoint waits for the rebuild.
        if not self._plan.wait_background(timeout=LONG_OP_TIMEOUT_MS / 1000):
            raise RecoveryError("a checkpoint cannot be saved while a lost PS's rows are still being rebuilt")
        return super().save(sess, *args, **kwargs)

    def restore(self, sess: tf.compat.v1.Session, save_path: str) -> None:  # see class docstring
        if self._kernels is not None:
            self._kernels.run(sess)  # a PS without the kernels, named before anything else runs there
        self._plan.prepare(sess, restore=lambda: self._restore(sess, save_path))



def raising_ready_op(plan: Any) -> tf.Tensor:
    """Like report_uninitialized_variables, but fails with ABORTED while anything is missing.

    `plan` is a `RecoveryPlan`, or anything with its ``whole_markers`` (PS task -> marker),
    ``variables`` (what must be initialised, markers included) and ``ready_wait_secs``
    (`tf_ecrec.flash.stock` passes its own).

    Before it reports, each PS waits up to ``ready_wait_secs`` for its
    whole marker (`EcRec>AwaitInitialized`): a worker waiting through a
    recovery then re-creates its session (and with it a worker session
    on every PS, which holds up the chief's calls there) once per wait
    instead of every `READY_RETRY_SECS`, and starts within milliseconds
    of the chief's last write.

    A deadline check in front of it turns a wait longer than
    `READY_DEADLINE_SECS` into a plain error, so a worker whose chief
    never comes back fails instead of retrying forever.
    """
    from tf_ecrec.ops import load_library

    lib = load_library()
    # First wait, on every PS at once, for its whole marker (written last by the chief).
    waits = []
    for p, marker in plan.whole_markers.items():
        with tf.compat.v1.device(marker.device):
            waits.append(lib.ec_rec_await_initialized(
                marker.handle, max_wait_micros=int(plan.ready_wait_secs * 1e6), name=f"ec_ready_wait_ps{p}"
            ))
    with tf.control_dependencies(waits):
        names = tf.compat.v1.report_uninitialized_variables(plan.variables)
    state: dict[str, float | None] = {"since": None}

    def deadline(missing: np.ndarray) -> np.ndarray:
        if missing.size == 0:
            state["since"] = None
            return missing
        since = state["since"] or time.time()
        state["since"] = since
        if time.time() - since > READY_DEADLINE_SECS:
            raise RecoveryError(
                f"the model was not ready within {READY_DEADLINE_SECS:.0f} s: {missing.size} variables are "
                "not initialised; is the chief running?"
            )
        return missing

    checked = tf.numpy_function(deadline, [names], tf.string, stateful=True, name="ec_ready_deadline")
    checked.set_shape([None])
    return lib.ec_rec_require_empty(checked, retry_micros=int(READY_RETRY_SECS * 1e6), name="ec_ready")


def scaffold_for(plan: RecoveryPlan, base: tf.compat.v1.train.Scaffold | None = None,
                 chief: bool = False, config: Any = None) -> tf.compat.v1.train.Scaffold:
    """The Scaffold that routes session creation through `plan`, composed with `base`'s fields.

    Ours: the saver (`ECSaver`), a no-op ``init_op`` and an ``init_fn`` that
    runs `plan.prepare`.  Kept from `base`: ``local_init_op``,
    ``summary_op`` and ``local_init_feed_dict``; its ``init_fn`` runs after
    ours (once the variables are whole), and its ``ready_op`` and
    ``ready_for_local_init_op`` are concatenated after ours (a name either
    reports is not ready).  `base`'s ``init_op``, ``init_feed_dict`` and
    saver are replaced: initialisation and restores are the plan's. The saver
    keeps the checkpoints the Estimator's own would (`config`, a RunConfig:
    ``keep_checkpoint_max``, ``keep_checkpoint_every_n_hours``).

    On the `chief`, our ready ops report nothing: its session creation runs
    `plan.prepare`, which leaves every variable whole or raises, so checking
    again would only cost the chief's resumption a first call across every PS.
    """
    kernels = None
    if chief:
        ready = tf.constant([], tf.string, name="ec_ready_after_prepare")
        kernels = PSKernelsCheck({p: marker.device for p, marker in plan.whole_markers.items()})
    else:
        ready = raising_ready_op(plan)
    saver = ECSaver(plan, kernels, sharded=True, save_relative_paths=True, **checkpoints_kept(config))
    user_init_fn = base.init_fn if base is not None else None  # a Scaffold's init_fn takes the session alone

    def init_fn(scaffold: tf.compat.v1.train.Scaffold, sess: tf.compat.v1.Session) -> None:
        if kernels is not None:
            kernels.run(sess)  # a PS without the kernels, named before anything else runs there
        plan.prepare(sess, restore=None)
        if user_init_fn is not None:
            user_init_fn(sess)

    kwargs: dict[str, Any] = {}
    ready_for_local_init = ready
    if base is not None:
        kwargs = {
            "local_init_op": base.local_init_op,
            "summary_op": base.summary_op,
            "local_init_feed_dict": base.local_init_feed_dict,
        }
        ready = _combined(ready, base.ready_op)
        ready_for_local_init = _combined(ready_for_local_init, base.ready_for_local_init_op)
    return tf.compat.v1.train.Scaffold(
        init_op=tf.no_op(name="ec_init_op"),
        init_fn=init_fn,
        ready_op=ready,
        ready_for_local_init_op=ready_for_local_init,
        saver=saver,
        **{k: v for k, v in kwargs.items() if v is not None},
    )


def _combined(ours: tf.Tensor, theirs: tf.Tensor | None) -> tf.Tensor:
    """Both ready ops' lists of names not ready (ours first)."""
    if theirs is None:
        return ours
    return tf.concat([ours, tf.reshape(theirs, [-1])], axis=0, name="ec_ready_with_base")


class StaleStepSettlerHook(tf.compat.v1.train.SessionRunHook):
    """On the chief: settles, in the background, the steps dead tasks left in the logs.

    A step pending longer than `stale_secs` whose round-1 commit is not
    waiting on an earlier step belongs to a task that died (a live step
    takes milliseconds): the hook's thread fences and settles it within
    about `stale_secs + interval_secs` of the death, while training goes on,
    which releases the round-1 commits of later steps waiting behind it
    (DESIGN.md invariant 9).  A live but slow step caught this way fails at
    its commit and counts as failed.

    Lifecycle: ``after_create_session`` starts the thread on the new session
    (stopping the previous one), ``end`` stops it.  The thread only runs
    session calls; a closed session or a PS that is down ends or skips a round.
    """

    def __init__(self, plan: RecoveryPlan, interval_secs: float = 1.0, stale_secs: float = STALE_SECS) -> None:
        if interval_secs <= 0 or stale_secs <= 0:
            raise ValueError(f"interval_secs and stale_secs must be > 0, got {interval_secs}, {stale_secs}")
        self._plan = plan
        self._interval = interval_secs
        self._stale = stale_secs
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._carried: list[CarriedCommit] = []

    def begin(self) -> None:
        self._carried = carried_commits()

    def after_create_session(self, session: tf.compat.v1.Session, coord: Any) -> None:
        self._stop_thread()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(session, self._stop), name="ec-stale-step-settler", daemon=True)
        self._thread.start()

    def end(self, session: tf.compat.v1.Session) -> None:
        self._stop_thread()

    def _stop_thread(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=30.0)
            self._thread = None

    def _run(self, session: tf.compat.v1.Session, stop: threading.Event) -> None:
        while not stop.wait(self._interval):
            try:
                mine = {sid for commit in self._carried for sid in commit.pending_sids()}
                report = self._plan.reconciler.settle_stale(session, self._plan.reconciler_ps(), self._stale, exclude=mine)
            except RuntimeError:
                return  # the session was closed
            except tf.errors.OpError as exc:
                _LOG.debug("stale-step settlement skipped a round: %s", exc.message.splitlines()[0])
                continue
            if report is not None:
                self._plan.notify(RecoveryResult(RecoveryMethod.SETTLED, []).settled(report))


class SettleAtEndHook(tf.compat.v1.train.SessionRunHook):
    """On the chief, at the end of training, settles steps other tasks left in the logs.

    A worker that died mid-step leaves its step's entries behind; settling
    them at the end leaves parity exact for the final check (and for the
    next job that restarts from this state). Steps of trainers still running
    are left to commit on their own (`Reconciler.settle_left_behind`):
    settling everything pending used to fence them, failing their steps, and
    made the chief's finish wait behind their commits for seconds.
    """

    def __init__(self, plan: RecoveryPlan) -> None:
        self._plan = plan

    def end(self, session: tf.compat.v1.Session) -> None:
        for commit in carried_commits(session.graph):  # the chief's own last step is not left behind
            commit.flush(session)
        if not self._plan.wait_background(timeout=LONG_OP_TIMEOUT_MS / 1000):
            _LOG.warning("training ended while a background rebuild was not done; the next start resumes it")
        try:
            self._plan.settle_left_behind(session)
        except tf.errors.OpError as exc:  # a PS is gone at the very end: the next recovery settles it
            _LOG.warning("could not settle pending steps at the end of training: %s", exc.message.splitlines()[0])


class InitialiserHook(tf.compat.v1.train.SessionRunHook):
    """On the chief: the fresh start's initialisers built again in ``begin``, once the Estimator has warm-started.

    ``Estimator(warm_start_from=...)`` replaces the initializers of the variables it warm-starts after the
    model_fn returns (`RecoveryPlan` is built inside it), so a fresh start that ran the initializers it saw
    then would ignore the warm start and train from scratch, silently. Hooks begin after the warm start
    and before the graph is finalized; parity and replicas are encoded from the initialised data, so
    they follow the warm-started values.
    """

    def __init__(self, plan: RecoveryPlan) -> None:
        self._plan = plan

    def begin(self) -> None:
        self._plan.build_initialisers()
