"""TensorFlow's tutorial "Parameter server training with ParameterServerStrategy" (its Keras ``fit`` part), protected.

The tutorial's model and data: three movie names per example looked up by a
``StringLookup`` in the input pipeline, their embeddings averaged, a sigmoid
unit; the label "yes" when "avenger" is among them.  It trains with
``model.fit`` on a ``DatasetCreator``, with the tutorial's optimizer
(``tf.keras.optimizers.legacy.RMSprop``) and callbacks (TensorBoard,
ModelCheckpoint, BackupAndRestore) under a working directory.

Every task runs this script with its own TF_CONFIG (``TFConfigClusterResolver``):
PS and worker tasks serve, the chief is the coordinator.  The tasks may start in
any order.  The lines marked ``# tf_ecrec`` are what protecting it takes
(docs/pss.md); the rest is the tutorial's.  A PS killed and restarted is rebuilt
from parity while the coordinator waits; a coordinator killed and started again
resumes from the last epoch's backup.  At the end the chief prints one JSON line:
the step reached, the backup's step it began from (if any) and the parity check.

    TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}' python estimator_examples/pss_tutorial.py
    ...
    TF_CONFIG='{... "task": {"type": "chief", "index": 0}}' python estimator_examples/pss_tutorial.py --working-dir DIR

Installed, this module is ``tf_ecrec.examples.pss_tutorial``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

import tensorflow as tf

import tf_ecrec.keras  # tf_ecrec
import tf_ecrec.pss  # tf_ecrec

FEATURE_VOCAB = ["avenger", "ironman", "batman", "hulk", "spiderman", "kingkong", "wonder_woman"]
LABEL_VOCAB = ["yes", "no"]


def feature_and_label_gen(num_examples: int = 200) -> dict[str, list[list[str]]]:
    examples: dict[str, list[list[str]]] = {"features": [], "label": []}
    for _ in range(num_examples):
        features = random.sample(FEATURE_VOCAB, 3)
        examples["features"].append(features)
        examples["label"].append(["yes"] if "avenger" in features else ["no"])
    return examples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--working-dir", default="/tmp/my_working_dir")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument("--ec", default="2+1", help="the erasure code, k+r (k + r PS tasks at least)")
    args = parser.parse_args(argv)
    random.seed(0)

    cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if cluster_resolver.task_type in ("worker", "ps"):
        server = tf_ecrec.pss.start_server(cluster_resolver)  # tf_ecrec: was tf.distribute.Server(...)
        server.join()
        return 0

    tf_ecrec.pss.prepare_process()  # tf_ecrec: the op library, and every task serving first
    strategy = tf.distribute.ParameterServerStrategy(
        cluster_resolver, variable_partitioner=tf_ecrec.pss.ECPartitioner())  # tf_ecrec: the partitioner
    protection = tf_ecrec.pss.protect(strategy, args.ec)  # tf_ecrec

    with strategy.scope():
        feature_lookup_layer = tf.keras.layers.StringLookup(vocabulary=FEATURE_VOCAB, mask_token=None)
        label_lookup_layer = tf.keras.layers.StringLookup(vocabulary=LABEL_VOCAB, num_oov_indices=0, mask_token=None)
        raw_feature_input = tf.keras.layers.Input(shape=(3,), dtype=tf.string, name="features")
        feature_preprocess_stage = tf.keras.Model({"features": raw_feature_input}, feature_lookup_layer(raw_feature_input))
        raw_label_input = tf.keras.layers.Input(shape=(1,), dtype=tf.string, name="label")
        label_preprocess_stage = tf.keras.Model({"label": raw_label_input}, label_lookup_layer(raw_label_input))

    examples = feature_and_label_gen()

    def dataset_fn(_: tf.distribute.InputContext) -> tf.data.Dataset:
        raw_dataset = tf.data.Dataset.from_tensor_slices(examples)
        return raw_dataset.map(
            lambda x: ({"features": feature_preprocess_stage(x["features"])}, label_preprocess_stage(x["label"]))
        ).shuffle(200).batch(32).repeat()

    with strategy.scope():
        model_input = tf.keras.layers.Input(shape=(3,), dtype=tf.int64, name="model_input")
        emb_layer = tf_ecrec.keras.ECEmbedding(  # tf_ecrec: was tf.keras.layers.Embedding
            input_dim=len(feature_lookup_layer.get_vocabulary()), output_dim=16)
        emb_output = tf.reduce_mean(emb_layer(model_input), axis=1)
        dense_output = tf.keras.layers.Dense(units=1, activation="sigmoid")(emb_output)
        model = tf.keras.Model({"features": model_input}, dense_output)
        optimizer = protection.optimizer(  # tf_ecrec: the wrapper
            tf.keras.optimizers.legacy.RMSprop(learning_rate=0.1))
        model.compile(optimizer, loss="binary_crossentropy", metrics=["accuracy"])

    callbacks = [
        tf.keras.callbacks.TensorBoard(log_dir=os.path.join(args.working_dir, "log")),
        tf.keras.callbacks.ModelCheckpoint(filepath=os.path.join(args.working_dir, "ckpt")),
        tf.keras.callbacks.BackupAndRestore(backup_dir=os.path.join(args.working_dir, "backup")),
    ]
    result = tf_ecrec.pss.fit(  # tf_ecrec: was model.fit
        model, tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch, callbacks=callbacks, verbose=2)
    print(json.dumps({"step": result.steps, "restored_step": result.restored_step,
                      "recoveries": [r.lost for r in result.recoveries],
                      "parity": tf_ecrec.pss.check_parity(model)}), flush=True)  # tf_ecrec: optional, the check
    return 0


if __name__ == "__main__":
    sys.exit(main())
