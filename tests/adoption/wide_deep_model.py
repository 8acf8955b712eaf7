"""A user's model module for ``tf-ecrec run --model wide_deep_model`` (the contract: tf_ecrec.launcher.job.models).

Wide & Deep on the Criteo layout: one ``[26 * rows, dim]`` table shared by all fields (each field's
ids offset into it), a 1-D ``[26 * rows]`` table of wide weights, an MLP on the dense features and
the embeddings. Protected tables when ``params["ec"]``, plain variables otherwise.
"""

import tensorflow as tf

import tf_ecrec

FIELDS = 26


def default_params(**flags):
    return {**flags, "hidden": [32, 16]}


def model_fn(features, labels, mode, params, config):
    rows, dim = params["table_sizes"][0], params["embedding_dim"]
    offsets = tf.constant([f * rows for f in range(FIELDS)], tf.int64)
    ids = features["cat"] + offsets
    if params.get("ec"):
        deep_table = tf_ecrec.EmbeddingTable("deep", [FIELDS * rows, dim])
        wide_table = tf_ecrec.EmbeddingTable("wide", [FIELDS * rows])
        deep, wide = deep_table.lookup(ids), wide_table.lookup(ids)
        penalty = 1e-5 * (deep_table.l2_loss() + wide_table.l2_loss())
    else:
        deep_table = tf.compat.v1.get_variable("deep", [FIELDS * rows, dim])
        wide_table = tf.compat.v1.get_variable("wide", [FIELDS * rows])
        deep, wide = tf.nn.embedding_lookup(deep_table, ids), tf.nn.embedding_lookup(wide_table, ids)
        penalty = 0.0
    x = tf.concat([features["dense"], tf.reshape(deep, [-1, FIELDS * dim])], 1)
    for units in params["hidden"]:
        x = tf.compat.v1.layers.dense(x, units, tf.nn.relu, kernel_initializer=tf.compat.v1.glorot_uniform_initializer())
    logits = tf.reshape(tf.compat.v1.layers.dense(x, 1), [-1]) + tf.reduce_sum(wide, 1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)) + penalty
    optimizer = tf.compat.v1.train.AdagradOptimizer(params["learning_rate"])
    if params.get("ec"):
        optimizer = tf_ecrec.ECOptimizer(optimizer)
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, predictions={"p": tf.sigmoid(logits)})
