"""End to end, one job for three things (each launched job costs the test command a minute):

- ``--data stream:DIR`` trained while a producer appends Criteo files, every record trained once
  (tf_ecrec.data.stream, tf_ecrec.launcher.stream_feed);
- every task exit classified in the report: an injected OOM in a PS at its memory cgroup limit comes
  back with a larger limit and is rebuilt from parity; an injected hang in a worker is killed and
  replaced (tf_ecrec.launcher.job.diagnosis, exits, memory_limit);
- nothing skipped or repeated beyond the records in flight across those failures.
"""

import json
import os
import subprocess
import sys
import time

from harness.cli_run import cli
from harness.records import assert_every_record_in_model


def _assert_every_record_trained_once(report: dict, total: int) -> None:
    """The stream's accounting: all `total` records trained into the model (no gap), none failed, and none
    trained again beyond what was in flight at the failures."""
    data = assert_every_record_in_model(report)
    assert data["records_total"] == total, data
    assert data["records_retrained"] <= data["records_in_flight_at_failures"], data


def test_a_stream_trains_as_it_arrives_through_an_oom_ps_and_a_hung_worker_with_every_record_once(tmp_path):
    stream = tmp_path / "stream"
    stream.mkdir()
    started = time.time()
    producer = subprocess.Popen([sys.executable, "-m", "tf_ecrec.data.stream", str(stream), "--files", "8",
                                 "--records", "15000", "--interval", "4"])
    try:
        before_cli = time.time()
        result = cli("run", "--model-dir", str(tmp_path / "m"), "--data", f"stream:{stream}", "--fault-tolerance",
                     "ecrec", "--ec", "2+1", "--ps", "3", "--workers", "2", "--table-rows", "2000",
                     "--embedding-dim", "8", "--quiet", "--restart-delay", "1",
                     "--ps-memory-mb", "900", "--inject", "oom:ps:1@step=150",
                     "--hang-secs", "4", "--inject", "hang:worker:0@step=300")
    finally:
        assert producer.wait(timeout=120) == 0
    assert result.returncode == 0, result.stderr[-4000:]
    with open(os.path.join(tmp_path / "m", "report.json"), encoding="utf-8") as fh:
        report = json.load(fh)

    # the stream: no gap (every record in the model), nothing repeated beyond what was in flight at the failures
    _assert_every_record_trained_once(report, 120_000)
    # trained as it arrived: training began before the producer wrote its last file
    first_trained = next(t for t, rate in report["throughput"] if rate > 0)
    last_file = max(os.path.getmtime(stream / n) for n in os.listdir(stream) if n.endswith(".tsv"))
    launched = before_cli + 5.0  # the report counts from the launch: at most the launcher's start-up after this
    assert launched + first_trained < last_file, (first_trained, last_file - started)

    # the failures, diagnosed and acted on
    exits = report["exits"]
    oom = [e for e in exits if e["task"] == "ps:1" and e["kind"] == "oom"]
    assert len(oom) == 1, exits
    assert oom[0]["signal"] == "SIGKILL" and "900 MB limit" in oom[0]["detail"]
    assert oom[0]["action"] == "restarted with a 1350 MB memory limit (was 900 MB)"
    hang = [e for e in exits if e["task"] == "worker:0" and e["kind"] == "hang"]
    assert len(hang) == 1 and hang[0]["action"] == "restarted", exits
    assert [e for e in exits if e["kind"] == "hang"] == hang, exits  # not the chief while it rebuilt ps:1
    # Frozen while it held a lease, the launcher's progress clock names it; frozen while it waited for the stream's
    # next file (no lease: exempt from that clock), the master's membership does (a run of 2026-11-30 froze it there).
    assert "out of memory" in result.stderr
    assert ("made no progress" in result.stderr) != ("silent to the job master" in hang[0]["detail"]), hang
    assert {e["kind"] for e in exits} >= {"oom", "hang", "exited"}
    (rec,) = [r for r in report["recovery"] if r["task"] == "ps:1"]  # the OOM-killed PS, rebuilt from parity
    assert rec["method"] == "parity" and rec["steps_rolled_back"] == 0, rec
    parity = report["parity"]
    assert parity["mismatches"] == 0 and parity["replica_mismatches"] == 0


def test_a_redis_stream_partition_trains_as_it_arrives_through_a_killed_ps_with_every_record_once(tmp_path):
    """``--data stream:redis://...``: a producer appends batches of Criteo records to a Redis Streams partition
    (tf_ecrec.data.redis_stream) while the job trains; a PS is killed and rebuilt from parity on the way."""
    from harness.redis_server import redis_server

    with redis_server(str(tmp_path)) as url:
        target = f"{url}/clicks/p0"
        producer = subprocess.Popen([sys.executable, "-m", "tf_ecrec.data.redis_stream", target, "--batches", "6",
                                     "--records", "10000", "--interval", "4"])
        try:
            before_cli = time.time()
            result = cli("run", "--model-dir", str(tmp_path / "m"), "--data", f"stream:{target}", "--fault-tolerance",
                         "ecrec", "--ec", "2+1", "--ps", "3", "--workers", "2", "--table-rows", "2000",
                         "--embedding-dim", "8", "--quiet", "--restart-delay", "1", "--kill", "ps:1@step=100")
        finally:
            assert producer.wait(timeout=120) == 0
            producer_done = time.time()
        assert result.returncode == 0, result.stderr[-4000:]
    with open(os.path.join(tmp_path / "m", "report.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    data = report["data"]
    _assert_every_record_trained_once(report, 60_000)
    assert data["corrupt_records"] == 0, data
    first_trained = next(t for t, rate in report["throughput"] if rate > 0)
    assert before_cli + 5.0 + first_trained < producer_done, (first_trained, producer_done - before_cli)
    (rec,) = report["recovery"]
    assert rec["task"] == "ps:1" and rec["method"] == "parity" and rec["steps_rolled_back"] == 0, rec
    assert report["parity"]["mismatches"] == 0 and report["parity"]["replica_mismatches"] == 0
