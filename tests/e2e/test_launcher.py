"""End to end: ``tf-ecrec run`` launches real PS/chief/worker processes and kills them with SIGKILL."""

import datetime
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from harness import zygote
from harness.cli_run import cli
from harness.ports import free_port_block, free_ports
from harness.procs import descendants, running, task_name

SMALL = ["--table-rows", "2000", "--embedding-dim", "8", "--quiet"]


def _report(model_dir):
    with open(os.path.join(model_dir, "report.json"), encoding="utf-8") as fh:
        return json.load(fh)


def test_malformed_kill_and_bad_combinations_fail_before_anything_starts(tmp_path):
    result = cli("run", "--model-dir", str(tmp_path / "a"), "--kill", "ps:1@1200")
    assert result.returncode == 2
    assert "--kill 'ps:1@1200' is malformed" in result.stderr
    result = cli("run", "--model-dir", str(tmp_path / "b"), "--ps", "2", "--kill", "ps:2@step=10")
    assert result.returncode == 2 and "ps:2 does not exist" in result.stderr
    assert not glob.glob(str(tmp_path / "*" / "logs" / "*.log"))


def test_a_port_in_use_is_named_before_any_task_starts(tmp_path):
    base = free_port_block(3)  # the job needs 3 ports (PS, chief, master); the middle one is taken
    port = base + 1
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", port))
    blocker.listen()
    try:
        result = cli("run", "--model-dir", str(tmp_path), "--ps", "1", "--workers", "1", "--base-port", str(port - 1))
    finally:
        blocker.close()
    assert result.returncode == 1
    assert f"port 127.0.0.1:{port} is in use" in result.stderr
    assert not glob.glob(str(tmp_path / "logs" / "*.log"))


def test_checkpoint_mode_survives_a_ps_kill_and_reports_the_rollback(tmp_path):
    # On the tables ecrec protects (--storage collection), unprotected: the like-for-like baseline.
    model_dir = str(tmp_path / "ckpt")
    result = cli(
        # One trainer: a stock worker polls for the restored model every 30 s (the test command's budget).
        "run", "--model-dir", model_dir, "--ps", "3", "--workers", "1", "--steps", "600",
        "--fault-tolerance", "checkpoint", "--checkpoint-steps", "150", "--kill", "ps:1@step=380",
        "--restart-delay", "1", "--storage", "collection", *SMALL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with open(os.path.join(model_dir, "variables.json"), encoding="utf-8") as fh:
        names = json.dumps(json.load(fh))
    assert all(f"ec/dlrm/ps{p}/data" in names for p in range(3)) and "parity" not in names
    report = _report(model_dir)
    assert report["global_step"] >= 600
    (rec,) = report["recovery"]
    assert rec["task"] == "ps:1" and rec["killed_at_step"] >= 380
    # The chief restored every variable from the newest checkpoint before the kill.
    with open(os.path.join(model_dir, "logs", "chief-0.log"), encoding="utf-8") as fh:
        restored = [int(s) for s in re.findall(r"Restoring parameters from .*model\.ckpt-(\d+)", fh.read())]
    assert restored, "the chief never restored a checkpoint"
    # Another worker may complete a step before the chief reads the restored step.
    assert restored[-1] <= rec["resumed_from_step"] <= restored[-1] + 1
    assert 0 < rec["steps_rolled_back"] == rec["reached_step"] - rec["resumed_from_step"]
    assert 0 < rec["seconds_to_resume"] <= rec["seconds_to_regain"]
    kinds = [e["kind"] for e in report["events"] if e["task"] == "ps:1"]
    assert kinds[:3] == ["start", "kill", "restart"] and "resumed" in kinds and "regained" in kinds
    assert re.fullmatch(r"[0-9a-f]{64}", report["variables_sha256"])
    assert report["samples_per_sec"] > 0 and report["data"]["records_trained"] >= 600 * 256
    # CPU per 1,000 samples over the steady window, from every task's /proc readings (the PS restart's too).
    cpu = report["cpu"]
    assert cpu["window_seconds"] > 0 and cpu["cpu_seconds_per_1000_samples"] > 0, cpu
    assert set(cpu["cpu_seconds_by_role"]) == {"ps", "chief"}, cpu  # one trainer: the chief
    assert cpu["cpu_seconds_per_1000_samples"] == pytest.approx(
        sum(cpu["cpu_seconds_per_1000_samples_by_role"].values()), abs=1e-3), cpu
    # tests/conftest.py's cli runs jobs with --no-plot: the report alone, no PNG (test_adoption checks the plot).
    assert report["plot"] is None and not os.path.exists(os.path.join(model_dir, "report.png")), report["plot"]
    assert "rolled back" in result.stderr and "report:" in result.stderr


def test_deterministic_runs_end_with_the_same_variable_bytes(tmp_path):
    def run(name, seed, *args):
        model_dir = str(tmp_path / name)
        result = cli(
            "run", "--model-dir", model_dir, "--ps", "2", "--workers", "1", "--steps", "150",
            "--deterministic", "--seed", str(seed), *SMALL, *args,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return _report(model_dir)

    first = run("a", 0, "--fault-tolerance", "none")
    # The same job under --fault-tolerance flash (tf_ecrec.flash.stock), both PS killed at step 80 and every
    # variable restored from the snapshot of step 50 in shared memory: the steps after it replay on the same
    # batches, so an exact restore (every variable as snapshotted, all at one step) ends with the same bytes.
    second = run("b", 0, "--fault-tolerance", "flash", "--flash-checkpoint-steps", "50",
                 "--kill", "ps:0@step=80", "--kill", "ps:1@step=80", "--restart-delay", "1")
    assert [r["method"] for r in second["recovery"]] == ["memory", "memory"], second["recovery"]
    assert all(0 < r["steps_rolled_back"] <= 50 for r in second["recovery"]), second["recovery"]
    # The digest sees every byte (a changed value changes it): tests/unit/test_verify_bounded.py.
    assert first["variables_sha256"] == second["variables_sha256"]


def test_criteo_data_corrupt_lines_are_counted_or_fail_the_run(tmp_path, criteo_corrupt_sample):
    # 400 lines, one shard of 8 batches of 50 = exactly one epoch in 8 steps.
    args = ["--data", f"criteo:{criteo_corrupt_sample}", "--ps", "1", "--workers", "1", "--steps", "8",
            "--batch-size", "50", "--fault-tolerance", "none", *SMALL]
    ok = cli("run", "--model-dir", str(tmp_path / "skip"), *args)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert _report(str(tmp_path / "skip"))["data"]["corrupt_records"] == 8
    failed = cli("run", "--model-dir", str(tmp_path / "fail"), *args, "--on-corrupt", "fail")
    assert failed.returncode == 1
    assert re.search(r"DataError: corrupt record at .*criteo_corrupt_sample.tsv:50:", failed.stderr), failed.stderr[-3000:]


def test_ctrl_c_stops_every_task(tmp_path):
    model_dir = str(tmp_path / "int")
    args = ["tf_ecrec.cli", "run", "--model-dir", model_dir, "--ps", "2", "--workers", "2", "--steps", "100000", *SMALL]
    # Ctrl-C as a terminal gives it, whatever this test runner inherited (a background job ignores SIGINT).
    launcher = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                f"sys.argv = {args!r}; runpy.run_module('tf_ecrec.cli', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:  # the PS and the chief up
            names = {task_name(pid) for pid in descendants(proc.pid)}
            if {"ps:0", "ps:1", "chief:0"} <= names:
                break
            time.sleep(0.5)
        tasks = descendants(proc.pid)
        assert {"ps:0", "ps:1", "chief:0"} <= {task_name(pid) for pid in tasks}, tasks
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "every task was stopped" in err
    assert [pid for pid in tasks if running(pid)] == []


def test_the_example_runs_as_a_plain_estimator_script_under_tf_config(tmp_path):
    ports = free_ports(2)
    cluster = {"ps": [f"127.0.0.1:{ports[0]}"], "chief": [f"127.0.0.1:{ports[1]}"]}
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "estimator_examples", "dlrm.py")
    model_dir = str(tmp_path / "plain")
    procs = {}
    for task in ("ps", "chief"):  # forked from the session's server: the script's own imports are done
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
               "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task, "index": 0}})}
        with open(tmp_path / f"{task}.log", "wb") as log:
            procs[task] = zygote.popen(
                [sys.executable, script, "--steps", "30", "--model-dir", model_dir, "--checkpoint-steps", "30"],
                env=env, stdout=log, stderr=subprocess.STDOUT, name=task)
    try:
        code = procs["chief"].wait(timeout=300)
        out = (tmp_path / "chief.log").read_text(encoding="utf-8", errors="replace")
        assert code == 0, out[-3000:]
        assert "Loss for final step" in out
        assert os.path.exists(os.path.join(model_dir, "model.ckpt-30.index"))
    finally:
        procs["ps"].kill()
        procs["ps"].wait()


def test_a_ps_that_never_comes_back_is_named_by_every_trainer_which_gives_up_after_its_wait(tmp_path):
    """Issue 33: no spare and no restart (--restart-delay inf): each trainer says which PS is gone and for how
    long it waits, keeps its log quiet meanwhile, and fails after --ps-wait with a RecoveryError naming it."""
    model_dir = str(tmp_path / "gone")
    result = cli("run", "--model-dir", model_dir, "--fault-tolerance", "ecrec", "--ec", "2+1", "--ps", "3",
                 "--workers", "2", "--steps", "100000", "--kill", "ps:1@step=100", "--restart-delay", "inf",
                 "--ps-wait", "10", *SMALL)
    assert result.returncode != 0, result.stderr[-3000:]
    assert "RecoveryError" in result.stderr and "ps:1 gone for" in result.stderr, result.stderr[-3000:]
    for trainer in ("chief-0", "worker-0"):  # evidence from each trainer's own log
        with open(os.path.join(model_dir, "logs", f"{trainer}.log"), encoding="utf-8") as fh:
            log = fh.read()
        waited = re.search(r"ps:1 gone for ([\d.]+) s with no step completed in the last ([\d.]+) s \(the bound: 10 s\)",
                           log)
        assert waited and float(waited.group(2)) >= 10, (trainer, log[-3000:])
        assert "ps:1 gone (the cluster source lists it as not alive); waiting up to 10 s" in log, trainer
        # MonitoredSession's re-creations (tens a second) are logged once per 30 s: over the span from the first
        # one logged to the trainer's last line, at most one more per 30 s.  Read from this log's own formatted
        # records (each also appears once more, unformatted, through TensorFlow's stderr handler).
        retries = [_log_time(m) for m in re.findall(
            r"^(\S+ \S+) INFO tensorflow: An error was raised while a session was being created", log, re.M)]
        span = _log_time(re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ", log, re.M)[-1]) - retries[0]
        assert len(retries) <= 1 + span / 30, (trainer, len(retries), span)


def _log_time(stamp: str) -> float:
    """Seconds since the epoch of a log record's ``YYYY-MM-DD HH:MM:SS,mmm`` stamp (the task's logging format)."""
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
