"""End to end under ``--fault-tolerance ecrec``: real PS/chief/worker processes, SIGKILL, rebuild from parity."""

import json
import os
import re

import numpy as np
from harness.cli_run import cli
from harness.records import assert_every_record_in_model
from harness.serving import serve_without_tf_ecrec, sha256

from tf_ecrec.cluster.threads import ENV_TASKS_PER_HOST, ps_thread_pools
from tf_ecrec.launcher.job.model_dir import log_file

SMALL = ["--table-rows", "2000", "--embedding-dim", "8", "--quiet"]


def _run(model_dir, *args, env=None):
    result = cli("run", "--model-dir", str(model_dir), "--fault-tolerance", "ecrec", *SMALL, *args, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    with open(os.path.join(model_dir, "report.json"), encoding="utf-8") as fh:
        return json.load(fh), result.stderr


def _assert_parity_exact(report, stripes):
    parity = report["parity"]
    assert parity["stripes_checked"] == stripes and parity["rows_checked"] > 0
    assert parity["mismatches"] == 0 and parity["replica_mismatches"] == 0, parity["mismatched"]
    assert parity["replicas_checked"] > 0


def _assert_every_trainer_back(report, trainers=("chief:0", "worker:0"), overlapping=()):
    """Issue 33: after each failure every trainer (not only the job's global step) trained again, from its own
    step datagrams, with at most two sessions (its first one may predate the chief's recovery).  How soon is a
    target measured in benchmarks/ and reported (`seconds_to_first_step`), not a wall-clock bound here.  A
    failure in `overlapping` (task names) hit during an earlier one's recovery: its training time lost is
    counted in that one's figure (no rate of its own before it), so it has none."""
    batch = report["config"]["batch_size"]
    for rec in report["recovery"]:
        # The job's cost of the failure, in seconds of its own rate: at least the steps it took back.
        taken_back = (rec["steps_rolled_back"] or 0) + rec["steps_undone"]
        if rec["task"] in overlapping:
            assert rec["training_seconds_lost"] is None, rec
        else:
            assert rec["training_seconds_lost"] is not None and rec["samples_lost"] >= taken_back * batch, rec
        per = rec["trainers"]
        assert sorted(per) == sorted(trainers), per
        for task, cost in per.items():
            where = (rec["task"], rec["killed_at_step"], task, cost)
            assert cost["records_after"] > 0 and cost["seconds_to_first_step"] is not None, where
            assert 1 <= cost["sessions"] <= 2, where


def _assert_exported_model_serves(model_dir, report):
    """Issue 34 item 3: the job saved its model at its end (no checkpoint interval: the chief's final save),
    and that checkpoint is the live model the report digested (every variable but parity and replicas, bit for
    bit); ``tf-ecrec export`` makes of it a SavedModel whose variables are the checkpoint's data chunks and dense
    weights, bit for bit, with no parity, replica or optimizer slot; it serves in a process that cannot import
    tf_ecrec (stock ops only) and predicts what the Estimator predicts from the checkpoint."""
    import tensorflow as tf

    from tf_ecrec.check.live_cluster import read_manifest, variables_digest
    from tf_ecrec.check.verify import redundancy_names
    from tf_ecrec.launcher.export import job_estimator

    checkpoint = tf.train.latest_checkpoint(str(model_dir))
    assert checkpoint is not None, os.listdir(model_dir)
    saved = tf.train.load_checkpoint(checkpoint)
    manifest = read_manifest(os.path.join(model_dir, "variables.json"))
    live = [r["name"] for r in manifest["variables"] if r["name"] not in redundancy_names(manifest["ec"])]
    assert variables_digest({n: saved.get_tensor(n) for n in live}) == report["variables_sha256"]
    done = cli("export", "--model-dir", str(model_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    export_path = done.stdout.strip().splitlines()[-1]
    exported = tf.train.load_checkpoint(os.path.join(export_path, "variables", "variables"))
    names = set(exported.get_variable_to_shape_map())
    data = {n for c in manifest["ec"]["collections"] for n in c["data"].values()}
    assert data <= names and not [n for n in names if "parity" in n or "ec_replica" in n or "Adagrad" in n], names
    rng = np.random.default_rng(3)
    rows = report["config"]["table_rows"]
    cat = np.zeros([32, 26], np.int64)
    cat[:, :4] = rng.integers(0, rows, [32, 4])  # the 4 tables the job's model reads (harness.cli_run)
    inputs = {"dense": rng.random([32, 13], dtype=np.float32), "cat": cat}
    (got,) = serve_without_tf_ecrec([export_path], inputs, str(model_dir)).values()
    assert got["variables"] == {f"{n}:0": sha256(exported.get_tensor(n)) for n in names}
    assert {n: sha256(exported.get_tensor(n)) for n in names} == {n: sha256(saved.get_tensor(n)) for n in names}
    want = next(job_estimator(str(model_dir)).predict(
        lambda: tf.data.Dataset.from_tensors((inputs, None)), yield_single_examples=False))["probability"]
    np.testing.assert_allclose(np.asarray(got["outputs"]["probability"], np.float32), want, rtol=1e-6, atol=1e-7)


def test_more_lost_ps_than_the_code_covers_restore_from_the_flash_checkpoint_in_memory(tmp_path):
    from tf_ecrec.flash.config import Manifest, shm_root
    from tf_ecrec.launcher.job.spec import JobSpec

    report, err = _run(tmp_path, "--ec", "2+1", "--ps", "3", "--workers", "2", "--steps", "600",
                       "--flash-checkpoint-steps", "100", "--kill", "ps:0@step=250", "--kill", "ps:1@step=250",
                       "--restart-delay", "1")
    assert [r["method"] for r in report["recovery"]] == ["memory", "memory"], report["recovery"]
    assert all(0 <= r["steps_rolled_back"] <= 100 for r in report["recovery"]), report["recovery"]
    assert "by memory" in err
    _assert_parity_exact(report, stripes=3)  # the snapshot's parity, exact: it was taken with no step in flight
    data = assert_every_record_in_model(report)  # the shard progress went back with the model: every record in it
    assert data["records_retrained"] > 0, data
    job = JobSpec(fault_tolerance="ecrec", flash_checkpoint_steps=100, model_dir=str(tmp_path))
    assert not os.path.exists(shm_root(job.flash, str(tmp_path)))  # the job's shared memory is freed at its end
    for p in range(3):  # every PS persisted its newest copy when the launcher stopped it (SIGTERM)
        manifests = [Manifest.decode((tmp_path / "flash" / f"ps{p}" / f"slot{s}" / "MANIFEST").read_bytes())
                     for s in range(2) if (tmp_path / "flash" / f"ps{p}" / f"slot{s}" / "MANIFEST").exists()]
        assert any(m is not None and m.global_step >= 300 for m in manifests), (p, manifests)


def test_more_lost_ps_than_the_code_covers_falls_back_to_the_checkpoint(tmp_path):
    report, err = _run(tmp_path, "--ec", "2+1", "--ps", "3", "--workers", "1", "--steps", "400",
                       "--checkpoint-steps", "100", "--kill", "ps:0@step=250", "--kill", "ps:1@step=250",
                       "--restart-delay", "1")
    assert [r["method"] for r in report["recovery"]] == ["checkpoint", "checkpoint"]
    assert report["recovery"][0]["steps_rolled_back"] > 0
    assert "by checkpoint" in err
    _assert_parity_exact(report, stripes=3)  # re-encoded after the restore


def test_a_spare_ps_takes_a_killed_ps_role_at_once_and_every_trainer_follows_it(tmp_path):
    """--spare-ps: the killed PS's role goes to a running spare (no restart), its address replaces the lost one
    in the cluster file, trainers re-create their sessions for it in place, the chief rebuilds it from parity; a new spare
    starts behind it and takes the next loss.  A replacement never comes (--restart-delay inf: a pod that cannot be
    rescheduled): with a spare nothing waits for one, and every trainer trains again within seconds (issue 33).  The spare itself killed while it stands
    by (issue 33) is replaced at once (a spare holds no state: nothing to recover, no trainer affected), and the PS
    lost next takes the replacement.  The second PS lost is not killed but frozen (SIGSTOP: a live process with an
    open port that answers nothing, issue 33 item 3): the launcher kills it once it answered its probe nothing for
    --ps-hang-secs (4 s by default), and it is moved and rebuilt like a killed one.  One job for these claims:
    launched jobs are most of the test command's CPU."""
    report, err = _run(tmp_path, "--ec", "2+1", "--ps", "3", "--workers", "2", "--steps", "500", "--spare-ps", "1",
                       "--kill", "spare:0@step=100", "--kill", "ps:1@step=200", "--inject", "hang:ps:2@step=350",
                       "--restart-delay", "inf")
    events = report["events"]
    assert [(e["task"], e["code"]) for e in events if e["kind"] == "spare_lost"] == [("spare:0", -9)]
    assert "is gone (killed by --kill spare:0@step=100); a new spare replaces it" in err
    assert [r["task"] for r in report["recovery"]] == ["ps:1", "ps:2"]  # the spare's loss is no failure of the job
    assert [r["method"] for r in report["recovery"]] == ["parity", "parity"], report["recovery"]
    assert all(r["steps_rolled_back"] == 0 and r["bytes_rebuilt"] > 0 for r in report["recovery"])
    moves = [e for e in events if e["kind"] == "move"]
    assert [(m["task"], m["spare"]) for m in moves] == [("ps:1", "spare:1"), ("ps:2", "spare:2")]
    assert not [e for e in events if e["kind"] == "restart"]  # nothing waited for a process to start
    # The one process that died on its own account is the frozen PS, killed by the launcher for its silence.
    assert [(e["task"], e["diagnosis"]["kind"]) for e in events if e["kind"] == "crash"] == [("ps:2", "hang")]
    assert [e["task"] for e in events if e["kind"] == "spare"] == ["spare:0", "spare:1", "spare:2", "spare:3"]
    for rec, move in zip(report["recovery"], moves):
        assert rec["address"] == move["new"] != move["old"]
    # Each trainer followed each move in place (its session re-created for the new address inside the same
    # Estimator.train), without leaving training to rebuild its Estimator.
    failovers = [(e["task"], e["state"]) for e in events if e["kind"] == "failover"]
    assert sorted(t for t, s in failovers if s == "retarget") == ["chief:0", "chief:0", "worker:0", "worker:0"]
    assert not [f for f in failovers if f[1] == "wait"], failovers
    _assert_every_trainer_back(report)
    assert report["data"]["records_trained"] >= report["data"]["records_total"]
    _assert_parity_exact(report, stripes=3)
    with open(os.path.join(tmp_path, "cluster.json"), encoding="utf-8") as fh:
        cluster = json.load(fh)
    assert cluster["ps"][1:] == [moves[0]["new"], moves[1]["new"]] and cluster["version"] == 2  # one per move
    assert "spare:1 at " in err and "takes the role of ps:1" in err
    assert set(report["memory"]) >= {"chief:0", "worker:0", "ps:0", "ps:1", "spare:3"}
    (silent,) = [e for e in report["exits"] if e["kind"] == "hang"]
    assert silent["task"] == "ps:2" and "--ps-hang-secs 4" in silent["detail"], report["exits"]
    seconds = float(re.search(r"answered nothing for ([\d.]+) s", silent["detail"]).group(1))
    assert seconds >= 4, silent  # killed for its silence, not before
    print(f"ps:2 killed {seconds:.1f} s after its last answer; training s lost per failure: "
          f"{[r['training_seconds_lost'] for r in report['recovery']]}")
    _assert_exported_model_serves(tmp_path, report)  # the model trained through both moves, served
    # Every PS and spare sized its thread pools to its share of this host's CPUs: 3 PS, 2 trainers, 1 spare.
    # (TF_ECREC_PS_THREADS set where the tests run is the tasks' setting too.)
    want = ps_thread_pools({**os.environ, ENV_TASKS_PER_HOST: "6"})
    for name in ("ps:0", "ps:1", "spare:0", "spare:3"):
        with open(log_file(str(tmp_path), name), encoding="utf-8") as fh:
            log = fh.read()
        if want is None:
            assert "PS thread pools: TensorFlow's sizing" in log, name
            continue
        pools = re.findall(r"PS thread pools: (\d+) intra-op, (\d+) inter-op \(.*, (\d+) tasks on this host\)", log)
        assert pools and all(p == (str(want.intra), str(want.inter), "6") for p in pools), (name, pools, want)


def test_a_sequence_of_failures_with_three_asynchronous_workers_ends_exact_and_whole(tmp_path):
    """The exactness issue's sequence: a worker killed between its applies and its folds, later the data PS
    it updated, then two PS at once, then the chief; 2+2 on 4 PS, three asynchronous workers."""
    import numpy as np
    import tensorflow as tf

    model_dir = tmp_path / "job"
    os.makedirs(model_dir)
    env = {"TF_ECREC_FAILPOINT": "worker_after_apply@worker:0@step=150", "TF_ECREC_FAILPOINT_DIR": str(model_dir)}
    report, err = _run(model_dir, "--ec", "2+2", "--ps", "4", "--workers", "3", "--steps", "720",
                       "--kill", "ps:1@step=260", "--kill", "ps:2@step=380", "--kill", "ps:3@step=380",
                       "--kill", "chief:0@step=540", "--restart-delay", "1",
                       "--checkpoint-steps", "5000", env=env)  # no checkpoint before the end: only the final one
    assert os.path.exists(model_dir / "tf_ecrec_failpoint_worker_after_apply_worker_0"), "the failpoint did not fire"
    ps_recoveries = [r for r in report["recovery"] if r["task"].startswith("ps:")]
    assert sorted(r["task"] for r in ps_recoveries) == ["ps:1", "ps:2", "ps:3"]
    assert all(r["method"] == "parity" and r["steps_rolled_back"] == 0 for r in ps_recoveries), ps_recoveries
    settlement = report["settlement"]
    assert settlement["steps_undone"] + settlement["steps_finished"] >= 1, settlement  # the cut worker step at least
    assert "steps cut by failures:" in err
    _assert_parity_exact(report, stripes=4)
    data = report["data"]
    assert data["finished"] and data["records_failed"] == 0 and data["records_trained"] >= data["records_total"], data
    # No accumulator holds a value no sequence of Adagrad updates can produce (below its initial 0.1).
    reader = tf.train.load_checkpoint(str(model_dir))
    accumulators = [n for n in reader.get_variable_to_shape_map() if n.endswith("/Adagrad") and "ec_replica" not in n]
    assert accumulators
    for name in accumulators:
        assert float(np.min(reader.get_tensor(name))) >= np.float32(0.1), name


def test_with_a_spare_training_goes_on_while_the_killed_ps_rows_are_rebuilt_even_when_the_chief_dies_midway(tmp_path):
    """--spare-ps 1 --kill ps:1: trainers resume once the spare holds the lost PS's variables with its table rows
    pending; steps complete between that and the end of the rebuild (lookups wait only for the rows they ask for,
    which the rebuild installs first), nothing is rolled back and parity is exact at the end.  The chief is killed
    as soon as it reports the rebuild begun (--kill chief:0@rebuild, issue 33: a failure during the move) and comes
    back after 20 s, as a rescheduled pod: the restarted chief resumes the rebuild from where the rows stand, and
    the job ends with every record trained (it once never ended: after the worker's failover BUILD its shard
    progress hook asked the new graph's commits about the wrong runs, no record was acknowledged again, and both
    trainers starved for data, session after session)."""
    # Small slices (128 KB, several hundred session calls for the 170 MB of ps:1) make the walk outlast
    # the trainers' first steps after they resume, so that their lookups meet pending rows; the walk
    # pauses as long as each slice took (--rebuild-share 0.5), leaving the rest of the time to training.
    report, err = _run(tmp_path, "--ec", "2+1", "--ps", "3", "--workers", "2", "--steps", "950", "--spare-ps", "1",
                       "--table-rows", "100000", "--embedding-dim", "16", "--kill", "ps:1@step=250",
                       "--kill", "chief:0@rebuild", "--rebuild-slice-mb", "0.125", "--rebuild-share", "0.5",
                       "--restart-delay", "20")
    assert [r["task"] for r in report["recovery"]] == ["ps:1", "chief:0"], report["recovery"]
    rec = report["recovery"][0]
    assert rec["method"] == "parity" and rec["rebuilt_in_background"] and rec["steps_rolled_back"] == 0, rec
    events = report["events"]
    started = next(e for e in events if e["kind"] == "rebuilding")
    done = next(e for e in events if e["kind"] == "recovered")
    chief_killed = next(e for e in events if e["kind"] == "kill" and e["task"] == "chief:0")
    assert started["t"] <= chief_killed["t"] < done["t"], (started, chief_killed, done)  # killed mid-rebuild
    # The chief read the global step when trainers were let in and when the last row was installed:
    # steps completed in between, on a PS whose rows were partly there.
    assert done["global_step"] > started["global_step"], (started, done)
    assert rec["bytes_rebuilt"] > 20_000_000
    # Every trainer trained again after each failure, from its own step datagrams.  Its sessions are not bounded
    # here: the worker's wait for the chief's 20 s restart ends with its session's deadline (a failover BUILD).
    for failure in report["recovery"]:
        for task in ("chief:0", "worker:0"):
            cost = failure["trainers"][task]
            assert cost["records_after"] > 0 and cost["seconds_to_first_step"] is not None, (failure["task"], task, cost)
    data = report["data"]
    assert data["finished"] and data["records_trained"] >= data["records_total"] and data["records_failed"] == 0, data
    with open(os.path.join(tmp_path, "logs", "chief-0.log"), encoding="utf-8") as fh:
        log = fh.read()
    assert "resuming the background rebuild of PS [1]" in log
    asked = re.search(r"background rebuild of PS \[1\] done: (\d+) rows \((\d+) asked for by lookups first\)", log)
    assert asked and int(asked.group(2)) > 0, "no lookup asked for a pending row"
    assert "rebuilds lost PS [1] while training goes on" in err
    _assert_parity_exact(report, stripes=3)


def test_a_second_ps_lost_while_the_first_is_rebuilt_onto_the_spare_is_rebuilt_with_it(tmp_path):
    """Issue 33, a failure during the move: 2+2 on 4 PS with a spare; ps:1 killed, its role given to the spare and
    its rows rebuilt in the background; ps:2 killed as soon as that rebuild is reported begun (--kill
    ps:2@rebuild): its role goes to the spare started behind the first move, both are rebuilt from parity
    (r = 2 covers them), nothing is rolled back, every trainer trains again after each loss, the job ends
    with every record trained and parity exact, and the report does not count the steps the first recovery
    undid as the second one's rollback."""
    # 700 steps: at 4 tables the job trains ~55 steps/s here, so 500 left less than the 5 s window after the second
    # recovery in which the report looks for the rate to come back (two failed runs of "back" on 2026-11-30).
    report, err = _run(tmp_path, "--ec", "2+2", "--ps", "4", "--workers", "2", "--steps", "700", "--spare-ps", "1",
                       "--table-rows", "30000", "--kill", "ps:1@step=200", "--kill", "ps:2@rebuild",
                       "--rebuild-slice-mb", "0.125", "--rebuild-share", "0.5", "--restart-delay", "inf")
    assert [r["task"] for r in report["recovery"]] == ["ps:1", "ps:2"], report["recovery"]
    # (It failed here once, in a full run at 26 tables, with a report that did not say which field: now it does.)
    assert all(r["method"] == "parity" and r["steps_rolled_back"] == 0 for r in report["recovery"]), [
        (r["task"], r["method"], r["steps_rolled_back"], r["killed_at_step"], r["reached_step"], r["resumed_from_step"],
         r["steps_undone"]) for r in report["recovery"]]
    events = report["events"]
    started = next(e for e in events if e["kind"] == "rebuilding")
    second = next(e for e in events if e["kind"] == "kill" and e["task"] == "ps:2")
    done = next(e for e in events if e["kind"] == "recovered")
    assert started["t"] <= second["t"] < done["t"], (started, second, done)  # lost during the first's rebuild
    assert done["lost_ps"] == [1, 2], done
    moves = [e for e in events if e["kind"] == "move"]
    assert [(m["task"], m["spare"]) for m in moves] == [("ps:1", "spare:0"), ("ps:2", "spare:1")], moves
    assert not [e for e in events if e["kind"] == "restart"]  # nothing waited for a replacement
    _assert_every_trainer_back(report, overlapping=("ps:2",))
    # How the two failures' figures share the pause is the report's arithmetic, tested on fixed datagrams in
    # tests/unit/test_failure_cost.py. Whether and how soon the rate came back within 5 % is a throughput target,
    # measured in benchmarks/: it compares windows of the job's rate, which a neighbour's load changes, and the rate
    # before this early kill includes the job's first, slower steps (a CI run of 2026-12-01 had it back in the
    # window that starts at the kill, where this test asked for it after the second kill).
    data = report["data"]
    assert data["finished"] and data["records_trained"] >= data["records_total"] and data["records_failed"] == 0, data
    assert "rebuilds lost PS [1, 2] while training goes on" in err
    _assert_parity_exact(report, stripes=4)
