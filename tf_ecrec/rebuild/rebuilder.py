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
  `tf_ecrec.erasure.codec.decode` reads them) and the decoding coefficients
  (`tf_ecrec.erasure.codec.decoding_coefficients`).  A process holds at most the
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
from `tf_ecrec.layout.placement` through each collection's table layout.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import tensorflow as tf

from tf_ecrec.base import unfolded
from tf_ecrec.errors import ConfigError
from tf_ecrec.layout.device import ps_index, variable_name
from tf_ecrec.layout.stripe_encoding import row_words, split_row_words
from tf_ecrec.layout.table_layout import ChunkKind, ChunkSpec
from tf_ecrec.rebuild.background import WANTED_WAIT_MS, BackgroundRebuild
from tf_ecrec.rebuild.stripes import CollectionRebuild, RebuildStats
from tf_ecrec.step import steplog
from tf_ecrec.step.embedding import EmbeddingCollection
from tf_ecrec.step.optimizer import ECOptimizer

_LOG = logging.getLogger(__name__)

DEFAULT_SLICE_BYTES = 16 << 20
"""Bytes of one chunk's slice read per session call: the bound on what a rebuild holds in flight per chunk."""


@dataclasses.dataclass(eq=False)
class _Group:
    """A table variable group on one PS (a data variable with its slots, or a parity variable)."""

    table: CollectionRebuild
    ps: int
    var: tf.Variable
    chunks: tuple[ChunkSpec, ...]
    pending_rows: Any = None
    begin_pending: Any = None
    ranges: Any = None
    preserve: Any = None



class Rebuilder:
    """The PS-side rebuild and re-encode of an EC graph; build it (inside the graph) before finalize.

    Args:
      optimizer: the graph's `ECOptimizer` (after `minimize`).
      collections: the protected embedding collections.
      slice_bytes: bytes of each chunk slice per session call (> 0).
    """

    collection_rebuild = CollectionRebuild
    """The ops of one collection's rebuild (the fault-schedule harness swaps in a broken variant to show
    that its oracle catches a rebuild that decodes from survivors' current words instead of their T0 words)."""

    def __init__(self, optimizer: ECOptimizer, collections: Iterable[EmbeddingCollection],
                 slice_bytes: int = DEFAULT_SLICE_BYTES, logs: dict[int, tf.Tensor] | None = None) -> None:
        if not isinstance(slice_bytes, int) or slice_bytes <= 0:
            raise ConfigError(f"slice_bytes={slice_bytes!r}; rule: an integer > 0; source: Rebuilder(slice_bytes=)")
        from tf_ecrec import ops as ec_ops

        self._opt = optimizer
        # The delta log handles of this graph (the optimizer's, where it built the step in the same graph; a
        # TF2 recovery's function graph makes its own).
        logs = self.logs = dict(optimizer.logs if logs is None else logs)
        with tf.name_scope("ec_rebuild"):
            self.wait_ms = tf.compat.v1.placeholder_with_default(tf.constant(WANTED_WAIT_MS, tf.int64), [], name="wait_ms")
            wait = {}
            for p, log in logs.items():
                with tf.compat.v1.device(log.device):
                    wait[p] = ec_ops.wait_wanted(log, self.wait_ms, name=f"wait_wanted_ps{p}")
        self.tables = [self.collection_rebuild(c, optimizer, slice_bytes, logs, wait) for c in collections]
        self._variables = {v.op.name: v for v in tf.compat.v1.global_variables()}  # none in a TF2 function graph
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
        for table in self.tables:
            coll = table.coll
            for p, var in sorted(coll.data.items()):
                groups.append(_Group(table, p, var, tuple(table.layout.chunks_on(p, ChunkKind.DATA))))
            for p, var in sorted(self._opt.parity[coll.name].items()):
                groups.append(_Group(table, p, var, tuple(table.layout.chunks_on(p, ChunkKind.PARITY))))
        # A PS's rows pending from an earlier T0 are forgotten before this one marks its own: a rebuild started
        # over after a cut re-created the variables, under new keys where the variables are eager ones (TF2).
        forget = {p: self._on(log, ec_ops.rebuild_forget_pending) for p, log in logs.items()}
        for g in groups:
            log = logs[g.ps]
            with tf.compat.v1.device(log.device), tf.control_dependencies([forget[g.ps]]):
                g.pending_rows = tf.compat.v1.placeholder_with_default(
                    tf.constant(int(g.var.shape[0]), tf.int64), [], name="pending_rows"
                )
                g.begin_pending = ec_ops.rebuild_begin_pending(log, g.var, g.pending_rows)
                g.ranges = tf.compat.v1.placeholder(tf.int64, [None, 2], name="preserve")
                g.preserve = ec_ops.preserve_ranges(log, g.var, g.ranges)
        return groups

    @staticmethod
    def _zeros_into(var: tf.Variable) -> tf.Operation:
        """Creates `var` on its PS as zeros of its shape, made when the op runs (`tf_ecrec.base.unfolded`)."""
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
                            copies[(variable_name(target), variable_name(source))] = target.assign(
                                source.read_value(), read_value=False)
            if is_step:
                continue
            rows = primary.shape.as_list()[0]
            for rep in reps:
                with tf.compat.v1.device(rep.device):
                    words = row_words([v.read_value() for v in group], rows)
                    copies[(variable_name(rep), name)] = rep.assign(words, read_value=False)
                with tf.compat.v1.device(primary.device):
                    values = split_row_words(rep.read_value(), group)
                    ops = [v.assign(value, read_value=False) for v, value in zip(group, values)]
                    copies[(name, variable_name(rep))] = tf.group(*ops)
        return copies

    # ---- running ---------------------------------------------------------------------------

    def _allocate(self, sess: tf.compat.v1.Session, lost: set[int], options: Any) -> RebuildStats:
        """Creates every variable of the `lost` PS as zeros; the stats of a rebuild that starts with it."""
        stats = RebuildStats()
        allocs = [op for name, op in self._alloc.items() if ps_index(self._variables[name].device) in lost]
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
        lost_set = {int(p) for p in lost}
        stats = self._allocate(sess, lost_set, options)
        for table in self.tables:
            targets = [ch for st in table.layout.stripes for ch in st.chunks if ch.ps in lost_set]
            present = {st.index: {ch.index_in_stripe for ch in st.chunks if ch.ps not in lost_set} for st in table.layout.stripes}
            table.run(sess, targets, present, options, stats)
        self._copy_dense(sess, lambda v: ps_index(v.device) in lost_set, options, stats)
        return stats

    def begin_background(self, sess: tf.compat.v1.Session, lost: Iterable[int], options: Any = None) -> BackgroundRebuild:
        """T0 of a rebuild while training goes on; call with every step settled and no trainer running.

        Allocates the lost variables, copies their dense variables, marks
        their table rows pending and makes every PS preserve the T0 words of
        the rows the rebuild may decode from (`_t0_ranges`: the survivors'
        from now, the lost PS's from each row's install); returns the `BackgroundRebuild` that
        installs the rows (not started).  The caller then lets trainers run.
        """
        lost_set = {int(p) for p in lost}
        t = time.perf_counter()
        stats = RebuildStats()
        # One session call (each distinct call costs a graph registration on every PS it touches in
        # a new session): the lost dense variables copied from a replica, the other lost variables
        # allocated as zeros, their rows marked pending and the survivors' sources preserved.  No
        # two of these write the same variable, so they need no order among them.
        ops, copied = self._dense_copy_ops(lambda v: ps_index(v.device) in lost_set, stats)
        ops += [
            op for name, op in self._alloc.items()
            if ps_index(self._variables[name].device) in lost_set and name not in copied
        ]
        pairs = []
        for g in self._groups:
            if g.ps in lost_set:
                ops.append(g.begin_pending)
            ops.append(g.preserve)
            pairs.append((g.ranges, np.asarray(self._t0_ranges(g, lost_set), np.int64).reshape(-1, 2)))
        if ops:
            sess.run(ops, steplog.feeds(*pairs), options=options)
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

    def _t0_ranges(self, g: _Group, lost: set[int]) -> list[tuple[int, int]]:
        """The local rows of `g` that keep their T0 words during a rebuild of `lost`: every chunk whose stripe
        lost a member.  On a PS being rebuilt that is each of its chunks, kept from each row's install (which
        gives it its T0 words): a rebuild resumed for the PS that did not finish decodes from those that did."""
        return [
            self._local_range(g, ch)
            for ch in g.chunks
            if any(c.ps in lost for c in g.table.layout.stripes[ch.stripe].chunks)
        ]

    @staticmethod
    def _local_range(g: _Group, ch: ChunkSpec) -> tuple[int, int]:
        first = int(g.table.layout.local_rows(ch)[0])
        return first, first + g.table.rows

    def view_stats(self, sess: tf.compat.v1.Session, tasks: Iterable[int]) -> dict[int, np.ndarray]:
        """PS -> [rows pending there, rows saved there, variable groups preserving T0 there]."""
        tasks = [p for p in tasks if p in self._view_stats]
        values = sess.run([self._view_stats[p] for p in tasks])
        return dict(zip(tasks, values))

    def unfinished(self, sess: tf.compat.v1.Session, tasks: Iterable[int]) -> list[int]:
        """The `tasks` with rows still pending: a background rebuild to resume (`resume_background`).

        When none has any, every row was installed; if PS still keep T0 words, the rebuild's finish never
        ran (its chief died after the last install), and its preservation is ended here: else each PS would
        keep a copy of every distinct row written from then on.
        """
        stats = self.view_stats(sess, tasks)
        pending = sorted(p for p, v in stats.items() if int(v[0]) > 0)
        preserving = sorted(p for p, v in stats.items() if int(v[1]) > 0 or int(v[2]) > 0)
        if not pending and preserving:
            _LOG.warning("ending the T0 preservation a finished background rebuild left on PS %s", preserving)
            self.end_preserve(sess, preserving)
        return pending

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
        for table in self.tables:
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
                ops.append(self._copies[(variable_name(target), variable_name(source))])
                written = [primary, *opt.slots_of(primary)] if target is primary else [target]
                written_names.update(variable_name(v) for v in written)
                stats.variables += len(written)
                stats.bytes += sum(int(np.prod(v.shape.as_list(), dtype=np.int64)) * v.dtype.base_dtype.size for v in written)
        return ops, written_names

