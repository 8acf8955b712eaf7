"""A script protected with the previous release's README lines, run under its own TF_CONFIG launcher.

Every process runs this file.  The trainers import ``tf_ecrec`` and ``tf_ecrec.ops`` (the old
README's lines), build a model_fn with an ``EmbeddingCollection`` and ``ECOptimizer``, place with
``ECDeviceFn`` and wrap with ``ec_model_fn``, and call ``tf.estimator.train_and_evaluate``.  A PS
task serves: with ``UPGRADE_PS=bare`` it is a TensorFlow server that never imports tf_ecrec (a PS
image without it); with ``UPGRADE_PS=import`` it only does ``import tf_ecrec`` before serving.
``UPGRADE_SESSION_CONFIG`` and ``UPGRADE_TASK_WAIT_SECS`` are the tests' knobs (see where they are read).
"""

import json
import os
import sys

import tensorflow as tf

config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
PS_MODE = os.environ.get("UPGRADE_PS", "import")

if task["type"] == "ps":
    if PS_MODE == "import":
        import tf_ecrec  # all a PS of the old README does: the kernels come with it
    server = tf.distribute.Server(tf.train.ClusterSpec(config["cluster"]), job_name="ps", task_index=task["index"],
                                  protocol="grpc", start=True)
    print("ps serving", "with tf_ecrec imported" if "tf_ecrec" in sys.modules else "without tf_ecrec", flush=True)
    server.join()

import tf_ecrec  # noqa: E402
import tf_ecrec.ops  # noqa: E402  (the previous README: every task process loads the op library)

tf.compat.v1.disable_eager_execution()
tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
MODEL_DIR, MAX_STEPS = sys.argv[1], int(sys.argv[2])


def input_fn():
    def example(i):
        ids = tf.stack([i % 300, (i * 7) % 120])
        return {"cat": ids}, tf.cast(i % 2, tf.float32)

    return tf.data.Dataset.range(1 << 30).map(example).batch(32)


def model_fn(features, labels, mode, params, config):
    tables = tf_ecrec.EmbeddingCollection("user", [("a", 300), ("b", 120)], 4)
    vectors = tf.reshape(tables.lookup_all(features["cat"]), [-1, 8])
    logits = tf.reshape(tf.compat.v1.layers.dense(vectors, 1), [-1])
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    optimizer = tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.05))
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode=mode, loss=loss, train_op=train_op)


# UPGRADE_SESSION_CONFIG=plain: a session config of the user's own, without device filters (as many public
# scripts pass): a worker's session then reaches every task of the cluster, the chief included.
session_config = tf.compat.v1.ConfigProto(allow_soft_placement=True) if os.environ.get("UPGRADE_SESSION_CONFIG") else None
run_config = tf.estimator.RunConfig(model_dir=MODEL_DIR, device_fn=tf_ecrec.ECDeviceFn(), save_checkpoints_steps=10**6,
                                    log_step_count_steps=10, session_config=session_config)
# UPGRADE_TASK_WAIT_SECS: the tests' shorter bound on a worker's wait for the tasks its session reaches.
wait = {"task_wait_secs": float(os.environ["UPGRADE_TASK_WAIT_SECS"])} if "UPGRADE_TASK_WAIT_SECS" in os.environ else {}
estimator = tf.estimator.Estimator(tf_ecrec.ec_model_fn(model_fn, tf_ecrec.ECConfig(k=2, r=1), **wait), config=run_config)
tf.estimator.train_and_evaluate(estimator, tf.estimator.TrainSpec(input_fn, max_steps=MAX_STEPS),
                                tf.estimator.EvalSpec(input_fn, steps=1, start_delay_secs=10**6))
print("trained to step", MAX_STEPS, flush=True)
