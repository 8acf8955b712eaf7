"""End to end: every task exit is classified in the report; an out-of-memory PS comes back with a larger
memory limit (and is rebuilt from parity); a hung worker is killed and replaced."""

import json
import os

from conftest import cli


def test_an_oom_ps_gets_a_larger_limit_and_a_hung_worker_is_replaced(tmp_path):
    result = cli("run", "--model-dir", str(tmp_path), "--fault-tolerance", "ecrec", "--ec", "2+1", "--ps", "3",
                 "--workers", "2", "--steps", "700", "--table-rows", "2000", "--embedding-dim", "8", "--quiet",
                 "--ps-memory-mb", "900", "--inject", "oom:ps:1@step=150",
                 "--hang-secs", "4", "--inject", "hang:worker:0@step=350", "--restart-delay", "1")
    assert result.returncode == 0, result.stderr[-4000:]
    with open(os.path.join(tmp_path, "report.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    exits = report["exits"]
    oom = [e for e in exits if e["task"] == "ps:1" and e["kind"] == "oom"]
    assert len(oom) == 1, exits
    assert oom[0]["signal"] == "SIGKILL" and "900 MB limit" in oom[0]["detail"]
    assert oom[0]["action"] == "restarted with a 1350 MB memory limit (was 900 MB)"
    hang = [e for e in exits if e["task"] == "worker:0" and e["kind"] == "hang"]
    assert len(hang) == 1 and hang[0]["action"] == "restarted", exits
    assert "out of memory" in result.stderr and "made no progress" in result.stderr
    # the PS killed by the kernel was rebuilt from parity like any lost PS
    ps = [r for r in report["recovery"] if r["task"] == "ps:1"]
    assert ps and ps[0]["method"] == "parity" and ps[0]["steps_rolled_back"] == 0, report["recovery"]
    parity = report["parity"]
    assert parity["mismatches"] == 0 and parity["replica_mismatches"] == 0
    assert report["global_step"] >= 700
    # the tasks stopped at the end are in the list too, as normal exits
    assert {e["kind"] for e in exits} >= {"oom", "hang", "exited"}
