"""A script protected with the previous release's README lines still runs (issue 30, the upgrade case).

`tests/adoption/upgrade_user.py` is that script: ``import tf_ecrec.ops`` in every process,
``ECOptimizer``, ``ECDeviceFn``, ``ec_model_fn``, ``tf.estimator.train_and_evaluate`` under its own
TF_CONFIG launcher (`harness.process_cluster`: one process per task, as pods).  A PS of that script
that only imports ``tf_ecrec`` serves the kernels; a PS that never imported it is named on the chief
by a typed error before anything trains, and the worker does not wait for the dead chief forever.
"""

from __future__ import annotations

import os
import re
import sys
import time

import pytest
from harness.process_cluster import ProcessCluster

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "adoption", "upgrade_user.py")
JOBS = {"chief": 1, "worker": 1, "ps": 3}


def _cluster(tmp_path, steps: int, bare_ps: int | None, env: dict[str, str] | None = None) -> ProcessCluster:
    def env_of(task_type: str, index: int) -> dict[str, str]:
        return {"UPGRADE_PS": "bare" if (task_type, index) == ("ps", bare_ps) else "import"}

    return ProcessCluster([sys.executable, SCRIPT, str(tmp_path / "model"), str(steps)], JOBS, str(tmp_path / "logs"),
                          env=env, env_of=env_of)


@pytest.mark.timeout(600)
def test_a_ps_without_the_kernels_is_named_on_the_chief_and_the_worker_does_not_hang(tmp_path) -> None:
    cluster = _cluster(tmp_path, steps=40, bare_ps=1)
    try:
        started = time.monotonic()
        cluster.start_all()
        codes = cluster.wait(["chief:0"], timeout=300)
        chief_secs = time.monotonic() - started
        log = cluster.log("chief:0")
        assert codes["chief:0"] != 0, log[-3000:]
        assert "ps serving without tf_ecrec" in cluster.log("ps:1")
        # Typed, naming the PS and what to do, in place of TensorFlow's "Op type not registered ... in binary
        # running on <host>" (which names a host every local task shares).
        match = re.search(r"tf_ecrec\.errors\.PSKernelsMissing: (.*)", log)
        assert match, log[-4000:]
        assert "/job:ps/task:1 " in match.group(1) and "/job:ps/task:0" not in match.group(1), match.group(1)
        assert "/job:ps/task:2" not in match.group(1) and "import tf_ecrec" in match.group(1), match.group(1)
        assert not re.search(r"step = \d+", log), "a step trained before the check"
        # The worker's ready wait ends with the PS's error as soon as it asks it (it does not wait on the chief).
        codes = cluster.wait(["worker:0"], timeout=120)
        assert codes["worker:0"] != 0
        assert "not registered" in cluster.log("worker:0")
        print(f"chief failed {chief_secs:.1f} s after the start; worker {time.monotonic() - started:.1f} s")
    finally:
        cluster.stop()


@pytest.mark.timeout(600)
def test_a_worker_whose_session_reaches_a_dead_chief_fails_within_its_deadline_and_the_job_then_trains(tmp_path) -> None:
    """Two claims on one set of PS processes (launched jobs are most of the test command's CPU): a worker
    whose session reaches a chief that is not running fails within its deadline; then, with the chief
    started and the worker started again as the README's script has them, the job trains to its end on
    PS tasks that only imported tf_ecrec (they serve the kernels)."""
    # The user's own session config (no device filters): the worker's session reaches the chief, which is
    # not running (it died before the worker started).  TensorFlow's CreateSession would wait for ever.
    cluster = _cluster(tmp_path, steps=40, bare_ps=None,
                       env={"UPGRADE_SESSION_CONFIG": "plain", "UPGRADE_TASK_WAIT_SECS": "15"})
    try:
        for task in ("ps:0", "ps:1", "ps:2", "worker:0"):
            cluster.start(task)
        codes = cluster.wait(["worker:0"], timeout=240)
        log = cluster.log("worker:0")
        assert codes["worker:0"] != 0, log[-3000:]
        match = re.search(r"tf_ecrec\.errors\.RecoveryError: (.*)", log)
        assert match, log[-4000:]
        assert match.group(1).startswith("worker:0: chief:0 at ") and "within 15 s" in match.group(1), match.group(1)

        # The README's script as it is (its own session config and waits), on the same PS processes.
        for knob in ("UPGRADE_SESSION_CONFIG", "UPGRADE_TASK_WAIT_SECS"):
            del cluster.env[knob]
        cluster.start("chief:0")
        cluster.start("worker:0")
        codes = cluster.wait(["chief:0", "worker:0"], timeout=400)
        assert codes == {"chief:0": 0, "worker:0": 0}, (codes, cluster.log("chief:0")[-3000:])
        assert "trained to step 40" in cluster.log("chief:0")
        for p in range(3):
            assert "ps serving with tf_ecrec imported" in cluster.log(f"ps:{p}")
    finally:
        cluster.stop()
