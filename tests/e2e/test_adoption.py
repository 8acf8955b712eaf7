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


def test_the_guide_shows_exactly_the_lines_the_protected_script_changes():
    with open(os.path.join(SCRIPTS, "deepfm.py"), encoding="utf-8") as fh:
        stock = fh.read()
    with open(os.path.join(SCRIPTS, "deepfm_protected.py"), encoding="utf-8") as fh:
        protected = fh.read()
    with open(GUIDE, encoding="utf-8") as fh:
        guide = fh.read()
    block = re.search(r"```diff\n(.*?)```", guide, re.S)
    assert block, "docs/adoption.md has no diff block"
    shown = [line for line in block.group(1).splitlines() if line[:1] in "+-"]
    assert shown == _changed_lines(stock, protected)


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


def test_a_canned_dnn_classifier_with_protected_columns_survives_a_killed_ps(tmp_path):
    """Issue 34: a canned estimator as a user runs it (tests/adoption/canned_dnn_protected.py: the v1 DNNClassifier,
    its two embedding columns tf_ecrec's, an ECOptimizer, tf_ecrec.train under its own TF_CONFIG, one process per
    task): a PS SIGKILLed mid-training and restarted is rebuilt from parity with 0 steps rolled back (no checkpoint
    exists after step 0), both trainers end, and parity is exact on the live PS afterwards."""
    model_dir = str(tmp_path / "model")
    script = [sys.executable, os.path.join(SCRIPTS, "canned_dnn_protected.py"), "--model_dir", model_dir,
              "--max_steps", "1000"]
    job = ProcessCluster(script, {"ps": 3, "chief": 1, "worker": 1}, str(tmp_path / "logs"), fork=True)
    try:
        job.start_all()
        killed_at = job.wait_for_step(300)
        job.kill("ps:1")
        job.start("ps:1")
        codes = job.wait(["chief:0", "worker:0"], timeout=600)
        assert codes == {"chief:0": 0, "worker:0": 0}, {t: job.log(t)[-3000:] for t in codes}
        with open(os.path.join(model_dir, "recovery.jsonl"), encoding="utf-8") as fh:
            entries = [json.loads(line) for line in fh]
        rebuilt = [e for e in entries if e["lost_ps"] == [1]]
        assert rebuilt and rebuilt[0]["method"] == "parity" and rebuilt[0]["steps_rolled_back"] == 0, entries
        assert rebuilt[0]["global_step"] + rebuilt[0]["steps_undone"] >= killed_at, entries
        verify = zygote.run([sys.executable, "-m", "tf_ecrec.cli", "verify", "--model-dir", model_dir],
                            env=job.env, timeout=300)
        assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
        result = json.loads(verify.stdout)
        assert result["mismatches"] == 0 and result["replica_mismatches"] == 0 and result["stripes_checked"] == 6, result
    finally:
        job.stop()


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
    with open(os.path.join(model_dir, "report.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    (rec,) = report["recovery"]
    assert rec["method"] == "parity" and rec["steps_rolled_back"] == 0, rec
    parity = report["parity"]
    assert parity["mismatches"] == 0 and parity["replica_mismatches"] == 0 and parity["stripes_checked"] > 0, parity
    # The throughput plot beside the report (the other e2e jobs run with --no-plot: tests/conftest.py's cli).
    assert report["plot"] == os.path.join(model_dir, "report.png") and os.path.getsize(report["plot"]) > 10_000, report["plot"]
    assert f"(plot: {report['plot']})" in done.stderr
    with open(os.path.join(model_dir, "variables.json"), encoding="utf-8") as fh:
        names = {v["name"] for v in json.load(fh)["variables"]}
    assert {"ec/wide/ps0/data", "ec/wide/ps1/data", "ec/deep/ps0/data", "ec/deep/ps1/data"} <= names, sorted(names)


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
