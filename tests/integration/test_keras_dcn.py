"""A Keras DCN converted with model_to_estimator keeps parity and replicas exact, on an in-process PS cluster.

The cluster (3 PS tasks and a chief, in-process servers from `tf_cluster`)
is shared by the module and reset before each test.  Each training test
builds the Estimator as a user would, from a RunConfig made under the
chief's TF_CONFIG (so its master is the chief's server), trains on synthetic
Criteo batches, then reads every variable back from the PS tasks through the
manifest (`tf_ecrec.check.live_cluster`) and checks every stripe and replica bit for bit
(`tf_ecrec.check.verify`).  The layer's and the example's errors are checked on
graphs alone.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
from harness import zygote
from harness.serving import serve_without_tf_ecrec, sha256
from tf_cluster import tf_cluster

from tf_ecrec.check.live_cluster import read_manifest, read_variables, variables_digest
from tf_ecrec.check.verify import check_parity, redundancy_names
from tf_ecrec.cluster.tf_config import ClusterConfig, tf_config_env
from tf_ecrec.data.pipeline import BATCH_RECORDS_COLLECTION, StaticShards, make_dataset, with_data_accounting
from tf_ecrec.data.synthetic import SyntheticCriteo
from tf_ecrec.erasure.code import ECConfig
from tf_ecrec.errors import ConfigError
from tf_ecrec.estimator.model_fn import ec_model_fn
from tf_ecrec.examples import dcn
from tf_ecrec.hooks.manifest import VariableManifestHook
from tf_ecrec.keras import ECEmbedding, ECEmbeddings, ECKerasOptimizer
from tf_ecrec.launcher.job.models import data_sizes
from tf_ecrec.layout.device import ECDeviceFn
from tf_ecrec.step.embedding import ECContext, set_context

ps_cluster = tf_cluster(num_ps=3)


@pytest.fixture
def cluster(ps_cluster):
    """The module's cluster with no variables left by an earlier test (they would be found initialised)."""
    ps_cluster.reset()
    return ps_cluster


SMALL = {"table_sizes": [300] * 6, "embedding_dim": 4, "cross_layers": 2, "projection_dim": 8, "deep_mlp": [16]}
BATCH = 64


def _run_config(cluster, model_dir, device_fn=False):
    with tf_config_env(cluster.config("chief")):
        return tf.estimator.RunConfig(
            model_dir=str(model_dir), tf_random_seed=3, log_step_count_steps=10**6,
            device_fn=ECDeviceFn() if device_fn else None,
        )


def _input_fn(params):
    source = SyntheticCriteo(data_sizes(params), 50 * BATCH, seed=1)
    return lambda: make_dataset(source, StaticShards(source.num_records, 4 * BATCH), BATCH, data_sizes(params))


class _Runs(tf.compat.v1.train.SessionRunHook):
    """Counts the training steps a train() call ran, and fetches the batch size the graph reports."""

    def __init__(self):
        self.runs = 0
        self.records = []

    def begin(self):
        counts = tf.compat.v1.get_collection(BATCH_RECORDS_COLLECTION)
        self._records = counts[0] if counts else None

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._records) if self._records is not None else None

    def after_run(self, run_context, run_values):
        self.runs += 1
        if run_values.results is not None:
            self.records.append(int(run_values.results))


def _train(cluster, estimator, params, max_steps, tmp_path):
    """Trains to `max_steps`; returns (values read from the PS tasks, manifest, the `_Runs` hook)."""
    path = str(tmp_path / "variables.json")
    runs = _Runs()
    estimator.train(_input_fn(params), max_steps=max_steps, hooks=[VariableManifestHook(path), runs])
    manifest = read_manifest(path)
    return read_variables(manifest["variables"], cluster.ps_addresses), manifest, runs


def _covered(meta):
    """Every variable name the ECOptimizer's description accounts for."""
    names = set()
    for coll in meta["collections"]:
        names |= set(coll["data"].values()) | set(coll["parity"].values())
        names |= {s for slots in coll["slots"].values() for s in slots}
    for primary, replicas in meta["replicas"].items():
        names |= {primary, *replicas, *meta["replica_slots"][primary]}
    return names


def _replica_values(values, meta, name):
    return [int(values[r]) for r in meta["replicas"][name]]


# ---- training through model_to_estimator ---------------------------------------------------------------------


def test_protected_dcn_keeps_parity_and_replicas_exact_and_steps_once(cluster, tmp_path):
    params = dcn.default_params(**SMALL, ec="2+1")
    run_config = _run_config(cluster, tmp_path)
    assert run_config.master == cluster.target("chief") and run_config.num_ps_replicas == 3

    first, manifest, runs = _train(cluster, dcn.make_estimator(run_config, params), params, 5, tmp_path)
    meta = manifest["ec"]
    assert meta["optimizer"] == "adagrad" and meta["code"] == [2, 1]
    result = check_parity(meta, first)
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0, result["mismatched"]
    assert result["stripes_checked"] == 3
    # Every variable on the PS tasks is a protected table, a replicated dense variable, the global
    # step, or the slots, parity and replicas the ECOptimizer made for them: Keras' updates went
    # through it and nothing else (no stock slot, no Keras iterations counter).
    assert set(first) == _covered(meta)
    dense = {n for n in meta["replicas"] if n != "global_step"}
    assert dense == {v for v in first if v.startswith("dcn/")} and len(dense) == 2 * 3 + 2 + 2
    # The Estimator's global step is Keras' optimizer iterations: incremented once per step, with its replica.
    assert runs.runs == 5 and first["global_step"] == 5 and _replica_values(first, meta, "global_step") == [5]

    # A new Estimator (as after a failover) builds a new graph and carries on from the live PS state.
    second, manifest, runs = _train(cluster, dcn.make_estimator(run_config, params), params, 30, tmp_path)
    assert manifest["ec"] == meta
    result = check_parity(meta, second)
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0, result["mismatched"]
    assert runs.runs == 25 and second["global_step"] == 30 and _replica_values(second, meta, "global_step") == [30]
    tables = list(meta["collections"][0]["data"].values())
    assert all(not np.array_equal(first[t], second[t]) for t in tables)
    assert not np.array_equal(first["dcn/logit/kernel"], second["dcn/logit/kernel"])


def test_the_trained_model_exports_a_savedmodel_served_without_tf_ecrec_and_warm_starts_a_new_job(cluster, tmp_path):
    """Issue 34 item 3, for a Keras model through model_to_estimator (its model_fn wrapped by make_estimator
    already): `tf_ecrec.offline_estimator` reads the code and PS count from the model dir, exports the last
    checkpoint, and the SavedModel serves in a process that cannot import tf_ecrec (stock ops only); its variables
    are the live PS's data chunks and dense weights bit for bit, with no parity, replica or slot; it predicts what
    the Estimator predicts from the checkpoint.  Then ``warm_start_from`` that model dir (same code and PS count)
    gives a new job's tables and dense weights the checkpoint's values, and their parity and replicas are
    encoded from those values (steps at learning rate 0 leave the weights as they started; parity is checked)."""
    import tf_ecrec
    from tf_ecrec.launcher.export import serving_input_receiver_fn

    params = dcn.default_params(**SMALL, ec="2+1")
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    estimator = dcn.make_estimator(_run_config(cluster, first_dir), params)
    live, manifest, _ = _train(cluster, estimator, params, 10, first_dir)
    offline = tf_ecrec.offline_estimator(estimator)
    path = offline.export_saved_model(str(tmp_path / "export"), serving_input_receiver_fn).decode()
    rng = np.random.default_rng(7)
    cat = np.zeros([16, 26], np.int64)
    cat[:, :6] = rng.integers(0, 300, [16, 6])
    inputs = {"dense": rng.random([16, 13], dtype=np.float32), "cat": cat}
    (got,) = serve_without_tf_ecrec([path], inputs, str(tmp_path)).values()
    names = {n.removesuffix(":0") for n in got["variables"]}
    data = set(manifest["ec"]["collections"][0]["data"].values())
    assert data <= names and names <= set(live) - redundancy_names(manifest["ec"]), sorted(names)
    assert not [n for n in names if "Adagrad" in n], sorted(names)
    assert got["variables"] == {f"{n}:0": sha256(live[n]) for n in names}
    want = next(offline.predict(lambda: tf.data.Dataset.from_tensors((inputs, None)), yield_single_examples=False))
    (key,) = got["outputs"]
    np.testing.assert_allclose(np.asarray(got["outputs"][key], np.float32), want[key], rtol=1e-6, atol=1e-7)

    cluster.reset()  # a new job: new PS tasks, nothing on them
    still = {**params, "optimizer": "sgd", "learning_rate": 0.0}
    warm = tf.estimator.Estimator(ec_model_fn(dcn.model_fn, ECConfig(2, 1)), params=still,
                                  config=_run_config(cluster, second_dir), warm_start_from=str(first_dir))
    started, manifest, runs = _train(cluster, warm, still, 2, second_dir)
    assert runs.runs == 2
    weights = [n for n in names if n != "global_step"]
    assert len(weights) > 10
    for name in weights:
        np.testing.assert_array_equal(started[name], live[name], err_msg=name)
    result = check_parity(manifest["ec"], started)
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0, result["mismatched"]


def test_a_compiled_model_converted_once_trains_through_an_ec_optimizer_in_every_graph(cluster, tmp_path):
    # The plain model_to_estimator flow: one compiled model, one Estimator, two train() calls.  Each
    # call builds a graph and clones the model into it with the same optimizer object, which must
    # give each graph its own ECOptimizer (the second call resumes from the Saver checkpoint).
    params = dcn.default_params(**SMALL, ec="2+1")
    model = dcn.keras_model(params, num_ps=3)
    assert isinstance(model.optimizer.optimizer, ECKerasOptimizer)  # inside Keras' TFOptimizer
    estimator = tf.keras.estimator.model_to_estimator(
        keras_model=model, config=_run_config(cluster, tmp_path, device_fn=True), checkpoint_format="saver"
    )
    for steps in (3, 7):
        values, manifest, runs = _train(cluster, estimator, params, steps, tmp_path)
        result = check_parity(manifest["ec"], values)
        assert result["mismatches"] == 0 and result["replica_mismatches"] == 0, result["mismatched"]
        assert set(values) == _covered(manifest["ec"])
        assert values["global_step"] == steps and _replica_values(values, manifest["ec"], "global_step") == [steps]
    assert runs.runs == 4


def test_launcher_style_model_fn_with_code_from_ec_model_fn(cluster, tmp_path):
    # What `tf-ecrec run --model dcn --fault-tolerance ecrec` builds: params["ec"] = True, the code
    # (here 1+2: two replicas, Reed-Solomon parity) and PS count from ec_model_fn, data accounting outside.
    params = dcn.default_params(**SMALL, bottom_mlp=[64, 4], optimizer="sgd", ec=True)
    model_fn = with_data_accounting(ec_model_fn(dcn.model_fn, ECConfig(1, 2)))
    estimator = tf.estimator.Estimator(model_fn=model_fn, params=params, config=_run_config(cluster, tmp_path))
    values, manifest, runs = _train(cluster, estimator, params, 6, tmp_path)
    meta = manifest["ec"]
    assert meta["code"] == [1, 2] and meta["optimizer"] == "sgd"
    result = check_parity(meta, values)
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0, result["mismatched"]
    assert result["replicas_checked"] == 2 * 11
    assert set(values) == _covered(meta)
    assert runs.runs == 6 and values["global_step"] == 6 and _replica_values(values, meta, "global_step") == [6, 6]
    assert runs.records == [BATCH] * 6  # with_data_accounting counted every batch

    # The same checks from outside the job, in bounded slices from the live PS tasks: `tf-ecrec verify`
    # and the launcher's end-of-job digest (`python -m tf_ecrec.check.digest`), a small budget splitting stripes.
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    ps = ",".join(cluster.ps_addresses)
    verify = zygote.run([sys.executable, "-m", "tf_ecrec.cli", "verify", "--model-dir", str(tmp_path), "--ps", ps],
                        env=env, timeout=120)
    assert verify.returncode == 0, verify.stderr[-2000:]
    assert json.loads(verify.stdout) == result
    digest = zygote.run(
        [sys.executable, "-c", "import sys, tf_ecrec.check.live_cluster as i, tf_ecrec.check.digest as d; i.READ_BYTES = 1000; sys.exit(d.main(sys.argv[1:]))",
         str(tmp_path / "variables.json"), ps], env=env, timeout=120)
    assert digest.returncode == 0, digest.stderr[-2000:]
    out = json.loads(digest.stdout.strip().splitlines()[-1])
    model = {n: v for n, v in values.items() if n not in redundancy_names(meta)}
    assert out["parity"] == result
    assert out["variables_sha256"] == variables_digest(model) and out["variables"] == len(model)


def test_plain_dcn_trains_keras_embeddings_spread_over_the_ps_tasks(cluster, tmp_path):
    params = dcn.default_params(**SMALL)
    estimator = dcn.make_estimator(_run_config(cluster, tmp_path), params)
    values, manifest, runs = _train(cluster, estimator, params, 4, tmp_path)
    assert "ec" not in manifest
    tables = [r for r in manifest["variables"] if r["name"].endswith("/embeddings")]
    assert len(tables) == 6 and {r["device"] for r in tables} == {f"/job:ps/task:{p}" for p in range(3)}
    assert {r["name"] + "/Adagrad" for r in tables} <= set(values)  # the stock optimizer's slots
    assert runs.runs == 4 and values["global_step"] == 4


# ---- the layer, on graphs ------------------------------------------------------------------------------


TABLES = [("a", 40), ("b", 7)]


def test_layer_without_a_code_or_a_ps_count_names_what_is_missing():
    ids = lambda: tf.compat.v1.placeholder(tf.int64, [None, 2])  # noqa: E731
    with tf.Graph().as_default(), tf_config_env(None):
        with pytest.raises(ConfigError, match=r"layer 'e1' needs an erasure code: pass ec="):
            ECEmbeddings(TABLES, 4, num_ps=3, name="e1")(ids())
        with pytest.raises(ConfigError, match=r"layer 'e2' needs the PS count: pass num_ps=.*TF_CONFIG is not set"):
            ECEmbeddings(TABLES, 4, ec="2+1", name="e2")(ids())
        with pytest.raises(ConfigError, match=r"code 3\+1 needs k \+ r = 4 distinct PS tasks.*the job has 3"):
            ECEmbeddings(TABLES, 4, ec="3+1", num_ps=3, name="e3")(ids())
    no_ps = ClusterConfig({"chief": ("127.0.0.1:2000",), "worker": ("127.0.0.1:2001",)}, "chief", 0)
    with tf.Graph().as_default(), tf_config_env(no_ps):
        with pytest.raises(ConfigError, match=r"layer 'e4' needs PS tasks.*TF_CONFIG has no ps job"):
            ECEmbeddings(TABLES, 4, ec="2+1", name="e4")(ids())


def test_layer_takes_the_ps_count_from_ec_model_fn_then_tf_config():
    four_ps = ClusterConfig(
        {"chief": ("127.0.0.1:2000",), "ps": tuple(f"127.0.0.1:{3000 + i}" for i in range(4))}, "chief", 0
    )
    with tf.Graph().as_default(), tf_config_env(four_ps), tf.compat.v1.device(ECDeviceFn()):
        from_env = ECEmbeddings(TABLES, 4, ec=ECConfig(2, 1), name="env")
        from_env(tf.compat.v1.placeholder(tf.int64, [None, 2]))
        set_context(ECContext(ECConfig(1, 2), 3))
        from_ctx = ECEmbeddings(TABLES, 4, name="ctx")
        from_ctx(tf.compat.v1.placeholder(tf.int64, [None, 2]))
    assert from_env.collection.num_ps == 4 and from_env.collection.ec == ECConfig(2, 1)
    assert from_ctx.collection.num_ps == 3 and from_ctx.collection.ec == ECConfig(1, 2)


def test_layer_weights_are_the_ps_variables_and_get_sparse_gradients():
    with tf.Graph().as_default(), tf.compat.v1.device(ECDeviceFn(num_ps=3)):
        layer = ECEmbeddings(TABLES, 4, ec="2+1", num_ps=3, name="emb")
        ids = tf.constant([[0, 6], [39, 0]], tf.int64)
        rows = layer(ids)
        single = ECEmbedding(10, 3, ec="2+1", num_ps=3, name="one")
        one = single(tf.constant([[1, 2, 3]], tf.int64))
        grads = tf.compat.v1.gradients(tf.reduce_sum(rows), layer.trainable_weights)
    assert rows.shape.as_list() == [2, 2, 4] and one.shape.as_list() == [1, 3, 3]
    data = [layer.collection.data[p] for p in sorted(layer.collection.data)]
    names = [f"ec/emb/ps{p}/data:0" for p in range(3)]
    assert [v.name for v in layer.trainable_weights] == [v.name for v in data] == names
    assert [v.device for v in data] == [f"/job:ps/task:{p}" for p in range(3)]
    assert all(isinstance(g, tf.IndexedSlices) for g in grads)


def test_layer_config_round_trips():
    layer = ECEmbeddings(TABLES, 4, ec="2+1", num_ps=3, embeddings_initializer="zeros", collection="c", name="emb")
    config = layer.get_config()
    assert config["tables"] == [["a", 40], ["b", 7]] and config["ec"] == "2+1" and config["collection"] == "c"
    assert ECEmbeddings.from_config(config).get_config() == config
    single = ECEmbedding(10, 3, ec=ECConfig(1, 1), name="one")
    assert ECEmbedding.from_config(single.get_config()).get_config() == single.get_config()
    assert single.get_config()["input_dim"] == 10 and single.get_config()["num_ps"] is None


def test_layer_cannot_be_built_eagerly_and_says_what_to_do():
    inputs = tf.keras.Input(shape=(2,), dtype=tf.int64)
    with pytest.raises(ConfigError, match=r"cannot be built eagerly.*subclassed tf.keras.Model"):
        ECEmbeddings(TABLES, 4, ec="2+1", num_ps=3, name="eager")(inputs)


def test_keras_optimizer_checks_the_rule_and_makes_one_ec_optimizer_per_graph():
    with pytest.raises(ConfigError, match=r"cannot apply AdadeltaOptimizer"):
        ECKerasOptimizer(tf.compat.v1.train.AdadeltaOptimizer(0.1))
    optimizer = ECKerasOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
    with tf.Graph().as_default():
        first = optimizer.ec_optimizer()
        assert optimizer.ec_optimizer() is first
    with tf.Graph().as_default():
        assert optimizer.ec_optimizer() is not first


def test_example_params_and_make_estimator_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"DCN has no parameters \['cross'\]"):
        dcn.default_params(cross=2)
    with pytest.raises(ConfigError, match=r"erasure code '2\+' is malformed"):
        dcn.default_params(ec="2+")
    with pytest.raises(ConfigError, match=r"needs the erasure code itself in params\['ec'\]"):
        dcn.make_estimator(tf.estimator.RunConfig(model_dir=str(tmp_path)), dcn.default_params(ec=True))


def test_a_model_fn_with_two_ec_optimizers_is_refused_before_training(cluster, tmp_path):
    """A canned estimator's shape (FTRL for the wide part, Adagrad for the deep part), each optimizer wrapped:
    two step programs would share each PS's delta log and recovery would know one of them, so the job is
    refused when the graph is built, with a typed error, instead of falling back to the checkpoint at the
    first failure (issue 34)."""
    import tf_ecrec

    def two_optimizers(features, labels, mode, params):
        coll = tf_ecrec.EmbeddingCollection("deep", [("c0", 64)], 4)
        rows = coll.lookup_all(tf.reshape(features["ids"], [-1, 1]))
        wide = tf.compat.v1.get_variable("wide", [1], initializer=tf.zeros_initializer(), use_resource=True)
        logits = tf.reduce_sum(tf.reshape(rows, [8, -1]), axis=1) + wide
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        step = tf.compat.v1.train.get_or_create_global_step()
        deep_op = tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.05)).minimize(
            loss, var_list=list(coll.data.values()))
        wide_op = tf_ecrec.ECOptimizer(tf.compat.v1.train.FtrlOptimizer(0.05)).minimize(
            loss, global_step=step, var_list=[wide])
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf.group(deep_op, wide_op))

    def input_fn():
        ids = tf.constant(np.arange(8, dtype=np.int64))
        return tf.data.Dataset.from_tensors(({"ids": ids}, tf.ones([8]))).repeat()

    estimator = tf.estimator.Estimator(model_fn=ec_model_fn(two_optimizers, ECConfig(2, 1)),
                                       config=_run_config(cluster, tmp_path))
    with pytest.raises(ConfigError, match=r"applied gradients through tf_ecrec.ECOptimizer 2 times \(2 optimizer "
                                          r"objects\); rule: one ECOptimizer"):
        estimator.train(input_fn, steps=1)
    assert not tf.io.gfile.glob(str(tmp_path / "model.ckpt-*"))  # refused before a first step or checkpoint
