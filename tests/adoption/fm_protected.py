"""A factorization machine with tf.estimator, protected by tf_ecrec, in the style of public recsys scripts.

Smaller than ``deepfm_protected.py`` and with no input files: the clicks are
generated in the input pipeline.  Run one process per task with TF_CONFIG
set by the cluster launcher; with ``TF_ECREC_CLUSTER_FILE`` set, the
trainers follow PS tasks that come back at new addresses.  Training ends at
``--max_steps`` or, for an open-ended run, once ``--stop_file`` exists.
"""

import argparse
import os

import tensorflow as tf

import tf_ecrec

tf.compat.v1.disable_eager_execution()
tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)

parser = argparse.ArgumentParser()
parser.add_argument("--model_dir", required=True)
parser.add_argument("--feature_size", type=int, default=4000)
parser.add_argument("--field_size", type=int, default=8)
parser.add_argument("--embedding_size", type=int, default=8)
parser.add_argument("--batch_size", type=int, default=64)
parser.add_argument("--max_steps", type=int, default=1000)
parser.add_argument("--learning_rate", type=float, default=0.05)
parser.add_argument("--session_timeout_secs", type=float, default=30.0)
parser.add_argument("--stop_file", default="")
FLAGS = parser.parse_args()


def input_fn(feature_size, field_size, batch_size, seed):
    per_field = feature_size // field_size

    def click(index):
        draw = tf.random.stateless_uniform([field_size], seed=tf.stack([tf.constant(seed, tf.int64), index]),
                                           maxval=per_field, dtype=tf.int64)
        ids = draw + tf.range(field_size, dtype=tf.int64) * per_field
        label = tf.cast(tf.equal(ids[0] % 2, 0), tf.float32)
        return {"feat_ids": ids}, label

    return tf.data.Dataset.range(1 << 40).map(click).batch(batch_size).prefetch(4)


def model_fn(features, labels, mode, params):
    FM_B = tf.compat.v1.get_variable("fm_bias", shape=[1], initializer=tf.compat.v1.zeros_initializer())
    FM_W = tf_ecrec.EmbeddingTable("fm_w", [params["feature_size"]], initializer=tf.compat.v1.zeros_initializer())
    FM_V = tf_ecrec.EmbeddingTable("fm_v", [params["feature_size"], params["embedding_size"]],
                                   initializer=tf.compat.v1.glorot_normal_initializer())
    ids = features["feat_ids"]
    y_w = tf.reduce_sum(FM_W.lookup(ids), 1)
    embeddings = FM_V.lookup(ids)
    y_v = 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(embeddings, 1)) - tf.reduce_sum(tf.square(embeddings), 1), 1)
    hidden = tf.compat.v1.layers.dense(tf.reshape(embeddings, [-1, params["field_size"] * params["embedding_size"]]),
                                       16, activation=tf.nn.relu)
    y = FM_B + y_w + y_v + tf.reshape(tf.compat.v1.layers.dense(hidden, 1), [-1])
    predictions = {"prob": tf.sigmoid(y)}
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode=mode, predictions=predictions)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(logits=y, labels=labels))
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode=mode, loss=loss,
                                          eval_metric_ops={"auc": tf.compat.v1.metrics.auc(labels, predictions["prob"])})
    optimizer = tf.compat.v1.train.AdagradOptimizer(params["learning_rate"])
    train_op = tf_ecrec.ECOptimizer(optimizer).minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode=mode, predictions=predictions, loss=loss, train_op=train_op)


class StopFileHook(tf.compat.v1.train.SessionRunHook):
    """Ends training once `path` exists (looked at every 10 steps)."""

    def __init__(self, path):
        self._path = path
        self._steps = 0

    def after_run(self, run_context, run_values):
        self._steps += 1
        if self._steps % 10 == 0 and os.path.exists(self._path):
            run_context.request_stop()


def main():
    params = {"feature_size": FLAGS.feature_size, "field_size": FLAGS.field_size,
              "embedding_size": FLAGS.embedding_size, "learning_rate": FLAGS.learning_rate}
    config = tf.estimator.RunConfig(model_dir=FLAGS.model_dir, save_checkpoints_steps=100000, log_step_count_steps=50)
    fm = tf.estimator.Estimator(model_fn=model_fn, params=params, config=config)
    train_spec = tf.estimator.TrainSpec(
        input_fn=lambda: input_fn(FLAGS.feature_size, FLAGS.field_size, FLAGS.batch_size, seed=os.getpid()),
        max_steps=FLAGS.max_steps, hooks=[StopFileHook(FLAGS.stop_file)] if FLAGS.stop_file else [])
    eval_spec = tf.estimator.EvalSpec(
        input_fn=lambda: input_fn(FLAGS.feature_size, FLAGS.field_size, FLAGS.batch_size, seed=0), steps=10)
    tf_ecrec.train_and_evaluate(fm, train_spec, eval_spec, session_timeout_secs=FLAGS.session_timeout_secs)


if __name__ == "__main__":
    main()
