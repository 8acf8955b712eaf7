"""Wide and deep on census-like records with TensorFlow's canned estimator, in the style of TensorFlow's wide-and-deep
tutorial: numeric, bucketized, vocabulary, hashed and crossed columns, train_and_evaluate with an exporter. Run one
process per task with TF_CONFIG set by the cluster launcher; without TF_CONFIG it trains locally."""

import argparse

import numpy as np
import tensorflow as tf

import tf_ecrec.feature_column

EDUCATION = ["Bachelors", "HS-grad", "Masters", "Doctorate", "Some-college", "Assoc-voc", "11th", "Prof-school"]


def records(seed, n):
    rng = np.random.default_rng(seed)
    age, hours = rng.integers(17, 80, n), rng.integers(10, 70, n)
    education, occupation = rng.integers(0, len(EDUCATION), n), rng.integers(0, 300, n)
    occupation_effect = np.random.default_rng(0).normal(0, 1, 300)
    logit = np.linspace(-1.5, 1.5, len(EDUCATION))[education] + occupation_effect[occupation] + (age - 45) / 20
    label = (rng.random(n) < 1 / (1 + np.exp(-2 * (logit + (hours > 50))))).astype(np.float32)  # learnable, noisy
    features = {"age": age.astype(np.float32), "hours_per_week": hours.astype(np.float32),
                "education": np.array(EDUCATION)[education], "occupation": np.char.add("occ-", occupation.astype(str))}
    return features, label


def input_fn(seed, n, repeat=True):
    dataset = tf.data.Dataset.from_tensor_slices(records(seed, n))
    return (dataset.shuffle(1000, seed=seed).repeat() if repeat else dataset).batch(64)


def columns():
    age = tf.feature_column.numeric_column("age")
    hours = tf.feature_column.numeric_column("hours_per_week")
    education = tf.feature_column.categorical_column_with_vocabulary_list("education", EDUCATION)
    occupation = tf.feature_column.categorical_column_with_hash_bucket("occupation", 1000)
    age_buckets = tf.feature_column.bucketized_column(age, [25, 30, 35, 40, 45, 50, 55, 60, 65])
    wide = [education, occupation, age_buckets, tf.feature_column.crossed_column(["education", "occupation"], 10000),
            tf.feature_column.crossed_column([age_buckets, "education", "occupation"], 10000)]
    deep = [age, hours] + [tf_ecrec.feature_column.embedding_column(c, 8) for c in (education, occupation)]
    return tf_ecrec.feature_column.linear(wide), deep


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=1000)
    args = parser.parse_args()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    wide, deep = columns()
    config = tf.estimator.RunConfig(model_dir=args.model_dir, save_checkpoints_steps=100000, log_step_count_steps=50)
    dnn = tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.05))  # the canned defaults, as v1 optimizers
    estimator = tf.compat.v1.estimator.DNNLinearCombinedClassifier(
        linear_feature_columns=wide, dnn_feature_columns=deep, dnn_hidden_units=[100, 50],
        dnn_optimizer=dnn, linear_optimizer=dnn.part(tf.compat.v1.train.FtrlOptimizer(0.2)),
        loss_reduction=tf.compat.v1.losses.Reduction.SUM_OVER_BATCH_SIZE, config=config)
    receiver = tf.estimator.export.build_parsing_serving_input_receiver_fn(
        tf.feature_column.make_parse_example_spec(wide + deep))
    train_spec = tf.estimator.TrainSpec(lambda: input_fn(1, 20000), max_steps=args.max_steps)
    eval_spec = tf.estimator.EvalSpec(lambda: input_fn(2, 4000, repeat=False), steps=None, start_delay_secs=1,
                                      throttle_secs=5, exporters=[tf.estimator.LatestExporter("census", receiver)])
    print("final evaluation:", tf_ecrec.train_and_evaluate(estimator, train_spec, eval_spec))


if __name__ == "__main__":
    main()
