"""End to end: trainers added and taken back by the throughput policy while the job trains, every record
trained once the job ends (tf_ecrec.master.autoscale, tf_ecrec.launcher.autoscaling)."""

import json
import os

from harness.cli_run import cli
from harness.records import assert_every_record_in_model


def test_the_job_scales_its_trainers_within_bounds_and_loses_no_record(tmp_path):
    result = cli("run", "--model-dir", str(tmp_path), "--fault-tolerance", "ecrec", "--ec", "2+1", "--ps", "3",
                 "--workers", "1", "--min-workers", "1", "--max-workers", "3", "--autoscale-window", "5",
                 "--steps", "1500", "--table-rows", "2000", "--embedding-dim", "8", "--quiet")
    assert result.returncode == 0, result.stderr[-4000:]
    with open(os.path.join(tmp_path, "report.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    scaling = report["scaling"]
    assert scaling and scaling[0]["delta"] == 1 and scaling[0]["workers"] == 1, scaling
    assert float(scaling[0]["rates"]["1"]) > 0  # the chief alone was measured before the first addition
    for d in scaling:  # within the bounds, and every decision carries the rates it was made on
        assert 1 <= d["workers"] + d["delta"] <= 3 and d["reason"], d
    added = [e for e in report["events"] if e["kind"] == "add"]
    assert added and added[0]["task"] == "worker:0"
    assert "autoscaling at global step" in result.stderr
    assert_every_record_in_model(report)
    parity = report["parity"]
    assert parity["mismatches"] == 0 and parity["replica_mismatches"] == 0
