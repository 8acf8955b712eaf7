"""End to end: ``--fault-tolerance flash``, flash checkpoints on their own (no erasure coding; tf_ecrec.flash.stock).

Stock partitioned tables and optimizers; every PS snapshots into shared memory every N steps with
strict rounds (every trainer parked); a lost PS brings every variable back to the newest snapshot.
Exactness (a deterministic run restored from memory ends with the bytes of a run never killed) is
asserted in tests/e2e/test_launcher.py, beside the determinism it relies on.
"""

import json
import os

from conftest import cli
from harness.records import assert_every_record_in_model

SMALL = ["--table-rows", "2000", "--embedding-dim", "8", "--quiet"]


def _run(model_dir, *args):
    result = cli("run", "--model-dir", str(model_dir), "--fault-tolerance", "flash", *SMALL, *args)
    assert result.returncode == 0, result.stderr[-4000:]
    with open(os.path.join(model_dir, "report.json"), encoding="utf-8") as fh:
        return json.load(fh), result.stderr


def test_two_lost_ps_come_back_from_memory_with_at_most_n_steps_rolled_back_and_every_record_trained(tmp_path):
    from tf_ecrec.flash.config import shm_root
    from tf_ecrec.launcher.spec import JobSpec

    report, err = _run(tmp_path, "--ps", "3", "--workers", "2", "--steps", "400", "--flash-checkpoint-steps", "100",
                       "--kill", "ps:0@step=250", "--kill", "ps:1@step=250", "--restart-delay", "1")
    assert report["config"]["fault_tolerance"] == "flash"
    assert [r["method"] for r in report["recovery"]] == ["memory", "memory"], report["recovery"]
    assert all(0 <= r["steps_rolled_back"] <= 100 for r in report["recovery"]), report["recovery"]
    assert "by memory" in err
    assert_every_record_in_model(report)  # the shard progress went back with the model: every record in it
    with open(tmp_path / "flash_stats.json", encoding="utf-8") as fh:
        stats = json.load(fh)
    assert stats["rounds"] - stats["skipped"] >= 2 and stats["snapshots"], stats  # strict rounds did keep copies
    assert not os.path.exists(shm_root(JobSpec(fault_tolerance="flash", model_dir=str(tmp_path)).flash, str(tmp_path)))

