"""Start order does not matter to a TF2 coordinator: `tf_ecrec.pss.prepare_process` waits for the tasks its
TF_CONFIG names (`tf_ecrec.cluster.ps_session.wait_until_serving`), and names the ones that never come.

Real TensorFlow servers on loopback ports; a "dead" task is a port nothing listens on.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest
import tensorflow as tf

from tf_ecrec.cluster.ps_session import answers, wait_until_serving
from tf_ecrec.errors import ClusterUnavailable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server(address: str) -> tf.distribute.Server:
    return tf.distribute.Server(tf.train.ClusterSpec({"ps": [address]}), job_name="ps", task_index=0, start=True)


def test_a_task_that_never_serves_is_named_with_its_address_and_the_others_are_not() -> None:
    live = f"127.0.0.1:{_free_port()}"
    dead = f"127.0.0.1:{_free_port()}"
    _server(live)
    assert answers(live, 5.0) and not answers(dead, 1.0)
    with pytest.raises(ClusterUnavailable, match=rf"ps:1 at {dead} did not answer within 1 s.*source: the test") as info:
        wait_until_serving({"ps:0": live, "ps:1": dead}, 1.0, "the test", probe_secs=0.5)
    assert live not in str(info.value)


def test_a_task_that_starts_late_is_waited_for() -> None:
    late = f"127.0.0.1:{_free_port()}"
    started: list[float] = []
    servers = []

    def start_late() -> None:
        time.sleep(1.5)
        servers.append(_server(late))
        started.append(time.monotonic())

    thread = threading.Thread(target=start_late, daemon=True)
    begun = time.monotonic()
    thread.start()
    waited = wait_until_serving({"ps:0": late}, 120.0, "the test", probe_secs=0.5)
    thread.join(timeout=60)
    # It returned once the server was up (its own evidence), not before: the wait covers the late start.
    assert started and begun + waited >= started[0] - 0.05, (waited, started[0] - begun)


def prepare_process_names_the_missing_ps_case() -> None:
    """In a fresh process (prepare_process sets this process's gRPC options): a TF_CONFIG whose ps:1 never
    comes gives ClusterUnavailable naming it, where the strategy's connection would abort the process."""
    import tf_ecrec.pss

    live, dead, me = (f"127.0.0.1:{_free_port()}" for _ in range(3))
    _server(live)
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"chief": [me], "ps": [live, dead]},
                                          "task": {"type": "chief", "index": 0}})
    try:
        tf_ecrec.pss.prepare_process(wait_secs=1.0)
    except ClusterUnavailable as exc:
        assert f"ps:1 at {dead}" in str(exc) and "TF_CONFIG" in str(exc) and live not in str(exc), exc
    else:
        raise AssertionError("prepare_process returned with ps:1 not serving")


def test_prepare_process_names_a_ps_that_never_comes(fresh_process) -> None:
    fresh_process("integration.test_cluster_wait:prepare_process_names_the_missing_ps_case", timeout=300)
