"""Canned estimators with protected feature columns (issue 34): a ``tf.compat.v1.estimator`` canned estimator
whose embedding columns are `tf_ecrec.feature_column.embedding_column` and whose optimizer is an ECOptimizer,
trained on an in-process PS cluster."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf
from harness.serving import serve_without_tf_ecrec, sha256
from tf_cluster import tf_cluster

import tf_ecrec
import tf_ecrec.feature_column
from tf_ecrec.check.live_cluster import read_manifest, read_variables
from tf_ecrec.check.verify import check_parity
from tf_ecrec.cluster.tf_config import tf_config_env
from tf_ecrec.erasure.code import ECConfig
from tf_ecrec.errors import ConfigError
from tf_ecrec.estimator.model_fn import ec_model_fn
from tf_ecrec.hooks.manifest import VariableManifestHook
from tf_ecrec.layout.placement import Layout
from tf_ecrec.layout.table_layout import ChunkKind

ps_cluster = tf_cluster(num_ps=3)
USERS, ITEMS, BATCH = 500, 97, 32


@pytest.fixture
def cluster(ps_cluster):
    ps_cluster.reset()
    return ps_cluster


def _values_at_start(manifest_path, cluster):
    """(a dict, a hook that fills it with every variable's value on the PS once the session is made: the values
    before the first step)."""
    values = {}

    class AtStart(tf.estimator.SessionRunHook):
        def after_create_session(self, session, coord):
            values.update(read_variables(read_manifest(manifest_path)["variables"], cluster.ps_addresses))

    return values, AtStart()


def _columns():
    user = tf.feature_column.categorical_column_with_hash_bucket("user", USERS)
    item = tf.feature_column.categorical_column_with_identity("item", ITEMS)
    return [tf_ecrec.feature_column.embedding_column(user, 8), tf_ecrec.feature_column.embedding_column(item, 4, "sum"),
            tf.feature_column.numeric_column("age")]


def _input_fn():
    rng = np.random.default_rng(0)
    n = 40 * BATCH
    features = {"user": np.array([f"u{i}" for i in rng.integers(0, 2000, n)]),
                "item": rng.integers(0, ITEMS, n).astype(np.int64), "age": rng.random(n).astype(np.float32)}
    labels = (features["item"] % 2).astype(np.float32)
    return lambda: tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(BATCH)


def _run_config(cluster, model_dir):
    with tf_config_env(cluster.config("chief")):
        return tf.estimator.RunConfig(model_dir=str(model_dir), tf_random_seed=3, log_step_count_steps=10**6)


def test_a_canned_dnn_classifier_trains_its_embedding_columns_striped_with_parity_exact(cluster, tmp_path):
    """DNNClassifier (the v1 class, Adagrad wrapped in an ECOptimizer) over a hashed and an identity column: each
    column's table is a collection striped over the 3 PS with parity (no TensorFlow ``embedding_weights``
    variable anywhere), the dense layers are replicated, parity and replicas are exact after training, and the
    tables moved."""
    canned = tf.compat.v1.estimator.DNNClassifier(
        [16, 8], _columns(), optimizer=tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1)),
        config=_run_config(cluster, tmp_path))
    estimator = tf.estimator.Estimator(ec_model_fn(canned.model_fn, ECConfig(2, 1)), config=canned.config)
    path = str(tmp_path / "variables.json")
    estimator.train(_input_fn(), max_steps=20, hooks=[VariableManifestHook(path)])
    manifest = read_manifest(path)
    meta = manifest["ec"]
    names = [r["name"] for r in manifest["variables"]]
    assert not [n for n in names if "embedding_weights" in n], names
    tables = {c["name"]: c for c in meta["collections"]}
    assert sorted(tables) == ["item_embedding", "user_embedding"] and all(len(c["data"]) == 3 for c in tables.values())
    live = read_variables(manifest["variables"], cluster.ps_addresses)
    assert live["global_step"] == 20
    result = check_parity(meta, live)
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0, result["mismatched"]
    assert result["stripes_checked"] == 6 and result["replicas_checked"] > 0
    assert any(np.abs(live[v]).sum() > 0 for c in tables.values() for v in c["data"].values())
    # Saved under their own names (a canned input layer's partitioner once gave them its slice names).
    saved = set(tf.train.load_checkpoint(str(tmp_path)).get_variable_to_shape_map())
    assert {v for c in tables.values() for v in c["data"].values()} <= saved, sorted(saved)

    # Issue 34 item 3: exported with the canned estimator's usual receiver (serialized tf.Examples), it serves in a
    # process that cannot import tf_ecrec, with the trained tables' data chunks bit for bit and no parity or slot,
    # and scores what the Estimator predicts from the checkpoint.
    offline = tf_ecrec.offline_estimator(canned)
    receiver = tf.estimator.export.build_parsing_serving_input_receiver_fn(tf.feature_column.make_parse_example_spec(
        _columns()))
    path = offline.export_saved_model(str(tmp_path / "export"), receiver).decode()
    rng = np.random.default_rng(4)
    rows = [(f"u{u}".encode(), int(i), float(a)) for u, i, a in zip(rng.integers(0, 2000, 8), rng.integers(0, ITEMS, 8),
                                                                        rng.random(8))]
    examples = [tf.train.Example(features=tf.train.Features(feature={
        "user": tf.train.Feature(bytes_list=tf.train.BytesList(value=[u])),
        "item": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
        "age": tf.train.Feature(float_list=tf.train.FloatList(value=[a]))})).SerializeToString() for u, i, a in rows]
    (got,) = serve_without_tf_ecrec([path], {"examples": np.array(examples, dtype=object)}, str(tmp_path)).values()
    names = {n.removesuffix(":0") for n in got["variables"]}
    data = {v for c in tables.values() for v in c["data"].values()}
    assert data <= names and not [n for n in names if "parity" in n or "replica" in n or "Adagrad" in n], sorted(names)
    assert all(got["variables"][f"{n}:0"] == sha256(live[n]) for n in data)
    features = {"user": np.array([u for u, _, _ in rows]), "item": np.array([i for _, i, _ in rows], np.int64),
                "age": np.array([a for _, _, a in rows], np.float32)}
    want = next(offline.predict(lambda: tf.data.Dataset.from_tensors(features), yield_single_examples=False))
    scores = np.asarray(got["outputs"]["scores"], np.float32)[:, 1]
    np.testing.assert_allclose(scores, want["probabilities"][:, 1], rtol=1e-5, atol=1e-6)


def test_an_embedding_column_with_what_a_protected_table_cannot_do_is_refused():
    user = tf.feature_column.categorical_column_with_hash_bucket("user", USERS)
    with pytest.raises(ConfigError, match="combiner='max'"):
        tf_ecrec.feature_column.embedding_column(user, 8, combiner="max")
    with pytest.raises(ConfigError, match="trainable=False"):
        tf_ecrec.feature_column.embedding_column(user, 8, trainable=False)
    with pytest.raises(ConfigError, match="rule: a categorical column"):
        tf_ecrec.feature_column.embedding_column(tf.feature_column.numeric_column("age"), 8)


def test_a_wide_and_deep_with_its_linear_part_under_a_second_optimizer_is_refused_when_its_graph_is_built(
        cluster, tmp_path):
    """DNNLinearCombinedClassifier (v1): the DNN part's optimizer wrapped, the linear part under its stock FTRL.
    The linear weights would have neither parity nor replicas, and the first failure of their PS would fall back
    to the checkpoint: refused before any step, naming them (issue 34: never a silent fallback)."""
    user = tf.feature_column.categorical_column_with_hash_bucket("user", USERS)
    canned = tf.compat.v1.estimator.DNNLinearCombinedClassifier(
        linear_feature_columns=[user], dnn_feature_columns=[tf_ecrec.feature_column.embedding_column(user, 8)],
        dnn_hidden_units=[8], dnn_optimizer=tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1)),
        config=_run_config(cluster, tmp_path))
    estimator = tf.estimator.Estimator(ec_model_fn(canned.model_fn, ECConfig(2, 1)), config=canned.config)
    with pytest.raises(ConfigError, match=r"trainable variables \['linear/linear_model/.*are not updated by the tf_ecrec"):
        estimator.train(_input_fn(), max_steps=2)


def _wide_and_deep(cluster, tmp_path, dnn_optimizer, linear_optimizer):
    user = tf.feature_column.categorical_column_with_hash_bucket("user", USERS)
    item = tf.feature_column.categorical_column_with_identity("item", ITEMS)
    wide = [user, tf.feature_column.crossed_column(["user", item], 1000)]
    deep = [tf_ecrec.feature_column.embedding_column(user, 8), tf_ecrec.feature_column.embedding_column(item, 4),
            tf.feature_column.numeric_column("age")]
    return tf.compat.v1.estimator.DNNLinearCombinedClassifier(
        linear_feature_columns=wide, linear_optimizer=linear_optimizer, dnn_feature_columns=deep,
        dnn_hidden_units=[16, 8], dnn_optimizer=dnn_optimizer, config=_run_config(cluster, tmp_path)), wide + deep


def test_a_canned_wide_and_deep_trains_both_parts_with_their_own_optimizers_in_one_protected_step(cluster, tmp_path):
    """Issue 34: DNNLinearCombinedClassifier (v1) with its two optimizers, Adagrad for the deep part and FTRL for
    the linear part given as ``ECOptimizer.part``: one protected step per run (the global step counts 20 runs, not
    40, the canned increment replaced by the step's count), the deep tables striped with parity under Adagrad, the
    linear weights (a hashed and a crossed column) replicated with their two FTRL slots, parity and replicas exact
    after training, both parts moved; exported, it serves what the Estimator predicts."""
    dnn = tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
    canned, columns = _wide_and_deep(cluster, tmp_path, dnn, dnn.part(tf.compat.v1.train.FtrlOptimizer(0.1)))
    estimator = tf.estimator.Estimator(ec_model_fn(canned.model_fn, ECConfig(2, 1)), config=canned.config)
    path = str(tmp_path / "variables.json")
    estimator.train(_input_fn(), max_steps=20, hooks=[VariableManifestHook(path)])
    manifest = read_manifest(path)
    meta = manifest["ec"]
    live = read_variables(manifest["variables"], cluster.ps_addresses)
    assert live["global_step"] == 20
    # The linear model's weights (the canned estimator partitions them over the PS: parts of one here, small).
    linear = sorted(n for n in meta["replicas"] if n.startswith("linear/") and "/weights/part_" in n)
    assert len(linear) == 2 and all(meta["rules"][n] == "ftrl" for n in linear), (linear, meta["rules"])
    assert all(len(meta["replica_slots"][n]) == 2 for n in linear), meta["replica_slots"]
    assert meta["optimizer"] == "adagrad" and sorted(c["name"] for c in meta["collections"]) == [
        "item_embedding", "user_embedding"]
    result = check_parity(meta, live)
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0, result["mismatched"]
    assert result["stripes_checked"] == 6 and result["replicas_checked"] >= len(linear)
    assert all(np.abs(live[n]).sum() > 0 for n in linear)  # FTRL moved the zero-initialised linear weights
    # Another train call builds a new graph with the same optimizer objects, as a failover's rebuild does.
    estimator.train(_input_fn(), max_steps=30)
    assert tf.train.load_checkpoint(str(tmp_path)).get_tensor("global_step") == 30  # (it crashed: the old graph's slots)
    receiver = tf.estimator.export.build_parsing_serving_input_receiver_fn(
        tf.feature_column.make_parse_example_spec(columns))
    offline = tf_ecrec.offline_estimator(canned)
    export = offline.export_saved_model(str(tmp_path / "export"), receiver).decode()
    example = tf.train.Example(features=tf.train.Features(feature={
        "user": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"u7"])),
        "item": tf.train.Feature(int64_list=tf.train.Int64List(value=[3])),
        "age": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5]))})).SerializeToString()
    (got,) = serve_without_tf_ecrec([export], {"examples": np.array([example], dtype=object)}, str(tmp_path)).values()
    features = {"user": np.array([b"u7"]), "item": np.array([3], np.int64), "age": np.array([0.5], np.float32)}
    want = next(offline.predict(lambda: tf.data.Dataset.from_tensors(features), yield_single_examples=False))
    np.testing.assert_allclose(np.asarray(got["outputs"]["scores"], np.float32)[:, 1], want["probabilities"][:, 1],
                               rtol=1e-5, atol=1e-6)


def test_parts_outside_ec_model_fn_are_refused_rather_than_training_nothing():
    """Nothing builds the updates an ECOptimizer with parts records unless ec_model_fn does: refused."""
    with tf.Graph().as_default():
        var = tf.compat.v1.get_variable("w", [4, 2])
        dnn = tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1), ec=ECConfig(2, 1))
        with pytest.raises(ConfigError, match=r"outside tf_ecrec\.ec_model_fn"):
            dnn.part(tf.compat.v1.train.FtrlOptimizer(0.1)).minimize(tf.reduce_sum(var), var_list=[var])


def test_parts_whose_train_op_runs_something_the_step_would_not_are_refused(cluster, tmp_path):
    """With parts the protected step replaces the model_fn's train op: one that runs anything else (here a counter
    of the user's) is refused, naming the op, rather than silently dropped."""
    dnn = tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
    linear = dnn.part(tf.compat.v1.train.FtrlOptimizer(0.1))

    def model_fn(features, labels, mode, config):
        x = tf.compat.v1.layers.dense(tf.reshape(features["age"], [-1, 1]), 1, name="d")
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.reshape(labels, [-1, 1]), logits=x))
        counter = tf.compat.v1.get_variable("mine", [], tf.int64, initializer=tf.zeros_initializer(), trainable=False)
        kernel, bias = tf.compat.v1.trainable_variables("d")
        step = tf.compat.v1.train.get_global_step()
        ops = [dnn.minimize(loss, var_list=[kernel]), linear.minimize(loss, var_list=[bias], global_step=step),
               counter.assign_add(1).op]
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf.group(*ops))

    estimator = tf.estimator.Estimator(ec_model_fn(model_fn, ECConfig(2, 1)), config=_run_config(cluster, tmp_path))
    with pytest.raises(ConfigError, match=r"train op runs 'AssignAddVariableOp.*' \(AssignAddVariableOp\) beside"):
        estimator.train(_input_fn(), max_steps=2)


@pytest.mark.parametrize("kind", ["linear_classifier", "wide_and_deep_regressor"])
def test_the_other_canned_estimators_a_recommender_uses_train_protected_with_parity_exact(cluster, tmp_path, kind):
    """LinearClassifier (its weights replicated under FTRL, its one optimizer wrapped) and DNNLinearCombinedRegressor
    (the two optimizers as an ECOptimizer and its part, as for the classifier): parity and replicas exact after 10
    steps, the global step counting runs once."""
    user = tf.feature_column.categorical_column_with_hash_bucket("user", USERS)
    item = tf.feature_column.categorical_column_with_identity("item", ITEMS)
    config = _run_config(cluster, tmp_path)
    if kind == "linear_classifier":
        canned = tf.compat.v1.estimator.LinearClassifier(
            [user, item, tf.feature_column.crossed_column(["user", item], 1000)],
            optimizer=tf_ecrec.ECOptimizer(tf.compat.v1.train.FtrlOptimizer(0.1)), config=config)
    else:
        dnn = tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
        canned = tf.compat.v1.estimator.DNNLinearCombinedRegressor(
            linear_feature_columns=[user], linear_optimizer=dnn.part(tf.compat.v1.train.FtrlOptimizer(0.1)),
            dnn_feature_columns=[tf_ecrec.feature_column.embedding_column(item, 4)], dnn_hidden_units=[8],
            dnn_optimizer=dnn, config=config)
    estimator = tf.estimator.Estimator(ec_model_fn(canned.model_fn, ECConfig(2, 1)), config=canned.config)
    path = str(tmp_path / "variables.json")
    estimator.train(_input_fn(), max_steps=10, hooks=[VariableManifestHook(path)])
    manifest = read_manifest(path)
    live = read_variables(manifest["variables"], cluster.ps_addresses)
    assert live["global_step"] == 10
    result = check_parity(manifest["ec"], live)
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0, result["mismatched"]
    weights = [n for n in manifest["ec"]["replicas"] if n.startswith("linear/") and "/weights/part_" in n]
    assert len(weights) == (3 if kind == "linear_classifier" else 1) and result["replicas_checked"] > len(weights)


def test_shared_embeddings_give_several_columns_one_protected_table(cluster, tmp_path):
    """``tf_ecrec.feature_column.shared_embeddings``: the item and the previous item read one collection (one table of
    ITEMS rows, striped with parity), which both features' rows move; columns of other bucket counts are refused."""
    item = tf.feature_column.categorical_column_with_identity("item", ITEMS)
    previous = tf.feature_column.categorical_column_with_identity("prev_item", ITEMS)
    columns = tf_ecrec.feature_column.shared_embeddings([item, previous], 4, combiner="sum")
    rng = np.random.default_rng(2)
    n = 20 * BATCH
    features = {"item": rng.integers(0, ITEMS // 2, n).astype(np.int64),  # the lower half of the rows
                "prev_item": rng.integers(ITEMS // 2, ITEMS, n).astype(np.int64)}  # the upper half
    labels = (features["item"] % 2).astype(np.float32)
    canned = tf.compat.v1.estimator.DNNClassifier(
        [8], columns, optimizer=tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1)),
        config=_run_config(cluster, tmp_path))
    estimator = tf.estimator.Estimator(ec_model_fn(canned.model_fn, ECConfig(2, 1)), config=canned.config)
    path = str(tmp_path / "variables.json")
    first, before = _values_at_start(path, cluster)
    estimator.train(lambda: tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(BATCH), max_steps=10,
                    hooks=[VariableManifestHook(path), before])
    manifest = read_manifest(path)
    (table,) = manifest["ec"]["collections"]
    assert table["name"] == "item_prev_item_shared_embedding", table["name"]
    live = read_variables(manifest["variables"], cluster.ps_addresses)
    result = check_parity(manifest["ec"], live)
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0, result["mismatched"]
    rows = np.concatenate([live[v] for _, v in sorted(table["data"].items(), key=lambda kv: int(kv[0]))])
    was = np.concatenate([first[v] for _, v in sorted(table["data"].items(), key=lambda kv: int(kv[0]))])
    moved = np.flatnonzero(np.any(rows != was, axis=1))
    # Both features' rows moved: about ITEMS (either half alone is at most ITEMS // 2 + 1; the stored rows are the
    # layout's chunks, so counted, not named).
    assert len(moved) >= 80, moved
    with pytest.raises(ConfigError, match="rule: one count"):
        tf_ecrec.feature_column.shared_embeddings(
            [item, tf.feature_column.categorical_column_with_identity("other", ITEMS + 1)], 4)


def test_a_protected_table_starts_from_a_stock_checkpoints_table(cluster, tmp_path):
    """Issue 34 item 3, a warm start from a model trained without tf_ecrec: ``embedding_column(...,
    ckpt_to_load_from=, tensor_name_in_ckpt=)`` reads a stock DNNClassifier's ``embedding_weights`` into the stripes
    (each PS its chunks' rows, as slices), so every row of the protected table starts equal to the stock one, and
    parity is encoded from them (exact after training). A tensor of another shape is refused, naming it."""
    user = tf.feature_column.categorical_column_with_hash_bucket("user", USERS)
    stock_dir = str(tmp_path / "stock")
    with tf_config_env(None):
        stock = tf.compat.v1.estimator.DNNClassifier(
            [8], [tf.feature_column.embedding_column(user, 8), tf.feature_column.numeric_column("age")],
            config=tf.estimator.RunConfig(model_dir=stock_dir, tf_random_seed=1))
        stock.train(_input_fn(), max_steps=5)
    name = "dnn/input_from_feature_columns/input_layer/user_embedding/embedding_weights"
    table = tf.train.load_checkpoint(stock_dir).get_tensor(name)
    columns = [tf_ecrec.feature_column.embedding_column(user, 8, ckpt_to_load_from=stock_dir, tensor_name_in_ckpt=name),
               tf.feature_column.numeric_column("age")]
    canned = tf.compat.v1.estimator.DNNClassifier(
        [8], columns, optimizer=tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1)),
        config=_run_config(cluster, tmp_path / "protected"))
    estimator = tf.estimator.Estimator(ec_model_fn(canned.model_fn, ECConfig(2, 1)), config=canned.config)
    path = str(tmp_path / "variables.json")
    first, before = _values_at_start(path, cluster)
    estimator.train(_input_fn(), max_steps=5, hooks=[VariableManifestHook(path), before])
    manifest = read_manifest(path)
    (coll,) = manifest["ec"]["collections"]
    layout = Layout.from_json(coll["layout"]).table(coll["name"])
    compared = 0
    for p, var in coll["data"].items():
        for i, chunk in enumerate(layout.chunks_on(int(p), ChunkKind.DATA)):
            got = first[var][i * chunk.rows: i * chunk.rows + chunk.real_rows]
            np.testing.assert_array_equal(got, table[chunk.row_start: chunk.row_start + chunk.real_rows])
            compared += chunk.real_rows
    assert compared == USERS
    live = read_variables(manifest["variables"], cluster.ps_addresses)
    result = check_parity(manifest["ec"], live)
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0, result["mismatched"]
    with pytest.raises(ConfigError, match=r"has the shape \[500, 8\]; rule: the table's \[rows, dim\] = \[500, 4\]"):
        tf_ecrec.feature_column.embedding_column(user, 4, ckpt_to_load_from=stock_dir, tensor_name_in_ckpt=name)
    with pytest.raises(ConfigError, match=r"no checkpoint there"):
        tf_ecrec.feature_column.embedding_column(user, 8, ckpt_to_load_from=str(tmp_path / "none"), tensor_name_in_ckpt=name)


class _DenseFeaturesModel(tf.keras.Model):
    """A Keras model over feature columns (a ``DenseFeatures`` layer), subclassed with ``get_config`` so that
    model_to_estimator builds it in the Estimator's graphs only (tf_ecrec.keras's rule for protected tables)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.features = tf.keras.layers.DenseFeatures(_columns())
        self.hidden = tf.keras.layers.Dense(8, activation="relu")
        self.out = tf.keras.layers.Dense(1)

    def call(self, inputs):
        return self.out(self.hidden(self.features(inputs)))

    def get_config(self):
        return {}


def test_a_keras_dense_features_model_trains_its_embedding_columns_protected_through_model_to_estimator(
        cluster, tmp_path):
    """Issue 34 item 2: ``tf.keras.layers.DenseFeatures`` over tf_ecrec's embedding columns in a Keras model
    converted with model_to_estimator (its optimizer `tf_ecrec.keras.ECKerasOptimizer`): the columns' collections
    are the layer's trainable weights, so Keras computes their gradients, and both tables train striped with parity
    exact."""
    from tf_ecrec.keras import ECKerasOptimizer

    config = _run_config(cluster, tmp_path)

    def model_fn(features, labels, mode, config):
        with tf.Graph().as_default():
            model = _DenseFeaturesModel()
            model.compile(optimizer=ECKerasOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1)),
                          loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
            converted = tf.keras.estimator.model_to_estimator(keras_model=model, config=config,
                                                             checkpoint_format="saver")
        return converted.model_fn(features, labels, mode, config)

    estimator = tf.estimator.Estimator(ec_model_fn(model_fn, ECConfig(2, 1)), config=config)
    path = str(tmp_path / "variables.json")
    first, before = _values_at_start(path, cluster)
    estimator.train(_input_fn(), max_steps=10, hooks=[VariableManifestHook(path), before])
    manifest = read_manifest(path)
    tables = {c["name"]: c for c in manifest["ec"]["collections"]}
    assert sorted(tables) == ["item_embedding", "user_embedding"], sorted(tables)
    live = read_variables(manifest["variables"], cluster.ps_addresses)
    assert live["global_step"] == 10
    result = check_parity(manifest["ec"], live)
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0 and result["stripes_checked"] == 6, result
    assert all(np.any(live[v] != first[v]) for c in tables.values() for v in c["data"].values() if live[v].size)


def _table_rows(coll, values):
    """A collection's one table, row by row, from its data variables' values (each PS's chunks stacked)."""
    layout = Layout.from_json(coll["layout"]).table(coll["name"])
    rows = np.zeros([layout.spec.rows, layout.spec.dim], np.float32)
    for p, var in coll["data"].items():
        for i, chunk in enumerate(layout.chunks_on(int(p), ChunkKind.DATA)):
            rows[chunk.row_start: chunk.row_start + chunk.real_rows] = values[var][i * chunk.rows: i * chunk.rows + chunk.real_rows]
    return rows


def test_a_linear_models_weights_are_striped_with_parity_and_train_as_stock_ones_do(cluster, tmp_path):
    """Issue 34 item 1, the wide part's weights: ``tf_ecrec.feature_column.linear(columns)`` makes the weights of
    each categorical column of a canned linear model (hashed, identity, crossed) a protected table of width 1,
    striped with parity and trained by FTRL with its slots; a column too small to stripe keeps a stock weight.
    The oracle: a stock LinearClassifier trained on the same batches without tf_ecrec (no cluster) ends with the
    same weights, row for row, to float rounding (the replicated stock weight of the small column differs from the
    stock run's in its last bits too, so those bits are not the stripes'; a row read or updated through the wrong
    partition would differ by the weight itself). Exported, the protected model serves without tf_ecrec what the
    stock model predicts."""
    user = tf.feature_column.categorical_column_with_hash_bucket("user", USERS)
    item = tf.feature_column.categorical_column_with_identity("item", ITEMS)
    small = tf.feature_column.categorical_column_with_identity("small", 4)  # 4 < 3 PS x k: a stock weight
    columns = [user, item, tf.feature_column.crossed_column(["user", item], 1000), small]
    data = _input_fn()

    def input_fn():
        return data().map(lambda f, y: ({**f, "small": f["item"] % 4}, y))

    stock_dir = str(tmp_path / "stock")
    with tf_config_env(None):
        stock = tf.compat.v1.estimator.LinearClassifier(
            columns, optimizer=tf.compat.v1.train.FtrlOptimizer(0.1), config=tf.estimator.RunConfig(
                model_dir=stock_dir, tf_random_seed=3))
        stock.train(input_fn, max_steps=12)
    canned = tf.compat.v1.estimator.LinearClassifier(
        tf_ecrec.feature_column.linear(columns), optimizer=tf_ecrec.ECOptimizer(tf.compat.v1.train.FtrlOptimizer(0.1)),
        config=_run_config(cluster, tmp_path / "protected"))
    estimator = tf.estimator.Estimator(ec_model_fn(canned.model_fn, ECConfig(2, 1)), config=canned.config)
    path = str(tmp_path / "protected" / "variables.json")  # where offline_estimator reads it
    estimator.train(input_fn, max_steps=12, hooks=[VariableManifestHook(path)])
    manifest = read_manifest(path)
    meta = manifest["ec"]
    live = read_variables(manifest["variables"], cluster.ps_addresses)
    assert live["global_step"] == 12
    tables = {c["name"]: c for c in meta["collections"]}
    assert sorted(tables) == ["item_X_user_linear", "item_linear", "user_linear"], sorted(tables)
    assert {meta["rules"].get(v, meta["optimizer"]) for c in tables.values() for v in c["data"].values()} == {"ftrl"}
    result = check_parity(meta, live)
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0, result["mismatched"]
    assert result["stripes_checked"] == 9, result
    assert [n for n in meta["replicas"] if "/weights" in n] == ["linear/linear_model/small/weights/part_0"], meta["replicas"]
    reader = tf.train.load_checkpoint(stock_dir)
    for column, table in (("user", "user_linear"), ("item", "item_linear"), ("item_X_user", "item_X_user_linear")):
        want = reader.get_tensor(f"linear/linear_model/{column}/weights")
        assert np.abs(want).sum() > 0, column  # trained: the comparison below is not of zeros
        np.testing.assert_allclose(_table_rows(tables[table], live), want, rtol=1e-5, atol=1e-7, err_msg=column)
    np.testing.assert_allclose(live["linear/linear_model/small/weights/part_0"],
                               reader.get_tensor("linear/linear_model/small/weights"), rtol=1e-5, atol=1e-7)
    receiver = tf.estimator.export.build_parsing_serving_input_receiver_fn(
        tf.feature_column.make_parse_example_spec(columns))
    offline = tf_ecrec.offline_estimator(canned)
    export = offline.export_saved_model(str(tmp_path / "export"), receiver).decode()
    feature = tf.train.Feature
    example = tf.train.Example(features=tf.train.Features(feature={
        "user": feature(bytes_list=tf.train.BytesList(value=[b"u7"])),
        "item": feature(int64_list=tf.train.Int64List(value=[3])),
        "small": feature(int64_list=tf.train.Int64List(value=[3]))})).SerializeToString()
    (got,) = serve_without_tf_ecrec([export], {"examples": np.array([example], dtype=object)}, str(tmp_path)).values()
    with tf_config_env(None):
        want = next(stock.predict(lambda: tf.data.Dataset.from_tensors(
            {"user": np.array([b"u7"]), "item": np.array([3], np.int64), "small": np.array([3], np.int64)}),
            yield_single_examples=False))
    np.testing.assert_allclose(np.asarray(got["outputs"]["scores"], np.float32)[:, 1], want["probabilities"][:, 1],
                               rtol=1e-5, atol=1e-6)


def test_protected_columns_refuse_what_they_cannot_protect_where_the_user_wrote_it(tmp_path):
    """Issue 34 item 5: not a v2 feature column; a vocabulary file that is not there (directly or under a weighted
    column), named with the rule, rather than a table initializer's NotFoundError in the first session."""
    with pytest.raises(ConfigError, match=r"rule: feature columns of tf.feature_column \(the v2 API\)"):
        tf_ecrec.feature_column.linear(["user"])
    missing = str(tmp_path / "vocab.txt")
    vocab = tf.feature_column.categorical_column_with_vocabulary_file("v", missing, vocabulary_size=10)
    weighted = tf.feature_column.weighted_categorical_column(vocab, "w")
    for make in (lambda c: tf_ecrec.feature_column.linear([c]), lambda c: tf_ecrec.feature_column.embedding_column(c, 4)):
        for column in (vocab, weighted):
            with pytest.raises(ConfigError, match=rf"reads vocabulary_file='{re.escape(missing)}', which does not exist"):
                make(column)
    with open(missing, "w", encoding="utf-8") as fh:
        fh.write("".join(f"t{i}\n" for i in range(10)))
    assert len(tf_ecrec.feature_column.linear([weighted])) == 1
