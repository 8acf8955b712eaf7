"""End to end under ``--strategy pss``: the launcher's processes, Keras fit of keras_dlrm, a PS SIGKILLed
mid-training and rebuilt from parity by the coordinator, the report's parity check and recovery entry."""

import json
import os

import pytest
from harness.cli_run import cli

PSS = ["--model", "keras_dlrm", "--strategy", "pss", "--fault-tolerance", "ecrec", "--table-rows", "2000",
       "--embedding-dim", "8", "--batch-size", "128", "--quiet"]


def test_a_ps_killed_during_keras_fit_is_rebuilt_from_parity(tmp_path):
    result = cli("run", "--model-dir", str(tmp_path), *PSS, "--ps", "3", "--workers", "3", "--steps", "240",
                 "--kill", "ps:1@step=100", "--restart-delay", "1")
    assert result.returncode == 0, result.stderr[-4000:]
    with open(os.path.join(tmp_path, "report.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    assert report["global_step"] == 240
    (rec,) = report["recovery"]
    assert rec["task"] == "ps:1" and rec["method"] == "parity" and rec["steps_rolled_back"] == 0, rec
    assert rec["bytes_rebuilt"] > 0 and rec["resumed_from_step"] >= rec["killed_at_step"] - rec["steps_undone"], rec
    parity = report["parity"]
    assert parity["stripes_checked"] == 3 and parity["rows_checked"] > 0 and parity["replicas_checked"] > 0
    assert parity["mismatches"] == 0 and parity["replica_mismatches"] == 0, parity["mismatched"]
    assert len(report["variables_sha256"]) == 64
    with open(os.path.join(tmp_path, "recovery.jsonl"), encoding="utf-8") as fh:
        (entry,) = [json.loads(line) for line in fh]
    assert entry["method"] == "parity" and entry["lost_ps"] == [1] and entry["steps_rolled_back"] == 0
    assert "recovered lost PS [1] by parity" in result.stderr
    # The coordinator's recovery rebuilt the tables while fit trained on (tf_ecrec.pss.rebuild).
    assert rec["rebuilt_in_background"] is True, rec
    assert "rebuilds lost PS [1] while training goes on" in result.stderr


@pytest.mark.parametrize("flags, rule", [
    (["--fault-tolerance", "checkpoint"], "--strategy pss trains with --fault-tolerance ecrec"),
    (["--restart-at", "new-port"], "keeps its address"),
    (["--model", "dlrm"], "has no callable keras_model"),
])
def test_pss_refuses_what_it_does_not_support(tmp_path, flags, rule):
    result = cli("run", "--model-dir", str(tmp_path), *PSS, *flags)
    assert result.returncode != 0 and rule in result.stderr, result.stderr[-2000:]


def test_a_coordinator_killed_after_a_ps_recovery_resumes_from_its_backup(tmp_path):
    """Keras' BackupAndRestore in the launcher's job: a backup at each epoch's end (200 steps), taken after a PS
    was rebuilt (the backup writes every tracked variable, the optimizer's learning-rate variable on the rebuilt
    PS among them); the chief killed at step 240 restarts from the backup of step 200, not from step 0.  The
    epoch after the kill is long (the launcher sees a step up to a second after it is trained, and the steps
    of this small model take milliseconds): the kill lands before the job ends."""
    result = cli("run", "--model-dir", str(tmp_path), *PSS, "--ps", "3", "--workers", "2", "--steps", "600",
                 "--kill", "ps:1@step=60", "--kill", "chief:0@step=240", "--restart-delay", "1")
    assert result.returncode == 0, result.stderr[-4000:]
    with open(os.path.join(tmp_path, "report.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    assert report["global_step"] == 600
    ps, chief = report["recovery"]
    assert ps["task"] == "ps:1" and ps["method"] == "parity" and ps["steps_rolled_back"] == 0, ps
    assert chief["task"] == "chief:0" and chief["method"] == "backup" and chief["resumed_from_step"] == 200, chief
    assert 0 < chief["steps_rolled_back"] <= chief["reached_step"] - 200, chief
    with open(os.path.join(tmp_path, "recovery.jsonl"), encoding="utf-8") as fh:
        entries = [json.loads(line) for line in fh]
    assert [e["method"] for e in entries] == ["parity", "backup"] and entries[1]["global_step"] == 200, entries
    parity = report["parity"]
    assert parity["rows_checked"] > 0 and parity["mismatches"] == 0 and parity["replica_mismatches"] == 0, parity
    assert os.listdir(os.path.join(tmp_path, "backup")) == [], "BackupAndRestore deletes its backup when fit ends"


def test_two_ps_lost_beyond_the_code_are_restored_from_the_flash_snapshot(tmp_path):
    """``--flash-checkpoint-steps`` under ``--strategy pss``: ps:0 and ps:1 of a 2+1 code SIGKILLed at once (two
    chunks of every stripe lost): the coordinator restores every PS from the newest flash snapshot complete in
    memory (`tf_ecrec.pss.flash`), the steps since it are trained again, and the job ends with exact parity."""
    result = cli("run", "--model-dir", str(tmp_path), *PSS, "--ps", "3", "--workers", "2", "--steps", "400",
                 "--flash-checkpoint-steps", "50", "--kill", "ps:0@step=200", "--kill", "ps:1@step=200",
                 "--restart-delay", "1")
    assert result.returncode == 0, result.stderr[-4000:]
    with open(os.path.join(tmp_path, "report.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    with open(os.path.join(tmp_path, "flash_stats.json"), encoding="utf-8") as fh:
        captured = json.load(fh)["captured"]  # a write cut after its own tier is restorable: every capture
    assert report["global_step"] == 400
    for rec in report["recovery"]:
        assert rec["method"] == "memory" and rec["resumed_from_step"] in captured, (rec, captured)
        assert 0 < rec["resumed_from_step"] <= rec["killed_at_step"], rec
    with open(os.path.join(tmp_path, "recovery.jsonl"), encoding="utf-8") as fh:
        (entry,) = [json.loads(line) for line in fh]
    assert entry["method"] == "memory" and entry["lost_ps"] == [0, 1] and entry["bytes_rebuilt"] > 0, entry
    assert entry["steps_rolled_back"] == entry["step_before"] - entry["global_step"] > 0, entry
    parity = report["parity"]
    assert parity["rows_checked"] > 0 and parity["mismatches"] == 0 and parity["replica_mismatches"] == 0, parity
