"""Erasure-coded embedding tables: storage on the PS tasks and lookup.

An `EmbeddingCollection` holds one or more tables of the same width.  The
tables are concatenated into one logical table (table ``t`` starts at row
``base[t]``), which `tf_ecrec.layout.placement.plan` cuts into chunks and stripes
over the ``N`` PS tasks.  Each PS ``p`` gets one variable,
``ec/<collection>/ps<p>/data``, holding its data chunks one after another
(local chunk ``i`` at rows ``[i*c, (i+1)*c)``), put on PS ``p`` by the
job's device function (`tf_ecrec.layout.device`).
Padding rows are zero and never looked up.

The optimizer state of these variables and their parity are created by
`tf_ecrec.step.optimizer.ECOptimizer` when it first applies gradients: only then
is the optimizer, hence the slot count and the parity row width, known.

A lookup routes ids to their PS with two small constant tables (PS and local
chunk of every chunk), gathers on each PS in one op, and stitches the rows
back into the caller's order.  Gradients reach each PS variable as
`IndexedSlices` through the gather, as for stock partitioned variables.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_ecrec import ops as ec_ops
from tf_ecrec.base import unfolded
from tf_ecrec.base.graph_registry import GraphRegistry
from tf_ecrec.erasure import codec
from tf_ecrec.erasure.code import ECConfig
from tf_ecrec.errors import ConfigError
from tf_ecrec.layout import placement
from tf_ecrec.layout.device import check_placed, on_ps, storage_device, storage_is_local, variable_name
from tf_ecrec.layout.table_layout import ChunkKind, ChunkSpec, TableSpec
from tf_ecrec.step.step_program import StepGeneration

_LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ECContext:
    """Defaults for tables built in this graph: the code, the PS count and the step generation.

    ``version`` is the cluster version (TF_CONFIG ``version``) the graph is
    built for: the start of `steps`, the `StepGeneration` whose value goes
    into the top bits of every step id (a PS whose log was raised to a later
    generation refuses older steps, `tf_ecrec.step.steplog`) and whose target
    follows the cluster when the trainer follows a moved PS in place.
    """

    ec: ECConfig
    num_ps: int
    version: dataclasses.InitVar[int] = 0
    steps: StepGeneration = dataclasses.field(init=False, compare=False)
    # How its ECOptimizers commit a step unless told otherwise: "in_step", "carried" or "batched" (the
    # graph's runs are then driven by a `tf_ecrec.step.carried_commit.CarriedCommitHook`, which `ec_model_fn` adds).
    commit: str = "in_step"

    def __post_init__(self, version: int) -> None:
        object.__setattr__(self, "steps", StepGeneration(version))

    @property
    def generation(self) -> int:
        """The version of the cluster this graph's trainer follows now (the chief's recovery raises the PS to it)."""
        return self.steps.target


# The job-wide defaults `ec_model_fn` sets for a graph, and the protected collections built in it.
_CONTEXTS: GraphRegistry[ECContext] = GraphRegistry()
_COLLECTIONS: GraphRegistry[EmbeddingCollection] = GraphRegistry()


def set_context(context: ECContext, graph: tf.Graph | None = None) -> None:
    """Makes `context` the defaults of the tables built in `graph` (the default graph)."""
    _CONTEXTS.add(context, graph)


def current_context(graph: tf.Graph | None = None) -> ECContext | None:
    """The last context set for `graph` (the default graph), None if none was."""
    items = _CONTEXTS.items(graph)
    return items[-1] if items else None


class EmbeddingCollection:
    """Tables of one width, stored erasure-coded across the PS tasks.

    Build it inside the Estimator's model_fn (the graph being built is the
    training graph); each call creates new variables.

    Args:
      name: the collection's name (variable scope under "ec/").
      tables: (table name, rows) pairs, in lookup order.
      dim: values per row.
      ec: the code; default: the one set by `tf_ecrec.ec_model_fn`.
      num_ps: PS tasks; default: the one set by `tf_ecrec.ec_model_fn`.
      initializer: initializer of the real rows, called with a shape
        [rows, dim]; default uniform in [-0.05, 0.05]; a `FromCheckpoint`
        reads them from a stock table's checkpoint (one table).
      protected: False stores the tables the same way (the variables,
        layout and lookups of ``ec``) with no protection: no parity, no
        wait for rows being rebuilt, trained by a stock optimizer; the
        like-for-like baseline of a protected collection.  Build it under
        `tf_ecrec.layout.device.layout_placement` (or an `ECDeviceFn`).

    Raises:
      ConfigError: no code or PS count known, a code the PS count cannot
        place, or a bad table.
    """

    def __init__(
        self,
        name: str,
        tables: Sequence[tuple[str, int]],
        dim: int,
        ec: ECConfig | None = None,
        num_ps: int | None = None,
        initializer: Callable[..., Any] | FromCheckpoint | None = None,
        protected: bool = True,
    ) -> None:
        ctx = current_context()
        ec = ec or (ctx.ec if ctx else None)
        num_ps = num_ps or (ctx.num_ps if ctx else None)
        if ec is None or not num_ps:
            raise ConfigError(
                f"embedding collection {name!r} needs an erasure code and the PS count: build it in a "
                "model_fn wrapped with tf_ecrec.ec_model_fn, or pass ec= and num_ps=; source: EmbeddingCollection"
            )
        ec.check_cluster(num_ps, source=f"embedding collection {name!r}")
        if not tables:
            raise ConfigError(f"embedding collection {name!r} has no tables; source: EmbeddingCollection")
        names = [t for t, _ in tables]
        if len(set(names)) != len(names):
            raise ConfigError(f"embedding collection {name!r} repeats a table name in {names}; source: tables")
        for table, rows in tables:
            if int(rows) < 1:
                raise ConfigError(f"table {table!r} has {rows} rows; a table needs >= 1; source: tables")
        self.name = name
        self.protected = bool(protected)
        self.ec = ec
        self.num_ps = int(num_ps)
        self.dim = int(dim)
        self.table_names = tuple(names)
        self._table_index = {t: i for i, t in enumerate(names)}
        self.table_rows = tuple(int(r) for _, r in tables)
        self.base = np.concatenate([[0], np.cumsum(self.table_rows)[:-1]]).astype(np.int64)
        self.total_rows = int(sum(self.table_rows))
        if self.total_rows < ec.k:
            raise ConfigError(
                f"embedding collection {name!r} has {self.total_rows} rows in all, fewer than k = {ec.k} "
                "chunks of a stripe need; source: tables"
            )
        # The layout and the code, computed once: everything else asks them.
        self.code = codec.Code(ec.k, ec.r)
        self.layout = placement.plan(self.num_ps, ec.k, ec.r, [TableSpec(name, self.total_rows, self.dim)])
        self.table_layout = self.layout.table(name)
        self.chunk_rows = int(self.table_layout.chunk_rows)
        self.data_chunks_on: dict[int, tuple[ChunkSpec, ...]] = {
            p: self.table_layout.chunks_on(p, ChunkKind.DATA) for p in range(self.num_ps)
        }
        self.parity_chunks_on: dict[int, tuple[ChunkSpec, ...]] = {
            p: self.table_layout.chunks_on(p, ChunkKind.PARITY) for p in range(self.num_ps)
        }
        init = initializer or tf.compat.v1.random_uniform_initializer(-0.05, 0.05)
        self.data: dict[int, tf.Variable] = {}
        with tf.compat.v1.variable_scope("ec") as scope, tf.compat.v1.variable_scope(name) as inner:
            for s in (scope, inner):  # an enclosing scope's partitioner (a canned estimator's input layer) would split them
                s.set_partitioner(None)
            for p, local_chunks in self.data_chunks_on.items():
                if not local_chunks:
                    continue
                rows = len(local_chunks) * self.chunk_rows
                real_rows = [c.real_rows for c in local_chunks]
                with on_ps(p):
                    self.data[p] = tf.compat.v1.get_variable(
                        f"ps{p}/data",
                        shape=[rows, self.dim],
                        dtype=tf.float32,
                        initializer=(_from_checkpoint(init, local_chunks, self.total_rows, self.dim, p)
                                     if isinstance(init, FromCheckpoint) else _masked(init, real_rows, self.chunk_rows, p)),
                        use_resource=True,
                    )
                check_placed(self.data[p], p, f"the data chunks of collection {name!r}")
        if self.protected:  # what ECOptimizer, recovery and verification find
            _COLLECTIONS.add(self)

    # ---- lookup ---------------------------------------------------------------------------

    def logical_rows(self, table: int | str, ids: tf.Tensor) -> tf.Tensor:
        t = self._table_index[table] if isinstance(table, str) else int(table)
        return tf.cast(ids, tf.int64) + int(self.base[t])

    def lookup(self, table: int | str, ids: tf.Tensor) -> tf.Tensor:
        """Rows of one table: ``ids`` of any shape -> ``ids.shape + [dim]``.

        Ids must lie in [0, rows of the table); an id outside makes the gather
        on the PS fail with InvalidArgument rather than read another table.
        """
        t = self._table_index.get(table, -1) if isinstance(table, str) else int(table)
        if not 0 <= t < len(self.table_names):
            raise ConfigError(
                f"collection {self.name} has no table {table!r}; rule: a name of {list(self.table_names)} or an "
                f"index below {len(self.table_names)}; source: EmbeddingCollection.lookup"
            )
        ids = tf.cast(ids, tf.int64)
        checked = _check_range(ids, tf.constant(self.table_rows[t], tf.int64), f"table {self.table_names[t]}")
        with tf.control_dependencies([checked]):
            return self._gather_logical(self.logical_rows(t, ids))

    def lookup_all(self, ids: tf.Tensor) -> tf.Tensor:
        """Rows of every table at once: ``ids`` [batch, tables] -> [batch, tables, dim]."""
        ids = tf.cast(ids, tf.int64)
        limits = tf.constant(np.asarray(self.table_rows, dtype=np.int64))
        checked = _check_range(ids, limits, f"the tables of collection {self.name}")
        with tf.control_dependencies([checked]):
            return self._gather_logical(ids + tf.constant(self.base))

    def _gather_logical(self, rows: tf.Tensor) -> tf.Tensor:
        shape = tf.shape(rows)
        flat = tf.reshape(rows, [-1])
        c = tf.constant(self.chunk_rows, tf.int64)
        chunk = flat // c
        ps = tf.gather(tf.constant(self.table_layout.chunk_ps.astype(np.int32)), chunk)
        local = tf.gather(tf.constant(self.table_layout.chunk_local), chunk) * c + flat % c
        positions = tf.dynamic_partition(tf.range(tf.size(flat)), ps, self.num_ps)
        locals_ = tf.dynamic_partition(local, ps, self.num_ps)
        values = []
        for p in range(self.num_ps):
            if p in self.data:
                with tf.control_dependencies(self._await_rows(p, locals_[p])):
                    values.append(tf.gather(self.data[p], locals_[p]))
            else:  # a PS without data chunks of this collection gets no ids
                values.append(tf.zeros([0, self.dim], tf.float32))
        stitched = tf.dynamic_stitch(positions, values)
        return tf.reshape(stitched, tf.concat([shape, [self.dim]], axis=0))

    def _await_rows(self, p: int, local: tf.Tensor) -> list[tf.Operation]:
        """Before PS `p`'s rows `local` are read: the rows a background rebuild has not installed yet are asked for
        and waited on (a no-op otherwise; tf_ecrec.rebuild). Nothing where reads are stock gathers only (a
        SavedModel, an evaluator, an exporter, an unprotected collection): no op of ours."""
        if not self.protected or exporting() or storage_is_local():
            return []
        with tf.compat.v1.device(self.data[p].device):
            return [ec_ops.await_rebuilt_rows(ec_ops.delta_log(name=f"ec_delta_log_ps{p}"), self.data[p], local)]

    def div_index(self, rows: tf.Tensor) -> tf.Tensor:
        """``rows`` (logical rows; negative ids stay) as indices into the data variables taken in PS order as
        TensorFlow's ``div`` partitions of one variable, for a lookup made by TensorFlow's own embedding ops (a
        canned linear model's weighted sum, `tf_ecrec.feature_column.linear`): every PS holds k chunks, so the
        parts are equal and a row's index is its PS's offset plus its local row. The indices wait, as `lookup`
        does, for rows a background rebuild has not installed yet.

        Raises:
          ConfigError: the PS tasks hold different numbers of rows (fewer than num_ps x k rows): no ``div`` split.
        """
        sizes = {int(v.shape[0]) for v in self.data.values()}
        if len(self.data) != self.num_ps or len(sizes) != 1:
            raise ConfigError(f"collection {self.name!r} holds {sorted(sizes)} rows on {len(self.data)} of {self.num_ps} "
                              "PS; rule: the same rows on every PS (at least num_ps x k rows); source: div_index")
        part = sizes.pop()
        chunks = np.arange(len(self.table_layout.chunk_ps), dtype=np.int64)
        shift = self.table_layout.chunk_ps * part + (self.table_layout.chunk_local - chunks) * self.chunk_rows
        rows = tf.cast(rows, tf.int64)
        index = tf.where(rows >= 0, rows + tf.gather(tf.constant(shift), tf.maximum(rows, 0) // self.chunk_rows), rows)
        # Index 0 too: TensorFlow's safe sparse lookup gives an example with no id row 0 (its result then zeroed).
        valid = tf.concat([tf.boolean_mask(index, index >= 0), tf.zeros([1], tf.int64)], axis=0)
        locals_ = tf.dynamic_partition(valid % part, tf.cast(valid // part, tf.int32), self.num_ps)
        with tf.control_dependencies([w for p in range(self.num_ps) for w in self._await_rows(p, locals_[p])]):
            return tf.identity(index)

    # ---- metadata ---------------------------------------------------------------------------

    def data_variable_of(self) -> Mapping[str, int]:
        """Data variable op name -> PS task."""
        return {variable_name(v): p for p, v in self.data.items()}


def collections(graph: tf.Graph | None = None) -> list[EmbeddingCollection]:
    """The protected collections built in `graph` (the default graph), in order."""
    return _COLLECTIONS.items(graph)


def exporting() -> bool:
    """Whether ``tf.saved_model.save`` (Keras' ``model.save`` included) is tracing the function being built.

    A saved model reads the tables and never trains, so its lookups are stock gathers: no wait for rows
    a background rebuild has not installed (a tf_ecrec op), and the SavedModel loads and serves in a
    process without tf_ecrec.  TensorFlow marks the tracing it does while saving with its save context
    (`tensorflow.python.saved_model.save_context`, the same flag its own saving code reads).
    """
    from tensorflow.python.saved_model import save_context  # pylint: disable=import-outside-toplevel

    return bool(save_context.in_save_context())


def _check_range(ids: tf.Tensor, limits: tf.Tensor, what: str) -> tf.Operation:
    ok = tf.reduce_all(tf.logical_and(ids >= 0, ids < limits))
    return tf.debugging.Assert(ok, [f"ids out of range for {what}: each id must be in [0, rows); ids:", ids, "rows:", limits], summarize=8)


@dataclasses.dataclass(frozen=True)
class FromCheckpoint:
    """A collection's initializer: its rows are those of `tensor_name` in the checkpoint `path` (a file prefix,
    or a directory's latest), a stock ``[rows, dim]`` table of a collection of one table (a warm start from a
    model trained without tf_ecrec: `tf_ecrec.feature_column.embedding_column`'s ``ckpt_to_load_from``)."""

    path: str
    tensor_name: str

    def prefix(self, rows: int, dim: int) -> str:
        """The checkpoint's prefix, its tensor checked to be ``[rows, dim]`` float32 (a ConfigError names it)."""
        prefix = tf.train.latest_checkpoint(self.path) or self.path
        source = f"ckpt_to_load_from={self.path!r}"
        try:
            shapes = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
        except (tf.errors.NotFoundError, tf.errors.DataLossError, ValueError) as exc:
            raise ConfigError(f"{source}: no checkpoint there ({exc}); rule: a checkpoint prefix or a directory holding "
                              f"one; source: {source}") from exc
        if list(shapes.get(self.tensor_name, ())) != [rows, dim]:
            raise ConfigError(f"tensor_name_in_ckpt={self.tensor_name!r} in {prefix} has the shape "
                              f"{shapes.get(self.tensor_name, 'missing')}; rule: the table's [rows, dim] = [{rows}, {dim}]; "
                              f"source: {source}")
        return prefix


def _from_checkpoint(src: FromCheckpoint, chunks: Sequence[ChunkSpec], rows: int, dim: int, task: int) -> Callable[..., Any]:
    """The initializer of PS `task`'s data chunks from `src`: each chunk's real rows read from the checkpoint as a slice
    (on the PS, as TensorFlow's own warm start reads a variable's), its padding zeros."""
    prefix = src.prefix(rows, dim)

    def initializer(shape: Any, dtype: Any = tf.float32, partition_info: Any = None) -> tf.Tensor:
        parts = []
        with storage_device(task):
            for chunk in chunks:
                assert chunk.row_start is not None  # data chunks
                (values,) = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[src.tensor_name], dtypes=[tf.float32],
                                                 shape_and_slices=[f"{rows} {dim} {chunk.row_start},{chunk.real_rows}:-"])
                parts.append(tf.pad(values, [[0, chunk.rows - chunk.real_rows], [0, 0]]))
            return tf.concat(parts, axis=0)

    return initializer


def _masked(init: Callable[..., Any], real_rows: Sequence[int], chunk_rows: int, task: int) -> Callable[..., Any]:
    """An initializer giving `init`'s values on real rows and exact zeros on padding rows, computed on PS `task`.

    Local chunk ``i`` of the variable holds ``real_rows[i]`` real rows, then
    padding.  The values are computed where the variable lives: TensorFlow
    builds a variable's initial value outside every device scope, which in a
    distributed session puts it on the chief, and a large table's initial
    values would then pass through (and stay cached in) the chief's memory.
    """

    def initializer(shape: Any, dtype: Any = tf.float32, partition_info: Any = None) -> tf.Tensor:
        with storage_device(task):
            values = init(shape, dtype=dtype)
            local = unfolded.row_numbers(int(shape[0]))
            real = (local % chunk_rows) < tf.gather(tf.constant(real_rows, tf.int64), local // chunk_rows)
            return tf.where(real[:, None], values, tf.constant(0, values.dtype))

    return initializer
