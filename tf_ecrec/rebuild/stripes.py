"""The rebuild ops of one collection's stripes: for every chunk, a read, a combine and a write on its PS.

Built once, before the graph is finalized, generic in which chunks are lost:
`CollectionRebuild.feeds` turns "rebuild these chunks from those" into the
read mask and the decoding coefficients (`tf_ecrec.erasure.codec.decoding_coefficients`)
the ops take, and `run` walks the chunks' rows slice by slice.  The
background variants (decode from the survivors' T0 words, install only rows
still pending) are what `tf_ecrec.rebuild.background` runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_ecrec.erasure import codec
from tf_ecrec.layout.device import variable_name
from tf_ecrec.layout.table_layout import ChunkSpec
from tf_ecrec.step import steplog
from tf_ecrec.step.embedding import EmbeddingCollection
from tf_ecrec.step.optimizer import ECOptimizer


@dataclasses.dataclass
class RebuildStats:
    """What a rebuild or re-encode wrote."""

    variables: int = 0
    bytes: int = 0
    session_calls: int = 0
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds of each part of a T0 (`Rebuilder.begin_background`), in order."""



@dataclasses.dataclass(frozen=True)
class _Chunk:
    spec: ChunkSpec
    variables: tuple[tf.Variable, ...]  # data: the data variable and its slots; parity: the parity variable
    write: tf.Operation  # combine the stripe's slices into this chunk's rows (on its PS)


class CollectionRebuild:
    """The rebuild ops of one collection: a read, a combine and a write per chunk of every stripe."""

    def __init__(self, coll: EmbeddingCollection, opt: ECOptimizer, slice_bytes: int,
                 logs: dict[int, tf.Tensor] | None = None, wait: dict[int, tf.Operation] | None = None) -> None:
        from tf_ecrec import ops as ec_ops  # loads the op library

        self.coll = coll
        self.layout = coll.table_layout
        self.code = coll.code
        self.width = (1 + len(opt.slots_of(next(iter(coll.data.values()))))) * coll.dim  # words per row of a chunk
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
            # The mask's flags (0 or 1) and the coefficient rows, taken apart once: a slice per use is four
            # graph ops, and graph building is most of a chief's start and of its rebuild after a move.
            self._flags = tf.unstack(tf.reshape(tf.cast(self.read, tf.int64), [stripes * n]), name="read_flags")
            self._coef_rows = tf.unstack(tf.reshape(self.coefs, [stripes * n, n]), name="coef_rows")
            self._consts: dict[tuple[str, str], tf.Tensor] = {}
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
                                list(variables), start, count * self._flag(s, ch.index_in_stripe),
                                name=f"read_s{s}_c{ch.index_in_stripe}",
                            )
                        )
                for ch in stripe.chunks:
                    i = ch.index_in_stripe
                    variables, start = starts[i]
                    with tf.compat.v1.device(variables[0].device):
                        words = ec_ops.combine_rows(self._coef_row(s, i), slices, name=f"combine_s{s}_c{i}")
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
                    size = tf.size(off, out_type=tf.int64)
                parts = []
                for other in stripe.chunks:
                    j = other.index_in_stripe
                    vars_j, _ = starts[j]
                    first_j = self.layout.local_rows(other)[0]
                    device = vars_j[0].device
                    with tf.compat.v1.device(device):
                        if j == i:  # the target itself: coefficient 0
                            parts.append(self._const(device, "none", np.zeros([0, 0], np.int32)))
                            continue
                        # The offsets if chunk j is read, none if not.
                        take = tf.reshape(size * self._flag(s, j), self._const(device, "one", np.array([1], np.int32)))
                        rows = tf.slice(off, self._const(device, "zero", np.array([0], np.int64)), take) + first_j
                        parts.append(self._t0_words(list(vars_j), logs[other.ps], rows,
                                                    name=f"bg_read_{kind}_s{s}_c{i}_from{j}"))
                with tf.compat.v1.device(variables[0].device):
                    words = ec_ops.combine_rows(self._coef_row(s, i), parts, name=f"bg_combine_{kind}_s{s}_c{i}")
                    outs.append(
                        ec_ops.install_row_words(list(variables), log_i, off + first, words, add=not ch.is_data,
                                                 name=f"bg_install_{kind}_s{s}_c{i}")
                    )
            self.installs[(s, i)] = (outs[0], outs[1])

    def _flag(self, stripe: int, index: int) -> tf.Tensor:
        """1 if the rebuild reads chunk `index` of `stripe`, else 0 (int64)."""
        return self._flags[stripe * self.code.n + index]

    def _coef_row(self, stripe: int, index: int) -> tf.Tensor:
        """The decoding coefficients of chunk `index` of `stripe` (int32, one per chunk of the stripe)."""
        return self._coef_rows[stripe * self.code.n + index]

    def _const(self, device: str, name: str, value: np.ndarray) -> tf.Tensor:
        """One constant per device (`value` under `name`), shared by the ops there."""
        key = (device, name)
        if key not in self._consts:
            with tf.compat.v1.device(device):
                self._consts[key] = tf.constant(value, name=name)
        return self._consts[key]

    @staticmethod
    def _t0_words(variables: list[tf.Variable], log: tf.Tensor, rows: tf.Tensor, name: str) -> tf.Tensor:
        """The words `rows` of a survivor's chunk held at T0 (preserved since; current if never written)."""
        from tf_ecrec import ops as ec_ops

        return ec_ops.read_preserved_row_words(variables, log, rows, name=name)

    def feeds(self, targets: Sequence[ChunkSpec], present: dict[int, set[int]]) -> Any:
        """The read mask and decoding coefficients that rebuild `targets` from the chunks `present`
        (a feed dict in a graph, `tf_ecrec.step.steplog.feeds` pairs under TF2)."""
        n = self.code.n
        read = np.zeros([self.layout.num_stripes, n], bool)
        coefs = np.zeros([self.layout.num_stripes, n, n], np.int32)
        for ch in targets:
            s, i = ch.stripe, ch.index_in_stripe
            coef = codec.decoding_coefficients(self.code, present[s], i)
            coefs[s, i] = coef
            read[s] |= coef != 0
        return steplog.feeds((self.read, read), (self.coefs, coefs))

    def run(self, sess: tf.compat.v1.Session, targets: Sequence[ChunkSpec], present: dict[int, set[int]],
            options: Any, stats: RebuildStats) -> None:
        """Writes every chunk of `targets` from the chunks `present` (per stripe), slice by slice."""
        if not targets:
            return
        feeds = self.feeds(targets, present)
        writes = [self.chunks[(ch.stripe, ch.index_in_stripe)].write for ch in targets]
        for lo in range(0, self.rows, self.slice_rows):
            sess.run(writes, steplog.feeds((self.lo, lo), *(feeds.items() if isinstance(feeds, dict) else feeds)), options=options)
            stats.session_calls += 1
        stats.bytes += len(targets) * self.rows * self.width * 4
        stats.variables += len({variable_name(v) for ch in targets for v in self.chunks[(ch.stripe, ch.index_in_stripe)].variables})

