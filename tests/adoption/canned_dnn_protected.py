"""A canned DNNClassifier over feature columns, protected as docs/adoption.md says: its embedding columns are
tf_ecrec.feature_column.embedding_column, its optimizer an ECOptimizer, its run tf_ecrec.train.  One process of a
TF_CONFIG job (a PS serves; the chief and workers train)."""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

import tf_ecrec
import tf_ecrec.feature_column

USERS, ITEMS = 4000, 300


def input_fn():
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    rng = np.random.default_rng(1 + int(task.get("index", 0)) + (100 if task.get("type") == "worker" else 0))
    n = 16384
    users, items = rng.integers(0, USERS, n), rng.integers(0, ITEMS, n)
    features = {"user": np.char.add("u", users.astype(str)), "item": items.astype(np.int64),
                "age": rng.random(n).astype(np.float32)}
    labels = ((users + items) % 3 == 0).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(64)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=600)
    args = parser.parse_args()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    user = tf.feature_column.categorical_column_with_hash_bucket("user", 2000)
    item = tf.feature_column.categorical_column_with_identity("item", ITEMS)
    columns = [tf_ecrec.feature_column.embedding_column(user, 8), tf_ecrec.feature_column.embedding_column(item, 8),
               tf.feature_column.numeric_column("age")]
    config = tf.estimator.RunConfig(model_dir=args.model_dir, save_checkpoints_steps=100000, log_step_count_steps=50)
    estimator = tf.compat.v1.estimator.DNNClassifier(
        [32, 16], columns, optimizer=tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.05)), config=config)
    tf_ecrec.train(estimator, input_fn, max_steps=args.max_steps)


if __name__ == "__main__":
    main()
