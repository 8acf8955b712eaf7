"""`tf_ecrec.EmbeddingTable`: tables of any width, 1-D included, and the L2 penalty of the rows a step reads."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_ecrec
from tf_ecrec.errors import ConfigError
from tf_ecrec.layout.device import local_storage


def _tables():
    kw = {"ec": tf_ecrec.ECConfig(1, 1), "num_ps": 2}
    return tf_ecrec.EmbeddingTable("w", [100], **kw), tf_ecrec.EmbeddingTable("v", [100, 4], **kw)


def test_lookups_have_the_shapes_of_embedding_lookup_and_the_penalty_counts_each_row_once():
    with tf.Graph().as_default(), local_storage():
        w, v = _tables()
        ids = tf.constant([[1, 2, 2], [3, 1, 99]], tf.int64)
        rows_w, rows_v = w.lookup(ids), v.lookup(ids)
        assert rows_w.shape.as_list() == [2, 3] and rows_v.shape.as_list() == [2, 3, 4]
        penalty_w, penalty_v = w.l2_loss(), v.l2_loss()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got_w, got_v, pw, pv = sess.run([rows_w, rows_v, penalty_w, penalty_v])
    distinct = {1: 0, 2: 1, 3: 3, 99: 5}  # id -> its first position in the flattened ids
    flat_w, flat_v = got_w.reshape(-1), got_v.reshape(-1, 4)
    np.testing.assert_allclose(pw, 0.5 * sum(flat_w[i] ** 2 for i in distinct.values()), rtol=1e-6)
    np.testing.assert_allclose(pv, 0.5 * sum((flat_v[i] ** 2).sum() for i in distinct.values()), rtol=1e-6)
    assert got_w[0, 1] == got_w[0, 2] and got_w[0, 0] == got_w[1, 1]  # the same id reads the same row


def test_the_penalty_gradient_touches_only_the_rows_read():
    with tf.Graph().as_default(), local_storage():
        w, _ = _tables()
        w.lookup(tf.constant([5, 7], tf.int64))
        grads = tf.compat.v1.gradients(w.l2_loss(), w.variables)
        assert all(isinstance(g, tf.IndexedSlices) for g in grads if g is not None)


def test_a_table_used_as_a_tensor_names_the_ways_to_read_and_penalize_it():
    with tf.Graph().as_default(), local_storage():
        w, _ = _tables()
        with pytest.raises((ConfigError, ValueError), match=r"EmbeddingTable 'w' used as a tensor; rule: .*lookup.*l2_loss"):
            tf.nn.l2_loss(w)
        with pytest.raises(ConfigError, match=r"l2_loss\(\) before any lookup"):
            w.l2_loss()


@pytest.mark.parametrize("shape", [[], [10, 2, 3], [0], [10, 0]])
def test_a_shape_of_another_rank_or_size_is_refused(shape):
    with tf.Graph().as_default(), local_storage():
        with pytest.raises(ConfigError, match=r"rule: \[rows\] or \[rows, dim\]"):
            tf_ecrec.EmbeddingTable("x", shape, ec=tf_ecrec.ECConfig(1, 1), num_ps=2)
