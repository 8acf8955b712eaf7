"""Feature columns whose tables are erasure-coded: ``embedding_column``, ``shared_embeddings`` and ``linear``.

    user = tf.feature_column.categorical_column_with_hash_bucket("user", 100_000)
    columns = [tf_ecrec.feature_column.embedding_column(user, 16)]        # was: tf.feature_column.embedding_column
    estimator = tf.compat.v1.estimator.DNNClassifier(
        [64, 32], columns, optimizer=tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.05)))
    tf_ecrec.train(estimator, input_fn, max_steps=...)

The column is TensorFlow's `EmbeddingColumn` (the same fields, parse spec, shapes and name; any
categorical column: hashed, identity, vocabulary, weighted), whose table is a
`tf_ecrec.EmbeddingCollection` of one table instead of a variable: striped over the PS tasks with
parity, read with the collection's lookup and combined per example as TensorFlow's sparse lookup
does (``sum``, ``mean``, ``sqrtn``; ids below 0, as an out-of-vocabulary id without OOV buckets, and
weights of 0 or less are dropped; an example with no id gets zeros). It serves both feature-column
APIs: the v1 ``input_layer`` of the ``tf.compat.v1.estimator`` canned estimators and the v2
``DenseFeatures``. The collection is made the first time the graph reads the column, inside the
model_fn that `tf_ecrec.ec_model_fn` wraps (its code and PS count). Not supported (a `ConfigError`
when the graph is built): ``max_norm``. ``ckpt_to_load_from`` starts the table from a stock table's checkpoint. ``shared_embeddings`` gives several
categorical columns of one bucket count one table, as `tf.feature_column.shared_embeddings` does (each
column is then an embedding column of that table, named as an ordinary one: ``<column>_embedding``).
``linear(columns)`` protects a linear model's weights (a canned estimator's wide part): see `linear`.
"""

from __future__ import annotations

import functools
import re
import weakref
from typing import Any

import tensorflow as tf
from tensorflow.python.feature_column import feature_column_v2 as fc
from tensorflow.python.feature_column import feature_column_v2_types as fc_types

from tf_ecrec.errors import ConfigError
from tf_ecrec.step.embedding import EmbeddingCollection, FromCheckpoint, current_context

_COMBINERS = ("sum", "mean", "sqrtn")
# Per graph, the collection of each column (by name): a column read twice in a graph reads one table.
_TABLES: weakref.WeakKeyDictionary[tf.Graph, dict[str, EmbeddingCollection]] = weakref.WeakKeyDictionary()


class ECEmbeddingColumn(fc.EmbeddingColumn):
    """`tf.feature_column.embedding_column` with its table in a `tf_ecrec.EmbeddingCollection` (see the module doc)."""

    def create_state(self, state_manager: Any) -> None:
        """The collection's data variables as the layer's weights: a Keras model of a ``DenseFeatures`` layer
        trains what its layers own (`model_to_estimator`), and the table is a collection, not a variable of
        TensorFlow's. Each is handed to the state manager's own ``create_variable`` through a variable creator
        scope, which returns it instead of a new variable (both Keras feature layers create through it)."""
        for p, var in sorted(self._table().data.items()):
            def existing(next_creator: Any, _var: Any = var, **kwargs: Any) -> Any:
                return _var

            # Without the canned input layer's partitioner: it would give the variable a slice name to save under.
            with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope()) as scope, \
                    tf.compat.v1.variable_creator_scope(existing):
                scope.set_partitioner(None)
                state_manager.create_variable(self, f"ec_data_ps{p}", var.shape, tf.float32, trainable=True)

    def _get_dense_tensor_internal(self, sparse_tensors: Any, state_manager: Any) -> tf.Tensor:
        return self._protected_lookup(sparse_tensors)

    def _old_get_dense_tensor_internal(self, sparse_tensors: Any, weight_collections: Any, trainable: Any) -> tf.Tensor:
        return self._protected_lookup(sparse_tensors)

    def _table(self) -> EmbeddingCollection:
        tables = _TABLES.setdefault(tf.compat.v1.get_default_graph(), {})
        key = getattr(self, "shared_table", None) or self.name  # `shared_embeddings`: one table for several columns
        if key not in tables:
            name = re.sub(r"[^A-Za-z0-9_.\-]", "_", key)
            init = FromCheckpoint(self.ckpt_to_load_from, self.tensor_name_in_ckpt) if self.ckpt_to_load_from else None
            tables[key] = EmbeddingCollection(name, [(name, _buckets(self.categorical_column))], self.dimension,
                                              initializer=init or self.initializer)
        return tables[key]

    def _protected_lookup(self, sparse_tensors: Any) -> tf.Tensor:
        if self.max_norm is not None:
            raise ConfigError(f"embedding_column {self.name!r} has max_norm={self.max_norm!r}; rule: None (not supported "
                              "by a protected table); source: tf_ecrec.feature_column.embedding_column")
        table = self._table()
        ids, weights = sparse_tensors.id_tensor, sparse_tensors.weight_tensor
        batch = ids.dense_shape[0]
        if ids.dense_shape.shape[0] != 2:  # [batch, ...]: every id of an example in one row, as the sparse lookup does
            ids = tf.sparse.reshape(ids, tf.stack([batch, -1]))
            weights = tf.sparse.reshape(weights, tf.stack([batch, -1])) if weights is not None else None
        example, values = ids.indices[:, 0], ids.values
        w = tf.cast(weights.values, tf.float32) if weights is not None else tf.ones_like(values, tf.float32)
        keep = tf.logical_and(values >= 0, w > 0) if weights is not None else values >= 0
        example, values, w = (tf.boolean_mask(t, keep) for t in (example, values, w))
        rows = table.lookup(table.table_names[0], values) * w[:, None]
        total = tf.math.unsorted_segment_sum(rows, example, batch)
        if self.combiner == "mean":
            total = tf.math.divide_no_nan(total, tf.math.unsorted_segment_sum(w, example, batch)[:, None])
        elif self.combiner == "sqrtn":
            total = tf.math.divide_no_nan(total, tf.sqrt(tf.math.unsorted_segment_sum(w * w, example, batch))[:, None])
        return total


def embedding_column(categorical_column: Any, dimension: int, combiner: str = "mean", initializer: Any = None,
                     ckpt_to_load_from: str | None = None, tensor_name_in_ckpt: str | None = None,
                     trainable: bool = True) -> ECEmbeddingColumn:
    """`tf.feature_column.embedding_column(categorical_column, dimension, combiner, initializer, ckpt_to_load_from,
    tensor_name_in_ckpt)`, protected. With both checkpoint arguments the table starts from a stock table of a
    checkpoint (a model trained without tf_ecrec: its ``.../embedding_weights``), read into the stripes on each PS.

    Raises:
      ConfigError: a dimension below 1, an unknown combiner, a column that is not a categorical column, a vocabulary
        file that is missing, one of the two checkpoint arguments without the other, a checkpoint or tensor that is not there or not the table's shape.
    """
    if (ckpt_to_load_from is None) != (tensor_name_in_ckpt is None):
        raise ConfigError(f"ckpt_to_load_from={ckpt_to_load_from!r}, tensor_name_in_ckpt={tensor_name_in_ckpt!r}; rule: "
                          "both or neither; source: tf_ecrec.feature_column.embedding_column")
    if not isinstance(dimension, int) or dimension < 1:
        raise ConfigError(f"dimension={dimension!r}; rule: an integer >= 1; source: tf_ecrec.feature_column.embedding_column")
    if trainable is not True:
        raise ConfigError(f"trainable={trainable!r}; rule: True (a protected table is trained by the ECOptimizer; a frozen "
                          "table is a stock embedding_column); source: tf_ecrec.feature_column.embedding_column")
    if combiner not in _COMBINERS:
        raise ConfigError(f"combiner={combiner!r}; rule: one of {_COMBINERS}; source: tf_ecrec.feature_column.embedding_column")
    if not isinstance(categorical_column, (fc.CategoricalColumn, fc.fc_old._CategoricalColumn)):
        raise ConfigError(f"categorical_column={categorical_column!r}; rule: a categorical column (hash bucket, identity, "
                          "vocabulary, weighted); source: tf_ecrec.feature_column.embedding_column")
    _check_vocabulary(categorical_column, "tf_ecrec.feature_column.embedding_column")
    if ckpt_to_load_from is not None:  # refused here, where the user wrote it (in the graph it surfaces wrapped)
        FromCheckpoint(ckpt_to_load_from, str(tensor_name_in_ckpt)).prefix(_buckets(categorical_column), dimension)
    return ECEmbeddingColumn(categorical_column=categorical_column, dimension=dimension, combiner=combiner,
                             initializer=initializer or tf.compat.v1.truncated_normal_initializer(stddev=dimension ** -0.5),
                             ckpt_to_load_from=ckpt_to_load_from, tensor_name_in_ckpt=tensor_name_in_ckpt, max_norm=None,
                             trainable=trainable)


def shared_embeddings(categorical_columns: Any, dimension: int, combiner: str = "mean", initializer: Any = None,
                      shared_embedding_collection_name: str | None = None) -> list[ECEmbeddingColumn]:
    """`tf.feature_column.shared_embeddings(categorical_columns, dimension, ...)`, protected: one table for all.

    Raises:
      ConfigError: no column, columns of different bucket counts (rule of TensorFlow's too), or what
        `embedding_column` refuses.
    """
    columns = list(categorical_columns)
    source = "tf_ecrec.feature_column.shared_embeddings"
    if not columns:
        raise ConfigError(f"categorical_columns=[]; rule: at least one categorical column; source: {source}")
    for column in columns:
        if not isinstance(column, (fc.CategoricalColumn, fc.fc_old._CategoricalColumn)):
            raise ConfigError(f"categorical_columns has {column!r}; rule: categorical columns; source: {source}")
    buckets = {column.name: _buckets(column) for column in columns}
    if len(set(buckets.values())) != 1:
        raise ConfigError(f"categorical_columns have the bucket counts {buckets}; rule: one count (one table); source: {source}")
    name = shared_embedding_collection_name or "_".join(sorted(buckets)) + "_shared_embedding"
    initializer = initializer or tf.compat.v1.truncated_normal_initializer(stddev=dimension ** -0.5)
    out = []
    for column in columns:
        shared = embedding_column(column, dimension, combiner, initializer)
        shared.shared_table = name  # read by ECEmbeddingColumn._table
        out.append(shared)
    return out


class ShardedVariable(list):  # a list: TensorFlow's sparse lookup reads a list as partitions
    """A protected linear weight as the linear model's ``weights``: the collection's data variables, in PS order.

    TensorFlow's safe sparse lookup reads a list as the ``div`` partitions of one variable. The class is named
    as TensorFlow's own split variables are because Keras layers recognise a split variable by that class name
    and then track each part as a weight (so the layer, and a canned model's summaries, see the data variables).
    """


class ECLinearColumn(fc.CategoricalColumn):
    """A categorical column whose weights in a linear model are a protected table (see `linear`)."""

    def __init__(self, categorical_column: Any) -> None:
        self.categorical_column = categorical_column

    @property
    def name(self) -> str:
        return str(self.categorical_column.name)

    @property
    def num_buckets(self) -> int:
        return _buckets(self.categorical_column)

    @property
    def parse_example_spec(self) -> Any:
        return self.categorical_column.parse_example_spec

    @property
    def parents(self) -> list[Any]:
        return [self.categorical_column]

    @property
    def _is_v2_column(self) -> bool:
        return bool(self.categorical_column._is_v2_column)

    def __repr__(self) -> str:
        return f"ECLinearColumn({self.categorical_column!r})"

    def transform_feature(self, transformation_cache: Any, state_manager: Any) -> Any:
        return transformation_cache.get(self.categorical_column, state_manager)

    def create_state(self, state_manager: Any) -> None:
        """Called by the linear model in the variable scope where it then creates the column's ``weights``: a
        custom getter on that scope (this column's only) makes them the collection's data variables."""
        self.categorical_column.create_state(state_manager)
        ctx = current_context()
        if ctx is None or self.num_buckets < ctx.num_ps * ctx.ec.k:  # a table too small to stripe: a stock weight
            return
        scope = tf.compat.v1.get_variable_scope()
        wanted, outer, column = f"{scope.name}/weights", scope.custom_getter, self

        def claim(getter: Any, name: str, *args: Any, **kwargs: Any) -> Any:  # TensorFlow passes getter= and name=
            if outer is not None:
                getter = functools.partial(outer, getter)
            if name != wanted:
                return getter(name, *args, **kwargs)
            shape: Any = kwargs["shape"] if "shape" in kwargs else args[0]  # (buckets, units)
            table = column._table(int(shape[1]))
            return ShardedVariable(table.data[p] for p in range(table.num_ps))

        scope.set_custom_getter(claim)

    def get_sparse_tensors(self, transformation_cache: Any, state_manager: Any) -> Any:
        pair = self.categorical_column.get_sparse_tensors(transformation_cache, state_manager)
        table = _TABLES.get(tf.compat.v1.get_default_graph(), {}).get(self._key)
        if table is None:  # a stock weight (a small table), or read outside a linear model
            return pair
        try:
            weights = state_manager.get_variable(self, "weights")
        except (ValueError, KeyError, AttributeError):
            weights = None
        if not isinstance(weights, ShardedVariable):
            raise ConfigError(f"linear column {self.name!r} is read by something other than the linear model that "
                              "made its weights; rule: a tf_ecrec.feature_column.linear column feeds a linear model "
                              "only; source: tf_ecrec.feature_column.linear")
        ids = tf.SparseTensor(pair.id_tensor.indices, table.div_index(pair.id_tensor.values), pair.id_tensor.dense_shape)
        return fc.CategoricalColumn.IdWeightPair(ids, pair.weight_tensor)

    @property
    def _key(self) -> str:
        return f"{self.name}/linear"

    def _table(self, units: int) -> EmbeddingCollection:
        tables = _TABLES.setdefault(tf.compat.v1.get_default_graph(), {})
        if self._key not in tables:
            name = re.sub(r"[^A-Za-z0-9_.\-]", "_", self.name) + "_linear"
            tables[self._key] = EmbeddingCollection(name, [(name, self.num_buckets)], units,
                                                    initializer=tf.compat.v1.zeros_initializer())
        return tables[self._key]

    def get_config(self) -> dict[str, Any]:
        from tensorflow.python.feature_column import serialization  # pylint: disable=import-outside-toplevel

        return {"categorical_column": serialization.serialize_feature_column(self.categorical_column)}

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None, columns_by_name: Any = None) -> Any:
        from tensorflow.python.feature_column import serialization  # pylint: disable=import-outside-toplevel

        return cls(serialization.deserialize_feature_column(config["categorical_column"], custom_objects,
                                                            columns_by_name))


def linear(columns: Any) -> list[Any]:
    """A linear model's feature columns with the weights of each categorical one (hashed, identity, vocabulary,
    bucketized, crossed, weighted) protected: striped over the PS tasks with parity, as an embedding table of
    width ``units``, and read by TensorFlow's own weighted sum. Dense columns, and categorical ones of fewer
    than num_ps x k buckets, keep stock weights (dense variables: replicated).

        wide = tf_ecrec.feature_column.linear(wide)     # the linear_feature_columns of a canned estimator

    Raises:
      ConfigError: an item that is not a feature column of TensorFlow's v2 API, a vocabulary file that is missing.
    """
    out = []
    for column in list(columns):
        if isinstance(column, fc.CategoricalColumn) and getattr(column, "_is_v2_column", False):
            _check_vocabulary(column, "tf_ecrec.feature_column.linear")
            out.append(column if isinstance(column, ECLinearColumn) else ECLinearColumn(column))
        elif isinstance(column, fc_types.FeatureColumn) and getattr(column, "_is_v2_column", False):
            out.append(column)
        else:
            raise ConfigError(f"columns has {column!r}; rule: feature columns of tf.feature_column (the v2 API); "
                              "source: tf_ecrec.feature_column.linear")
    return out


def _check_vocabulary(column: Any, source: str) -> None:
    """A vocabulary file a column (or a column it is built on) reads must be there: refused where the user wrote
    the column, not as a table initializer's NotFoundError inside the first session."""
    path = getattr(column, "vocabulary_file", None)
    if path is not None and not tf.io.gfile.exists(path):
        raise ConfigError(f"column {column.name!r} reads vocabulary_file={path!r}, which does not exist; rule: an "
                          f"existing vocabulary file; source: {source}")
    for parent in getattr(column, "parents", []):
        if isinstance(parent, fc_types.FeatureColumn):
            _check_vocabulary(parent, source)


def _buckets(column: Any) -> int:
    return int(getattr(column, "num_buckets", None) or column._num_buckets)
