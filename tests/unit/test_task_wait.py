"""A worker's bounded wait for the tasks its session reaches (`tf_ecrec.recovery.task_wait`), with fake time."""

from __future__ import annotations

import pytest

from tf_ecrec.base.retry import Retry, retry_on
from tf_ecrec.errors import ConfigError, RecoveryError
from tf_ecrec.recovery.task_wait import TaskWaitHook, run_config_targets, session_targets

CLUSTER = {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1", "p:2"]}


def test_the_targets_are_what_the_device_filters_name_or_the_whole_cluster() -> None:
    # Estimator's default filters for worker 1: the PS and itself; the chief is not reached.
    assert session_targets(CLUSTER, ["/job:ps", "/job:worker/task:1"], "worker:1") == {"ps:0": "p:1", "ps:1": "p:2"}
    # A user's session config without filters: every other task, the chief included.
    assert session_targets(CLUSTER, [], "worker:1") == {"chief:0": "c:1", "worker:0": "w:1", "ps:0": "p:1", "ps:1": "p:2"}
    assert session_targets(CLUSTER, ["/job:ps/replica:0/task:1"], "worker:0") == {"ps:1": "p:2"}


def test_a_propagated_cluster_is_what_the_session_reaches(monkeypatch) -> None:
    import json

    import tensorflow as tf

    from tf_ecrec.cluster.ps_session import session_config
    from tf_ecrec.cluster.tf_config import ClusterConfig

    cluster = ClusterConfig({"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1", "p:2"]}, "worker", 1)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster.cluster, "task": {"type": "worker", "index": 1}}))
    run_config = tf.estimator.RunConfig(session_config=session_config(cluster, 30.0))
    assert run_config_targets(run_config) == ({"ps:0": "p:1", "ps:1": "p:2"}, "worker:1")  # not the chief
    plain = tf.estimator.RunConfig(session_config=tf.compat.v1.ConfigProto(allow_soft_placement=True))
    assert run_config_targets(plain)[0] == {"chief:0": "c:1", "worker:0": "w:1", "ps:0": "p:1", "ps:1": "p:2"}


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, secs: float) -> None:
        self.now += secs


def _retry(clock: FakeTime, deadline: float) -> Retry:
    return Retry(max_tries=10_000, delay=0.5, max_delay=2.0, max_jitter=0.0, deadline=deadline,
                 retry_if=retry_on(OSError), sleep_func=clock.sleep, clock=lambda: clock.now)


def test_a_task_that_never_answers_is_named_after_the_deadline() -> None:
    clock = FakeTime()
    asked: list[str] = []

    def connect(address: str) -> None:
        asked.append(address)
        if address == "c:1":
            raise ConnectionRefusedError("refused")

    hook = TaskWaitHook({"chief:0": "c:1", "ps:0": "p:1"}, "worker:0", 30.0, connect=connect, retry=_retry(clock, 30.0))
    with pytest.raises(RecoveryError, match=r"^worker:0: chief:0 at c:1 did not answer within 30 s \(refused\)"):
        hook.begin()
    assert 28.0 <= clock.now <= 30.0 and asked.count("c:1") > 10 and "p:1" not in asked  # sorted: chief first


def test_a_task_that_comes_up_ends_the_wait() -> None:
    clock = FakeTime()

    def connect(address: str) -> None:
        if clock.now < 5.0:
            raise ConnectionRefusedError("not yet")

    TaskWaitHook({"chief:0": "c:1"}, "worker:0", 30.0, connect=connect, retry=_retry(clock, 30.0)).begin()
    assert 5.0 <= clock.now < 8.0


def test_a_deadline_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="deadline_secs=0"):
        TaskWaitHook({}, "worker:0", 0)
