"""Steps cut at each failpoint, by SIGKILL of the process there, are survived exactly.

Each test runs a deterministic single-worker ``ecrec`` job with
``TF_ECREC_FAILPOINT`` set for every process to a sequence of
``<point>@<task>@step=N`` entries: each named process kills itself at that
point of the first step starting at global step N or later; the launcher
restarts it (as it restarts any task that dies from a signal, like a pod
restart).  The chief settles each cut step (undoes it: one worker, nothing
overtook it), rebuilds what was lost, and the job ends with the same bytes in
every variable as the same job with no failure, and exact parity.  Every
point is cut once; two jobs (PS side, worker side) rather than one per point
keep the test command's launches down.  Two PS moved to new ports by SIGKILL
share the same no-failure run.  The code is 3+1 on 4 PS (every PS holds data
of some stripes and the parity of others; 2+1 and 2+2 are the other modules'
codes), and the last PS is among those cut and moved.
"""

import json
import os

import pytest
from harness.cli_run import cli
from harness.parity_kills import assert_rebuilt_by_parity_to_the_same_bytes

ARGS = ["--fault-tolerance", "ecrec", "--ec", "3+1", "--ps", "4", "--workers", "1", "--steps", "160",
        "--deterministic", "--table-rows", "2000", "--embedding-dim", "8", "--quiet", "--restart-delay", "1"]


def _run(model_dir, failpoints=None, commit=None):
    env = {"TF_ECREC_FAILPOINT_DIR": str(model_dir)}
    if commit:
        env["TF_ECREC_COMMIT"] = commit
    if failpoints:
        env["TF_ECREC_FAILPOINT"] = failpoints
    os.makedirs(model_dir, exist_ok=True)
    result = cli("run", "--model-dir", str(model_dir), *ARGS, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    with open(os.path.join(model_dir, "report.json"), encoding="utf-8") as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    # The points are the phases of a step with its folds and commit in its run (TF2 steps; Estimator
    # jobs with TF_ECREC_COMMIT=in_step): the reference runs so too.  One worker makes the bytes the same
    # in every commit mode, so the moved-PS job (the default, folds batched over steps) is held to it too.
    return _run(tmp_path_factory.mktemp("ref"), commit="in_step")["variables_sha256"]


@pytest.mark.parametrize(
    "failpoints",
    [
        # Cuts on the PS side, in sequence: a data PS dies with its update applied, before any fold; a
        # parity PS dies after folding; the first data PS again, with the step counted, before the commit.
        "ps_after_apply@ps:1@step=40,parity_ps_after_fold@ps:3@step=85,ps_after_count@ps:1@step=125",
        # Cuts on the worker: between data and parity, then after every update, before the commit.
        "worker_after_apply@chief:0@step=45,worker_before_commit@chief:0@step=110",
    ],
    ids=["ps-side", "worker-side"],
)
def test_processes_killed_at_failpoints_leave_the_same_bytes_as_no_failure(tmp_path, reference, failpoints):
    report = _run(tmp_path, failpoints, commit="in_step")
    for entry in failpoints.split(","):
        point, task, _ = entry.split("@")
        assert os.path.exists(tmp_path / f"tf_ecrec_failpoint_{point}_{task.replace(':', '_')}"), f"{entry} did not fire"
    crashes = [e for e in report["events"] if e["kind"] in ("crash", "kill")]
    assert len(crashes) == len(failpoints.split(",")), report["events"]
    assert report["variables_sha256"] == reference
    parity = report["parity"]
    assert parity["mismatches"] == 0 and parity["replica_mismatches"] == 0, parity["mismatched"]


def test_two_ps_moved_to_new_ports_one_after_the_other_leave_the_same_bytes_as_no_failure(tmp_path, reference):
    """The global step's PS and, after its recovery, the last PS, each SIGKILLed and brought back at a new port
    (the trainers rebuild TF_CONFIG, RunConfig, Estimator and session for it: tf_ecrec.session.failover): rebuilt from
    parity, nothing rolled back, no checkpoint read, the no-failure run's bytes.  The second kill cannot meet the
    first recovery: the global step does not pass the first kill's step before the rebuilt PS is back."""
    model_dir = tmp_path / "moved"
    os.makedirs(model_dir)
    result = cli("run", "--model-dir", str(model_dir), *ARGS, "--kill", "ps:0@step=60", "--kill", "ps:3@step=110",
                 "--restart-at", "new-port")
    assert result.returncode == 0, result.stderr[-4000:]
    with open(os.path.join(model_dir, "report.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    assert_rebuilt_by_parity_to_the_same_bytes(report, result.stderr, reference, (0, 3), str(model_dir), moved=True)
    parity = report["parity"]
    assert parity["stripes_checked"] == 4 and parity["mismatches"] == 0 and parity["replica_mismatches"] == 0, parity
    # No checkpoint interval: the chief saved its model once, at the end of training, through both moves
    # (tf_ecrec.hooks.final_checkpoint; a session stopped to follow a move is not the end: its unit test).
    import tensorflow as tf

    state = tf.train.get_checkpoint_state(str(model_dir))
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [f"model.ckpt-{report['global_step']}"]
