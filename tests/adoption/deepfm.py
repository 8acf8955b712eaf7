"""DeepFM on libsvm-format CTR data with tf.estimator, in the style of public recsys scripts.

Input lines: ``label feat_id:feat_val feat_id:feat_val ...`` with one entry per field.
Run one process per task with TF_CONFIG set by the cluster launcher; without TF_CONFIG it
trains locally.
"""

import argparse
import glob
import json
import os

import tensorflow as tf

tf.compat.v1.disable_eager_execution()
tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)

parser = argparse.ArgumentParser()
parser.add_argument("--data_dir", required=True)
parser.add_argument("--model_dir", required=True)
parser.add_argument("--feature_size", type=int, default=20000)
parser.add_argument("--field_size", type=int, default=10)
parser.add_argument("--embedding_size", type=int, default=8)
parser.add_argument("--deep_layers", default="32,16")
parser.add_argument("--batch_size", type=int, default=128)
parser.add_argument("--num_epochs", type=int, default=1)
parser.add_argument("--max_steps", type=int, default=1000)
parser.add_argument("--learning_rate", type=float, default=0.01)
parser.add_argument("--l2_reg", type=float, default=0.0001)
parser.add_argument("--optimizer", default="Adam", choices=["Adam", "Adagrad", "GD", "Ftrl"])
parser.add_argument("--save_checkpoints_steps", type=int, default=500)
FLAGS = parser.parse_args()


def input_fn(filenames, batch_size=32, num_epochs=1, perform_shuffle=False):
    def decode_libsvm(line):
        columns = tf.strings.split([line], " ")
        labels = tf.strings.to_number(columns.values[0], out_type=tf.float32)
        splits = tf.strings.split(columns.values[1:], ":")
        id_vals = tf.reshape(splits.values, [-1, 2])
        feat_ids = tf.strings.to_number(id_vals[:, 0], out_type=tf.int64)
        feat_vals = tf.strings.to_number(id_vals[:, 1], out_type=tf.float32)
        return {"feat_ids": feat_ids, "feat_vals": feat_vals}, labels

    dataset = tf.data.TextLineDataset(filenames).map(decode_libsvm, num_parallel_calls=2).prefetch(500)
    if perform_shuffle:
        dataset = dataset.shuffle(buffer_size=256)
    return dataset.repeat(num_epochs).batch(batch_size)


def model_fn(features, labels, mode, params):
    field_size, feature_size = params["field_size"], params["feature_size"]
    embedding_size, l2_reg = params["embedding_size"], params["l2_reg"]
    layers = [int(x) for x in params["deep_layers"].split(",")]

    FM_B = tf.compat.v1.get_variable("fm_bias", shape=[1], initializer=tf.compat.v1.constant_initializer(0.0))
    FM_W = tf.compat.v1.get_variable("fm_w", shape=[feature_size], initializer=tf.compat.v1.glorot_normal_initializer())
    FM_V = tf.compat.v1.get_variable("fm_v", shape=[feature_size, embedding_size],
                                     initializer=tf.compat.v1.glorot_normal_initializer())

    feat_ids = tf.reshape(features["feat_ids"], [-1, field_size])
    feat_vals = tf.reshape(features["feat_vals"], [-1, field_size])

    with tf.compat.v1.variable_scope("first-order"):
        feat_wgts = tf.nn.embedding_lookup(FM_W, feat_ids)
        y_w = tf.reduce_sum(feat_wgts * feat_vals, 1)
    with tf.compat.v1.variable_scope("second-order"):
        embeddings = tf.nn.embedding_lookup(FM_V, feat_ids)
        embeddings = embeddings * tf.reshape(feat_vals, [-1, field_size, 1])
        sum_square = tf.square(tf.reduce_sum(embeddings, 1))
        square_sum = tf.reduce_sum(tf.square(embeddings), 1)
        y_v = 0.5 * tf.reduce_sum(sum_square - square_sum, 1)
    with tf.compat.v1.variable_scope("deep-part"):
        deep = tf.reshape(embeddings, [-1, field_size * embedding_size])
        for units in layers:
            deep = tf.compat.v1.layers.dense(deep, units, activation=tf.nn.relu,
                                             kernel_initializer=tf.compat.v1.glorot_uniform_initializer())
        y_d = tf.reshape(tf.compat.v1.layers.dense(deep, 1, kernel_initializer=tf.compat.v1.glorot_uniform_initializer()), [-1])

    y = FM_B + y_w + y_v + y_d
    pred = tf.sigmoid(y)
    predictions = {"prob": pred}
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode=mode, predictions=predictions)

    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(logits=y, labels=labels)) + \
        l2_reg * tf.nn.l2_loss(FM_W) + l2_reg * tf.nn.l2_loss(FM_V)
    eval_metric_ops = {"auc": tf.compat.v1.metrics.auc(labels, pred)}
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode=mode, predictions=predictions, loss=loss, eval_metric_ops=eval_metric_ops)

    if params["optimizer"] == "Adam":
        optimizer = tf.compat.v1.train.AdamOptimizer(learning_rate=params["learning_rate"], beta1=0.9, beta2=0.999, epsilon=1e-8)
    elif params["optimizer"] == "Adagrad":
        optimizer = tf.compat.v1.train.AdagradOptimizer(learning_rate=params["learning_rate"], initial_accumulator_value=1e-8)
    elif params["optimizer"] == "Ftrl":
        optimizer = tf.compat.v1.train.FtrlOptimizer(params["learning_rate"])
    else:
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(params["learning_rate"])
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode=mode, predictions=predictions, loss=loss, train_op=train_op)


def serving_input_receiver_fn():
    feature_spec = {"feat_ids": tf.compat.v1.placeholder(tf.int64, [None, FLAGS.field_size], name="feat_ids"),
                    "feat_vals": tf.compat.v1.placeholder(tf.float32, [None, FLAGS.field_size], name="feat_vals")}
    return tf.estimator.export.build_raw_serving_input_receiver_fn(feature_spec)()


def main():
    tr_files = sorted(glob.glob(os.path.join(FLAGS.data_dir, "tr*libsvm")))
    va_files = sorted(glob.glob(os.path.join(FLAGS.data_dir, "va*libsvm")))
    params = {"field_size": FLAGS.field_size, "feature_size": FLAGS.feature_size, "embedding_size": FLAGS.embedding_size,
              "l2_reg": FLAGS.l2_reg, "learning_rate": FLAGS.learning_rate, "deep_layers": FLAGS.deep_layers,
              "optimizer": FLAGS.optimizer}
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    print("task:", task)

    config = tf.estimator.RunConfig(model_dir=FLAGS.model_dir, save_checkpoints_steps=FLAGS.save_checkpoints_steps,
                                    log_step_count_steps=50)
    DeepFM = tf.estimator.Estimator(model_fn=model_fn, params=params, config=config)
    train_spec = tf.estimator.TrainSpec(
        input_fn=lambda: input_fn(tr_files, batch_size=FLAGS.batch_size, num_epochs=FLAGS.num_epochs, perform_shuffle=True),
        max_steps=FLAGS.max_steps)
    exporter = tf.estimator.LatestExporter("deepfm", serving_input_receiver_fn, exports_to_keep=1)
    eval_spec = tf.estimator.EvalSpec(
        input_fn=lambda: input_fn(va_files, batch_size=FLAGS.batch_size, num_epochs=1),
        steps=None, start_delay_secs=1, throttle_secs=5, exporters=[exporter])
    tf.estimator.train_and_evaluate(DeepFM, train_spec, eval_spec)


if __name__ == "__main__":
    main()
