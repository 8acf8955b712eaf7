import json

import pytest

from tf_ecrec.cluster.tf_config import ClusterConfig, tf_config_env, with_tf_environment
from tf_ecrec.errors import ConfigError
from tf_ecrec.launcher.job.spec import JobSpec
from tf_ecrec.launcher.process_table import ProcessTable

TF_CONFIG = {
    "cluster": {
        "chief": ["127.0.0.1:2222"],
        "worker": ["127.0.0.1:2223", "127.0.0.1:2224"],
        "ps": ["127.0.0.1:2225", "127.0.0.1:2226"],
    },
    "task": {"type": "worker", "index": 1},
}


def test_parses_a_tf_config_and_derives_the_task_properties():
    cfg = ClusterConfig.from_tf_config(TF_CONFIG)
    assert (cfg.task_type, cfg.task_index, cfg.task) == ("worker", 1, "worker:1")
    assert cfg.address == "127.0.0.1:2224"
    assert cfg.num_ps == 2 and cfg.num_workers == 3
    assert cfg.worker_position == 2  # the chief is 0, worker:0 is 1
    assert not cfg.is_chief


def test_to_tf_config_is_the_inverse_of_from_tf_config():
    cfg = ClusterConfig.from_tf_config(TF_CONFIG)
    assert ClusterConfig.from_tf_config(cfg.to_tf_config()) == cfg
    assert cfg.to_tf_config() == TF_CONFIG


def test_the_value_is_frozen():
    cfg = ClusterConfig.from_tf_config(TF_CONFIG)
    with pytest.raises(Exception):
        cfg.task_index = 0  # type: ignore[misc]


def test_replace_address_moves_one_task_and_bumps_the_version():
    cfg = ClusterConfig.from_tf_config(TF_CONFIG)
    moved = cfg.replace_address("ps", 1, "127.0.0.1:3000")
    assert moved.ps_addresses == ("127.0.0.1:2225", "127.0.0.1:3000")
    assert moved.version == cfg.version + 1
    assert cfg.ps_addresses[1] == "127.0.0.1:2226"  # the original is unchanged
    with pytest.raises(ConfigError, match=r"task ps:5 is not in the cluster"):
        cfg.replace_address("ps", 5, "127.0.0.1:3000")


@pytest.mark.parametrize(
    "tf_config, message",
    [
        ({"cluster": {}, "task": {"type": "ps", "index": 0}}, r"'cluster' must be a non-empty object"),
        ({"cluster": {"ps": ["a:1"]}}, r"'task' must be an object"),
        ({"cluster": {"ps": "a:1"}, "task": {"type": "ps", "index": 0}}, r"cluster\['ps'\] must be a list"),
        ({"cluster": {"ps": ["a:1"], "boss": ["b:2"]}, "task": {"type": "ps", "index": 0}}, r"unknown job 'boss'"),
        ({"cluster": {"ps": ["nohost"]}, "task": {"type": "ps", "index": 0}}, r"address of ps:0 must be \"host:port\""),
        ({"cluster": {"ps": ["a:99999"]}, "task": {"type": "ps", "index": 0}}, r"port in 1..65535"),
        ({"cluster": {"ps": ["a:1", "a:1"]}, "task": {"type": "ps", "index": 0}}, r"address a:1 is used by both ps:0 and ps:1"),
        ({"cluster": {"ps": ["a:1"]}, "task": {"type": "worker", "index": 0}}, r"task type 'worker' is not a job"),
        ({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 3}}, r"task index 3 is out of range for job 'ps' with 1 task"),
        ({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": "0"}}, r"task index must be an integer"),
        ({"cluster": {"chief": ["a:1", "a:2"], "ps": ["a:3"]}, "task": {"type": "ps", "index": 0}}, r"2 chiefs"),
    ],
)
def test_bad_tf_config_gets_a_config_error_naming_value_rule_and_source(tf_config, message):
    with pytest.raises(ConfigError, match=message) as info:
        ClusterConfig.from_tf_config(tf_config)
    assert "source: environment variable TF_CONFIG" in str(info.value)


def test_from_environment_reports_missing_and_malformed_json():
    with pytest.raises(ConfigError, match=r"TF_CONFIG is not set"):
        ClusterConfig.from_environment({})
    with pytest.raises(ConfigError, match=r"TF_CONFIG is not valid JSON"):
        ClusterConfig.from_environment({"TF_CONFIG": "{cluster"})
    cfg = ClusterConfig.from_environment({"TF_CONFIG": json.dumps(TF_CONFIG)})
    assert cfg.task == "worker:1"


def test_tf_config_env_sets_and_restores_the_variable(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "previous")
    cfg = ClusterConfig.from_tf_config(TF_CONFIG)
    import os

    with tf_config_env(cfg):
        assert json.loads(os.environ["TF_CONFIG"]) == TF_CONFIG
    assert os.environ["TF_CONFIG"] == "previous"
    with tf_config_env(None):
        assert "TF_CONFIG" not in os.environ
    assert os.environ["TF_CONFIG"] == "previous"


def test_run_config_reads_the_cluster_we_write():
    import tensorflow as tf

    cfg = ClusterConfig.from_tf_config(TF_CONFIG).for_task("chief", 0)
    with tf_config_env(cfg):
        run_config = tf.estimator.RunConfig()
    assert run_config.task_type == "chief" and run_config.is_chief
    assert run_config.num_ps_replicas == 2 and run_config.num_worker_replicas == 3
    assert run_config.master == "grpc://127.0.0.1:2222"


def test_a_tasks_tensorflow_settings_are_added_where_its_environment_does_not_set_them():
    assert with_tf_environment({"PATH": "/bin"}) == {"PATH": "/bin", "TF_ENABLE_ONEDNN_OPTS": "0"}
    assert with_tf_environment({"TF_ENABLE_ONEDNN_OPTS": "1"})["TF_ENABLE_ONEDNN_OPTS"] == "1"  # the user's wins


def test_every_launched_task_starts_with_them(monkeypatch):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    assert ProcessTable(JobSpec()).base_environment()["TF_ENABLE_ONEDNN_OPTS"] == "0"
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")
    assert ProcessTable(JobSpec()).base_environment()["TF_ENABLE_ONEDNN_OPTS"] == "1"

