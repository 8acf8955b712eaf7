import json

import pytest

from tf_ecrec.errors import ConfigError
from tf_ecrec.launcher.job.kill_spec import KillSpec
from tf_ecrec.launcher.job.spec import JobSpec


def test_kill_specs_parse_and_print_back():
    k = KillSpec.parse("ps:1@step=1200")
    assert (k.task_type, k.task_index, k.step, k.task) == ("ps", 1, 1200, "ps:1")
    assert str(k) == "ps:1@step=1200"
    assert KillSpec.parse("worker:0@step=5").task == "worker:0"
    assert KillSpec.parse("spare:0@step=7").task == "spare:0"
    during = KillSpec.parse("chief:0@rebuild")
    assert (during.task, during.step, during.during, str(during)) == ("chief:0", 0, "rebuild", "chief:0@rebuild")
    assert KillSpec.parse(str(during)) == during


def test_a_kill_during_a_rebuild_needs_one_that_happens_and_is_a_kill_only():
    assert JobSpec(fault_tolerance="ecrec", spare_ps=1, kills=(KillSpec.parse("ps:2@rebuild"),)).kills
    with pytest.raises(ConfigError, match=r"--kill ps:2@rebuild: a lost PS is rebuilt in the background only onto a "
                                          r"spare.*\(got ecrec, 0\); source: --kill"):
        JobSpec(fault_tolerance="ecrec", kills=(KillSpec.parse("ps:2@rebuild"),))
    with pytest.raises(ConfigError, match=r"--remove-worker 'worker:0@rebuild': @rebuild is a --kill trigger"):
        KillSpec.parse("worker:0@rebuild", "--remove-worker")


@pytest.mark.parametrize("text", ["ps1@step=3", "ps:1@3", "ps:x@step=3", "gpu:0@step=3", "ps:1@step=-3", "",
                                  "ps:1@rebuilds", "ps:1@rebuild=3"])
def test_malformed_kill_is_a_config_error(text):
    with pytest.raises(ConfigError, match=r"is malformed; expected TASK@step=N.*source: --kill"):
        KillSpec.parse(text)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kills": (KillSpec("ps", 3, 10),)}, r"ps:3 does not exist; this job has ps:0..2"),
        ({"kills": (KillSpec("worker", 1, 10),)}, r"worker:1 does not exist.*worker:0..0"),
        ({"workers": 1, "kills": (KillSpec("worker", 0, 10),)}, r"no non-chief worker"),
        ({"kills": (KillSpec("ps", 0, 3000),)}, r"step 3000 must be inside the run"),
        ({"kills": (KillSpec("spare", 0, 10),)}, r"spare:0 does not exist; this job starts no spare \(--spare-ps 0\)"),
        ({"spare_ps": 1, "kills": (KillSpec("spare", 1, 10),)}, r"spare:1 does not exist; this job starts spare:0..0"),
        ({"checkpoint_steps": 10, "checkpoint_secs": 5.0}, r"both given"),
        ({"fault_tolerance": "none", "checkpoint_steps": 10}, r"a checkpoint interval was given with --fault-tolerance none"),
        ({"deterministic": True, "workers": 2}, r"--deterministic needs --workers 1"),
        ({"ps": 0}, r"--ps 0 must be >= 1"),
        ({"tables": 0}, r"--tables 0 must be in 1..26 \(the data's categoricals\); source: --tables"),
        ({"tables": 27}, r"--tables 27 must be in 1..26"),
        ({"data": "criteo:"}, r"must be 'synthetic', 'criteo:PATH\[,PATH...\]', 'stream:DIR' or 'stream:redis://"),
        ({"data": "stream:"}, r"'stream:DIR' or"),
        ({"data": "stream:redis://127.0.0.1:6379/clicks"}, r"redis://HOST:PORT/DB/TOPIC/PARTITION"),
        ({"data": "stream:/tmp/s", "master": False}, r"a stream is sharded by the job master"),
        ({"fault_tolerance": "magic"}, r"--fault-tolerance 'magic' is not one of"),
        ({"spare_ps": -1}, r"--spare-ps -1 must be an integer >= 0; source: --spare-ps"),
        ({"rebuild_slice_mb": 0}, r"--rebuild-slice-mb 0 must be > 0; source: --rebuild-slice-mb"),
        ({"rebuild_share": 0.0}, r"--rebuild-share 0.0 must be in \(0, 1\]; source: --rebuild-share"),
        ({"rebuild_share": 1.5}, r"--rebuild-share 1.5 must be in \(0, 1\]; source: --rebuild-share"),
        ({"storage": "sharded"}, r"--storage 'sharded' is not one of \('partitioned', 'collection'\); source: --storage"),
        ({"fault_tolerance": "ecrec", "storage": "partitioned"}, r"ecrec protects the collection storage only"),
        ({"fault_tolerance": "none", "ec": "4+1"}, r"--ec 4\+1 was given with --fault-tolerance none and partitioned tables"),
        ({"fault_tolerance": "none", "storage": "collection", "ec": "4+1"}, r"4\+1"),  # 5 tasks on 3 PS
        ({"fault_tolerance": "none", "storage": "collection", "model": "dcn"}, r"for --model dlrm only, not 'dcn'"),
    ],
)
def test_bad_flag_combinations_are_rejected_before_anything_starts(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        JobSpec(**kwargs)


def test_table_storage_defaults_to_the_collection_under_ecrec_only_and_takes_the_code_as_its_layout():
    assert JobSpec(fault_tolerance="ecrec").table_storage == "collection"
    assert JobSpec(fault_tolerance="none").table_storage == "partitioned"
    assert JobSpec(fault_tolerance="checkpoint", storage="collection", ec="4+1", ps=5).table_storage == "collection"


def test_flag_spellings_become_enum_members_and_go_back_to_job_json_as_spellings():
    from tf_ecrec.launcher.job.choices import FaultTolerance, OnCorrupt, Optimizer, RestartAt, Storage

    job = JobSpec(fault_tolerance="ecrec", optimizer="ftrl", restart_at="new-port", on_corrupt="fail")
    assert job.fault_tolerance is FaultTolerance.ECREC and job.optimizer is Optimizer.FTRL
    assert job.restart_at is RestartAt.NEW_PORT and job.on_corrupt is OnCorrupt.FAIL
    assert job.table_storage is Storage.COLLECTION
    data = job.to_json()
    assert [type(data[k]) for k in ("fault_tolerance", "optimizer", "restart_at", "on_corrupt")] == [str] * 4
    assert (data["fault_tolerance"], data["restart_at"]) == ("ecrec", "new-port")
    assert JobSpec.from_json(json.loads(json.dumps(data))) == job


def test_checkpoint_interval_maps_to_run_config_arguments():
    assert JobSpec(checkpoint_steps=100).checkpoint_interval == {
        "save_checkpoints_steps": 100,
        "save_checkpoints_secs": None,
    }
    assert JobSpec(checkpoint_secs=30.0).checkpoint_interval["save_checkpoints_secs"] == 30.0
    assert JobSpec(fault_tolerance="none").checkpoint_interval == {
        "save_checkpoints_steps": None,
        "save_checkpoints_secs": None,
    }


def test_json_round_trip(tmp_path):
    job = JobSpec(kills=(KillSpec("ps", 1, 100), KillSpec("chief", 0, 200)), data="criteo:/a,/b")
    path = tmp_path / "job.json"
    import json

    path.write_text(json.dumps(job.to_json()))
    assert JobSpec.load(str(path)) == job
    assert job.criteo_paths == ["/a", "/b"]
    with pytest.raises(ConfigError, match=r"unknown fields \['bogus'\]"):
        JobSpec.from_json({**job.to_json(), "bogus": 1})


def test_master_kills_and_elastic_flags_parse_and_round_trip(tmp_path):
    from tf_ecrec.launcher.job.kill_spec import parse_add_workers, parse_kills, parse_removes

    kills = parse_kills(["master@step=50", "worker:1@step=400"])
    assert [(k.task_type, k.task, str(k)) for k in kills] == [
        ("master", "master", "master@step=50"), ("worker", "worker:1", "worker:1@step=400")]
    job = JobSpec(workers=2, kills=kills, add_workers=parse_add_workers(["step=300", "step=100"]),
                  removes=parse_removes(["worker:0@step=500"]), zk="127.0.0.1:2181/jobs/a", task_timeout=5.0)
    assert job.add_workers == (100, 300)  # slot worker:1 at 100, worker:2 at 300
    assert job.worker_slots == 3 and job.added_at("worker:1") == 100 and job.added_at("worker:0") is None
    assert job.uses_master and job.owns_master
    import json

    path = tmp_path / "job.json"
    path.write_text(json.dumps(job.to_json()))
    assert JobSpec.load(str(path)) == job


def test_deterministic_and_no_master_runs_have_no_master():
    assert not JobSpec(deterministic=True, workers=1).uses_master
    assert not JobSpec(master=False).uses_master
    external = JobSpec(master_address="10.0.0.1:50051")
    assert external.uses_master and not external.owns_master


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"master": False, "zk": "h:1/j"}, r"--zk needs the job master, but --no-master was given"),
        ({"deterministic": True, "workers": 1, "add_workers": (10,)}, r"--add-worker needs the job master, but --deterministic"),
        ({"kills": (KillSpec("master", 0, 10),), "master_address": "h:1"}, r"runs no master to kill"),
        ({"master_address": "nohost"}, r"--master 'nohost' must be HOST:PORT"),
        ({"master_token_file": "/t"}, r"--master-token-file applies to an external --master"),
        ({"zk": "h:2181"}, r"--zk 'h:2181'.*job path below the root"),
        ({"task_timeout": 0}, r"--task-timeout 0 must be > 0"),
        ({"add_workers": (3000,)}, r"--add-worker step=3000 must be inside the run"),
        ({"removes": (KillSpec("ps", 0, 10),)}, r"only non-chief workers"),
        ({"removes": (KillSpec("worker", 1, 10),)}, r"worker:1 does not exist"),
        ({"removes": (KillSpec("worker", 0, 10), KillSpec("worker", 0, 20))}, r"worker:0 is removed twice"),
        ({"add_workers": (100,), "removes": (KillSpec("worker", 1, 50),)}, r"added at step 100 .*after that step"),
        ({"add_workers": (100,), "kills": (KillSpec("worker", 1, 100),)}, r"added at step 100 .*after that step"),
    ],
)
def test_master_and_elastic_rules_are_checked_before_anything_starts(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        JobSpec(**kwargs)


@pytest.mark.parametrize("text", ["step=", "300", "worker:1@step=3", "step=-1"])
def test_malformed_add_worker_is_a_config_error(text):
    from tf_ecrec.launcher.job.kill_spec import parse_add_workers

    with pytest.raises(ConfigError, match=r"--add-worker .* is malformed; expected step=N"):
        parse_add_workers([text])


@pytest.mark.parametrize("model", ["dlrm", "dcn", "keras_dlrm", "wide_deep_canned"])
def test_fewer_tables_give_the_model_that_many_and_the_data_all_26_columns(model):
    """--tables N: the built-in models get N table sizes; the data still hashes 26 categoricals, the
    ones no table reads into one row (`data_sizes`); a user module returning another count is refused."""
    from tf_ecrec.launcher.job.models import data_sizes, load_model, model_params

    pss = {"strategy": "pss", "fault_tolerance": "ecrec"} if model == "keras_dlrm" else {}
    job = JobSpec(model=model, tables=4, table_rows=300, **pss)
    params = model_params(job, load_model(model, keras=bool(pss)))
    assert params["table_sizes"] == [300] * 4
    assert data_sizes(params) == [300] * 4 + [1] * 22

    class TwentySix:
        @staticmethod
        def default_params(**flags):
            return {**flags, "table_sizes": [300] * 26}

    with pytest.raises(ConfigError, match=r"rule: 4 sizes \(--tables\).*source: the model module"):
        model_params(job, TwentySix)


@pytest.mark.parametrize("flags", [["--ec", "2+1"], ["--fault-tolerance", "flash", "--ec", "2+1"],
                                   ["--fault-tolerance", "none", "--ec", "4+1"]])
def test_a_code_given_with_a_fault_tolerance_that_does_not_use_it_is_refused(tmp_path, capsys, flags):
    """`tf-ecrec run --ec 2+1` without --fault-tolerance ecrec once trained with checkpoints alone, silently:
    the code named is the default one, so the spec could not tell it was asked for."""
    from tf_ecrec.cli import main

    assert main(["run", "--model-dir", str(tmp_path / "m"), *flags]) == 2
    err = capsys.readouterr().err
    assert f"--ec {flags[-1]} was given with --fault-tolerance" in err and "source: --ec" in err, err
    assert not (tmp_path / "m").exists()  # refused before anything started
