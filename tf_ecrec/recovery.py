"""Rebuilding lost parameter servers from parity and replicas, at the chief's session re-creation.

The seam (DESIGN.md section 2): when a PS dies, every worker's step fails and
`MonitoredTrainingSession` re-creates its session.  On the chief that runs
`SessionManager.prepare_session`, which calls the Scaffold's saver
``restore()`` when a checkpoint exists and otherwise its ``init_op`` and
``init_fn``.  `ec_model_fn` hands the Estimator a Scaffold whose saver
(`ECSaver`), ``init_op`` (a no-op) and ``init_fn`` all lead here, to
`RecoveryPlan.prepare`, which decides from what is initialised on the PS
tasks:

============================  =================================================
state found                   action
============================  =================================================
everything initialised        settle the steps a dead task left in the logs
                              (`tf_ecrec.steplog`); a chief restart keeps the
                              live state
nothing initialised           restore the checkpoint if there is one (then
                              re-encode parity and replicas); else, if the model
                              dir's `STARTED_MARKER` says the job had started,
                              raise `RecoveryError` (a lost job is not a fresh
                              one); else initialise (`INIT_BATCH_BYTES` per
                              call, parity and replicas encoded from the data
                              in slices) and write it
some initialised, no marker,  a fresh start cut mid-way (e.g. by a timeout):
no checkpoint                 initialise again, as above
the variables of <= r PS of   settle the steps the failure cut, then rebuild
every stripe missing          the lost variables: data chunks and slots decoded from
                              the surviving chunks, parity re-encoded, dense
                              variables, their slots and the global step copied
                              from a replica, replicas copied from primaries
more missing than the code    fall back to the checkpoint (``method:
covers                        "checkpoint"``), re-encode; without a checkpoint
                              raise `RecoveryError`
============================  =================================================

Initialisation, rebuild, restore and checkpoint saves run with
`LONG_OP_TIMEOUT_MS` as their deadline, not the session's operation timeout.

By default (``background=True``) the table rows of lost PS are rebuilt while
training goes on: once settled, the lost variables allocated, their dense
variables copied, their table rows marked pending and every survivor
preserving the rows they decode from, the whole markers are written and
trainers resume; a lookup of a pending row waits for it and the rebuild
installs asked-for rows first (`tf_ecrec.rebuild.BackgroundRebuild`,
docs/rebuild.md).  A session re-created before the rebuild is done resumes
it; a PS lost meanwhile makes the unfinished one count as lost too.
Checkpoints and the end of training wait for the rebuild.

The chief decides; the bytes move PS to PS (`tf_ecrec.rebuild`): lost
variables are allocated on their PS and decoded there in bounded slices
from the surviving stripe members with the C++ GF(2^16) kernels, dense
variables copied from a surviving replica, with ops built before the graph
was finalized.  No table bytes pass through the chief, no checkpoint is read
when parity suffices, and surviving PS keep their state.

Workers wait for the chief with a ready op that first waits on every PS
(up to `READY_WAIT_SECS`, without holding a PS thread) for the marker the
chief writes last, and raises ``AbortedError`` (instead of reporting "not
ready") while variables are still missing: their recoverable session then
checks again at once instead of sleeping the stock 30 seconds, resumes
within milliseconds of the chief's last write, and gives up with
``DeadlineExceeded`` after `READY_DEADLINE_SECS`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tensorflow.python.client import session as tf_session

from tf_ecrec.device import check_placed, on_ps, ps_device
from tf_ecrec.embedding import EmbeddingCollection, collections, current_context, device_task
from tf_ecrec.errors import ConfigError, RecoveryError
from tf_ecrec.optimizer import ECOptimizer
from tf_ecrec.rebuild import DEFAULT_SLICE_BYTES, BackgroundRebuild, Rebuilder
from tf_ecrec.steplog import Reconciler, SettleReport

_LOG = logging.getLogger(__name__)

READY_DEADLINE_SECS = 1800.0
READY_RETRY_SECS = 0.1
READY_WAIT_SECS = 2.0
"""Longest one ready check of a waiting worker waits on the PS for the chief's whole markers
(`EcRec>AwaitInitialized`): the check returns as soon as they are written, and a worker re-creates
its session (a worker session on every PS) at most about once per this."""
INIT_BATCH_BYTES = 256 << 20
"""Bytes of variables initialised per session call at a fresh start: a PS computes initial values for at
most this much (plus the largest single variable) at once, not for its whole share."""
LONG_OP_TIMEOUT_MS = 3_600_000
"""Deadline of initialisation, rebuild and restore calls: a session's operation timeout (there to
end waits on a dead task) must not cut the work itself on a large model."""
WHOLE_MARKERS = "tf_ecrec_whole_markers"
"""Graph collection of the per-PS markers that a PS's state is whole (`RecoveryPlan`)."""
PROFILE_DIR_ENV = "TF_ECREC_PROFILE_DIR"
"""When set, every session call of a recovery is traced: a Chrome trace per call and a summary of
each call's wall time against the span its ops ran in (the rest: partitioning, graph registration
on the PS tasks, RPCs) go to that directory (`_TracingSession`)."""
STARTED_MARKER = "tf_ecrec_started"
"""File in the model dir written once the variables were first initialised: with it, finding every
variable gone is a lost job, not a fresh one."""


@dataclasses.dataclass
class RecoveryResult:
    """What one `prepare` did.

    Attributes:
      method: "none", "init", "parity", "checkpoint", "settled" (the
        background settlement of a dead task's steps) or "rebuilt" (the end
        of a background rebuild: `lost_ps` whole again; `seconds` from the
        session creation that started it).
      background: for "parity": the table rows are installed in the
        background while training goes on (`tf_ecrec.rebuild.BackgroundRebuild`);
        a "rebuilt" result follows.
      lost_ps: PS tasks whose variables were missing.
      variables_rebuilt: how many variables were written.
      bytes_rebuilt: bytes written to rebuilt variables.
      seconds: wall time of the decision and the rebuild.
      global_step: the global step after it.
      phases: seconds of each part of `seconds`, in order (the profile of a
        recovery: "inspect", "settle", "t0" or "rebuild", "generation",
        "mark", "read_step"; "restore" and "reencode" for a checkpoint).
    """

    method: str
    lost_ps: list[int]
    variables_rebuilt: int = 0
    bytes_rebuilt: int = 0
    seconds: float = 0.0
    global_step: int | None = None
    steps_undone: int = 0
    steps_finished: int = 0
    folds_rolled_back: int = 0
    background: bool = False
    phases: dict[str, float] = dataclasses.field(default_factory=dict)

    def settled(self, report: SettleReport | None) -> RecoveryResult:
        """Adds what a settlement did to this result; returns it."""
        if report is not None:
            self.steps_undone += report.undone
            self.steps_finished += report.finished
            self.folds_rolled_back += report.rolled_back
        return self


Listener = Callable[[RecoveryResult], None]


class _Phases:
    """Wall seconds of consecutive parts of a procedure: ``lap(name)`` closes the part since the last lap."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._last, 4)
        self._last = now

    def add(self, seconds: dict[str, float]) -> None:
        """Splits the part since the last lap into `seconds` (measured inside it) and closes it."""
        for name, s in seconds.items():
            self.seconds[name] = round(self.seconds.get(name, 0.0) + s, 4)
        self._last = time.perf_counter()


class RecoveryPlan:
    """The ops and the procedure that bring a session's variables back; build it before finalize.

    Args:
      optimizer: the graph's ECOptimizer (after `minimize`).
      listener: called with every `RecoveryResult` (e.g. to report it).
      model_dir: where the job persists (the marker that it started lives
        there); without it a partly initialised cluster is taken for lost PS.
      slice_bytes: rows of a chunk the rebuild moves per session call
        (`tf_ecrec.rebuild`), in bytes.
      background: rebuild lost table rows while training goes on (lookups
        of rows not yet there wait for them, and the rebuild installs those
        first); False rebuilds everything before any trainer steps.  The
        harness drives a background rebuild itself through `job`.
      ready_wait_secs: how long one ready check of a worker waits on the PS
        for the state to be whole (keep it under the session's operation
        timeout, which cuts any call).
      rebuild_share: the fraction of the time a background rebuild walks
        its slices, in (0, 1]: below 1 the walk pauses after each slice
        for as long as the slice took, scaled, leaving the PS tasks' CPU to
        training (`BackgroundRebuild.start`).
    """

    def __init__(self, optimizer: ECOptimizer, listener: Listener | None = None, model_dir: str | None = None,
                 slice_bytes: int = DEFAULT_SLICE_BYTES, background: bool = True,
                 ready_wait_secs: float = READY_WAIT_SECS, rebuild_share: float = 1.0) -> None:
        if not ready_wait_secs >= 0:
            raise ConfigError(f"ready_wait_secs={ready_wait_secs!r}; rule: >= 0; source: RecoveryPlan(ready_wait_secs=)")
        self._ready_wait_secs = float(ready_wait_secs)
        if not 0 < rebuild_share <= 1:
            raise ConfigError(f"rebuild_share={rebuild_share!r}; rule: 0 < share <= 1; source: RecoveryPlan(rebuild_share=)")
        self.rebuild_share = float(rebuild_share)
        self._opt = optimizer
        self.background = bool(background)
        self._job: BackgroundRebuild | None = None
        self._job_done: Callable[[BackgroundRebuild], None] | None = None
        self._job_lock = threading.Lock()
        self._marker = os.path.join(model_dir, STARTED_MARKER) if model_dir else None
        self._long = tf.compat.v1.RunOptions(timeout_in_ms=LONG_OP_TIMEOUT_MS)
        self._listener = listener
        self._graph = tf.compat.v1.get_default_graph()
        self._colls: list[EmbeddingCollection] = [c for c in collections() if c.name in optimizer.parity]
        model_variables = list(tf.compat.v1.global_variables())
        with tf.name_scope("ec_recovery"):
            self._whole = {p: self._whole_marker(p) for p in sorted(optimizer.logs)}
            self._model_variables = model_variables
            self.variables = model_variables + list(self._whole.values())
            self._initialized = tf.stack([v.is_initialized() for v in self.variables])
            step = tf.compat.v1.train.get_global_step()
            self._step = step.read_value() if step is not None else None
            self._init_batches = self._initialiser_batches(optimizer, model_variables)
            self._init_whole = {p: v.initializer for p, v in self._whole.items()}
        self._by_name = {v.op.name: v for v in self.variables}
        self._marker_names = {v.op.name for v in self._whole.values()}
        self.rebuilder = Rebuilder(optimizer, self._colls, slice_bytes=slice_bytes)
        self.reconciler = Reconciler(
            optimizer.targets, optimizer.logs, optimizer.expected_folds, commit_timeout_ms=optimizer.commit_timeout_ms
        )
        self.protected_names = self._protected_names()

    @staticmethod
    def _initialiser_batches(optimizer: ECOptimizer, variables: Sequence[tf.Variable]) -> list[tuple[tf.Operation, list[str]]]:
        """The initialisers of every variable that is not derived from others, in calls of <= INIT_BATCH_BYTES.

        Parity and replicas are derived: a fresh start allocates them and
        encodes them from the initialised data with the rebuild's sliced
        walk (`_initialise`), so no PS holds its whole share of initial
        values, their encodings and the variables at once.
        """
        derived = optimizer.redundancy_names()
        batches: list[list[tf.Variable]] = [[]]
        size = 0
        for v in variables:
            if v.op.name in derived:
                continue
            nbytes = int(np.prod(v.shape.as_list(), dtype=np.int64)) * v.dtype.base_dtype.size
            if batches[-1] and size + nbytes > INIT_BATCH_BYTES:
                batches.append([])
                size = 0
            batches[-1].append(v)
            size += nbytes
        return [
            (tf.group(*[v.initializer for v in vs], name=f"init_model_{i}"), [v.op.name for v in vs])
            for i, vs in enumerate(batches) if vs
        ]

    def _initialise(self, sess: tf.compat.v1.Session) -> None:
        """A fresh start: data, slots, dense primaries and other variables initialised in bounded batches,
        then parity and replicas allocated and encoded from them (`Rebuilder.reencode`, PS to PS in slices)."""
        for batch, _ in self._init_batches:
            sess.run(batch, options=self._long)
        self.rebuilder.allocate_derived(sess, options=self._long)
        self.rebuilder.reencode(sess, options=self._long)

    @staticmethod
    def _whole_marker(task: int) -> tf.Variable:
        """PS `task`'s marker that its state is whole: initialised last, by initialisation, restore or rebuild.

        A PS whose marker is missing counts as lost whatever else it holds (a
        rebuild or restore cut mid-way leaves allocated, partly written
        variables), and the workers' ready op waits for every marker, so no
        step runs on a PS before its state is whole.  Not in GLOBAL_VARIABLES:
        checkpoints do not hold it.
        """
        with on_ps(task), tf.compat.v1.device(ps_device(task)):  # under an ECDeviceFn or not
            marker = tf.compat.v1.Variable(
                True, name=f"ps{task}_whole", trainable=False, use_resource=True, collections=[WHOLE_MARKERS]
            )
        check_placed(marker, task, "the whole-state marker of a PS")
        return marker

    # ---- graph pieces for the Scaffold ---------------------------------------------------------------------------

    def raising_ready_op(self) -> tf.Tensor:
        """Like report_uninitialized_variables, but fails with ABORTED while anything is missing.

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
        for p, marker in self._whole.items():
            with tf.compat.v1.device(marker.device):
                waits.append(lib.ec_rec_await_initialized(
                    marker.handle, max_wait_micros=int(self._ready_wait_secs * 1e6), name=f"ec_ready_wait_ps{p}"
                ))
        with tf.control_dependencies(waits):
            names = tf.compat.v1.report_uninitialized_variables(self.variables)
        state: dict[str, float | None] = {"since": None}

        def deadline(missing: np.ndarray) -> np.ndarray:
            if missing.size == 0:
                state["since"] = None
                return missing
            state["since"] = state["since"] or time.time()
            if time.time() - state["since"] > READY_DEADLINE_SECS:
                raise RecoveryError(
                    f"the model was not ready within {READY_DEADLINE_SECS:.0f} s: {missing.size} variables are "
                    "not initialised; is the chief running?"
                )
            return missing

        checked = tf.compat.v1.py_func(deadline, [names], tf.string, stateful=True, name="ec_ready_deadline")
        checked.set_shape([None])
        return lib.ec_rec_require_empty(checked, retry_micros=int(READY_RETRY_SECS * 1e6), name="ec_ready")

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
            sess = _TracingSession(sess, os.environ[PROFILE_DIR_ENV])
        started = time.time()
        laps = _Phases()
        initialized = dict(zip((v.op.name for v in self.variables), sess.run(self._initialized)))
        # A PS without its marker is lost even if it holds variables (a rebuild or restore cut mid-way).
        broken = {p for p, marker in self._whole.items() if not initialized[marker.op.name]}
        missing = [v for v in self.variables if not initialized[v.op.name] or device_task(v.device) in broken]
        # A PS whose rows are still pending (a background rebuild cut by this session's creation).
        degraded = self._degraded(sess, [p for p in self._whole if p not in broken])
        laps.lap("inspect")
        if not missing:
            # Nothing was lost, but a task (the previous chief, say) may have died
            # mid-step: settle what it left in the logs.
            report = self.settle(sess)
            if degraded:
                _LOG.warning("resuming the background rebuild of PS %s", degraded)
                self._start_job(job_sess, self.rebuilder.resume_background(degraded), started)
            return self._done(RecoveryResult("none", [], background=bool(degraded)).settled(report), started, sess)
        fresh = self._marker is not None and not tf.io.gfile.exists(self._marker)
        everything = len([v for v in missing if v.op.name not in self._marker_names]) == len(self._model_variables)
        if everything or (fresh and restore is None):
            if restore is not None:
                restore()
                self.reconciler.discard(sess, self.reconciler_ps())
                self._reencode(sess)
                self.rebuilder.clear_views(sess, self.reconciler_ps(), options=self._long)
                self._mark_whole(sess, self._whole)
                return self._done(RecoveryResult("checkpoint", []), started, sess)
            if self._marker is not None and not fresh:
                raise RecoveryError(
                    f"every variable on every PS is gone, the job had started ({self._marker} exists) and there is "
                    "no checkpoint: training cannot go on from where it was. Run with checkpoints "
                    "(--checkpoint-steps/--checkpoint-secs), or delete the marker to start over from scratch."
                )
            # A fresh start, possibly cut mid-way (a partly initialised cluster): initialise it all.
            self._initialise(sess)
            self._mark_whole(sess, self._whole)
            if self._marker is not None:
                tf.io.gfile.makedirs(os.path.dirname(self._marker))
                with tf.io.gfile.GFile(self._marker, "w") as f:
                    f.write(f"initialised at {time.time():.0f}\n")
            return self._done(RecoveryResult("init", []), started, sess)
        lost = sorted({device_task(v.device) for v in missing})
        missing = [v for v in missing if v.op.name not in self._marker_names]
        # A PS still being rebuilt holds rows that are not there yet: it is rebuilt again with
        # the lost ones (from the survivors' state now), though its log is alive and settled.
        rebuilt = sorted(set(lost) | set(degraded))
        _LOG.warning("rebuilding %d variables of lost PS %s%s", len(missing), lost,
                     f" and PS {degraded}, whose rebuild was not done" if degraded else "")
        reason = self._unrecoverable(missing, rebuilt)
        if reason is None:
            alive = [p for p in self.reconciler_ps() if p not in lost]
            # Older trainers (a PS moved) may no longer write; then settle the steps the
            # failure cut and roll the lost variables' parity back to their committed
            # prefix (tf_ecrec.steplog) before decoding.
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
            result = RecoveryResult("parity", rebuilt, stats.variables, stats.bytes, background=self.background)
            result.settled(report)
            if self.background:
                self._start_job(job_sess, job, started, result)
            return self._done(result, started, sess, laps)
        if restore is None:
            raise RecoveryError(
                f"PS {lost} lost {len(missing)} variables and {reason}; there is no checkpoint to fall back to. "
                "Run with checkpoints (--checkpoint-steps/--checkpoint-secs) to survive this."
            )
        _LOG.warning("PS %s lost and %s: restoring every variable from the checkpoint", lost, reason)
        restore()
        self.reconciler.discard(sess, [p for p in self.reconciler_ps() if p not in lost])
        laps.lap("restore")
        self._reencode(sess)
        laps.lap("reencode")
        self.rebuilder.clear_views(sess, self.reconciler_ps(), options=self._long)
        self._mark_whole(sess, lost)
        laps.lap("mark")
        return self._done(RecoveryResult("checkpoint", lost), started, sess, laps)

    # ---- the background rebuild ---------------------------------------------------------------------------

    @property
    def job(self) -> BackgroundRebuild | None:
        """The background rebuild of the current session, if one is under way (or finished)."""
        return self._job

    def _degraded(self, sess: tf.compat.v1.Session, tasks: Sequence[int]) -> list[int]:
        stats = self.rebuilder.view_stats(sess, tasks)
        return sorted(p for p, v in stats.items() if int(v[0]) > 0)

    def _start_job(self, sess: tf.compat.v1.Session, job: BackgroundRebuild, started: float,
                   first: RecoveryResult | None = None) -> None:
        """Runs `job` on the chief's threads (or leaves it to the caller: ``threads=False``); reports its end."""

        def done(j: BackgroundRebuild) -> None:
            result = RecoveryResult("rebuilt", list(j.lost), j.stats.variables, j.stats.bytes,
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
    """Whether a background rebuild runs on threads; the fault-schedule harness sets it False and
    drives `job`'s steps itself, then calls `finish_job`."""

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
        if ops:
            sess.run(ops, options=self._long)

    def _done(self, result: RecoveryResult, started: float, sess: tf.compat.v1.Session,
              laps: _Phases | None = None) -> RecoveryResult:
        if self._step is not None:
            result.global_step = int(sess.run(self._step))
        if laps is not None:
            laps.lap("read_step")
            result.phases = dict(laps.seconds)
        result.seconds = time.time() - started
        if result.method in ("parity", "checkpoint"):
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

    def notify(self, result: RecoveryResult) -> None:
        """Hands a result to the listener (the background settlement's, for instance)."""
        if self._listener is not None:
            self._listener(result)

    # ---- what can be rebuilt ---------------------------------------------------------------------------

    def _protected_names(self) -> set[str]:
        opt = self._opt
        names = set()
        for coll in self._colls:
            for p, var in coll.data.items():
                names.add(var.op.name)
                names.update(s.op.name for s in opt.slots_of(var))
            names.update(v.op.name for v in opt.parity[coll.name].values())
        for name, reps in opt.replicas.items():
            names.add(name)
            names.update(r.op.name for r in reps)
            names.update(s.op.name for s in opt.slots_of(opt.protected[name]))
        return names

    def _unrecoverable(self, missing: Sequence[tf.Variable], lost: Sequence[int]) -> str | None:
        unprotected = [v.op.name for v in missing if v.op.name not in self.protected_names]
        if unprotected:
            return f"these lost variables have no parity or replica: {unprotected[:5]}"
        lost_set = set(lost)
        for coll in self._colls:
            for stripe in coll.table_layout.unrecoverable_stripes(lost_set, coll.ec.r):
                gone = sum(p in lost_set for p in stripe.ps)
                return f"stripe {stripe.index} of {coll.name!r} lost {gone} chunks and the code {coll.ec} rebuilds {coll.ec.r}"
        for name, reps in self._opt.replicas.items():
            copies = [self._opt.protected[name]] + reps
            if all(device_task(c.device) in lost_set for c in copies):
                return f"{name} and all {len(reps)} of its replicas were lost"
        return None

    # ---- rebuilding ---------------------------------------------------------------------------

    def _reencode(self, sess: tf.compat.v1.Session) -> None:
        """Re-encodes every parity and replica from the data (after a checkpoint restore)."""
        self.rebuilder.reencode(sess, options=self._long)


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

    def __init__(self, plan: RecoveryPlan, interval_secs: float = 1.0, stale_secs: float = 5.0) -> None:
        if interval_secs <= 0 or stale_secs <= 0:
            raise ValueError(f"interval_secs and stale_secs must be > 0, got {interval_secs}, {stale_secs}")
        self._plan = plan
        self._interval = interval_secs
        self._stale = stale_secs
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def after_create_session(self, session: tf.compat.v1.Session, coord: Any) -> None:  # noqa: D102
        self._stop_thread()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(session, self._stop), name="ec-stale-step-settler", daemon=True)
        self._thread.start()

    def end(self, session: tf.compat.v1.Session) -> None:  # noqa: D102
        self._stop_thread()

    def _stop_thread(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=30.0)
            self._thread = None

    def _run(self, session: tf.compat.v1.Session, stop: threading.Event) -> None:
        while not stop.wait(self._interval):
            try:
                report = self._plan.reconciler.settle_stale(session, self._plan.reconciler_ps(), self._stale)
            except RuntimeError:
                return  # the session was closed
            except tf.errors.OpError as exc:
                _LOG.debug("stale-step settlement skipped a round: %s", exc.message.splitlines()[0])
                continue
            if report is not None:
                self._plan.notify(RecoveryResult("settled", []).settled(report))


class SettleAtEndHook(tf.compat.v1.train.SessionRunHook):
    """On the chief, at the end of training, settles steps other tasks left in the logs.

    A worker that died mid-step leaves its step's entries behind; finishing
    them at the end leaves parity exact for the final check (and for the
    next job that restarts from this state).
    """

    def __init__(self, plan: RecoveryPlan) -> None:
        self._plan = plan

    def end(self, session: tf.compat.v1.Session) -> None:
        if not self._plan.wait_background(timeout=LONG_OP_TIMEOUT_MS / 1000):
            _LOG.warning("training ended while a background rebuild was not done; the next start resumes it")
        try:
            self._plan.settle(session)
        except tf.errors.OpError as exc:  # a PS is gone at the very end: the next recovery settles it
            _LOG.warning("could not settle pending steps at the end of training: %s", exc.message.splitlines()[0])


class LongDeadlineSaver(tf.compat.v1.train.Saver):
    """The stock Saver, with saves and restores under `LONG_OP_TIMEOUT_MS` instead of the session's timeout.

    The session's operation timeout is there to end waits on a dead task; it
    must not cut the save or the restore of a large model (at 4 GB of tables
    a save takes longer than the default 10 s).
    """

    def save(self, sess: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: D102 - see class docstring
        return super().save(_LongDeadline(sess), *args, **kwargs)

    def restore(self, sess: tf.compat.v1.Session, save_path: str) -> None:  # noqa: D102 - see class docstring
        self._restore(sess, save_path)

    def _restore(self, sess: tf.compat.v1.Session, save_path: str) -> None:
        """The stock restore op, run under the long deadline instead of the session's."""
        _LOG.info("Restoring parameters from %s", save_path)
        sess.run(
            self.saver_def.restore_op_name, {self.saver_def.filename_tensor_name: save_path},
            options=tf.compat.v1.RunOptions(timeout_in_ms=LONG_OP_TIMEOUT_MS),
        )


class ECSaver(LongDeadlineSaver):
    """A Saver whose restore() rebuilds from parity when it can, and restores the checkpoint only when it must.

    Saving is the stock Saver's, under the long deadline (`LongDeadlineSaver`).
    `SessionManager` calls ``restore`` when the model dir has a checkpoint;
    the decision is `RecoveryPlan.prepare`'s.
    """

    def __init__(self, plan: RecoveryPlan, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._plan = plan

    def save(self, sess: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: D102 - see class docstring
        # Rows still pending on a PS being rebuilt read as zeros: a checkpoint waits for the rebuild.
        if not self._plan.wait_background(timeout=LONG_OP_TIMEOUT_MS / 1000):
            raise RecoveryError("a checkpoint cannot be saved while a lost PS's rows are still being rebuilt")
        return super().save(sess, *args, **kwargs)

    def restore(self, sess: tf.compat.v1.Session, save_path: str) -> None:  # noqa: D102 - see class docstring
        self._plan.prepare(sess, restore=lambda: self._restore(sess, save_path))


def long_deadline_scaffold(base: tf.compat.v1.train.Scaffold | None = None) -> tf.compat.v1.train.Scaffold:
    """A Scaffold for unprotected training whose initialisation, saves and restores run under
    `LONG_OP_TIMEOUT_MS` (keeps `base`'s local init and summary ops); build it in the model_fn."""
    init = tf.compat.v1.global_variables_initializer()
    long = tf.compat.v1.RunOptions(timeout_in_ms=LONG_OP_TIMEOUT_MS)
    kwargs: dict[str, Any] = {}
    if base is not None:
        kwargs = {"local_init_op": base.local_init_op, "summary_op": base.summary_op}
    return tf.compat.v1.train.Scaffold(
        init_op=tf.no_op(name="long_deadline_init_op"),
        init_fn=lambda scaffold, sess: sess.run(init, options=long),
        saver=LongDeadlineSaver(sharded=True, max_to_keep=3, save_relative_paths=True),
        **{k: v for k, v in kwargs.items() if v is not None},
    )


def long_deadline_model_fn(model_fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps an Estimator model_fn so that, in training, its Scaffold is `long_deadline_scaffold`."""
    import inspect

    accepted = set(inspect.signature(model_fn).parameters)

    def wrapped(features: Any, labels: Any, mode: str, params: Any, config: Any) -> Any:
        kwargs = {"features": features, "labels": labels, "mode": mode, "params": params, "config": config}
        spec = model_fn(**{k: v for k, v in kwargs.items() if k in accepted})
        if mode == tf.estimator.ModeKeys.TRAIN:
            spec = spec._replace(scaffold=long_deadline_scaffold(spec.scaffold))
        return spec

    return wrapped


class _LongDeadline(tf_session.SessionInterface):
    """A session whose calls without their own `RunOptions` run under `LONG_OP_TIMEOUT_MS`."""

    def __init__(self, sess: Any) -> None:
        self._sess = sess

    @property
    def graph(self) -> tf.Graph:
        return self._sess.graph

    @property
    def sess_str(self) -> str:
        return getattr(self._sess, "sess_str", "")

    def run(self, fetches: Any, feed_dict: Any = None, options: Any = None, run_metadata: Any = None) -> Any:
        if options is None:
            options = tf.compat.v1.RunOptions(timeout_in_ms=LONG_OP_TIMEOUT_MS)
        return self._sess.run(fetches, feed_dict=feed_dict, options=options, run_metadata=run_metadata)

    def partial_run_setup(self, *args: Any, **kwargs: Any) -> Any:
        return self._sess.partial_run_setup(*args, **kwargs)

    def partial_run(self, *args: Any, **kwargs: Any) -> Any:
        return self._sess.partial_run(*args, **kwargs)


class _TracingSession(_LongDeadline):
    """Runs every call fully traced; appends ``{label, wall_s, ops_s}`` per call to
    ``recovery_calls.jsonl`` in `directory` and writes each call's Chrome trace there.

    ``ops_s`` is the span from the first op's start to the last op's end on any
    device; ``wall_s - ops_s`` is what the call spent elsewhere (pruning,
    partitioning and registering its graph on each PS in a new session, RPCs).
    """

    _count = 0

    def __init__(self, sess: Any, directory: str) -> None:
        super().__init__(sess)
        self._dir = directory
        os.makedirs(directory, exist_ok=True)

    def run(self, fetches: Any, feed_dict: Any = None, options: Any = None, run_metadata: Any = None) -> Any:
        from tensorflow.python.client import timeline

        traced = tf.compat.v1.RunOptions()
        if options is not None:
            traced.CopyFrom(options)
        traced.trace_level = tf.compat.v1.RunOptions.FULL_TRACE
        traced.output_partition_graphs = True
        meta = run_metadata if run_metadata is not None else tf.compat.v1.RunMetadata()
        t = time.perf_counter()
        out = self._sess.run(fetches, feed_dict=feed_dict, options=traced, run_metadata=meta)
        wall = time.perf_counter() - t
        starts = [n.all_start_micros for d in meta.step_stats.dev_stats for n in d.node_stats]
        ends = [n.all_start_micros + n.all_end_rel_micros for d in meta.step_stats.dev_stats for n in d.node_stats]
        _TracingSession._count += 1
        n = _TracingSession._count
        label = ",".join(sorted({getattr(f, "name", str(f)).split("/")[0] for f in tf.nest.flatten(fetches)}))[:200]
        with open(os.path.join(self._dir, "recovery_calls.jsonl"), "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"call": n, "pid": os.getpid(), "label": label, "wall_s": round(wall, 4),
                                 "ops_s": round((max(ends) - min(starts)) / 1e6, 4) if starts else 0.0,
                                 "devices": len(meta.step_stats.dev_stats),
                                 "partition_nodes": sum(len(g.node) for g in meta.partition_graphs),
                                 "partition_mb": round(sum(g.ByteSize() for g in meta.partition_graphs) / 1e6, 3)})
                     + "\n")
        with open(os.path.join(self._dir, f"recovery_call_{os.getpid()}_{n}.json"), "w", encoding="utf-8") as fh:
            fh.write(timeline.Timeline(meta.step_stats).generate_chrome_trace_format())
        return out


def scaffold_for(plan: RecoveryPlan, base: tf.compat.v1.train.Scaffold | None = None,
                 chief: bool = False) -> tf.compat.v1.train.Scaffold:
    """The Scaffold that routes session creation through `plan` (keeps `base`'s other fields).

    On the `chief`, the ready ops report nothing: its session creation runs
    `plan.prepare`, which leaves every variable whole or raises, so checking
    again would only cost the chief's resumption a first call across every PS.
    """
    if chief:
        ready = tf.constant([], tf.string, name="ec_ready_after_prepare")
    else:
        ready = plan.raising_ready_op()
    saver = ECSaver(plan, sharded=True, max_to_keep=3, save_relative_paths=True)
    kwargs: dict[str, Any] = {}
    if base is not None:
        kwargs = {
            "local_init_op": base.local_init_op,
            "summary_op": base.summary_op,
            "copy_from_scaffold": None,
        }
        kwargs.pop("copy_from_scaffold")
    return tf.compat.v1.train.Scaffold(
        init_op=tf.no_op(name="ec_init_op"),
        init_fn=lambda scaffold, sess: plan.prepare(sess, restore=None),
        ready_op=ready,
        ready_for_local_init_op=ready,
        saver=saver,
        **{k: v for k, v in kwargs.items() if v is not None},
    )
