"""A user's own Estimator script, adopted through docs/adoption.md, survives a killed PS with no rollback.

``tests/adoption/deepfm.py`` is a DeepFM in the style of public recsys
Estimator scripts (libsvm input, a ``[features]`` first-order table and a
``[features, K]`` factor table read with ``embedding_lookup``, L2 on both,
Adam, ``train_and_evaluate`` under TF_CONFIG); ``deepfm_protected.py`` is the
same script with exactly the guide's changed lines.  The job is started the
way a TF_CONFIG launcher starts it: one process per task (2 PS, chief, worker,
evaluator), each with its own TF_CONFIG, no ``tf-ecrec run``.
"""

from __future__ import annotations

import difflib
import glob
import json
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest
from harness import zygote
from harness.cli_run import cli
from harness.process_cluster import ProcessCluster
from harness.serving import serve_without_tf_ecrec, sha256

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(REPO, "tests", "adoption")
GUIDE = os.path.join(REPO, "docs", "adoption.md")
FEATURES, FIELDS = 5000, 10


def _write_libsvm(path: str, lines: int, seed: int) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(lines):
            ids = [f * (FEATURES // FIELDS) + rng.randrange(FEATURES // FIELDS) for f in range(FIELDS)]
            label = int(ids[0] % 2 == 0) if rng.random() < 0.9 else rng.randrange(2)  # learnable, with noise
            fh.write(f"{label} " + " ".join(f"{i}:1" for i in ids) + "\n")


def _changed_lines(old: str, new: str) -> list[str]:
    diff = difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---"))]


@pytest.mark.parametrize("stock, protected, block", [("deepfm.py", "deepfm_protected.py", 0),
                                                     ("wide_deep_canned.py", "wide_deep_canned_protected.py", 1)])
def test_the_guide_shows_exactly_the_lines_the_protected_script_changes(stock, protected, block):
    """Each of docs/adoption.md's diff blocks, in order, is the diff between a stock script and its protected copy
    (DeepFM with its own model_fn; the canned wide and deep, in at most 10 changed lines)."""
    with open(os.path.join(SCRIPTS, stock), encoding="utf-8") as fh:
        old = fh.read()
    with open(os.path.join(SCRIPTS, protected), encoding="utf-8") as fh:
        new = fh.read()
    with open(GUIDE, encoding="utf-8") as fh:
        blocks = re.findall(r"```diff\n(.*?)```", fh.read(), re.S)
    assert len(blocks) == 2, "docs/adoption.md has not its two diff blocks"
    shown = [line for line in blocks[block].splitlines() if line[:1] in "+-"]
    assert shown == _changed_lines(old, new)
    assert protected != "wide_deep_canned_protected.py" or len([x for x in shown if x[:1] == "+"]) <= 10, shown


@pytest.fixture
def data_dir(tmp_path):
    path = tmp_path / "data"
    path.mkdir()
    _write_libsvm(str(path / "tr1.libsvm"), 8000, seed=1)
    _write_libsvm(str(path / "tr2.libsvm"), 8000, seed=2)
    _write_libsvm(str(path / "va1.libsvm"), 1000, seed=3)
    return str(path)


def test_a_public_style_script_adopted_through_the_guide_survives_a_killed_ps(tmp_path, data_dir):
    model_dir = str(tmp_path / "model")
    script = [sys.executable, os.path.join(SCRIPTS, "deepfm_protected.py"), "--data_dir", data_dir,
              "--model_dir", model_dir, "--feature_size", str(FEATURES), "--field_size", str(FIELDS),
              "--max_steps", "800", "--num_epochs", "20", "--save_checkpoints_steps", "100000"]
    job = ProcessCluster(script, {"ps": 2, "chief": 1, "worker": 1, "evaluator": 1}, str(tmp_path / "logs"),
                         fork=True)
    try:
        job.start_all()
        killed_at = job.wait_for_step(300)
        job.kill("ps:1")
        job.start("ps:1")  # the pod restarted behind its name: the same address
        codes = job.wait(["chief:0", "worker:0", "evaluator:0"], timeout=600)
        assert codes == {"chief:0": 0, "worker:0": 0, "evaluator:0": 0}, {t: job.log(t)[-3000:] for t in codes}

        # The chief rebuilt ps:1 from parity and replicas: no checkpoint (none after step 0 existed).
        with open(os.path.join(model_dir, "recovery.jsonl"), encoding="utf-8") as fh:
            entries = [json.loads(line) for line in fh]
        rebuilt = [e for e in entries if e["lost_ps"] == [1]]
        assert rebuilt and rebuilt[0]["method"] == "parity", entries
        assert rebuilt[0]["steps_rolled_back"] == 0, entries
        # What settlement undid (returned steps not yet durable: their records are trained again) is bounded.
        assert rebuilt[0]["global_step"] + rebuilt[0]["steps_undone"] >= killed_at, entries
        assert "method': 'checkpoint" not in job.log("chief:0")

        # Parity is exact on the live PS after training.
        verify = zygote.run([sys.executable, "-m", "tf_ecrec.cli", "verify", "--model-dir", model_dir],
                            env=job.env, timeout=300)
        assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
        result = json.loads(verify.stdout)
        assert result["mismatches"] == 0 and result["replica_mismatches"] == 0 and result["stripes_checked"] > 0, result
        # The evaluator evaluated the protected model's checkpoints (the tables built with the training layout).
        evaluations = re.findall(r"Saving dict for global step (\d+): auc = ([0-9.]+)", job.log("evaluator:0"))
        assert evaluations and int(evaluations[-1][0]) >= 800, job.log("evaluator:0")[-3000:]
        assert float(evaluations[-1][1]) > 0.7, evaluations  # the protected model learned
        _assert_the_exporter_serves_without_tf_ecrec(model_dir, int(evaluations[-1][0]))
        # No warning of ours on a clean run. TensorFlow's notices that tf.estimator itself is deprecated
        # come with every Estimator call, the user's stock script's included: not ours to remove.
        for task in ("chief:0", "worker:0", "ps:0", "evaluator:0"):
            ours = [line for line in job.log(task).splitlines()
                    if "WARNING" in line and ("tf_ecrec" in line or "Issue encountered when serializing" in line)
                    and "(from tensorflow_estimator." not in line]
            assert not ours, (task, ours[:5])
        # Both tables, the 1-D one included, are striped with parity (not dense replicas).
        with open(os.path.join(model_dir, "variables.json"), encoding="utf-8") as fh:
            names = {v["name"] for v in json.load(fh)["variables"]}
        assert {"ec/fm_w/ps0/data", "ec/fm_w/ps1/data", "ec/fm_v/ps0/data", "ec/fm_v/ps1/data"} <= names, sorted(names)
    finally:
        job.stop()


def test_a_canned_wide_and_deep_adopted_in_a_few_lines_survives_a_killed_ps_and_serves(tmp_path):
    """Issue 34: the tutorial-shaped wide-and-deep script (tests/adoption/wide_deep_canned.py: TensorFlow's canned
    DNNLinearCombinedClassifier over numeric, bucketized, vocabulary, hashed and crossed columns, train_and_evaluate
    with an exporter) adopted with the lines docs/adoption.md shows (wide_deep_canned_protected.py), one process per
    task under its own TF_CONFIG. ps:1 SIGKILLed mid-training and restarted is rebuilt from parity with 0 steps
    rolled back; both tables and the linear part's weights striped (the weights under FTRL), parity and replicas
    exact at the end; the evaluator's AUC at least the stock script's less 0.05, trained locally on the same data at the same
    time; the exporter's SavedModel serves in a process without tf_ecrec, holding the checkpoint's values."""
    model_dir, stock_dir = str(tmp_path / "model"), str(tmp_path / "stock")
    stock = subprocess.Popen([sys.executable, os.path.join(SCRIPTS, "wide_deep_canned.py"), "--model_dir", stock_dir,
                              "--max_steps", "1000"], env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    script = [sys.executable, os.path.join(SCRIPTS, "wide_deep_canned_protected.py"), "--model_dir", model_dir,
              "--max_steps", "1000"]
    job = ProcessCluster(script, {"ps": 3, "chief": 1, "worker": 1, "evaluator": 1}, str(tmp_path / "logs"), fork=True)
    try:
        job.start_all()
        killed_at = job.wait_for_step(300)
        job.kill("ps:1")
        job.start("ps:1")
        codes = job.wait(["chief:0", "worker:0", "evaluator:0"], timeout=600)
        assert codes == {"chief:0": 0, "worker:0": 0, "evaluator:0": 0}, {t: job.log(t)[-3000:] for t in codes}
        with open(os.path.join(model_dir, "recovery.jsonl"), encoding="utf-8") as fh:
            entries = [json.loads(line) for line in fh]
        rebuilt = [e for e in entries if e["lost_ps"] == [1]]
        assert rebuilt and rebuilt[0]["method"] == "parity" and rebuilt[0]["steps_rolled_back"] == 0, entries
        assert rebuilt[0]["global_step"] + rebuilt[0]["steps_undone"] >= killed_at, entries
        verify = zygote.run([sys.executable, "-m", "tf_ecrec.cli", "verify", "--model-dir", model_dir],
                            env=job.env, timeout=300)
        assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
        result = json.loads(verify.stdout)
        with open(os.path.join(model_dir, "variables.json"), encoding="utf-8") as fh:
            ec_meta = json.load(fh)["ec"]
        # The wide part's five categorical columns (vocabulary, hashed, bucketized, two crossed): striped tables.
        linear = [c for c in ec_meta["collections"] if c["name"].endswith("_linear")]
        assert len(linear) == 5 and {ec_meta["rules"][v] for c in linear for v in c["data"].values()} == {"ftrl"}, (
            ec_meta["collections"], ec_meta["rules"])
        assert not [n for n in ec_meta["replicas"] if "/weights" in n], ec_meta["replicas"]
        assert result["mismatches"] == 0 and result["replica_mismatches"] == 0 and result["stripes_checked"] == 6 + 15, result
        out, _ = stock.communicate(timeout=600)
        assert stock.returncode == 0, out[-3000:]
        (stock_auc,) = re.findall(r"'auc': (?:np\.float32\()?([0-9.]+)", out)
        evaluations = re.findall(r"Saving dict for global step (\d+): .*auc = ([0-9.]+)", job.log("evaluator:0"))
        assert evaluations and int(evaluations[-1][0]) >= 1000, job.log("evaluator:0")[-3000:]
        # The protected model learns as well as the stock one (it measured higher: 0.886 against 0.790, two trainers).
        assert float(stock_auc) > 0.7 and float(evaluations[-1][1]) > float(stock_auc) - 0.05, (stock_auc, evaluations)
        _assert_the_census_export_serves_without_tf_ecrec(model_dir, int(evaluations[-1][0]))
    finally:
        stock.kill()
        job.stop()


def _assert_the_census_export_serves_without_tf_ecrec(model_dir, last_step):
    import tensorflow as tf

    export = os.path.dirname(sorted(glob.glob(os.path.join(model_dir, "export", "census", "*", "saved_model.pb")))[-1])
    checkpoint = tf.train.load_checkpoint(os.path.join(model_dir, f"model.ckpt-{last_step}"))
    names = set(tf.train.load_checkpoint(os.path.join(export, "variables", "variables")).get_variable_to_shape_map())
    assert [n for n in names if "/data" in n] and not [n for n in names if "parity" in n or "replica" in n
                                                       or "Ftrl" in n or "Adagrad" in n], sorted(names)
    example = tf.train.Example(features=tf.train.Features(feature={
        "age": tf.train.Feature(float_list=tf.train.FloatList(value=[52.0])),
        "hours_per_week": tf.train.Feature(float_list=tf.train.FloatList(value=[40.0])),
        "education": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"Masters"])),
        "occupation": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"occ-12"]))})).SerializeToString()
    (got,) = serve_without_tf_ecrec([export], {"examples": np.array([example] * 3, dtype=object)}, model_dir).values()
    # The canned estimator's partitioned variables (one part each at this size) are saved whole, served by part.
    assert {n.removesuffix(":0").removesuffix("/part_0"): h for n, h in got["variables"].items()} == {
        n: sha256(checkpoint.get_tensor(n)) for n in names}
    scores = np.asarray(got["outputs"]["scores"], np.float32)
    assert scores.shape == (3, 2) and np.allclose(scores.sum(axis=1), 1, atol=1e-5), scores


def _assert_the_exporter_serves_without_tf_ecrec(model_dir, last_step):
    """Issue 34 item 3: the script's own EvalSpec exporter, run by the evaluator on the protected model, wrote a
    SavedModel of the last evaluated checkpoint that serves in a process that cannot import tf_ecrec (stock ops
    only): its variables are that checkpoint's data chunks and dense weights bit for bit, no parity or slot."""
    import tensorflow as tf

    (export,) = glob.glob(os.path.join(model_dir, "export", "deepfm", "*", "saved_model.pb"))
    export = os.path.dirname(export)
    checkpoint = tf.train.load_checkpoint(os.path.join(model_dir, f"model.ckpt-{last_step}"))
    exported = tf.train.load_checkpoint(os.path.join(export, "variables", "variables"))
    names = set(exported.get_variable_to_shape_map())
    assert {"ec/fm_w/ps0/data", "ec/fm_v/ps1/data"} <= names and not [n for n in names if "parity" in n or "replica" in n
                                                                          or "Adam" in n or "Adagrad" in n], names
    rng = np.random.default_rng(5)
    inputs = {"feat_ids": rng.integers(0, FEATURES, [16, FIELDS]), "feat_vals": rng.random([16, FIELDS], np.float32)}
    (got,) = serve_without_tf_ecrec([export], inputs, model_dir).values()
    assert got["variables"] == {f"{n}:0": sha256(checkpoint.get_tensor(n)) for n in names}
    probabilities = np.asarray(got["outputs"]["prob"])
    assert probabilities.shape == (16,) and np.all((probabilities > 0) & (probabilities < 1)), probabilities


def _rebuilt_by_parity_and_exact(model_dir):
    """A launched job's report and its parity check, asserting its one recovery was by parity with 0 rolled back
    and parity and replicas exact at the end."""
    with open(os.path.join(model_dir, "report.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    (rec,) = report["recovery"]
    assert rec["method"] == "parity" and rec["steps_rolled_back"] == 0, rec
    parity = report["parity"]
    assert parity["mismatches"] == 0 and parity["replica_mismatches"] == 0 and parity["stripes_checked"] > 0, parity
    return report, parity


def _cli_in(cwd, *args):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run([sys.executable, "-m", "tf_ecrec.cli", *args], capture_output=True, text=True,
                          timeout=900, cwd=cwd, env=env)


def test_a_users_model_module_runs_under_the_launcher_with_its_faults_and_report(tmp_path):
    # `--model wide_deep_model` from the directory holding the module, as `python -m` finds it.
    model_dir = str(tmp_path / "wide_deep")
    done = _cli_in(SCRIPTS, "run", "--model", "wide_deep_model", "--model-dir", model_dir, "--fault-tolerance", "ecrec",
                   "--ec", "1+1", "--ps", "2", "--workers", "2", "--steps", "500", "--table-rows", "500",
                   "--embedding-dim", "4", "--kill", "ps:1@step=200", "--restart-delay", "1", "--quiet")
    assert done.returncode == 0, done.stderr[-4000:]
    report, _ = _rebuilt_by_parity_and_exact(model_dir)
    # The throughput plot beside the report (the other e2e jobs run with --no-plot: tests/conftest.py's cli).
    assert report["plot"] == os.path.join(model_dir, "report.png") and os.path.getsize(report["plot"]) > 10_000, report["plot"]
    assert f"(plot: {report['plot']})" in done.stderr
    with open(os.path.join(model_dir, "variables.json"), encoding="utf-8") as fh:
        names = {v["name"] for v in json.load(fh)["variables"]}
    assert {"ec/wide/ps0/data", "ec/wide/ps1/data", "ec/deep/ps0/data", "ec/deep/ps1/data"} <= names, sorted(names)


def test_the_canned_wide_and_deep_example_runs_under_the_launcher_through_a_killed_ps(tmp_path):
    """Issue 34 item 2: ``tf-ecrec run --model wide_deep_canned`` trains TensorFlow's canned wide and deep over the
    launcher's data (its linear part's FTRL as a part of the deep part's ECOptimizer): ps:1 killed and restarted is
    rebuilt by parity with 0 steps rolled back, parity exact on the stripes of the tables and of the linear part's
    weights, every record trained."""
    model_dir = str(tmp_path / "run")
    done = cli("run", "--model", "wide_deep_canned", "--model-dir", model_dir, "--fault-tolerance", "ecrec", "--ec",
               "1+1", "--ps", "2", "--workers", "2", "--steps", "400", "--tables", "3", "--table-rows", "500",
               "--kill", "ps:1@step=200", "--restart-delay", "1", "--quiet")
    assert done.returncode == 0, done.stderr[-4000:]
    report, parity = _rebuilt_by_parity_and_exact(model_dir)
    with open(os.path.join(model_dir, "variables.json"), encoding="utf-8") as fh:
        rules = json.load(fh)["ec"]["rules"]
    assert len([n for n, rule in rules.items() if n.endswith("/data") and "_linear/" in n and rule == "ftrl"]) == 4 * 2, (
        rules)  # 3 tables + the cross, on 2 PS each
    assert parity["stripes_checked"] == 7 * 2, parity  # 3 embedding and 4 linear tables, 2 stripes each
    data = report["data"]
    assert data["records_trained"] == data["records_total"] and data["records_retrained"] == 0, data


def _forked_cli_in(cwd, *args):
    """`_cli_in`, forked from the fork server (`conftest.cli`): the module is found through PYTHONPATH, which a
    forked process puts on its path as an interpreter does (`python -m` from `cwd` is `_cli_in`'s case above)."""
    path = os.pathsep.join(p for p in (str(cwd), os.environ.get("PYTHONPATH", "")) if p)
    return cli(*args, cwd=str(cwd), env={"PYTHONPATH": path})


def test_a_model_module_that_breaks_the_contract_stops_the_launch_with_its_name(tmp_path):
    # Four launches that fail, forked from the fork server: no TensorFlow import apiece.
    run = str(tmp_path / "m")
    (tmp_path / "no_model_fn.py").write_text("def default_params(**flags):\n    return flags\n")
    done = _forked_cli_in(str(tmp_path), "run", "--model", "no_model_fn", "--model-dir", run, "--quiet")
    assert done.returncode == 2 and "module 'no_model_fn' has no callable model_fn" in done.stderr, done.stderr[-2000:]
    missing = _forked_cli_in(str(tmp_path), "run", "--model", "not_a_module_here", "--model-dir", run, "--quiet")
    assert missing.returncode == 2 and "cannot import module 'not_a_module_here'" in missing.stderr, missing.stderr[-2000:]
    bad = _forked_cli_in(str(tmp_path), "run", "--model", "my-model", "--model-dir", run, "--quiet")
    assert bad.returncode == 2 and "nor a module path" in bad.stderr, bad.stderr[-2000:]
    # A model_fn that raises: the chief dies of it, and the launcher names the exception, not the gRPC noise after it.
    (tmp_path / "raising_model.py").write_text(
        "from tf_ecrec.examples.dlrm import default_params  # noqa: F401\n\n\n"
        "def model_fn(features, labels, mode, params):\n    raise RuntimeError('this model_fn breaks')\n")
    broke = _forked_cli_in(str(tmp_path), "run", "--model", "raising_model", "--model-dir", str(tmp_path / "r"),
                           "--ps", "1", "--workers", "1", "--steps", "20", "--fault-tolerance", "none", "--quiet")
    assert broke.returncode == 1 and "exited with code 1; it raised (its log: " in broke.stderr, broke.stderr[-3000:]
    assert "Traceback (most recent call last):" in broke.stderr, broke.stderr[-3000:]
    assert "RuntimeError: this model_fn breaks" in broke.stderr, broke.stderr[-3000:]
