"""`EmbeddingTable`: one protected table of any width, in place of a ``get_variable`` table.

Public recsys scripts keep each table in its own variable: a ``[features, K]``
table of factors read by every field, and a 1-D ``[features]`` table of
first-order weights::

    FM_W = tf.compat.v1.get_variable("fm_w", [feature_size])
    FM_V = tf.compat.v1.get_variable("fm_v", [feature_size, K])
    w = tf.nn.embedding_lookup(FM_W, feat_ids)          # feat_ids.shape
    v = tf.nn.embedding_lookup(FM_V, feat_ids)          # feat_ids.shape + [K]
    penalty = tf.nn.l2_loss(FM_W) + tf.nn.l2_loss(FM_V)

The protected form keeps that shape of code::

    FM_W = tf_ecrec.EmbeddingTable("fm_w", [feature_size])
    FM_V = tf_ecrec.EmbeddingTable("fm_v", [feature_size, K])
    w = FM_W.lookup(feat_ids)
    v = FM_V.lookup(feat_ids)
    penalty = FM_W.l2_loss() + FM_V.l2_loss()

Each table is an `EmbeddingCollection` of its own (one table, its own width;
a 1-D table is stored as width 1 and read back without the last axis), so
tables of several widths are all striped and covered by parity; several
same-width tables that are always read together are cheaper as one
collection (one gather per PS for all of them).

The L2 penalty.  ``tf.nn.l2_loss(table)`` penalizes every row, so its
gradient is dense and every step would rewrite every row of the table and
fold a table-sized delta into parity.  `EmbeddingTable.l2_loss` penalizes the
rows the step looked up, each distinct row once (the form large-scale
recommenders use; the penalty on a row applies when it is trained).  A table
passed where a tensor is expected raises `ConfigError` saying so; the full
penalty stays available as ``sum(tf.nn.l2_loss(v) for v in table.variables)``
(padding rows are zero) for a user who accepts its cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tf_ecrec.errors import ConfigError
from tf_ecrec.step.embedding import EmbeddingCollection


class EmbeddingTable:
    """One protected table of shape ``[rows]`` or ``[rows, dim]``, built inside an `ec_model_fn`.

    Args:
      name: the table's name (its variables are under ``ec/<name>/``).
      shape: ``[rows]`` (a 1-D table of weights) or ``[rows, dim]``.
      initializer: initializer of the real rows, called with ``[n, dim]``
        (``[n, 1]`` for a 1-D table); default uniform in [-0.05, 0.05].
      **collection_kwargs: passed to `EmbeddingCollection` (``ec``, ``num_ps``).

    Raises:
      ConfigError: a shape of another rank, or non-positive sizes.
    """

    def __init__(self, name: str, shape: Sequence[int], initializer: Callable[..., Any] | None = None,
                 **collection_kwargs: Any) -> None:
        dims = [int(d) for d in shape]
        if len(dims) not in (1, 2) or min(dims) < 1:
            raise ConfigError(f"EmbeddingTable {name!r} shape={list(shape)}; rule: [rows] or [rows, dim], "
                              "every size >= 1; source: EmbeddingTable")
        self.name = name
        self.shape = tuple(dims)
        self.collection = EmbeddingCollection(name, [(name, dims[0])], dims[1] if len(dims) == 2 else 1,
                                              initializer=initializer, **collection_kwargs)
        self._ids: list[tf.Tensor] = []
        self._rows: list[tf.Tensor] = []

    @property
    def variables(self) -> list[tf.Variable]:
        """The data variables (one per PS holding chunks of the table; padding rows are zero)."""
        return [self.collection.data[p] for p in sorted(self.collection.data)]

    def lookup(self, ids: tf.Tensor) -> tf.Tensor:
        """Rows of ``ids`` (any shape): ``ids.shape + [dim]``, or ``ids.shape`` for a 1-D table."""
        ids = tf.cast(ids, tf.int64)
        rows = self.collection.lookup(0, ids)
        self._ids.append(tf.reshape(ids, [-1]))
        self._rows.append(tf.reshape(rows, [-1, self.collection.dim]))
        return tf.squeeze(rows, -1) if len(self.shape) == 1 else rows

    def l2_loss(self) -> tf.Tensor:
        """``sum(row ** 2) / 2`` over the distinct rows this graph's lookups read (see the module doc).

        Call it after the lookups it should cover.

        Raises:
          ConfigError: no lookup was built yet.
        """
        if not self._ids:
            raise ConfigError(f"EmbeddingTable {self.name!r}.l2_loss() before any lookup; rule: call it after "
                              "the lookups whose rows it penalizes; source: the model_fn")
        ids = tf.concat(self._ids, 0)
        rows = tf.concat(self._rows, 0)
        unique, position = tf.unique(ids)
        first = tf.math.unsorted_segment_min(tf.range(tf.size(ids)), position, tf.size(unique))
        return tf.nn.l2_loss(tf.gather(rows, first))


def _refuse_conversion(value: EmbeddingTable, dtype: Any = None, name: Any = None, as_ref: bool = False) -> Any:
    raise ConfigError(
        f"EmbeddingTable {value.name!r} used as a tensor; rule: read it with .lookup(ids), penalize it with "
        ".l2_loss() (the rows the step read), or use .variables for the whole storage; source: the model_fn")


tf.register_tensor_conversion_function(EmbeddingTable, _refuse_conversion)
