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
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_ecrec import codec, placement
from tf_ecrec.embedding import EmbeddingCollection, device_task
from tf_ecrec.errors import ConfigError
from tf_ecrec.optimizer import ECOptimizer

_LOG = logging.getLogger(__name__)

DEFAULT_SLICE_BYTES = 8 << 20
"""Bytes of one chunk's slice read per session call: the bound on what a rebuild holds in flight per chunk."""


@dataclasses.dataclass
class RebuildStats:
    """What a rebuild or re-encode wrote."""

    variables: int = 0
    bytes: int = 0
    session_calls: int = 0


@dataclasses.dataclass(frozen=True)
class _Chunk:
    spec: placement.ChunkSpec
    variables: tuple[tf.Variable, ...]  # data: the data variable and its slots; parity: the parity variable
    write: tf.Operation  # combine the stripe's slices into this chunk's rows (on its PS)


class _CollectionRebuild:
    """The rebuild ops of one collection: a read, a combine and a write per chunk of every stripe."""

    def __init__(self, coll: EmbeddingCollection, opt: ECOptimizer, slice_bytes: int) -> None:
        from tf_ecrec import ops as ec_ops  # loads the op library

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

    def run(self, sess: tf.compat.v1.Session, targets: Sequence[placement.ChunkSpec], present: dict[int, set[int]],
            options: Any, stats: RebuildStats) -> None:
        """Writes every chunk of `targets` from the chunks `present` (per stripe), slice by slice."""
        if not targets:
            return
        n = self.code.n
        read = np.zeros([self.layout.num_stripes, n], bool)
        coefs = np.zeros([self.layout.num_stripes, n, n], np.int32)
        for ch in targets:
            s, i = ch.stripe, ch.index_in_stripe
            coef = codec.decoding_coefficients(self.code, present[s], i)
            coefs[s, i] = coef
            read[s] |= coef != 0
        writes = [self.chunks[(ch.stripe, ch.index_in_stripe)].write for ch in targets]
        for lo in range(0, self.rows, self.slice_rows):
            sess.run(writes, {self.lo: lo, self.read: read, self.coefs: coefs}, options=options)
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

    def __init__(self, optimizer: ECOptimizer, collections: Iterable[EmbeddingCollection],
                 slice_bytes: int = DEFAULT_SLICE_BYTES) -> None:
        if not isinstance(slice_bytes, int) or slice_bytes <= 0:
            raise ConfigError(f"slice_bytes={slice_bytes!r}; rule: an integer > 0; source: Rebuilder(slice_bytes=)")
        self._opt = optimizer
        self._tables = [_CollectionRebuild(c, optimizer, slice_bytes) for c in collections]
        self._variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        with tf.name_scope("ec_rebuild"):
            self._alloc = {name: self._zeros_into(v) for name, v in self._variables.items()}
            self._copies = self._dense_copies()

    # ---- graph ---------------------------------------------------------------------------

    @staticmethod
    def _zeros_into(var: tf.Variable) -> tf.Operation:
        """Creates `var` on its PS as zeros of its shape (a shape fed at run time cannot be folded into a constant)."""
        with tf.compat.v1.device(var.device):
            dims = tf.compat.v1.placeholder_with_default(tf.constant(var.shape.as_list(), tf.int64), [var.shape.rank])
            zeros = tf.fill(dims, tf.constant(0, var.dtype.base_dtype))
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

    def rebuild(self, sess: tf.compat.v1.Session, lost: Iterable[int], options: Any = None) -> RebuildStats:
        """Allocates and rebuilds every variable of the `lost` PS from the survivors (which must cover them)."""
        lost_set = set(int(p) for p in lost)
        stats = RebuildStats()
        allocs = [op for name, op in self._alloc.items() if device_task(self._variables[name].device) in lost_set]
        if allocs:
            sess.run(allocs, options=options)
            stats.session_calls += 1
        for table in self._tables:
            targets = [ch for st in table.layout.stripes for ch in st.chunks if ch.ps in lost_set]
            present = {st.index: {ch.index_in_stripe for ch in st.chunks if ch.ps not in lost_set} for st in table.layout.stripes}
            table.run(sess, targets, present, options, stats)
        self._copy_dense(sess, lambda v: device_task(v.device) in lost_set, options, stats)
        return stats

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
        opt = self._opt
        ops = []
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
                stats.variables += len(written)
                stats.bytes += sum(int(np.prod(v.shape.as_list(), dtype=np.int64)) * v.dtype.base_dtype.size for v in written)
        if ops:
            sess.run(ops, options=options)
            stats.session_calls += 1
