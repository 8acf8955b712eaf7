"""Rebuilding lost variables where the data lives: PS to PS, in bounded slices, decoded in C++.

`RecoveryPlan` (tf_ecrec.recovery) decides *whether* to rebuild; this module
does it.  Everything here is graph built once, before the graph is
finalized, and generic in which PS were lost; at recovery the chief only
feeds a few scalars and small coefficient matrices and runs the ops:

* **Tables** (data chunks with their optimizer slots, and parity): for every
  chunk of every stripe there is a read of a slice of its rows on its own PS
  (`tf_ecrec.ops.read_row_words`) and, on the same PS, a combination of the
  slices of its stripe's other members (`combine_rows`, GF(2^16) or XOR in
  C++) written into its rows (`write_row_words`).  TensorFlow sends each
  slice from the survivor's PS to the lost chunk's PS directly; no table
  bytes pass through the chief.  The chief walks the chunks' rows slice by
  slice (`slice_bytes` per chunk read), feeding the slice offset, which
  chunks to read (the first ``k`` survivors of each stripe, as
  `tf_ecrec.codec.decode` reads them) and the decoding coefficients
  (`tf_ecrec.codec.decoding_coefficients`).  A process holds at most the
  slices in flight for its own lost chunks beyond its variables.
* **Lost variables are allocated first**, as zeros of their shape on their
  PS (no initializer runs: the rebuild overwrites every row, padding
  included, which decodes to zero).
* **Dense variables** (with their slots) and the global step are copied from
  a surviving replica, and replicas from their primary, by assignments that
  run on the target's PS and read the source PS to PS.
* **Re-encoding** (after a checkpoint restore) is the same walk with every
  parity chunk as the target and the data chunks as the survivors, and every
  replica copied from its primary.

Layout (which chunk of which stripe sits where, at which local rows) comes
from `tf_ecrec.placement` through each collection's table layout.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_ecrec import codec, placement, unfolded
from tf_ecrec.embedding import EmbeddingCollection, device_task
from tf_ecrec.errors import ConfigError
from tf_ecrec.optimizer import ECOptimizer

_LOG = logging.getLogger(__name__)

DEFAULT_SLICE_BYTES = 16 << 20
WALKERS = 2  # slices of a background rebuild in flight together (benchmarks/rebuild_speed.py compares)
"""Bytes of one chunk's slice read per session call: the bound on what a rebuild holds in flight per chunk."""
WANTED_WAIT_MS = 200
"""How long one round of the background rebuild's wanted-rows loop waits for a lookup to ask."""


@dataclasses.dataclass
class RebuildStats:
    """What a rebuild or re-encode wrote."""

    variables: int = 0
    bytes: int = 0
    session_calls: int = 0
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds of each part of a T0 (`Rebuilder.begin_background`), in order."""


@dataclasses.dataclass(eq=False)
class _Group:
    """A table variable group on one PS (a data variable with its slots, or a parity variable)."""

    table: Any  # _CollectionRebuild
    ps: int
    var: tf.Variable
    chunks: tuple[placement.ChunkSpec, ...]
    pending_rows: Any = None
    begin_pending: Any = None
    ranges: Any = None
    preserve: Any = None


@dataclasses.dataclass(frozen=True)
class _Chunk:
    spec: placement.ChunkSpec
    variables: tuple[tf.Variable, ...]  # data: the data variable and its slots; parity: the parity variable
    write: tf.Operation  # combine the stripe's slices into this chunk's rows (on its PS)


class _CollectionRebuild:
    """The rebuild ops of one collection: a read, a combine and a write per chunk of every stripe."""

    def __init__(self, coll: EmbeddingCollection, opt: ECOptimizer, slice_bytes: int,
                 logs: dict[int, tf.Tensor] | None = None, wait: dict[int, tf.Operation] | None = None) -> None:
        from tf_ecrec import ops as ec_ops

        self.coll = coll
        self.layout = coll.table_layout
        self.code = codec.Code(coll.ec.k, coll.ec.r)
        self.width = (1 + len(opt.rule.slots)) * coll.dim  # words per row of every chunk
        self.rows = int(self.layout.chunk_rows)
        self.slice_rows = max(1, min(self.rows, slice_bytes // (4 * self.width)))
        n = self.code.n
        stripes = self.layout.num_stripes
        with tf.name_scope(f"ec_rebuild/{coll.name}"):
            self.lo = tf.compat.v1.placeholder(tf.int64, [], name="lo")
            self.read = tf.compat.v1.placeholder_with_default(tf.zeros([stripes, n], tf.bool), [stripes, n], name="read")
            self.coefs = tf.compat.v1.placeholder_with_default(
                tf.zeros([stripes, n, n], tf.int32), [stripes, n, n], name="coefs"
            )
            count = tf.maximum(tf.minimum(tf.constant(self.slice_rows, tf.int64), self.rows - self.lo), 0)
            parity_vars = opt.parity[coll.name]
            self.chunks: dict[tuple[int, int], _Chunk] = {}
            # Background rebuild (BackgroundRebuild): per chunk, an install of a slice and one of the wanted rows.
            self.bg_lo = tf.compat.v1.placeholder_with_default(tf.constant(0, tf.int64), [], name="bg_lo")
            self.installs: dict[tuple[int, int], tuple[tf.Tensor, tf.Tensor]] = {}  # (stripe, i) -> (slice, wanted)
            self._wait = wait or {}
            for stripe in self.layout.stripes:
                s = stripe.index
                slices = []
                starts = {}
                for ch in stripe.chunks:
                    if ch.is_data:
                        var = coll.data[ch.ps]
                        variables = (var, *opt.slots_of(var))
                    else:
                        variables = (parity_vars[ch.ps],)
                    start = self.layout.local_rows(ch)[0] + self.lo
                    starts[ch.index_in_stripe] = (variables, start)
                    with tf.compat.v1.device(variables[0].device):
                        slices.append(
                            ec_ops.read_row_words(
                                list(variables), start, tf.where(self.read[s, ch.index_in_stripe], count, tf.constant(0, tf.int64)),
                                name=f"read_s{s}_c{ch.index_in_stripe}",
                            )
                        )
                for ch in stripe.chunks:
                    i = ch.index_in_stripe
                    variables, start = starts[i]
                    with tf.compat.v1.device(variables[0].device):
                        words = ec_ops.combine_rows(self.coefs[s, i], slices, name=f"combine_s{s}_c{i}")
                        write = ec_ops.write_row_words(list(variables), start, words, name=f"write_s{s}_c{i}")
                    self.chunks[(s, i)] = _Chunk(ch, variables, write)
                if logs is not None:
                    self._background_ops(stripe, starts, logs)

    def _background_ops(self, stripe: Any, starts: dict[int, tuple[tuple[tf.Variable, ...], tf.Tensor]],
                        logs: dict[int, tf.Tensor]) -> None:
        """For each chunk of `stripe`: its rows decoded from the others' preserved (T0) words and installed.

        Two variants per chunk, both writing only rows still pending on its PS
        (so they may race): one for the slice of offsets from ``bg_lo``, one
        for the offsets that waiting lookups ask for.
        """
        from tf_ecrec import ops as ec_ops

        s = stripe.index
        for ch in stripe.chunks:
            i = ch.index_in_stripe
            variables, _ = starts[i]
            first = self.layout.local_rows(ch)[0]
            log_i = logs[ch.ps]
            outs = []
            for kind in ("slice", "wanted"):
                with tf.compat.v1.device(variables[0].device):
                    if kind == "slice":
                        hi = tf.minimum(self.bg_lo + self.slice_rows, self.rows)
                        off = tf.range(self.bg_lo, tf.maximum(hi, self.bg_lo), dtype=tf.int64)
                    else:
                        deps = [self._wait[ch.ps]] if ch.ps in self._wait else []
                        with tf.control_dependencies(deps):
                            off = ec_ops.wanted_rows(log_i, variables[0], first, first + self.rows) - first
                parts = []
                for other in stripe.chunks:
                    j = other.index_in_stripe
                    vars_j, _ = starts[j]
                    first_j = self.layout.local_rows(other)[0]
                    with tf.compat.v1.device(vars_j[0].device):
                        if j == i:  # the target itself: coefficient 0
                            parts.append(tf.zeros([0, 0], tf.int32))
                            continue
                        take = tf.where(self.read[s, j], tf.size(off), 0)
                        parts.append(self._t0_words(list(vars_j), logs[other.ps], off[:take] + first_j,
                                                    name=f"bg_read_{kind}_s{s}_c{i}_from{j}"))
                with tf.compat.v1.device(variables[0].device):
                    words = ec_ops.combine_rows(self.coefs[s, i], parts, name=f"bg_combine_{kind}_s{s}_c{i}")
                    outs.append(
                        ec_ops.install_row_words(list(variables), log_i, off + first, words, add=not ch.is_data,
                                                 name=f"bg_install_{kind}_s{s}_c{i}")
                    )
            self.installs[(s, i)] = (outs[0], outs[1])

    @staticmethod
    def _t0_words(variables: list[tf.Variable], log: tf.Tensor, rows: tf.Tensor, name: str) -> tf.Tensor:
        """The words `rows` of a survivor's chunk held at T0 (preserved since; current if never written)."""
        from tf_ecrec import ops as ec_ops

        return ec_ops.read_preserved_row_words(variables, log, rows, name=name)

    def feeds(self, targets: Sequence[placement.ChunkSpec], present: dict[int, set[int]]) -> dict[Any, np.ndarray]:
        """The read mask and decoding coefficients that rebuild `targets` from the chunks `present`."""
        n = self.code.n
        read = np.zeros([self.layout.num_stripes, n], bool)
        coefs = np.zeros([self.layout.num_stripes, n, n], np.int32)
        for ch in targets:
            s, i = ch.stripe, ch.index_in_stripe
            coef = codec.decoding_coefficients(self.code, present[s], i)
            coefs[s, i] = coef
            read[s] |= coef != 0
        return {self.read: read, self.coefs: coefs}

    def run(self, sess: tf.compat.v1.Session, targets: Sequence[placement.ChunkSpec], present: dict[int, set[int]],
            options: Any, stats: RebuildStats) -> None:
        """Writes every chunk of `targets` from the chunks `present` (per stripe), slice by slice."""
        if not targets:
            return
        feeds = self.feeds(targets, present)
        writes = [self.chunks[(ch.stripe, ch.index_in_stripe)].write for ch in targets]
        for lo in range(0, self.rows, self.slice_rows):
            sess.run(writes, {self.lo: lo, **feeds}, options=options)
            stats.session_calls += 1
        stats.bytes += len(targets) * self.rows * self.width * 4
        stats.variables += len({v.op.name for ch in targets for v in self.chunks[(ch.stripe, ch.index_in_stripe)].variables})


class Rebuilder:
    """The PS-side rebuild and re-encode of an EC graph; build it (inside the graph) before finalize.

    Args:
      optimizer: the graph's `ECOptimizer` (after `minimize`).
      collections: the protected embedding collections.
      slice_bytes: bytes of each chunk slice per session call (> 0).
    """

    collection_rebuild = _CollectionRebuild
    """The ops of one collection's rebuild (the fault-schedule harness swaps in a broken variant to show
    that its oracle catches a rebuild that decodes from survivors' current words instead of their T0 words)."""

    def __init__(self, optimizer: ECOptimizer, collections: Iterable[EmbeddingCollection],
                 slice_bytes: int = DEFAULT_SLICE_BYTES) -> None:
        if not isinstance(slice_bytes, int) or slice_bytes <= 0:
            raise ConfigError(f"slice_bytes={slice_bytes!r}; rule: an integer > 0; source: Rebuilder(slice_bytes=)")
        from tf_ecrec import ops as ec_ops

        self._opt = optimizer
        logs = dict(optimizer.logs)
        with tf.name_scope("ec_rebuild"):
            self.wait_ms = tf.compat.v1.placeholder_with_default(tf.constant(WANTED_WAIT_MS, tf.int64), [], name="wait_ms")
            wait = {}
            for p, log in logs.items():
                with tf.compat.v1.device(log.device):
                    wait[p] = ec_ops.wait_wanted(log, self.wait_ms, name=f"wait_wanted_ps{p}")
        self._tables = [self.collection_rebuild(c, optimizer, slice_bytes, logs, wait) for c in collections]
        self._variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        with tf.name_scope("ec_rebuild"):
            self._alloc = {name: self._zeros_into(v) for name, v in self._variables.items()}
            self._copies = self._dense_copies()
            self._groups = self._view_ops(logs)
            self._end_preserve = {p: self._on(log, ec_ops.preserve_end) for p, log in logs.items()}
            self._view_stats = {p: self._on(log, ec_ops.recovery_view_stats) for p, log in logs.items()}

    # ---- graph ---------------------------------------------------------------------------

    @staticmethod
    def _on(log: tf.Tensor, op: Any) -> Any:
        with tf.compat.v1.device(log.device):
            return op(log)

    def _view_ops(self, logs: dict[int, tf.Tensor]) -> list[_Group]:
        """Every table variable group (data with slots; parity) with its pending and preserve ops."""
        from tf_ecrec import ops as ec_ops

        groups = []
        for table in self._tables:
            coll = table.coll
            for p, var in sorted(coll.data.items()):
                groups.append(_Group(table, p, var, tuple(table.layout.chunks_on(p, placement.DATA))))
            for p, var in sorted(self._opt.parity[coll.name].items()):
                groups.append(_Group(table, p, var, tuple(table.layout.chunks_on(p, placement.PARITY))))
        for g in groups:
            log = logs[g.ps]
            with tf.compat.v1.device(log.device):
                g.pending_rows = tf.compat.v1.placeholder_with_default(
                    tf.constant(int(g.var.shape[0]), tf.int64), [], name="pending_rows"
                )
                g.begin_pending = ec_ops.rebuild_begin_pending(log, g.var, g.pending_rows)
                g.ranges = tf.compat.v1.placeholder(tf.int64, [None, 2], name="preserve")
                g.preserve = ec_ops.preserve_ranges(log, g.var, g.ranges)
        return groups

    @staticmethod
    def _zeros_into(var: tf.Variable) -> tf.Operation:
        """Creates `var` on its PS as zeros of its shape, made when the op runs (`tf_ecrec.unfolded`)."""
        with tf.compat.v1.device(var.device):
            zeros = unfolded.filled(var.shape.as_list(), 0, var.dtype.base_dtype)
            return tf.raw_ops.AssignVariableOp(resource=var.handle, value=zeros, name="alloc")

    def _dense_copies(self) -> dict[tuple[str, str], tf.Operation]:
        """(target, source) -> the assignment, on the target's PS, of every copy of a protected dense variable."""
        opt = self._opt
        copies: dict[tuple[str, str], tf.Operation] = {}
        for name, reps in opt.replicas.items():
            primary = opt.protected[name]
            group = [primary, *opt.slots_of(primary)]
            is_step = primary.dtype.base_dtype == tf.int64 and primary.shape.rank == 0
            # Copies holding the same words: every copy of the global step; the replicas of a dense variable.
            same = [primary, *reps] if is_step else reps
            for target in same:
                for source in same:
                    if source is not target:
                        with tf.compat.v1.device(target.device):
                            copies[(target.op.name, source.op.name)] = target.assign(source.read_value(), read_value=False)
            if is_step:
                continue
            rows = primary.shape.as_list()[0]
            for rep in reps:
                with tf.compat.v1.device(rep.device):
                    words = tf.concat(
                        [tf.reshape(tf.bitcast(v.read_value(), tf.int32), [rows, -1]) for v in group], axis=1
                    )
                    copies[(rep.op.name, name)] = rep.assign(words, read_value=False)
                with tf.compat.v1.device(primary.device):
                    bits = rep.read_value()
                    ops = []
                    col = 0
                    for v in group:
                        per_row = int(np.prod(v.shape.as_list()[1:], dtype=np.int64)) * v.dtype.base_dtype.size // 4
                        part = tf.reshape(bits[:, col : col + per_row], [rows] + v.shape.as_list()[1:] + ([2] if v.dtype.base_dtype.size == 8 else []))
                        ops.append(v.assign(tf.bitcast(part, v.dtype.base_dtype), read_value=False))
                        col += per_row
                    copies[(name, rep.op.name)] = tf.group(*ops)
        return copies

    # ---- running ---------------------------------------------------------------------------

    def _allocate(self, sess: tf.compat.v1.Session, lost: set[int], options: Any) -> RebuildStats:
        """Creates every variable of the `lost` PS as zeros; the stats of a rebuild that starts with it."""
        stats = RebuildStats()
        allocs = [op for name, op in self._alloc.items() if device_task(self._variables[name].device) in lost]
        if allocs:
            sess.run(allocs, options=options)
            stats.session_calls += 1
        return stats

    def allocate_derived(self, sess: tf.compat.v1.Session, options: Any = None) -> None:
        """Creates every parity variable and every replica as zeros (a fresh start, before `reencode`)."""
        names = self._opt.redundancy_names()
        allocs = [op for name, op in self._alloc.items() if name in names]
        if allocs:
            sess.run(allocs, options=options)

    def rebuild(self, sess: tf.compat.v1.Session, lost: Iterable[int], options: Any = None) -> RebuildStats:
        """Allocates and rebuilds every variable of the `lost` PS from the survivors (which must cover them)."""
        lost_set = set(int(p) for p in lost)
        stats = self._allocate(sess, lost_set, options)
        for table in self._tables:
            targets = [ch for st in table.layout.stripes for ch in st.chunks if ch.ps in lost_set]
            present = {st.index: {ch.index_in_stripe for ch in st.chunks if ch.ps not in lost_set} for st in table.layout.stripes}
            table.run(sess, targets, present, options, stats)
        self._copy_dense(sess, lambda v: device_task(v.device) in lost_set, options, stats)
        return stats

    def begin_background(self, sess: tf.compat.v1.Session, lost: Iterable[int], options: Any = None) -> BackgroundRebuild:
        """T0 of a rebuild while training goes on; call with every step settled and no trainer running.

        Allocates the lost variables, copies their dense variables, marks
        their table rows pending and makes every survivor preserve the rows
        the rebuild decodes from; returns the `BackgroundRebuild` that
        installs the rows (not started).  The caller then lets trainers run.
        """
        lost_set = set(int(p) for p in lost)
        t = time.perf_counter()
        stats = RebuildStats()
        # One session call (each distinct call costs a graph registration on every PS it touches in
        # a new session): the lost dense variables copied from a replica, the other lost variables
        # allocated as zeros, their rows marked pending and the survivors' sources preserved.  No
        # two of these write the same variable, so they need no order among them.
        ops, copied = self._dense_copy_ops(lambda v: device_task(v.device) in lost_set, stats)
        ops += [
            op for name, op in self._alloc.items()
            if device_task(self._variables[name].device) in lost_set and name not in copied
        ]
        feeds = {}
        for g in self._groups:
            if g.ps in lost_set:
                ops.append(g.begin_pending)
                continue
            ranges = [
                self._local_range(g, ch)
                for ch in g.chunks
                if any(c.ps in lost_set for c in g.table.layout.stripes[ch.stripe].chunks)
            ]
            ops.append(g.preserve)
            feeds[g.ranges] = np.asarray(ranges, np.int64).reshape(-1, 2)
        if ops:
            sess.run(ops, feeds, options=options)
            stats.session_calls += 1
        stats.phases["t0"] = time.perf_counter() - t
        job = BackgroundRebuild(self, lost_set)
        job.stats.variables += stats.variables
        job.stats.bytes += stats.bytes
        job.stats.session_calls += stats.session_calls
        job.stats.phases = stats.phases
        return job

    def resume_background(self, lost: Iterable[int]) -> BackgroundRebuild:
        """The rebuild of `lost` PS whose rows are still pending (a chief restarted mid-way): the same walk again."""
        return BackgroundRebuild(self, lost)

    @staticmethod
    def _local_range(g: _Group, ch: placement.ChunkSpec) -> tuple[int, int]:
        first = int(g.table.layout.local_rows(ch)[0])
        return first, first + g.table.rows

    def view_stats(self, sess: tf.compat.v1.Session, tasks: Iterable[int]) -> dict[int, np.ndarray]:
        """PS -> [rows pending there, rows preserved there]."""
        tasks = [p for p in tasks if p in self._view_stats]
        values = sess.run([self._view_stats[p] for p in tasks])
        return dict(zip(tasks, values))

    def end_preserve(self, sess: tf.compat.v1.Session, tasks: Iterable[int]) -> None:
        ops = [self._end_preserve[p] for p in tasks if p in self._end_preserve]
        if ops:
            sess.run(ops)

    def clear_views(self, sess: tf.compat.v1.Session, tasks: Iterable[int], options: Any = None) -> None:
        """Nothing pending or preserved on `tasks` (after a restore re-encoded everything)."""
        tasks = set(tasks)
        ops = [g.begin_pending for g in self._groups if g.ps in tasks]
        feeds = {g.pending_rows: 0 for g in self._groups if g.ps in tasks}
        ops += [self._end_preserve[p] for p in tasks if p in self._end_preserve]
        if ops:
            sess.run(ops, feeds, options=options)

    def reencode(self, sess: tf.compat.v1.Session, options: Any = None) -> RebuildStats:
        """Writes every parity chunk from its stripe's data and every replica from its primary."""
        stats = RebuildStats()
        for table in self._tables:
            targets = list(table.layout.parity_chunks)
            present = {st.index: {ch.index_in_stripe for ch in st.data} for st in table.layout.stripes}
            table.run(sess, targets, present, options, stats)
        primaries = {v.op.name for v in self._opt.protected.values()} | {
            s.op.name for v in self._opt.protected.values() for s in self._opt.slots_of(v)
        }
        self._copy_dense(sess, lambda v: v.op.name not in primaries, options, stats)
        return stats

    def _copy_dense(self, sess: tf.compat.v1.Session, is_target: Any, options: Any, stats: RebuildStats) -> None:
        ops, _ = self._dense_copy_ops(is_target, stats)
        if ops:
            sess.run(ops, options=options)
            stats.session_calls += 1

    def _dense_copy_ops(self, is_target: Any, stats: RebuildStats) -> tuple[list[tf.Operation], set[str]]:
        """The copies that restore every dense copy `is_target` selects, and the names of the variables they write."""
        opt = self._opt
        ops = []
        written_names: set[str] = set()
        for name, reps in opt.replicas.items():
            primary = opt.protected[name]
            copies = [primary, *reps]
            targets = [c for c in copies if is_target(c)]
            sources = [c for c in copies if not is_target(c)]
            if not targets:
                continue
            source = sources[0]  # the primary when it survives, else the first surviving replica
            for target in targets:
                ops.append(self._copies[(target.op.name, source.op.name)])
                written = [primary, *opt.slots_of(primary)] if target is primary else [target]
                written_names.update(v.op.name for v in written)
                stats.variables += len(written)
                stats.bytes += sum(int(np.prod(v.shape.as_list(), dtype=np.int64)) * v.dtype.base_dtype.size for v in written)
        return ops, written_names


class BackgroundRebuild:
    """The rebuild of lost PS tasks that runs while training goes on; `Rebuilder.begin_background` makes one.

    By the time it exists, the lost variables are allocated (zeros), their
    rows pending on their PS, dense copies done, and every survivor preserves
    the T0 words of the rows the rebuild decodes from (see
    ops/cc/kernels/recovery_view.h and docs/rebuild.md).  Two loops then
    install every pending row, each writing only rows still pending, so they
    may race: `install_wanted` decodes the rows waiting lookups ask for
    (blocking up to `WANTED_WAIT_MS` for one to ask), `install_next_slice`
    walks the lost chunks slice by slice.  When the walk is done every row
    is installed; `finish` then ends the survivors' preservation.

    `start` runs both loops on threads (the chief's); the fault-schedule
    harness calls the steps itself, interleaved with trainers' ops.
    """

    def __init__(self, rebuilder: Rebuilder, lost: Sequence[int]) -> None:
        self.lost = sorted(int(p) for p in lost)
        self._rebuilder = rebuilder
        lost_set = set(self.lost)
        self._slices: list[tuple[list[Any], dict[Any, Any]]] = []
        self._wanted: list[Any] = []
        self._wanted_feeds: dict[Any, Any] = {}
        self._row_bytes: dict[Any, int] = {}
        for table in rebuilder._tables:
            targets = [ch for st in table.layout.stripes for ch in st.chunks if ch.ps in lost_set]
            if not targets:
                continue
            present = {st.index: {ch.index_in_stripe for ch in st.chunks if ch.ps not in lost_set} for st in table.layout.stripes}
            feeds = table.feeds(targets, present)
            slice_fetch = [table.installs[(ch.stripe, ch.index_in_stripe)][0] for ch in targets]
            wanted_fetch = [table.installs[(ch.stripe, ch.index_in_stripe)][1] for ch in targets if ch.is_data]
            for t in slice_fetch + wanted_fetch:
                self._row_bytes[t] = table.width * 4
            for lo in range(0, table.rows, table.slice_rows):
                self._slices.append((slice_fetch, {**feeds, table.bg_lo: lo}))
            self._wanted.extend(wanted_fetch)
            self._wanted_feeds.update(feeds)
        self._next = 0
        self._lock = threading.Lock()
        self.stats = RebuildStats()
        self.rows_installed = 0
        self.rows_installed_on_demand = 0
        self.started = time.time()
        self.seconds: float | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._finished = threading.Event()

    # ---- steps ---------------------------------------------------------------------------

    @property
    def walked(self) -> bool:
        """Whether every slice was installed (then no row is pending)."""
        with self._lock:
            return self._next >= len(self._slices)

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def install_wanted(self, sess: tf.compat.v1.Session, wait_ms: int | None = None) -> int:
        """One round of the wanted rows: waits up to `wait_ms` for a lookup to ask, installs what is asked."""
        if not self._wanted:
            return 0
        feeds = dict(self._wanted_feeds)
        if wait_ms is not None:
            feeds[self._rebuilder.wait_ms] = int(wait_ms)
        counts = sess.run(self._wanted, feeds)
        rows = 0
        with self._lock:
            for fetch, n in zip(self._wanted, counts):
                self.rows_installed += int(n)
                self.rows_installed_on_demand += int(n)
                self.stats.bytes += int(n) * self._row_bytes[fetch]
                rows += int(n)
            self.stats.session_calls += 1
        return rows

    def install_next_slice(self, sess: tf.compat.v1.Session) -> bool:
        """Installs the next slice of every lost chunk of one table; False once the walk is done."""
        with self._lock:
            if self._next >= len(self._slices):
                return False
            fetch, feeds = self._slices[self._next]
            self._next += 1
        counts = sess.run(fetch, feeds)
        with self._lock:
            for t, n in zip(fetch, counts):
                self.rows_installed += int(n)
                self.stats.bytes += int(n) * self._row_bytes[t]
            self.stats.session_calls += 1
        return True

    def finish(self, sess: tf.compat.v1.Session) -> None:
        """After the walk: checks that nothing is pending on the lost PS, ends the survivors' preservation."""
        pending = self._rebuilder.view_stats(sess, self.lost)
        left = {p: int(v[0]) for p, v in pending.items() if int(v[0]) != 0}
        if left:
            raise RuntimeError(f"the background rebuild walked every slice but rows are still pending: {left}")
        survivors = [p for p in sorted(self._rebuilder._opt.logs) if p not in self.lost]
        self._rebuilder.end_preserve(sess, survivors)
        self.seconds = time.time() - self.started
        self._finished.set()

    # ---- threads ---------------------------------------------------------------------------

    def start(self, sess: tf.compat.v1.Session, on_done: Any = None, walkers: int | None = None,
              share: float = 1.0) -> None:
        """Runs the loops on threads: the wanted rows', and `walkers` (default `WALKERS`) walking the slices
        (slices in flight together overlap one's transfer with another's decoding); `on_done(self)` after
        `finish`, from the last walking thread.

        With `share` < 1 each walker pauses after a slice for ``(1 - share) / share`` times as long as the
        slice took, so the walk holds the PS tasks for about `share` of the time and training has the rest;
        the wanted rows' loop never pauses (a lookup waiting for a row is training waiting).
        """
        walkers = WALKERS if walkers is None else int(walkers)
        pause = (1.0 - share) / share

        def wanted() -> None:
            while not self._stop.is_set() and not self.walked:
                try:
                    self.install_wanted(sess)
                except (tf.errors.OpError, RuntimeError) as exc:
                    self._failed(exc)
                    return

        walking = [walkers]

        def walk() -> None:
            try:
                while not self._stop.is_set():
                    began = time.perf_counter()
                    if not self.install_next_slice(sess):
                        break
                    if pause > 0:
                        self._stop.wait(pause * (time.perf_counter() - began))
                with self._lock:
                    walking[0] -= 1
                    last = walking[0] == 0
                if self._stop.is_set() or not last:
                    return
                self.finish(sess)
            except (tf.errors.OpError, RuntimeError) as exc:
                self._failed(exc)
                return
            _LOG.warning(
                "background rebuild of PS %s done: %d rows (%d asked for by lookups first), %.1f MB in %.2f s",
                self.lost, self.rows_installed, self.rows_installed_on_demand, self.stats.bytes / 1e6, self.seconds,
            )
            if on_done is not None:
                on_done(self)

        self._threads = [threading.Thread(target=wanted, name="ec-rebuild-wanted", daemon=True)] + [
            threading.Thread(target=walk, name=f"ec-rebuild-walk-{i}", daemon=True) for i in range(walkers)
        ]
        for t in self._threads:
            t.start()

    def _failed(self, exc: BaseException) -> None:
        if self._stop.is_set():
            return
        self.error = exc
        self._stop.set()
        message = getattr(exc, "message", str(exc)).splitlines()[0] if str(exc) else type(exc).__name__
        _LOG.warning("background rebuild of PS %s stopped (the next session re-creation resumes it): %s", self.lost, message)

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until the rebuild finished or stopped; whether it finished."""
        deadline = None if timeout is None else time.time() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.time()))
        return self.finished

    def stop(self, timeout: float = 30.0) -> None:
        """Stops the loops (a new session takes over); rows already installed stay installed."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
