"""Rebuilding lost parameter servers from parity and replicas, at the chief's session re-creation.

The seam (DESIGN.md section 2): when a PS dies, every worker's step fails and `MonitoredTrainingSession`
re-creates its session. On the chief that runs `SessionManager.prepare_session`, which calls the
Scaffold's saver ``restore()`` when a checkpoint exists and otherwise its ``init_op`` and ``init_fn``.
`ec_model_fn` hands the Estimator a Scaffold whose saver (`ECSaver`), ``init_op`` (a no-op) and
``init_fn`` all lead here, to `RecoveryPlan.prepare`, which inspects what is initialised on the PS
tasks, asks `tf_ecrec.recovery.decision.decide` what to do (its docstring has the table) and does it.

Initialisation, rebuild, restore and checkpoint saves have `LONG_OP_TIMEOUT_MS` as deadline. By default
(``background=True``) lost table rows are rebuilt while training goes on: once settled, the lost variables
allocated, dense ones copied, table rows marked pending and every survivor preserving the rows they decode
from, the whole markers are written and trainers resume; a lookup of a pending row waits for it, asked-for
rows first (`tf_ecrec.rebuild.background.BackgroundRebuild`, docs/rebuild.md). A session re-created before
the rebuild is done resumes it; a PS lost meanwhile counts the unfinished one as lost too. Checkpoints and
the end of training wait for the rebuild. Snapshots come from a `SnapshotSource` (flash implements it).

The chief decides; the bytes move PS to PS (`tf_ecrec.rebuild`): lost variables are decoded on their PS in
bounded slices from the surviving stripe members, dense ones copied from a surviving replica; no table bytes
pass through the chief, no checkpoint is read when parity suffices, survivors keep their state. A restore
(flash snapshot or checkpoint) is fenced and owes the data rollback before it writes (`recovery.restore`).

Workers wait for the chief with a ready op that first waits on every PS (up to `READY_WAIT_SECS`, holding
no PS thread) for the marker the chief writes last, and raises ``AbortedError`` (not "not ready") while
variables are missing: their recoverable session checks again at once instead of sleeping the stock 30 s,
resumes within milliseconds of the chief's last write, and gives up after `READY_DEADLINE_SECS`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import tensorflow as tf

from tf_ecrec.errors import ConfigError, RecoveryError
from tf_ecrec.layout.device import ps_index
from tf_ecrec.rebuild.background import BackgroundRebuild
from tf_ecrec.rebuild.rebuilder import DEFAULT_SLICE_BYTES, Rebuilder
from tf_ecrec.recovery.deadline_session import LONG_OP_TIMEOUT_MS, PROFILE_DIR_ENV, TracingSession
from tf_ecrec.recovery.decision import Action, decide, unrecoverable_reason
from tf_ecrec.recovery.graph import checkpoint_step, initialiser_batches, protected_names, replica_tasks, whole_marker
from tf_ecrec.recovery.restore import fenced_restore
from tf_ecrec.recovery.result import Listener, Phases, RecoveryMethod, RecoveryResult
from tf_ecrec.recovery.snapshot_source import SnapshotSource
from tf_ecrec.step.embedding import EmbeddingCollection, collections, current_context
from tf_ecrec.step.optimizer import ECOptimizer
from tf_ecrec.step.steplog import Reconciler, SettleReport

_LOG = logging.getLogger(__name__)

READY_DEADLINE_SECS = 1800.0
READY_RETRY_SECS = 0.1
READY_WAIT_SECS = 2.0
"""Longest one ready check of a waiting worker waits on the PS for the chief's whole markers
(`EcRec>AwaitInitialized`): the check returns as soon as they are written, and a worker re-creates
its session (a worker session on every PS) at most about once per this."""
STARTED_MARKER = "tf_ecrec_started"
"""File in the model dir written once the variables were first initialised: with it, finding every
variable gone is a lost job, not a fresh one."""


class _ChiefOnly:
    """A part of the plan a non-chief task does not build: any use raises."""
    def __init__(self, part: str) -> None:
        self._part = part

    def __getattr__(self, name: str) -> Any:
        raise ConfigError(f"RecoveryPlan.{self._part}.{name}: built on the chief only; rule: recovery and "
                          "settlement run on the chief; source: RecoveryPlan(chief=False)")


class RecoveryPlan:
    """The ops and the procedure that bring a session's variables back; build it before finalize.

    Args:
      optimizer: the graph's ECOptimizer (after `minimize`).
      listener: called with every `RecoveryResult` (e.g. to report it).
      model_dir: where the job persists (the marker that it started lives there); without it a partly
        initialised cluster is taken for lost PS.
      slice_bytes: rows of a chunk the rebuild moves per session call (`tf_ecrec.rebuild`), in bytes.
      background: rebuild lost table rows while training goes on (lookups of rows not yet there wait for
        them, and the rebuild installs those first); False rebuilds everything before any trainer steps.
        The harness drives a background rebuild itself through `job`.
      ready_wait_secs: how long one ready check of a worker waits on the PS for the state to be whole
        (keep it under the session's operation timeout, which cuts any call).
      chief: False on a task that never recovers (a worker): the rebuild and settlement ops (a second
        of its start) are not built, and ``rebuilder`` / ``reconciler`` raise if used.
      rebuild_share: the fraction of the time a background rebuild walks its slices, in (0, 1]: below 1
        the walk pauses after each slice for as long as the slice took, scaled, leaving the PS tasks' CPU
        to training (`BackgroundRebuild.start`).
    """

    def __init__(self, optimizer: ECOptimizer, listener: Listener | None = None, model_dir: str | None = None,
                 slice_bytes: int = DEFAULT_SLICE_BYTES, background: bool = True,
                 ready_wait_secs: float = READY_WAIT_SECS, rebuild_share: float = 1.0, chief: bool = True) -> None:
        if not ready_wait_secs >= 0:
            raise ConfigError(f"ready_wait_secs={ready_wait_secs!r}; rule: >= 0; source: RecoveryPlan(ready_wait_secs=)")
        self.ready_wait_secs = float(ready_wait_secs)
        if not 0 < rebuild_share <= 1:
            raise ConfigError(f"rebuild_share={rebuild_share!r}; rule: 0 < share <= 1; source: RecoveryPlan(rebuild_share=)")
        self.rebuild_share = float(rebuild_share)
        self._opt = optimizer
        self.background = bool(background)
        self._job: BackgroundRebuild | None = None
        self._job_done: Callable[[BackgroundRebuild], None] | None = None
        self._job_lock = threading.Lock()
        self._marker = os.path.join(model_dir, STARTED_MARKER) if model_dir else None
        self._model_dir = model_dir
        self._long = tf.compat.v1.RunOptions(timeout_in_ms=LONG_OP_TIMEOUT_MS)
        self._listener = listener
        self._graph = tf.compat.v1.get_default_graph()
        self._colls: list[EmbeddingCollection] = [c for c in collections() if c.name in optimizer.parity]
        model_variables = list(tf.compat.v1.global_variables())
        with tf.name_scope("ec_recovery"):
            self.whole_markers = {p: whole_marker(p) for p in sorted(optimizer.logs)}
            self._model_variables = model_variables
            self.variables = model_variables + list(self.whole_markers.values())
            self._initialized = tf.stack([v.is_initialized() for v in self.variables])
            step = tf.compat.v1.train.get_global_step()
            self._step = step.read_value() if step is not None else None
            self._init_whole = {p: v.initializer for p, v in self.whole_markers.items()}
        self._by_name = {v.op.name: v for v in self.variables}
        self._marker_names = {v.op.name for v in self.whole_markers.values()}
        if chief:
            self.rebuilder = Rebuilder(optimizer, self._colls, slice_bytes=slice_bytes)
            self.reconciler = Reconciler(
                optimizer.targets, optimizer.logs, optimizer.expected_folds, commit_timeout_ms=optimizer.commit_timeout_ms
            )
        else:  # a worker's graph only waits for the chief's (its ready op)
            self.rebuilder, self.reconciler = cast(Rebuilder, _ChiefOnly("rebuilder")), cast(Reconciler, _ChiefOnly("reconciler"))
        self.protected_names = protected_names(optimizer, self._colls)
        self.flash: SnapshotSource | None = None  # set by ec_model_fn: restores prefer its newer snapshots
        self.build_initialisers()

    def build_initialisers(self) -> None:
        """The fresh start's initialisers from the variables' initializers as they are now; built again by the
        chief's `InitialiserHook` (Estimator's warm start replaces initializers after the model_fn returns)."""
        with self._graph.as_default(), tf.name_scope("ec_recovery"):
            self._init_batches = initialiser_batches(self._opt.redundancy_names(), self._model_variables)

    def _initialise(self, sess: tf.compat.v1.Session) -> None:
        """A fresh start: data, slots, dense primaries and other variables initialised in bounded batches,
        then parity and replicas allocated and encoded from them (`Rebuilder.reencode`, PS to PS in slices)."""
        for batch, _ in self._init_batches:
            sess.run(batch, options=self._long)
        self.rebuilder.allocate_derived(sess, options=self._long)
        self.rebuilder.reencode(sess, options=self._long)

    # ---- the decision ---------------------------------------------------------------------------

    def prepare(self, sess: tf.compat.v1.Session, restore: Callable[[], None] | None) -> RecoveryResult:
        """Brings every variable back (see the module docstring); `restore` restores the checkpoint.

        Raises:
          tf.errors.UnavailableError: a PS is still down (the caller retries).
          RecoveryError: more was lost than the code covers and there is no checkpoint.
        """
        self.stop_background()  # a new session: the previous one's rebuild loops end (and resume below)
        job_sess = sess  # the background rebuild's loops run untraced
        if os.environ.get(PROFILE_DIR_ENV):
            sess = TracingSession(sess, os.environ[PROFILE_DIR_ENV])
        started = time.time()
        laps = Phases()
        initialized = dict(zip((v.op.name for v in self.variables), sess.run(self._initialized)))
        # A PS without its marker is lost even if it holds variables (a rebuild or restore cut mid-way).
        broken = {p for p, marker in self.whole_markers.items() if not initialized[marker.op.name]}
        missing = [v for v in self.variables if not initialized[v.op.name] or ps_index(v.device) in broken]
        # A PS whose rows are still pending (a background rebuild cut by this session's creation).
        degraded = self.rebuilder.unfinished(sess, [p for p in self.whole_markers if p not in broken])
        laps.lap("inspect")
        lost = sorted({ps_index(v.device) for v in missing})
        model_missing = [v for v in missing if v.op.name not in self._marker_names]
        # A PS still being rebuilt holds rows that are not there yet: it is rebuilt again with
        # the lost ones (from the survivors' state now), though its log is alive and settled.
        rebuilt = sorted(set(lost) | set(degraded))
        everything = len(model_missing) == len(self._model_variables)
        unrecoverable = self._unrecoverable(model_missing, rebuilt) if missing else None
        # A flash snapshot is looked for only when a restore may be needed (it reads every PS's manifests).
        source = self.flash
        flash = source.choose(sess) if source is not None and (everything or unrecoverable) else None
        action = decide(
            missing=bool(missing),
            everything=everything,
            job_started=None if self._marker is None or not missing else tf.io.gfile.exists(self._marker),
            checkpoint=restore is not None or flash is not None,
            unrecoverable=unrecoverable,
        )
        if action in (Action.RESTORE, Action.FALLBACK) and source is not None and flash is not None and (
                restore is None or flash.global_step >= checkpoint_step(self._model_dir)):
            fenced_restore(sess, self.reconciler, self.reconciler_ps(), lost, lambda: source.restore(sess, flash, options=self._long),
                           self._model_dir, flash.global_step, "flash checkpoint", self._graph_generation())
            laps.lap("restore")
            self.rebuilder.clear_views(sess, self.reconciler_ps(), options=self._long)
            self._mark_whole(sess, self.whole_markers if action is Action.RESTORE else lost)
            laps.lap("mark")
            result = RecoveryResult(RecoveryMethod(flash.method), lost, sum(len(n) for n in source.names.values()),
                                    sum(source.bytes.values()))
            return self._done(result, started, sess, laps)
        if action is Action.SETTLE:
            # Nothing was lost, but a task (the previous chief, say) may have died mid-step: settle its entries.
            report = self.settle(sess)
            if degraded:
                _LOG.warning("resuming the background rebuild of PS %s", degraded)
                self._start_job(job_sess, self.rebuilder.resume_background(degraded), started)
            result = RecoveryResult(RecoveryMethod.NONE, [], background=bool(degraded))
            return self._done(result.settled(report), started, sess)
        if action is Action.RESTORE:
            assert restore is not None  # decide() restores only when a checkpoint is offered
            fenced_restore(sess, self.reconciler, self.reconciler_ps(), [], restore, self._model_dir, checkpoint_step(self._model_dir),
                           "checkpoint", self._graph_generation())
            self._reencode(sess)
            self.rebuilder.clear_views(sess, self.reconciler_ps(), options=self._long)
            self._mark_whole(sess, self.whole_markers)
            return self._done(RecoveryResult(RecoveryMethod.CHECKPOINT, []), started, sess)
        if action is Action.REFUSE_LOST_JOB:
            raise RecoveryError(
                f"every variable on every PS is gone, the job had started ({self._marker} exists) and there is "
                "no checkpoint: training cannot go on from where it was. Run with checkpoints "
                "(--checkpoint-steps/--checkpoint-secs), or delete the marker to start over from scratch."
            )
        if action is Action.INITIALISE:
            # A fresh start, possibly cut mid-way (a partly initialised cluster): initialise it all.
            self._initialise(sess)
            self._mark_whole(sess, self.whole_markers)
            if self._marker is not None:
                tf.io.gfile.makedirs(os.path.dirname(self._marker))
                with tf.io.gfile.GFile(self._marker, "w") as f:
                    f.write(f"initialised at {time.time():.0f}\n")
            return self._done(RecoveryResult(RecoveryMethod.INIT, []), started, sess)
        _LOG.warning("rebuilding %d variables of lost PS %s%s", len(model_missing), lost,
                     f" and PS {degraded}, whose rebuild was not done" if degraded else "")
        if action is Action.REBUILD:
            return self._rebuild(sess, job_sess, lost, rebuilt, started, laps)
        reason = self._unrecoverable(model_missing, rebuilt)
        if action is Action.REFUSE_UNRECOVERABLE:
            raise RecoveryError(
                f"PS {lost} lost {len(model_missing)} variables and {reason}; there is no checkpoint to fall back to. "
                "Run with checkpoints (--checkpoint-steps/--checkpoint-secs) to survive this."
            )
        _LOG.warning("PS %s lost and %s: restoring every variable from the checkpoint", lost, reason)
        assert restore is not None  # FALLBACK: decide() falls back only when a checkpoint is offered
        fenced_restore(sess, self.reconciler, self.reconciler_ps(), lost, restore, self._model_dir, checkpoint_step(self._model_dir),
                       "checkpoint", self._graph_generation())
        laps.lap("restore")
        self._reencode(sess)
        laps.lap("reencode")
        self.rebuilder.clear_views(sess, self.reconciler_ps(), options=self._long)
        self._mark_whole(sess, lost)
        laps.lap("mark")
        return self._done(RecoveryResult(RecoveryMethod.CHECKPOINT, lost), started, sess, laps)

    def _rebuild(self, sess: tf.compat.v1.Session, job_sess: tf.compat.v1.Session, lost: list[int],
                 rebuilt: list[int], started: float, laps: Phases) -> RecoveryResult:
        """`Action.REBUILD`: settles the cut steps, then rebuilds `rebuilt` from parity and replicas."""
        alive = [p for p in self.reconciler_ps() if p not in lost]
        # Older trainers (a PS moved) may no longer write; then settle the steps the
        # failure cut and roll the lost variables' parity back to their committed
        # prefix (tf_ecrec.step.steplog) before decoding.
        self._raise_generation(sess, alive)
        report = self.reconciler.settle(sess, alive, lost)
        laps.lap("settle")
        if self.background:
            job = self.rebuilder.begin_background(sess, rebuilt, options=self._long)
            stats = job.stats
            laps.add(stats.phases)
        else:
            stats = self.rebuilder.rebuild(sess, rebuilt, options=self._long)
            laps.lap("rebuild")
        self.reconciler.propagate_generation(sess, self.reconciler_ps(), self._graph_generation())
        laps.lap("generation")
        self._mark_whole(sess, lost)
        laps.lap("mark")
        result = RecoveryResult(RecoveryMethod.PARITY, rebuilt, stats.variables, stats.bytes, background=self.background)
        result.settled(report)
        if self.background:
            self._start_job(job_sess, job, started, result)
        return self._done(result, started, sess, laps)

    # ---- the background rebuild ---------------------------------------------------------------------------

    @property
    def job(self) -> BackgroundRebuild | None:
        """The background rebuild of the current session, if one is under way (or finished)."""
        return self._job

    def _start_job(self, sess: tf.compat.v1.Session, job: BackgroundRebuild, started: float,
                   first: RecoveryResult | None = None) -> None:
        """Runs `job` on the chief's threads (or leaves it to the caller: ``threads=False``); reports its end."""

        def done(j: BackgroundRebuild) -> None:
            result = RecoveryResult(RecoveryMethod.REBUILT, list(j.lost), j.stats.variables, j.stats.bytes,
                                    seconds=time.time() - started)
            if first is not None:
                result.steps_undone, result.steps_finished = first.steps_undone, first.steps_finished
                result.folds_rolled_back = first.folds_rolled_back
            try:
                if self._step is not None:
                    result.global_step = int(sess.run(self._step))
            except (tf.errors.OpError, RuntimeError):
                pass
            _LOG.warning("recovery: method=rebuilt lost_ps=%s bytes=%d seconds=%.3f global_step=%s",
                         result.lost_ps, result.bytes_rebuilt, result.seconds, result.global_step)
            self.notify(result)

        with self._job_lock:
            self._job = job
            self._job_done = done
        if self.run_threads:
            job.start(sess, on_done=done, share=self.rebuild_share)

    run_threads = True
    """Whether a background rebuild runs on threads (the harness sets False, drives `job`, calls `finish_job`)."""

    def finish_job(self, sess: tf.compat.v1.Session) -> None:
        """For a caller driving the job's steps: ends it after its walk and reports it."""
        job = self._job
        if job is None or job.finished:
            return
        job.finish(sess)
        if self._job_done is not None:
            self._job_done(job)

    def stop_background(self) -> None:
        """Stops the loops of a background rebuild (its rows stay installed; the next prepare resumes it)."""
        with self._job_lock:
            job, self._job = self._job, None
        if job is not None:
            job.stop()

    def wait_background(self, timeout: float | None = None) -> bool:
        """Waits for a background rebuild to finish (before a checkpoint or the end of training); whether none is left."""
        job = self._job
        if job is None or job.finished:
            return True
        if not self.run_threads:
            return False
        return job.wait(timeout)

    def _mark_whole(self, sess: tf.compat.v1.Session, tasks: Any) -> None:
        """Initialises the markers of `tasks` (the last write of a recovery: then workers may step)."""
        ops = [self._init_whole[p] for p in tasks if p in self._init_whole]
        if ops and self.flash is not None:  # trainers read the flash gate with every step
            self.flash.init_gate(sess)
        if ops:
            sess.run(ops, options=self._long)

    def _done(self, result: RecoveryResult, started: float, sess: tf.compat.v1.Session,
              laps: Phases | None = None) -> RecoveryResult:
        if self._step is not None:
            result.global_step = int(sess.run(self._step))
        if laps is not None:
            laps.lap("read_step")
            result.phases = dict(laps.seconds)
        result.seconds = time.time() - started
        if result.method in ("parity", "checkpoint", "memory", "disk"):
            _LOG.warning(
                "recovery: method=%s lost_ps=%s variables=%d bytes=%d seconds=%.3f global_step=%s phases=%s",
                result.method, result.lost_ps, result.variables_rebuilt, result.bytes_rebuilt,
                result.seconds, result.global_step, result.phases,
            )
        self.notify(result)
        return result

    def reconciler_ps(self) -> list[int]:
        return sorted(self._opt.logs)

    def _graph_generation(self) -> int:
        ctx = current_context(self._graph)
        return ctx.generation if ctx is not None else 0

    def _raise_generation(self, sess: tf.compat.v1.Session, alive: Sequence[int]) -> None:
        if self._graph_generation() > 0:
            self.reconciler.set_generation(sess, alive, self._graph_generation())

    def settle(self, sess: tf.compat.v1.Session) -> SettleReport:
        """Settles steps left in the logs (e.g. of a worker that died mid-step); every PS must be up."""
        return self.reconciler.settle(sess, self.reconciler_ps())

    def settle_left_behind(self, sess: tf.compat.v1.Session) -> SettleReport:
        """Settles the steps dead tasks left pending, leaving live trainers' steps to commit; every PS
        must be up (`Reconciler.settle_left_behind`)."""
        return self.reconciler.settle_left_behind(sess, self.reconciler_ps())

    def notify(self, result: RecoveryResult) -> None:
        """Hands a result to the listener (the background settlement's, for instance)."""
        if self._listener is not None:
            self._listener(result)

    def _unrecoverable(self, missing: Sequence[tf.Variable], lost: Sequence[int]) -> str | None:
        return unrecoverable_reason([v.op.name for v in missing], self.protected_names, lost,
                                    {c.name: c.layout for c in self._colls}, replica_tasks(self._opt))

    def _reencode(self, sess: tf.compat.v1.Session) -> None:
        """Re-encodes every parity and replica from the data (after a checkpoint restore)."""
        self.rebuilder.reencode(sess, options=self._long)
