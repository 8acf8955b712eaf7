"""A fault-schedule harness for the settlement protocol (docs/settlement.md), with an oracle.

Real parts: an in-process TensorFlow PS cluster, the real graph of
`tf_ecrec.ECOptimizer` and the real `RecoveryPlan` / `Reconciler`.  What is
simulated is only *when* things happen: several asynchronous workers' steps
are driven one op at a time (`ECOptimizer.program`: each phase runs alone by
feeding its inputs), interleaved at random, and failures are injected
between any two ops:

* a worker dies (its step is abandoned wherever it was);
* the chief settles dead workers' steps (the stale-step settlement), or
  restarts (a full settlement that fences every step in flight);
* one PS, or two at once, lose every variable and their delta log (the
  resources are destroyed, as a restart at the same address does), then
  the chief recovers, possibly crashing after any number of its session
  calls, or losing another PS in the middle, and recovers again;
* the cluster generation is raised (a PS moved): trainers still on the old
  generation keep trying to train;
* with ``background=True``, a recovery rebuilds the lost table rows while the
  workers go on (`tf_ecrec.rebuild.background.BackgroundRebuild`): the harness installs
  the walk's slices one at a time between any two ops, and a worker's step
  whose lookups wait for pending rows runs on a thread while the harness
  installs what those lookups ask for (the chief's "wanted" loop); kills,
  chief crashes and restarts land in the middle of it as anywhere else;
* the chief dies *inside* a rebuild call (`cut_rebuild_call`, and crashes
  during recovery that land on the T0 call): some of the call's ops ran,
  the others did not (a slice installed on one lost PS and not on the
  other, some survivors' preservation ended and not the others'); the
  chief's next session settles and resumes.

The oracle: every apply's delta is recorded as it returns, so for each row
of each protected variable (value and slots, as words) the harness knows the
sequence of states real updates took it through.  After every settlement
and recovery (and at the end of a background rebuild; while one runs, rows
of the PS being rebuilt are not read: a pending row reads as zeros) it
checks that each row holds one of them (invariant ii: whole updates only), that no step whose commit returned OK lost its update
(iii), that old-generation trainers changed nothing (vi), and, whenever no
step is in flight, that every stripe's parity and every replica equals the
code of the data bit for bit (i), and, at every full settlement (no rebuild
under way then), that no PS has a pending row or keeps a saved T0 row.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

import tf_ecrec
from harness import fold_rounds
from harness.rig_state import Snapshot
from tf_ecrec.base.retry import duplicate_request
from tf_ecrec.check.verify import check_parity
from tf_ecrec.erasure import codec
from tf_ecrec.errors import RecoveryError
from tf_ecrec.layout.device import ps_index
from tf_ecrec.recovery.graph import WHOLE_MARKERS
from tf_ecrec.recovery.plan import RecoveryPlan
from tf_ecrec.recovery.scaffold import raising_ready_op
from tf_ecrec.step.embedding import ECContext, set_context
from tf_ecrec.step.step_program import GENERATION_SHIFT, TargetKind

TABLES = [("a", 48), ("b", 12)]
DIM = 4
BATCH = 8
ACTION_TIMEOUT_MS = 20_000
SLICE_BYTES = 128  # a few rows per slice: a background walk takes several ticks
WANTED_WAIT_MS = 20


HUNG_GRACE_SECS = 60.0  # past an action's deadline: TensorFlow did not end it


class HungAction(Exception):
    """An action's run did not return although its deadline passed long ago (a wait no cancellation ends)."""


class InjectedCrash(Exception):
    """The chief 'died' in the middle of a recovery."""


def rebuild_call(fetches: Any) -> bool:
    """Whether a session call runs several ops of the rebuild (`tf_ecrec.rebuild`), and nothing else."""
    return (isinstance(fetches, (list, tuple)) and len(fetches) > 1
            and all(getattr(f, "name", "").startswith("ec_rebuild/") for f in fetches))


class _CrashingSession:
    """Passes `after` session calls through, then runs `on_crash` and raises InjectedCrash.

    With `cut`, a crashing call that is a rebuild call of several ops (`rebuild_call`: a T0, a slice
    of the walk, a round of the wanted rows, a rebuild's finish) is cut inside: the ops `cut(ops)`
    picks run (they are independent: TensorFlow runs them in any order), the others do not, and then
    the chief dies.  Outside rebuild calls the crash falls between two calls.
    """

    def __init__(self, sess: tf.compat.v1.Session, after: int, on_crash: Callable[[], None] | None = None,
                 cut: Callable[[list[Any]], list[Any]] | None = None) -> None:
        self._sess, self._left, self._on_crash, self._cut = sess, after, on_crash, cut

    def disarm(self) -> None:
        """The chief did not die after all: later calls (a background rebuild's end) pass through."""
        self._left = float("inf")

    def run(self, fetches: Any, feed_dict: Any = None, **kwargs: Any) -> Any:
        if self._left <= 0:
            if self._cut is not None and rebuild_call(fetches):
                ran = self._cut(list(fetches))
                if ran:
                    self._sess.run(ran, feed_dict, **kwargs)
            if self._on_crash is not None:
                self._on_crash()
            raise InjectedCrash()
        self._left -= 1
        return self._sess.run(fetches, feed_dict, **kwargs)


class Rig:
    """The graph of one sequence: model, optimizer, recovery plan, and per-PS destroy ops."""

    def __init__(self, k: int, r: int, num_ps: int, optimizer: str = "adagrad", reconciler_cls: type | None = None,
                 background: bool = False, rebuilder_cls: type | None = None, atomic: bool = False,
                 flash_dir: str | None = None, carried: bool = False, batched: bool = False) -> None:
        self.k, self.r, self.num_ps = k, r, num_ps
        self.graph = tf.Graph()
        with self.graph.as_default(), tf.compat.v1.device(tf_ecrec.ECDeviceFn(num_ps=num_ps, worker_device="/job:chief")):
            tf.compat.v1.set_random_seed(11)
            step = tf.compat.v1.train.get_or_create_global_step()
            self.step_name = step.op.name
            set_context(ECContext(tf_ecrec.ECConfig(k, r), num_ps))
            coll = tf_ecrec.EmbeddingCollection("h", TABLES, DIM)
            self.ids = tf.compat.v1.placeholder(tf.int64, [None, len(TABLES)], name="ids")
            emb = tf.reshape(coll.lookup_all(self.ids), [-1, DIM * len(TABLES)])
            out = tf.keras.layers.Dense(1, kernel_initializer=tf.compat.v1.glorot_uniform_initializer())(emb)
            loss = tf.reduce_mean(tf.square(out - 1.0))
            base = {
                "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.2),
                "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.2),
                "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
            }[optimizer]()
            # The step program the harness drives op by op: the commit rounds built on the carried step id
            # (`carried`: the Estimator jobs' graph) or on the step's own.
            # (`batched`: a step is its applies and count, its folds and commit in fold rounds.)
            commit = "batched" if batched else "carried" if carried else "in_step"
            self.opt = tf_ecrec.ECOptimizer(base, commit_timeout_ms=0, commit=commit)
            self.opt.minimize(loss, global_step=step)
            self.coll = coll
            self.plan = RecoveryPlan(self.opt, background=background, slice_bytes=SLICE_BYTES)
            self.plan.run_threads = False  # the harness drives a background rebuild's steps itself
            if rebuilder_cls is not None:  # a deliberately broken rebuild, to test the oracle
                self.plan.rebuilder = rebuilder_cls(self.opt, self.plan._colls, slice_bytes=SLICE_BYTES)
            self.ready = raising_ready_op(self.plan)  # what the workers' sessions wait on
            if reconciler_cls is not None:  # a deliberately broken protocol, to test the oracle
                self.plan.reconciler = reconciler_cls(
                    self.opt.targets, self.opt.logs, self.opt.expected_folds, commit_timeout_ms=0
                )
            self.flash = None
            if flash_dir is not None:  # flash checkpoints (tests/harness/flash_schedule.py drives them)
                from tf_ecrec.flash.config import FlashConfig
                from tf_ecrec.flash.snapshots import FlashSnapshots

                self.flash = FlashSnapshots(FlashConfig(every_steps=1, shm_dir=flash_dir + "/shm"), flash_dir + "/model",
                                            self.opt.logs, num_ps, num_trainers=1)
                self.plan.flash = self.flash
            markers = tf.compat.v1.get_collection(WHOLE_MARKERS)  # a PS's "state is whole" markers
            self.init = tf.group(tf.compat.v1.global_variables_initializer(), *[m.initializer for m in markers])
            self.variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
            self.destroy = {}
            for p in range(num_ps):
                ops = [
                    tf.raw_ops.DestroyResourceOp(resource=v.handle, ignore_lookup_error=True)
                    for v in [*self.variables.values(), *markers] if ps_index(v.device) == p
                ]
                if self.flash is not None:  # the shadows (and PS 0's gate) live in the PS process too
                    ops += [tf.raw_ops.DestroyResourceOp(resource=h, ignore_lookup_error=True) for h in self.flash.resources(p)]
                with tf.device(self.opt.logs[p].device):
                    ops.append(tf.raw_ops.DestroyResourceOp(resource=self.opt.logs[p], ignore_lookup_error=True))
                self.destroy[p] = tf.group(*ops)
            # Words of every apply target (var + slots), the rows the oracle follows.
            self.data_targets = {tid: t for tid, t in self.opt.targets.items() if t.kind == TargetKind.DATA}
            self.words = {
                tid: tf.concat([tf.reshape(v.read_value(), [int(v.shape[0]), -1]) for v in t.variables], axis=1)
                for tid, t in self.data_targets.items()
            }
            # Every PS's resources at once: a sequence's start on the session it keeps (`session`).
            self.destroy_all = tf.group(*self.destroy.values())
        self.graph.finalize()
        self._session: tuple[str, tf.compat.v1.Session] | None = None
        self.program = self.opt.program
        self.fold_round = self.opt.carried_commit.round if batched else None

    def session(self, target: str) -> tf.compat.v1.Session:
        """An initialised session on `target` on which nothing of an earlier sequence is left.

        The first time, the servers are reset and a session made.  It is kept for the next sequence of this
        graph, which gets it with every PS resource of the graph destroyed (as if every PS had restarted,
        which is what a kill in a sequence does to one) and initialised again: a new session would register
        each of the ~70 distinct calls of a sequence with the servers again, about a third of its time.  A
        kept session that no longer works (another graph's sequence reset the servers) is replaced.
        """
        if self._session is not None and self._session[0] == target:
            sess = self._session[1]
            try:
                sess.run(self.destroy_all)
                sess.run(self.init)
                return sess
            except tf.errors.OpError:
                self.drop_session()
        tf.compat.v1.Session.reset(target)
        # Every call without RunOptions of its own (settlement, recovery, reads) under the deadline the chief's
        # own calls have in a launched job (its session's operation timeout): without one, a session call
        # whose partition never answered waited for good (seen three times in full runs under load: the
        # stale settlement's session call sat in RunPartitions with no thread of any partition running).
        config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=ACTION_TIMEOUT_MS)
        sess = tf.compat.v1.Session(target, graph=self.graph, config=config)
        sess.run(self.init)
        self._session = (target, sess)
        return sess

    def drop_session(self) -> None:
        """Closes the kept session (a sequence that ended in an exception may have left calls running)."""
        if self._session is not None:
            _, sess = self._session
            self._session = None
            try:
                sess.close()
            except tf.errors.OpError:  # its master forgot it already (the servers were reset)
                pass

    def read_words(self, sess: tf.compat.v1.Session) -> dict[int, np.ndarray]:
        values = sess.run(self.words)
        return {tid: np.ascontiguousarray(v).view(np.int32) for tid, v in values.items()}


class Oracle:
    """Per row of each apply target: the states real updates took it through."""

    def __init__(self, initial: dict[int, np.ndarray], atomic: bool = False) -> None:
        # tid -> row -> list of (words, sid that produced it or 0)
        self.history: dict[int, dict[int, list[tuple[np.ndarray, int]]]] = {
            tid: {row: [(words[row].copy(), 0)] for row in range(words.shape[0])} for tid, words in initial.items()
        }
        # With `atomic` (one writer: nothing can overtake a step, so settlement can always undo a cut
        # step whole), a step whose update was taken out of one row must not stay in any other.
        self.atomic = atomic
        self.dropped: set[int] = set()

    def applied(self, tid: int, rows: np.ndarray, delta: np.ndarray, sid: int) -> None:
        for i, row in enumerate(np.asarray(rows, dtype=np.int64)):
            chain = self.history[tid][int(row)]
            chain.append((chain[-1][0] ^ delta[i], sid))

    def check(self, values: dict[int, np.ndarray], ok: set[int], where: str,
              pending: dict[int, np.ndarray] | None = None) -> list[str]:
        """Each row must hold a state of its history, no later than every OK step's; truncates
        each history at the state found (what comes after it was undone or rolled back).
        Rows marked in `pending` (per target, a mask) are not checked now."""
        problems = []
        pending = pending or {}
        for tid, rows in self.history.items():
            for row, chain in rows.items():
                if tid in pending and pending[tid][row]:
                    continue
                value = values[tid][row]
                match = next((j for j in range(len(chain) - 1, -1, -1) if np.array_equal(chain[j][0], value)), None)
                if match is None:
                    problems.append(f"{where}: target {tid} row {row} holds a value no sequence of its updates produced")
                    continue
                lost_ok = [sid for _, sid in chain[match + 1 :] if sid in ok]
                if lost_ok:
                    problems.append(f"{where}: target {tid} row {row} lost the update of OK step {lost_ok[0]}")
                self.dropped.update(sid for _, sid in chain[match + 1 :])
                del chain[match + 1 :]
        if self.atomic:
            kept = {sid for rows in self.history.values() for chain in rows.values() for _, sid in chain}
            for sid in sorted((kept & self.dropped) - {0}):
                problems.append(f"{where}: step {sid} was undone in some rows and kept in others (a partial step)")
                self.dropped.discard(sid)
        return problems


@dataclasses.dataclass
class _Step:
    sid: int
    feed: dict
    actions: list[tuple[str, Any]]
    results: dict = dataclasses.field(default_factory=dict)
    wrote: bool = False  # an apply, fold or count of it took effect (its entries are in a log until settled)
    commit: list = dataclasses.field(default_factory=list)  # carried mode: its rounds, run with the next step


@dataclasses.dataclass
class _Worker:
    wid: int
    generation: int
    step: _Step | None = None
    zombie: bool = False
    carried: _Step | None = None  # returned, its commit runs with the worker's next step (not durable yet)
    returned: list[_Step] = dataclasses.field(default_factory=list)  # batched: returned, not durable yet
    round: Any = None  # batched: the fold round the worker's run is (harness.fold_rounds.Round)


@dataclasses.dataclass
class Stats:
    """What a sequence (or a soak) did."""

    sequences: int = 0
    actions: int = 0
    steps_ok: int = 0
    steps_returned: int = 0
    returned_not_durable: int = 0
    fold_rounds: int = 0
    steps_failed: int = 0
    worker_kills: int = 0
    ps_kills: int = 0
    double_ps_kills: int = 0
    chief_crashes: int = 0
    second_failures: int = 0
    chief_restarts: int = 0
    stale_settlements: int = 0
    generation_bumps: int = 0
    zombie_writes_refused: int = 0
    background_rebuilds: int = 0
    rebuild_cuts: int = 0
    slices_installed: int = 0
    rows_asked_by_lookups: int = 0
    parity_checks: int = 0
    unrecoverable: int = 0
    chief_call_deadlines: int = 0  # a chief-side call cut by its deadline: the chief restarted (a full settlement)
    chief_call_duplicates: int = 0  # one refused as delivered twice by gRPC's retry: the same restart
    violations: list[str] = dataclasses.field(default_factory=list)

    def add(self, other: Stats) -> None:
        for f in dataclasses.fields(self):
            if f.name == "violations":
                self.violations.extend(other.violations)
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


# Rigs kept per process, by their arguments, the most recently used last (`rig_for`).
_RIGS: collections.OrderedDict[tuple, tuple[Rig, Snapshot]] = collections.OrderedDict()
RIGS_KEPT = 8
FRESH_RIGS_ENV = "TF_ECREC_HARNESS_FRESH_RIGS"  # "1": every sequence builds its own graph (to rule the cache out)


def rig_for(*args: Any, **kwargs: Any) -> Rig:
    """A Rig built with these arguments, in the Python state it was built in (`harness.rig_state`).

    The graph of a configuration is built once per process and kept (the last `RIGS_KEPT`); a sequence
    that asks for it again gets it with every object of ours put back as built.
    """
    key = (args, tuple(sorted(kwargs.items())))
    if os.environ.get(FRESH_RIGS_ENV) == "1":
        return Rig(*args, **kwargs)
    if key in _RIGS:
        _RIGS.move_to_end(key)
        rig, snapshot = _RIGS[key]
        snapshot.restore()
        return rig
    rig = Rig(*args, **kwargs)
    # The session outlives the sequences (`Rig.session`), the Python state does not.
    _RIGS[key] = (rig, Snapshot(rig, graph=rig.graph, keep=("_session",)))
    while len(_RIGS) > RIGS_KEPT:
        _RIGS.popitem(last=False)
    return rig


def snapshot_of(rig: Rig) -> Snapshot:
    """The built state `rig_for` puts `rig` back to (KeyError: a Rig it does not keep)."""
    return next(snapshot for kept, snapshot in _RIGS.values() if kept is rig)


class Sequence:
    """One seeded failure sequence on its configuration's graph (`rig_for`; the cluster's resources are reset
    first)."""

    def __init__(self, target: str, seed: int, k: int = 2, r: int = 1, num_ps: int = 3, workers: int = 3,
                 ticks: int = 800, optimizer: str = "adagrad", reconciler_cls: type | None = None,
                 background: bool = False, rebuilder_cls: type | None = None, atomic: bool = False,
                 flash_dir: str | None = None, carried: bool = False, rebuild_cut_weight: int = 2,
                 batched: bool = False) -> None:
        self.rng = np.random.default_rng(seed)
        # How often (against 500 step advances) the chief dies inside a call of a running background
        # rebuild; the rebuild-cut tests raise it to meet their coverage in fewer ticks.
        self.rebuild_cut_weight = rebuild_cut_weight
        # `carried`: a step's run ends after its count and its commit rounds run with the worker's next
        # step (tf_ecrec.step.carried_commit); a step is OK for the oracle once durable (its commit ran).
        self.carried = carried
        self.seed = seed
        self.target = target
        # `batched`: a step's run ends after its applies and count; a worker runs a fold round after every
        # `every` returned steps; a step is OK for the oracle once a round's query found it durable.
        self.batched = batched
        self.every = int(self.rng.integers(1, 5))
        self.check_ready = True  # False in a mutation test: rounds commit counted steps whether folded or not
        self.rig = rig_for(k, r, num_ps, optimizer, reconciler_cls, background, rebuilder_cls, flash_dir=flash_dir,
                           carried=carried, batched=batched)
        self.unsettled: set[int] = set()  # steps that wrote and ended without committing, not settled yet
        self.ticks = ticks
        # `atomic`: one worker that is never killed (one writer at a time), and the oracle also checks
        # that every cut step is undone or kept whole (docs/settlement.md, "Steps whole").
        if atomic and workers != 1:
            raise ValueError("atomic sequences have one worker")
        self.atomic = atomic
        self.workers = [_Worker(i, 0) for i in range(workers)]
        self.next_wid = workers
        self.generation = 0
        self.ok: set[int] = set()
        self.stats = Stats(sequences=1)
        self.sess: tf.compat.v1.Session | None = None

    # ---- running ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def start(self) -> Iterator[tf.compat.v1.Session]:
        """With a session on which nothing of an earlier sequence is left (`Rig.session`), initialised, and
        the oracle's initial states; the session is kept for the graph's next sequence unless this one
        ends in an exception."""
        self.sess = self.rig.session(self.target)
        self.oracle = Oracle(self.rig.read_words(self.sess), atomic=self.atomic)
        try:
            yield self.sess
        except BaseException:
            self.rig.drop_session()
            raise

    def run(self, stop: Callable[[Stats], bool] | None = None) -> Stats:
        """Runs up to `ticks` events, then drains the workers and settles; `stop` (given this sequence's
        stats so far) ends the events early, once the caller's coverage holds (the drain, settlement
        and checks still run)."""
        with self.start():
            for _ in range(self.ticks):
                if not self._tick():
                    return self.stats
                if stop is not None and stop(self.stats):
                    break
            self._drain()
            self._full_settle("end")
        return self.stats

    def _tick(self) -> bool:
        events = (
            ["advance"] * 500 + ["kill_worker"] * 3 + ["stale"] * 3 + ["chief_restart"] + ["kill_ps"] * 2
            + ["generation"] + ["quiesce"] + ["slice"] * 20 + ["cut_rebuild"] * self.rebuild_cut_weight
        )
        event = events[self.rng.integers(len(events))]
        if event == "slice" and self._job() is not None:
            self._install_slice()
        elif event == "cut_rebuild" and self._job() is not None:
            self.cut_rebuild_call()
        elif event in ("advance", "slice", "cut_rebuild"):
            self._advance(self.workers[self.rng.integers(len(self.workers))])
        elif event == "kill_worker" and not self.atomic:
            self._kill_worker()
        elif event == "stale":
            self._chief_call(self._settle_dead)
        elif event == "chief_restart":
            self._chief_call(lambda: self._full_settle("chief restart"))
        elif event == "kill_ps":
            return self._kill_ps()
        elif event == "generation":
            self._bump_generation()
        elif event == "quiesce":
            self._drain()
            self._full_settle("quiescent")
        return True

    # ---- worker steps ---------------------------------------------------------------------------

    def _new_step(self, worker: _Worker) -> _Step:
        sid = (worker.generation << GENERATION_SHIFT) | secrets.randbits(GENERATION_SHIFT)
        hot = np.minimum(self.rng.zipf(1.5, (BATCH, len(TABLES))) - 1, [[n - 1 for _, n in TABLES]])
        p = self.rig.program
        applies = list(p.applies)
        self.rng.shuffle(applies)
        # Applies in random order, each fold somewhere after its own apply (as TF runs them).
        order: list[tuple[str, Any]] = []
        for tid in applies:
            order.append(("apply", tid))
        folds = [("fold", (tid, i)) for tid in p.folds for i in range(len(p.folds[tid]))]
        for fold in folds:
            first = next(j for j, a in enumerate(order) if a == ("apply", fold[1][0]))
            order.insert(int(self.rng.integers(first + 1, len(order) + 1)), fold)
        tail = [("count", tid) for tid in p.counts]
        self.rng.shuffle(tail)
        r1 = [("round1", q) for q in p.round1]
        self.rng.shuffle(r1)
        r2 = [("round2", q) for q in p.round2]
        self.rng.shuffle(r2)
        if self.carried:
            return _Step(sid, {self.rig.ids: hot, p.sid: sid}, order + tail, commit=r1 + r2)
        return _Step(sid, {self.rig.ids: hot, p.sid: sid}, order + tail + r1 + r2)

    def _advance(self, worker: _Worker, flush: bool = False) -> None:
        """Runs one op of the worker's run: of its step, or of the commit its run carries (`flush`: the
        carried commit alone, as a trainer that ends runs it), or of its fold round (batched: a round
        once `every` steps returned, or with `flush` while any is not durable)."""
        if self.batched and worker.step is None and (worker.round is not None or len(worker.returned) >= self.every
                                                     or (flush and worker.returned)):
            self._advance_round(worker)
            return
        if worker.step is None and not (flush and worker.carried is not None):
            worker.step = self._new_step(worker)
        carried = worker.carried if worker.carried is not None and worker.carried.actions else None
        if carried is not None and (worker.step is None or not worker.step.actions or self.rng.random() < 0.5):
            step = carried
        else:
            step = worker.step
        kind, arg = step.actions[0]
        p = self.rig.program
        fetch: Any
        feed = dict(step.feed)
        if kind == "apply":
            fetch = p.applies[arg]
        elif kind == "fold":
            tid, i = arg
            indices, delta, seq = step.results[tid]
            a_indices, a_delta, a_seq = p.applies[tid]
            feed.update({a_indices: indices, a_delta: delta, a_seq: seq})
            fetch = p.folds[tid][i]
        elif kind == "count":
            gate, fetch = p.counts[arg]
            feed[gate] = 1
        else:
            gate, fetch = (p.round1 if kind == "round1" else p.round2)[arg]
            feed[gate] = step.sid
        self.stats.actions += 1
        try:
            out = self._run_action(fetch, feed, lookups=kind == "apply")
        except tf.errors.DeadlineExceededError:
            self.stats.violations.append(f"seed {self.seed}: {kind} {arg} of a step hung")
            self._abandon(worker)
            return
        except tf.errors.AbortedError as exc:
            if "cannot commit yet" in exc.message:
                # Round 1 waits behind an earlier step: the step's round-1 ops on the other
                # PS tasks run meanwhile (TF issues them together); try this one later.
                r1 = [a for a in step.actions if a[0] == "round1"]
                step.actions = r1[1:] + r1[:1] + [a for a in step.actions if a[0] != "round1"]
                return
            self.stats.steps_failed += 1
            self._abandon(worker)
            if worker.zombie:  # refused: the trainer notices and rebuilds on the current cluster
                self.stats.zombie_writes_refused += 1
                worker.zombie = False
                worker.generation = self.generation
            return
        if worker.zombie:
            self.stats.violations.append(f"seed {self.seed}: a trainer of an older generation wrote ({kind})")
        if kind == "apply":
            step.results[arg] = out
            self.oracle.applied(arg, out[0], out[1], step.sid)
        step.wrote = step.wrote or kind in ("apply", "fold", "count")
        step.actions.pop(0)
        self._end_run(worker)

    def _advance_round(self, worker: _Worker) -> None:
        """One op of the worker's fold round; the query ends it, and the steps it found durable are OK."""
        fr = self.rig.fold_round
        if worker.round is None:
            round_id = (worker.generation << GENERATION_SHIFT) | secrets.randbits(GENERATION_SHIFT)
            worker.round = fold_rounds.new_round(self.rng, fr, [s.sid for s in worker.returned], round_id)
        kind, arg = worker.round.actions[0]
        self.stats.actions += 1
        try:
            durable = fold_rounds.run_action(self.sess, fr, worker.round, kind, arg,
                                             tf.compat.v1.RunOptions(timeout_in_ms=ACTION_TIMEOUT_MS),
                                             check_ready=self.check_ready)
        except tf.errors.DeadlineExceededError:
            self.stats.violations.append(f"seed {self.seed}: {kind} {arg} of a fold round hung")
            self._abandon(worker)
            return
        except tf.errors.AbortedError:  # a round of an older generation is refused
            self.stats.steps_failed += 1
            self._abandon(worker)
            if worker.zombie:
                self.stats.zombie_writes_refused += 1
                worker.zombie = False
                worker.generation = self.generation
            return
        if worker.zombie and kind in ("fold", "commit"):
            self.stats.violations.append(f"seed {self.seed}: a fold round of an older generation wrote ({kind})")
        worker.round.actions.pop(0)
        if worker.round.actions:
            return
        worker.round = None
        self.stats.fold_rounds += 1
        done = set(durable or [])
        for step in [s for s in worker.returned if s.sid in done]:
            self.ok.add(step.sid)
            self.stats.steps_ok += 1
        worker.returned = [s for s in worker.returned if s.sid not in done]

    def _end_run(self, worker: _Worker) -> None:
        """The worker's run ended OK if its step and the commit it carried are done."""
        if (worker.step is not None and worker.step.actions) or (worker.carried is not None and worker.carried.actions):
            return
        if worker.carried is not None:  # its commit ran: durable
            self.ok.add(worker.carried.sid)
            self.stats.steps_ok += 1
            worker.carried = None
        if worker.step is None:
            return
        if self.batched:  # returned; a fold round makes it durable
            worker.returned.append(worker.step)
            self.stats.steps_returned += 1
        elif worker.step.commit:  # returned; the next run carries its commit
            worker.step.actions, worker.step.commit = worker.step.commit, []
            worker.carried = worker.step
            self.stats.steps_returned += 1
        else:
            self.ok.add(worker.step.sid)
            self.stats.steps_ok += 1
        worker.step = None

    def _run_action(self, fetch: Any, feed: dict, lookups: bool) -> Any:
        """Runs one op of a step within a deadline; while a background rebuild runs, an apply (whose forward
        lookups may wait for pending rows) runs on a thread of its own while the harness installs the rows
        those lookups ask for.

        The run carries its own deadline (`ACTION_TIMEOUT_MS`: TensorFlow cancels it then, and an op
        that waits must end on the cancellation). On its own thread, one still running
        `HUNG_GRACE_SECS` past it is a `HungAction`, named, not a wait without end. On this thread (the
        other actions) nothing but TensorFlow's deadline bounds it: ending the process instead (tried
        with `faulthandler`) ended an xdist worker in a clean-clone run, and xdist then waited for good.
        """
        options = tf.compat.v1.RunOptions(timeout_in_ms=ACTION_TIMEOUT_MS)
        job = self._job() if lookups else None
        if job is None:
            return self.sess.run(fetch, feed, options=options)
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["out"] = self.sess.run(fetch, feed, options=options)
            except BaseException as exc:  # re-raised on the harness's thread
                box["error"] = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        deadline = time.monotonic() + ACTION_TIMEOUT_MS / 1000 + HUNG_GRACE_SECS
        while thread.is_alive():
            if time.monotonic() > deadline:
                raise HungAction(f"seed {self.seed}: {fetch} did not return {HUNG_GRACE_SECS:.0f} s past its "
                                 f"{ACTION_TIMEOUT_MS} ms deadline")
            self.stats.rows_asked_by_lookups += job.install_wanted(self.sess, wait_ms=WANTED_WAIT_MS)
        if "error" in box:
            raise box["error"]
        return box["out"]

    def _job(self) -> Any:
        """The background rebuild under way, if any."""
        job = self.rig.plan.job
        return job if job is not None and not job.finished else None

    def _install_slice(self) -> None:
        job = self._job()
        if job.install_next_slice(self.sess):
            self.stats.slices_installed += 1
            return
        self.rig.plan.finish_job(self.sess)
        self._check("end of a background rebuild")

    def _complete_job(self) -> None:
        while self._job() is not None:
            self._install_slice()

    def _abandon(self, worker: _Worker) -> None:
        """The worker's run ends without committing (failed, hung or its worker died): its step, and the
        step whose commit the run carried (returned, never durable: its records are trained again)."""
        if worker.step is not None and worker.step.wrote:
            self.unsettled.add(worker.step.sid)
        if worker.carried is not None:
            self.unsettled.add(worker.carried.sid)
            self.stats.returned_not_durable += 1
        for step in worker.returned:  # batched: given up with the session, settled by the chief
            self.unsettled.add(step.sid)
            self.stats.returned_not_durable += 1
        worker.step = worker.carried = worker.round = None
        worker.returned = []

    def _settled_all(self) -> None:
        """Every pending step was settled (fenced, undone or finished, committed): none writes again."""
        self.unsettled.clear()
        for w in self.workers:
            for step in (w.step, w.carried, *w.returned):
                if step is not None:
                    step.wrote = False

    def _kill_worker(self) -> None:
        i = int(self.rng.integers(len(self.workers)))
        self._abandon(self.workers[i])
        self.workers[i] = _Worker(self.next_wid, self.generation)
        self.next_wid += 1
        self.stats.worker_kills += 1

    def _drain(self) -> None:
        """Lets every live, current worker finish its step (settling dead ones' steps it waits on)."""
        for _ in range(400):
            busy = [w for w in self.workers
                    if (w.step is not None or w.carried is not None or w.returned or w.round is not None) and not w.zombie]
            if not busy:
                break
            for w in busy:
                before = [len(s.actions) for s in (w.step, w.carried) if s is not None]
                rounds = self.stats.fold_rounds
                left = len(w.returned)
                self._advance(w, flush=True)
                if [len(s.actions) for s in (w.step, w.carried) if s is not None] == before and w.round is None \
                        and (self.stats.fold_rounds == rounds or len(w.returned) == left):
                    self._chief_call(self._settle_dead)  # blocked behind a dead step (or a round made nothing durable)
        for w in self.workers:
            if w.zombie:
                self._abandon(w)

    # ---- the chief ---------------------------------------------------------------------------

    def _live_sids(self) -> set[int]:
        return {s.sid for w in self.workers if not w.zombie for s in (w.step, w.carried, *w.returned) if s is not None}

    def _some_ops(self, ops: list[Any]) -> list[Any]:
        """The ops of a call that ran before the chief died inside it: any strict subset, at random."""
        n = int(self.rng.integers(0, len(ops)))
        return [ops[i] for i in sorted(self.rng.choice(len(ops), size=n, replace=False))]

    def cut_rebuild_call(self, pick: Callable[[list[Any]], list[Any]] | None = None) -> None:
        """The chief dies inside one call of the background rebuild, then its next session takes over.

        The call is the walk's next slice (or, sometimes, a round of the wanted rows), or the finish
        once the walk is done; `pick` (default: a random strict subset) chooses which of its ops ran.
        The next session settles and resumes the rebuild where the PS state says it is.
        """
        job = self._job()
        cut = _CrashingSession(self.sess, 0, cut=pick or self._some_ops)
        try:
            if job.walked:
                self.rig.plan.finish_job(cut)
            elif pick is not None or self.rng.random() < 0.8:
                job.install_next_slice(cut)
            else:
                job.install_wanted(cut, wait_ms=0)
        except InjectedCrash:
            pass
        self.stats.rebuild_cuts += 1
        self.rig.plan.prepare(self.sess, restore=None)  # the chief's next session: settles, resumes the rebuild
        self._settled_all()
        self._check("restart after a rebuild call was cut")

    def _settle_dead(self) -> None:
        snaps = self.rig.plan.reconciler._snapshots(self.sess, list(range(self.rig.num_ps)))
        pending = {e.sid for s in snaps.values() for e in s.entries}
        dead = sorted(pending - self._live_sids())
        if self.carried and self.rng.random() < 0.3:
            # A trainer paused past the stale bound (a slow input, a long hook) with its returned step
            # uncommitted: settlement takes it too (it was counted: kept), and its carried commit then
            # finds it committed.
            dead = sorted(set(dead) | {w.carried.sid for w in self.workers if w.carried is not None and not w.zombie})
        if self.batched and self.rng.random() < 0.3:  # the same for a trainer's returned steps
            dead = sorted(set(dead) | {s.sid for w in self.workers if not w.zombie for s in w.returned})
        self.unsettled.clear()  # the dead steps with entries are settled now
        if dead:
            self.rig.plan.reconciler.settle(self.sess, range(self.rig.num_ps), only=dead)
            self.stats.stale_settlements += 1
            self._check("stale settlement")

    def _chief_call(self, action: Callable[[], None], attempts: int = 3) -> None:
        """Runs a chief-side `action`; one cut by its session deadline is what a launched chief meets when a
        call outlives its operation timeout, or one TensorFlow refuses as delivered twice: its session fails and
        the restarted chief settles everything. Past `attempts` such restarts in a row the deadline is the
        sequence's failure, named."""
        for attempt in range(attempts):
            try:
                if attempt == 0:
                    action()
                else:
                    self._full_settle("chief restart after a deadline")
                return
            except tf.errors.DeadlineExceededError:
                self.stats.chief_call_deadlines += 1
            except tf.errors.AbortedError as exc:
                # The transport delivered a call twice and TensorFlow refused the second (a CI run of
                # 2026-12-01, settlement's fold call): the launched chief's session fails on it as on a deadline.
                if not duplicate_request(exc):
                    raise
                self.stats.chief_call_duplicates += 1
        raise HungAction(f"seed {self.seed}: {attempts} chief calls in a row outlived their {ACTION_TIMEOUT_MS} ms "
                         "deadline or were refused as delivered twice")

    def _full_settle(self, where: str) -> None:
        self.rig.plan.prepare(self.sess, restore=None)  # nothing lost: a chief (re)start settles everything
        self._settled_all()
        self._complete_job()  # a rebuild the restart resumed ends here, so that parity can be checked
        self.stats.chief_restarts += where == "chief restart"
        self._check(where)
        self._check_parity(where)  # every step with a log entry was just settled
        self._check_views(where)

    def _kill_ps(self, lost: list[int] | None = None, scripted: bool = False) -> bool:
        if lost is None:
            n = 2 if self.rig.r >= 2 and self.rng.random() < 0.4 else 1
            lost = [int(p) for p in self.rng.choice(self.rig.num_ps, size=n, replace=False)]
        n = len(lost)
        for p in lost:
            self.sess.run(self.rig.destroy[p])
        self.stats.ps_kills += 1
        self.stats.double_ps_kills += n == 2
        for w in self.workers:  # every session fails when a PS dies
            if w.step is not None or w.carried is not None or w.returned or w.round is not None:
                self.stats.steps_failed += 1
                self._abandon(w)
        attempts = 0
        while True:
            attempts += 1
            sess: Any = self.sess
            roll = 1.0 if scripted else self.rng.random()
            if attempts < 4 and roll < 0.25:
                sess = _CrashingSession(self.sess, int(self.rng.integers(0, 24)), cut=self._some_ops)
                self.stats.chief_crashes += 1
            elif attempts < 4 and roll < 0.35:
                other = int(self.rng.integers(self.rig.num_ps))
                sess = _CrashingSession(self.sess, int(self.rng.integers(0, 24)), lambda: self.sess.run(self.rig.destroy[other]),
                                        cut=self._some_ops)
                self.stats.second_failures += 1
            try:
                self.result = self.rig.plan.prepare(sess, restore=None)
                if isinstance(sess, _CrashingSession):
                    sess.disarm()
                self._settled_all()
                break
            except InjectedCrash:
                continue
            except RecoveryError:
                self.stats.unrecoverable += 1  # more lost than the code covers: refused loudly
                return False
        self._check("recovery", t0=True)
        if self._job() is not None:
            self.stats.background_rebuilds += 1  # parity is checked at the next full settlement
        else:
            self._check_parity("recovery")
        return True

    def _bump_generation(self) -> None:
        self.generation += 1
        self.rig.plan.reconciler.set_generation(self.sess, range(self.rig.num_ps), self.generation)
        self.stats.generation_bumps += 1
        for w in self.workers:
            if self.rng.random() < 0.5 and not self.atomic:  # a zombie would be a second writer
                w.zombie = True  # still on the old cluster view
            elif not w.zombie:
                w.generation = self.generation  # rebuilt: its next step is of the new generation
        # a zombie stays a zombie until it is refused (it rebuilds) or replaced (killed and restarted)
        if self.atomic:
            # As a real recovery does: it raises the generation and settles every step in flight
            # before a trainer of the new generation writes (else the refused step and the next one
            # are two writers).
            self._full_settle("generation")

    # ---- checks ---------------------------------------------------------------------------

    def _check(self, where: str, t0: bool = False) -> None:
        values = self.rig.read_words(self.sess)
        job = self._job()
        pending = {}
        if job is not None:
            # A row still pending on a PS being rebuilt reads as zeros (every word: no real row of
            # these models is all zero bits).  At T0 (`t0`) the value each will be given is known:
            # the code's decoding of the survivors, computed here with the NumPy codec; it must be a
            # state of the row's history (the check truncates the history there, as after a rebuild
            # that is not in the background).  Until it is installed it cannot be updated (its
            # history stays at that state) and it is not read; once installed it is checked again.
            tables = {v.op.name for v in self.rig.coll.data.values()}
            lost = {tid for tid, t in self.rig.data_targets.items()
                    if t.variables[0].op.name in tables and ps_index(t.variables[0].device) in job.lost}
            pending = {tid: ~values[tid].any(axis=1) for tid in lost}
            if t0:
                decoded = self._decoded(values, set(job.lost))
                for tid in lost:
                    values[tid] = np.where(pending[tid][:, None], decoded[tid], values[tid])
                pending = {}
        problems = self.oracle.check(values, self.ok, where, pending=pending)
        self.stats.violations.extend(f"seed {self.seed}: {p}" for p in problems)

    def _decoded(self, values: dict[int, np.ndarray], lost: set[int]) -> dict[int, np.ndarray]:
        """The words of every data row of the PS in `lost`, decoded from the survivors' words now."""
        rig = self.rig
        layout = rig.coll.table_layout
        code = codec.Code(rig.k, rig.r)
        tid_of = {ps_index(t.variables[0].device): tid for tid, t in rig.data_targets.items()
                  if t.variables[0].op.name in {v.op.name for v in rig.coll.data.values()}}
        parity = {p: np.ascontiguousarray(v).view(np.int32).reshape(v.shape[0], -1)
                  for p, v in self.sess.run(dict(rig.opt.parity[rig.coll.name])).items()}
        out = {tid_of[p]: values[tid_of[p]].copy() for p in lost if p in tid_of}
        c = layout.chunk_rows
        for stripe in layout.stripes:
            want = [ch for ch in stripe.chunks if ch.ps in lost and ch.is_data]
            if not want:
                continue
            present = {}
            for ch in stripe.chunks:
                if ch.ps not in lost:
                    first = layout.local_rows(ch)[0]
                    present[ch.index_in_stripe] = (values[tid_of[ch.ps]] if ch.is_data else parity[ch.ps])[first : first + c]
            got = codec.decode(code, present, [ch.index_in_stripe for ch in want])
            for ch in want:
                first = layout.local_rows(ch)[0]
                out[tid_of[ch.ps]][first : first + c] = got[ch.index_in_stripe]
        return out

    def _check_views(self, where: str) -> None:
        """With no rebuild under way, no PS has a pending row or keeps a saved (T0) row: a rebuild whose
        finish was cut does not leave preservation behind to grow with every row written."""
        left = {p: [int(x) for x in v] for p, v in self.rig.plan.rebuilder.view_stats(self.sess, range(self.rig.num_ps)).items()
                if any(int(x) for x in v)}
        if left:
            self.stats.violations.append(f"seed {self.seed}: {where}: no rebuild is under way but PS keep rows "
                                         f"[pending, saved, groups preserving]: {left}")

    def _check_parity(self, where: str) -> None:
        values = self.sess.run(self.rig.variables)
        result = check_parity(self.rig.opt.describe(), values)
        self.stats.parity_checks += 1
        if result["mismatches"] or result["replica_mismatches"]:
            self.stats.violations.append(f"seed {self.seed}: {where}: parity check {result['mismatched'][:3]}")
        name = self.rig.step_name
        copies = [values[name]] + [values[rep.op.name] for rep in self.rig.opt.replicas[name]]
        if any(int(c) != int(copies[0]) for c in copies):
            self.stats.violations.append(f"seed {self.seed}: {where}: global step copies differ {copies}")


    # ---- scripted use (regression tests) ---------------------------------------------------------

    def run_until(self, worker: int, kind: str) -> None:
        """Advances worker `worker` until its next action is of `kind` (or its step ends)."""
        w = self.workers[worker]
        if w.step is None:
            w.step = self._new_step(w)
        while w.step is not None and w.step.actions[0][0] != kind:
            self._advance(w)

    def finish_step(self, worker: int) -> bool:
        """Runs worker `worker`'s step to its end; False if it failed or stays blocked."""
        w = self.workers[worker]
        if w.step is None:
            w.step = self._new_step(w)
        sid = w.step.sid
        stuck = 0
        while w.step is not None:
            before = list(w.step.actions)
            self._advance(w)
            stuck = stuck + 1 if w.step is not None and sorted(w.step.actions) == sorted(before) else 0
            if stuck > len(before):  # every round-1 op tried, none can commit yet
                return False
        return sid in self.ok


def run_sequences(target: str, seeds: list[int], until_violation: bool = False,
                  enough: Callable[[Stats], bool] | None = None, max_extra: int = 3, **kwargs: Any) -> Stats:
    """Runs a sequence per seed; with `until_violation`, stops at the first violation (mutation tests): the
    sequence that found it stops its events there (then drains, settles and is checked), and no seed follows.

    What a seeded sequence does depends on timing (a kill lands before or after a step's commit; two
    kills beyond r end a sequence early), so a test states the coverage it needs (`enough`): seeds run
    in order until it holds, up to `max_extra` more after `seeds` while it does not, and the sequence
    during which it comes to hold stops its events there (then drains, settles and is checked as any
    other); the caller still asserts it.  Every sequence run is checked by the oracle; the soak (`benchmarks/settlement_soak.py`)
    runs hundreds.
    """
    total = Stats()
    extra = [seeds[-1] + 1 + i for i in range(max_extra)] if enough is not None and seeds else []

    def covered(current: Stats) -> bool:  # the coverage of the sequences so far and of the running one
        assert enough is not None
        both = dataclasses.replace(total, violations=[])
        both.add(current)
        return enough(both)

    def violated(current: Stats) -> bool:  # a mutation test needs one violation: the rest of its sequence adds none
        return bool(current.violations)

    stop = covered if enough is not None else violated if until_violation else None
    for seed in [*seeds, *extra]:
        if enough is not None and total.sequences and enough(total):
            break
        total.add(Sequence(target, seed, **kwargs).run(stop=stop))
        if until_violation and total.violations:
            break
    return total
