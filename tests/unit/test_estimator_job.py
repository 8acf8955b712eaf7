"""`tf_ecrec.train` / `train_and_evaluate` before any session: the code, TF_CONFIG and options checked."""

from __future__ import annotations

import json

import pytest
import tensorflow as tf

import tf_ecrec
from tf_ecrec.errors import ConfigError
from tf_ecrec.estimator.job import default_code


def _estimator(tmp_path):
    def model_fn(features, labels, mode):
        raise AssertionError("not built in these tests")

    return tf.estimator.Estimator(model_fn, model_dir=str(tmp_path))


def _tf_config(monkeypatch, ps, task=("chief", 0)):
    cluster = {"chief": ["localhost:1"], "ps": [f"localhost:{10 + i}" for i in range(ps)]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": task[0], "index": task[1]}}))


@pytest.mark.parametrize(("num_ps", "code"), [(2, "1+1"), (3, "2+1"), (6, "2+1")])
def test_the_default_code_covers_one_ps_loss(num_ps, code):
    assert str(default_code(num_ps)) == code


def test_one_ps_cannot_be_protected():
    with pytest.raises(ConfigError, match=r"needs >= 2 PS tasks, the job has 1"):
        default_code(1)


def test_no_tf_config_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ConfigError, match=r"TF_CONFIG is not set"):
        tf_ecrec.train(_estimator(tmp_path), lambda: None)


def test_a_code_wider_than_the_ps_job_is_named(tmp_path, monkeypatch):
    _tf_config(monkeypatch, ps=2)
    with pytest.raises(ConfigError, match=r"code 2\+1 needs k \+ r = 3 distinct PS tasks per stripe, but the job has 2"):
        tf_ecrec.train(_estimator(tmp_path), lambda: None, ec=tf_ecrec.ECConfig(2, 1))


def test_an_unknown_option_is_named(tmp_path, monkeypatch):
    _tf_config(monkeypatch, ps=2)
    with pytest.raises(ConfigError, match=r"unknown options \['session_timeout'\]"):
        tf_ecrec.train(_estimator(tmp_path), lambda: None, session_timeout=5)


def test_an_evaluator_does_not_train(tmp_path, monkeypatch):
    _tf_config(monkeypatch, ps=2, task=("evaluator", 0))
    with pytest.raises(ConfigError, match=r"task type 'evaluator' does not train"):
        tf_ecrec.train(_estimator(tmp_path), lambda: None)


@pytest.mark.parametrize("make", [
    lambda d: tf.estimator.DNNClassifier([4], [tf.feature_column.numeric_column("x")], model_dir=d),
    lambda d: tf.estimator.LinearClassifier([tf.feature_column.numeric_column("x")], model_dir=d),
])
def test_a_tf2_canned_estimator_is_refused_at_start_with_the_v1_class_to_use(tmp_path, monkeypatch, make):
    _tf_config(monkeypatch, ps=2)
    estimator = make(str(tmp_path))
    with pytest.raises(ConfigError, match=rf"estimator is a canned {type(estimator).__name__} .*tf.compat.v1.estimator class"):
        tf_ecrec.train(estimator, lambda: None)


def test_something_else_than_an_estimator_is_refused(tmp_path, monkeypatch):
    _tf_config(monkeypatch, ps=2)
    with pytest.raises(ConfigError, match=r"rule: a tf.estimator.Estimator or tf.compat.v1.estimator.Estimator"):
        tf_ecrec.train(object(), lambda: None)
