"""A step cut at each failpoint, by SIGKILL of the process there, is survived exactly.

Each test runs a deterministic single-worker ``ecrec`` job with
``TF_ECREC_FAILPOINT=<point>@<task>@step=N`` set for every process: the named
process kills itself at that point of the first step starting at global step
N or later; the launcher restarts it (as it restarts any task that dies from
a signal, like a pod restart).  The chief settles the cut step (undoes it:
one worker, nothing overtook it), rebuilds what was lost, and the job ends
with the same bytes in every variable as the same job with no failure, and
exact parity.
"""

import json
import os

import pytest
from conftest import cli

ARGS = ["--fault-tolerance", "ecrec", "--ec", "2+1", "--ps", "3", "--workers", "1", "--steps", "160",
        "--deterministic", "--table-rows", "2000", "--embedding-dim", "8", "--quiet", "--restart-delay", "1"]


def _run(model_dir, failpoint=None):
    env = {"TF_ECREC_FAILPOINT_DIR": str(model_dir)}
    if failpoint:
        env["TF_ECREC_FAILPOINT"] = failpoint
    os.makedirs(model_dir, exist_ok=True)
    result = cli("run", "--model-dir", str(model_dir), *ARGS, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    with open(os.path.join(model_dir, "report.json"), encoding="utf-8") as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("ref"))["variables_sha256"]


@pytest.mark.parametrize(
    "failpoint",
    [
        "ps_after_apply@ps:1@step=60",  # a data PS dies with its update applied, before any fold
        "worker_after_apply@chief:0@step=60",  # the worker dies between data and parity
        "parity_ps_after_fold@ps:2@step=60",  # a parity PS dies after folding
        "ps_after_count@ps:1@step=60",  # a data PS dies with the step counted, before the commit
        "worker_before_commit@chief:0@step=60",  # the worker dies after every update, before the commit
    ],
)
def test_a_process_killed_at_a_failpoint_leaves_the_same_bytes_as_no_failure(tmp_path, reference, failpoint):
    report = _run(tmp_path, failpoint)
    point = failpoint.split("@")[0]
    assert os.path.exists(tmp_path / f"tf_ecrec_failpoint_{point}_{failpoint.split('@')[1].replace(':', '_')}")
    crashes = [e for e in report["events"] if e["kind"] in ("crash", "kill")]
    assert crashes, "the failpoint did not fire"
    assert report["variables_sha256"] == reference
    parity = report["parity"]
    assert parity["mismatches"] == 0 and parity["replica_mismatches"] == 0, parity["mismatched"]
