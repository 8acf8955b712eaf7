import json
import os

import pytest

from tf_ecrec.launcher.events import Event
from tf_ecrec.launcher.job.spec import JobSpec
from tf_ecrec.launcher.report import build_report, plot_throughput, recovery_entries, steady_rates


def _events():
    return [
        Event(0.0, "start", "ps:1", 0),
        Event(5.0, "session", "chief:0", 0),
        Event(20.0, "kill", "ps:1", 1200),
        Event(22.0, "restart", "ps:1", 1200),
        Event(26.0, "session", "chief:0", 1000),
        Event(26.5, "session", "worker:0", 1010),
        Event(27.0, "resumed", "ps:1", 1001),
        Event(31.0, "regained", "ps:1", 1200),
    ]


def test_recovery_entry_measures_rollback_and_times_from_the_kill():
    (entry,) = recovery_entries(_events())
    assert entry == {
        "task": "ps:1",
        "killed_at_step": 1200,
        "reached_step": 1200,
        "resumed_from_step": 1000,
        "steps_rolled_back": 200,
        "steps_undone": 0,
        "seconds_to_resume": 7.0,
        "seconds_to_regain": 11.0,
        "method": "checkpoint",
        "rebuilt_in_background": False,
        "bytes_rebuilt": 0,
        "rebuild_seconds": 0.0,
        "address": "same",
        "failovers": 0,
        "recovery_phases": {},
        "window_seconds": 7.0,
        "samples_per_sec_in_window": 0.0,
        "while_rebuilding": None,
        "rebuild_gb_per_sec": None,
        "memory_mb_before": {},
        "memory_mb_in_window": {},
    }


def test_the_step_reached_counts_datagrams_sent_before_the_kill_that_the_launcher_read_after_it():
    t0 = 1000.0
    # (sender's t, step, records): the launcher killed at 1,200 while 1,203 and 1,206 were still unread;
    # 1,207 was sent after the kill (a later session's step).
    timeline = [(t0 + 19.0, 1200, 256), (t0 + 19.5, 1203, 384), (t0 + 19.9, 1206, 384), (t0 + 28.0, 1207, 128)]
    (entry,) = recovery_entries(_events(), timeline=timeline, t0=t0)
    assert entry["killed_at_step"] == 1200 and entry["reached_step"] == 1206
    # The restore went back to 1,000 from 1,206, not from the trigger's 1,200: the rollback counts from the step
    # reached (the trigger's would undercount a kill read late by as many steps as were unread).
    assert entry["resumed_from_step"] == 1000 and entry["steps_rolled_back"] == 206, entry


def test_a_recovery_that_went_on_past_a_late_read_trigger_rolled_nothing_back():
    t0 = 1000.0
    events = [Event(0.0, "start", "ps:1", 0), Event(20.0, "kill", "ps:1", 1200), Event(24.0, "session", "chief:0", 1206),
              Event(25.0, "resumed", "ps:1", 1207), Event(25.0, "recovered", "ps:1", 1207, {"method": "parity"})]
    timeline = [(t0 + 19.0, 1200, 256), (t0 + 19.9, 1206, 384), (t0 + 25.0, 1207, 128)]
    (entry,) = recovery_entries(events, timeline=timeline, t0=t0)
    assert entry["resumed_from_step"] == 1206 and entry["steps_rolled_back"] == 0, entry


def test_recovery_entry_names_the_new_address_and_counts_the_failovers_until_resumed():
    events = _events()
    events[3:3] = [
        Event(22.0, "move", "ps:1", 1200, {"old": "127.0.0.1:1", "new": "127.0.0.1:9"}),
        Event(23.0, "failover", "chief:0", None, {"state": "wait", "reason": "session failed"}),
        Event(24.0, "failover", "chief:0", None, {"state": "build", "reason": "PS moved"}),
        Event(24.5, "failover", "worker:0", None, {"state": "build", "reason": "PS moved"}),
    ]
    events.append(Event(40.0, "failover", "worker:0", None, {"state": "build", "reason": "later"}))
    (entry,) = recovery_entries(events)
    assert entry["address"] == "127.0.0.1:9" and entry["failovers"] == 2


def test_the_recovery_window_runs_to_the_rebuild_and_has_its_throughput_rate_and_memory():
    t0 = 1000.0
    events = [
        Event(20.0, "kill", "ps:1", 1200),
        Event(21.0, "restart", "ps:1", 1200),
        Event(25.0, "recovered", "chief:0", 1200, {"method": "parity", "bytes_rebuilt": 2_000_000_000, "rebuild_seconds": 2.0}),
        Event(26.0, "resumed", "ps:1", 1201),
    ]
    # 100 records/s before the kill, 40 records/s while the PS is rebuilt (other workers train on).
    timeline = [(t0 + t, t, 100) for t in range(1, 21)] + [(t0 + 20 + t, 20 + t, 40) for t in range(1, 6)]
    memory = {"chief:0": [(t, 500.0 + (300.0 if 21 <= t <= 24 else 0.0)) for t in range(0, 30)], "ps:1": [(10.0, 900.0)]}
    (entry,) = recovery_entries(events, "ecrec", timeline, t0, memory)
    assert entry["window_seconds"] == 5.0
    assert entry["samples_per_sec_in_window"] == 40.0
    assert entry["rebuild_gb_per_sec"] == 1.0
    assert entry["memory_mb_before"] == {"chief:0": 500.0, "ps:1": 900.0}
    assert entry["memory_mb_in_window"] == {"chief:0": 800.0}
    report = build_report(JobSpec(steps=100, fault_tolerance="ecrec"), t0, events, timeline, {}, {}, memory=memory)
    assert report["memory"]["chief:0"]["peak_mb"] == 800.0 and len(report["memory"]["chief:0"]["samples"]) == 30
    assert 0.3 < report["recovery"][0]["throughput_in_window"] < 0.5


def test_with_a_background_rebuild_the_window_runs_past_the_resume_to_the_rebuild_end():
    t0 = 1000.0
    events = [
        Event(20.0, "kill", "ps:1", 1200),
        Event(21.0, "rebuilding", "chief:0", 1200, {"lost_ps": [1], "seconds": 0.4, "phases": {"settle": 0.1, "t0": 0.3}}),
        Event(21.5, "resumed", "ps:1", 1201),
        Event(24.0, "recovered", "chief:0", 1230, {"method": "parity", "bytes_rebuilt": 3_000_000_000, "rebuild_seconds": 3.0}),
        Event(30.0, "kill", "ps:2", 1500),
        Event(40.0, "recovered", "chief:0", 1500, {"method": "parity", "bytes_rebuilt": 1, "rebuild_seconds": 1.0}),
        Event(41.0, "resumed", "ps:2", 1501),
    ]
    # 100 records/s, but only 50/s while the rows are installed after the resumption (21.5-24).
    timeline = [(t0 + t, t, 50 if 22 <= t <= 24 else 100) for t in range(1, 45)]
    first, second = recovery_entries(events, "ecrec", timeline, t0)
    assert first["rebuilt_in_background"] and first["window_seconds"] == 4.0
    assert first["samples_per_sec_in_window"] == 62.5 and first["rebuild_gb_per_sec"] == 1.0
    assert first["while_rebuilding"] == {"seconds": 2.5, "samples_per_sec": 60.0}
    assert first["recovery_phases"] == {"settle": 0.1, "t0": 0.3}
    assert first["seconds_to_resume"] == 1.5
    # The next kill's rebuild is its own (not the first's, nor after its resume without a "rebuilding").
    assert not second["rebuilt_in_background"] and second["window_seconds"] == 10.0
    assert second["while_rebuilding"] is None


def test_steps_undone_at_t0_of_a_background_rebuild_are_not_a_rollback_when_its_chief_dies_before_the_end():
    """T0's settlement undid 3 steps and reported them with "rebuilding"; the chief died, and the one restarted
    finished the rebuild and reported its own part (none): the 3 steps the global step went back are undone."""
    events = [
        Event(20.0, "kill", "ps:1", 1200),
        Event(21.0, "rebuilding", "chief:0", 1197, {"lost_ps": [1], "steps_undone": 3, "steps_finished": 2}),
        Event(21.2, "kill", "chief:0", 1197),
        Event(44.0, "session", "chief:0", 1197),
        Event(45.0, "resumed", "ps:1", 1198),
        Event(60.0, "recovered", "chief:0", 1400, {"method": "parity", "bytes_rebuilt": 9, "steps_undone": 0}),
    ]
    entry = recovery_entries(events, "ecrec")[0]
    assert entry["task"] == "ps:1" and entry["method"] == "parity" and entry["rebuilt_in_background"]
    assert (entry["steps_undone"], entry["steps_rolled_back"]) == (3, 0), entry


def test_a_ps_lost_inside_another_ones_rebuild_is_not_charged_with_the_steps_the_first_settlement_undid():
    """The run that found it: ps:1 killed at step 201, T0's settlement undid 3 steps (global step 198), ps:2 killed
    as the rebuild began, before any step: ps:2 reached 198, not the launcher's last read of 201."""
    events = [
        Event(20.0, "kill", "ps:1", 201),
        Event(21.0, "rebuilding", "chief:0", 198, {"lost_ps": [1], "steps_undone": 3}),
        Event(21.1, "kill", "ps:2", 201),
        Event(30.0, "resumed", "ps:1", 199),
        Event(30.0, "resumed", "ps:2", 199),
        Event(40.0, "recovered", "chief:0", 260, {"method": "parity", "lost_ps": [1, 2], "steps_undone": 0}),
    ]
    timeline = [(t, 180 + t - 10, 256) for t in range(10, 21)]  # steps sent up to the first kill
    first, second = recovery_entries(events, "ecrec", timeline)
    assert (first["reached_step"], first["steps_undone"], first["steps_rolled_back"]) == (201, 3, 0), first
    assert (second["reached_step"], second["steps_rolled_back"]) == (198, 0), second
    # A kill after steps sent since the settlement is measured from those steps (a launcher that read them late).
    later = [*timeline, (21.05, 205, 256)]
    assert recovery_entries(events, "ecrec", later)[1]["reached_step"] == 205


def test_a_worker_kill_without_a_new_session_rolls_nothing_back():
    events = [Event(10.0, "kill", "worker:0", 500), Event(10.1, "resumed", "worker:0", 501), Event(10.1, "regained", "worker:0", 501)]
    (entry,) = recovery_entries(events)
    assert entry["steps_rolled_back"] == 0 and entry["resumed_from_step"] == 500


def test_a_job_that_never_resumed_reports_none():
    (entry,) = recovery_entries([Event(10.0, "kill", "ps:0", 500)])
    assert entry["seconds_to_resume"] is None and entry["steps_rolled_back"] is None


def test_steady_rate_excludes_warmup_and_failure_windows():
    t0 = 1000.0
    # 100 records every second from t=1 to t=40, none between the kill (t=20) and the resume (t=30).
    timeline = [(t0 + t, t * 10, 100) for t in range(1, 41) if not 20 < t < 30]
    events = [Event(20.0, "kill", "ps:0", 200), Event(29.5, "resumed", "ps:0", 150)]
    steady, effective = steady_rates(timeline, events, t0, warmup_step=50)
    # warm-up ends at t=5 (step 50); records after it: t=6..40 minus the gap = 26 datagrams
    assert steady == pytest.approx(2600 / (35 - 9.5))
    assert effective == pytest.approx(2600 / 35)


def test_report_has_the_stable_fields_and_a_plot(tmp_path):
    job = JobSpec(steps=400)
    t0 = 1000.0
    timeline = [(t0 + 1 + i * 0.1, i, 256) for i in range(400)]
    report = build_report(
        job=job,
        t0=t0,
        events=_events(),
        timeline=timeline,
        done_reports={"chief:0": {"step": 400, "records": 90000, "corrupt_records": 3}},
        digest={"variables_sha256": "ab" * 32, "variables": 10, "bytes": 1234},
    )
    for field in ("config", "global_step", "samples_per_sec", "events", "recovery", "variables_sha256", "data"):
        assert field in report
    assert report["global_step"] == 400
    assert report["config"]["steps"] == 400
    assert report["data"] == {"records_trained": 90000, "corrupt_records": 3}
    assert {"t", "kind", "task", "global_step"} <= set(report["events"][0])
    json.dumps(report)  # serialisable
    png = plot_throughput(report, str(tmp_path / "r.png"))
    assert os.path.getsize(png) > 5000
    with open(png, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_no_plot_writes_the_report_alone(tmp_path):
    from tf_ecrec.cli import build_parser, job_from_args
    from tf_ecrec.launcher.run_record import write_report

    parse = build_parser().parse_args
    assert job_from_args(parse(["run", "--model-dir", str(tmp_path)])).plot is True
    job = job_from_args(parse(["run", "--model-dir", str(tmp_path), "--no-plot"]))
    assert job.plot is False and JobSpec.from_json(job.to_json()).plot is False
    for plot in (False, True):
        path = str(tmp_path / f"report-{plot}.json")
        write_report({"throughput": [[0.0, 10.0], [1.0, 12.0]], "events": [], "recovery": []}, path, plot=plot)
        with open(path, encoding="utf-8") as fh:
            written = json.load(fh)["plot"]
        assert (written is not None) is plot and os.path.exists(path[:-5] + ".png") is plot, written


def test_with_a_master_the_data_section_is_the_masters_counters_and_the_in_flight_bound():
    from tf_ecrec.master.sharding import DataStats

    stats = DataStats(dataset="train", records_total=1000, records_trained=1040, records_retrained=40,
                      records_requeued=64, records_failed=0, records_in_flight=0, shards_failed=0,
                      failed_shard_ids=(), finished=True)
    failures = [{"task": "worker:0", "global_step": 10, "records_in_flight": 96},
                {"task": "master", "global_step": 20, "records_in_flight": 32}]
    report = build_report(
        job=JobSpec(steps=400), t0=0.0, events=[], timeline=[],
        done_reports={"chief:0": {"step": 8, "records": 900, "corrupt_records": 2},
                      "worker:0": {"step": 8, "records": 200, "corrupt_records": 1}},
        digest={}, data_state=stats, failures=failures,
    )
    assert report["data"] == {
        "records_total": 1000, "records_trained": 1040, "records_retrained": 40, "records_requeued": 64,
        "records_failed": 0, "shards_failed": 0, "finished": True, "corrupt_records": 3,
        "failures": failures, "records_in_flight_at_failures": 128,
        # the model's side: 8 steps of at most 256 records hold at most 2,048 of the 1,000
        "records_in_model_max": 2048, "records_lost_from_model": 0,
    }


def test_the_model_side_bound_catches_acknowledged_records_in_no_model():
    from tf_ecrec.launcher.console import summary
    from tf_ecrec.launcher.data_report import records_lost_from_model
    from tf_ecrec.master.sharding import DataStats

    # Issue 30, case 1 as reported: 102,400 records acknowledged once each, the model at step 346 of 256.
    assert records_lost_from_model(102_400, 346, 256) == 13_824
    assert records_lost_from_model(102_400, 400, 256) == 0 and records_lost_from_model(102_400, 459, 256) == 0
    stats = DataStats("train", 102_400, 102_400, 0, 0, 0, 0, 0, (), True)
    report = build_report(job=JobSpec(steps=400), t0=0.0, events=[], timeline=[],
                          done_reports={"chief:0": {"step": 346}}, digest={}, data_state=stats)
    assert report["data"]["records_trained"] - report["data"]["records_retrained"] == report["data"]["records_total"]
    assert report["data"]["records_lost_from_model"] == 13_824  # what the counters alone cannot see
    assert "NOT IN THE MODEL: at least 13,824" in summary(report, "r.json")


def test_an_unknown_in_flight_count_leaves_the_bound_unknown():
    from tf_ecrec.launcher.report import data_section
    from tf_ecrec.master.sharding import DataStats

    stats = DataStats("train", 10, 10, 0, 0, 0, 0, 0, (), True)
    data = data_section({}, stats, [{"task": "ps:0", "global_step": 1, "records_in_flight": None}])
    assert data["records_in_flight_at_failures"] is None
    assert data_section({}, stats, [])["records_in_flight_at_failures"] == 0


def test_the_summary_says_loudly_when_records_were_dropped():
    from tf_ecrec.launcher.console import summary

    data = {"records_total": 1000, "records_trained": 900, "finished": True, "records_retrained": 0,
            "records_requeued": 150, "records_failed": 100, "shards_failed": 2}
    report = {"global_step": 10, "samples_per_sec": 1.0, "effective_samples_per_sec": 1.0,
              "config": {"fault_tolerance": "ecrec"}, "recovery": [], "variables_sha256": "x", "data": data}
    assert "DROPPED: 100 records of 2 shards" in summary(report, "r.json")
    assert "DROPPED" not in summary({**report, "data": {**data, "records_failed": 0, "shards_failed": 0}}, "r.json")


def test_settlement_totals_add_up_recoveries_and_background_settlements():
    from tf_ecrec.launcher.events import Event
    from tf_ecrec.launcher.report import settlement_totals

    events = [
        Event(1.0, "recovered", "chief:0", 10, {"method": "parity", "steps_undone": 1, "steps_finished": 2, "folds_rolled_back": 3}),
        Event(2.0, "settled", "chief:0", 20, {"steps_undone": 0, "steps_finished": 1, "folds_rolled_back": 0}),
        Event(3.0, "recovered", "chief:0", 30, {"method": "checkpoint"}),
    ]
    assert settlement_totals(events) == {"steps_undone": 1, "steps_finished": 3, "folds_rolled_back": 3}


def test_the_summary_names_a_kill_that_training_never_resumed_after():
    from tf_ecrec.launcher.console import summary

    report = {
        "global_step": 10, "samples_per_sec": 5.0, "effective_samples_per_sec": 4.0, "config": {"fault_tolerance": "checkpoint"}, "variables_sha256": "ab",
        "recovery": [
            {"task": "worker:0", "killed_at_step": 9, "resumed_from_step": None, "steps_rolled_back": None,
             "seconds_to_resume": None, "seconds_to_regain": None},
            {"task": "ps:1", "killed_at_step": 5, "resumed_from_step": 4, "steps_rolled_back": 1,
             "seconds_to_resume": 2.0, "seconds_to_regain": None},
        ],
    }
    text = summary(report, "/tmp/report.json")
    assert "worker:0 killed at step 9: training did not resume after it" in text
    assert "resumed after 2.0 s, regained step 5 never" in text


def test_finish_seconds_run_from_the_last_trained_step_to_the_chiefs_exit():
    from tf_ecrec.launcher.report import finish_seconds

    t0 = 1000.0
    timeline = [(t0 + 10.0, 5, 256), (t0 + 12.5, 6, 256), (t0 + 13.0, 6, 0)]  # a report with no records is not a step
    events = [Event(3.0, "exit", "worker:0", 6), Event(14.0, "exit", "chief:0", 6)]
    assert finish_seconds(events, timeline, t0) == 1.5
    assert finish_seconds(events[:1], timeline, t0) is None  # the chief never exited
    assert finish_seconds(events, [], t0) is None


def test_a_step_the_failure_cut_and_settlement_undid_is_not_a_rollback():
    # A worker died mid-step (its increment reached the global step: 303), then a PS died before the step was
    # settled; the parity recovery undid the cut step and the job went on from 302: nothing completed was lost.
    events = [
        Event(20.0, "kill", "ps:1", 303),
        Event(21.0, "restart", "ps:1", 303),
        Event(29.0, "recovered", "chief:0", 302, {"method": "parity", "steps_undone": 1}),
        Event(29.2, "session", "worker:0", 302),
        Event(29.5, "resumed", "ps:1", 302),
    ]
    (entry,) = recovery_entries(events)
    assert (entry["resumed_from_step"], entry["steps_undone"], entry["steps_rolled_back"]) == (302, 1, 0)
    # Under a checkpoint restore the same figures are a rollback: nothing is discounted.
    events[2] = Event(29.0, "recovered", "chief:0", 302, {"method": "checkpoint", "steps_undone": 1})
    (entry,) = recovery_entries(events)
    assert (entry["steps_undone"], entry["steps_rolled_back"]) == (0, 1)


def test_each_failure_says_per_trainer_when_it_trained_again_how_many_sessions_and_at_what_rate():
    """Issue 33: the global step moves while one trainer steps; each trainer's own datagrams tell."""
    from tf_ecrec.launcher.trainer_report import trainer_entries

    t0 = 1000.0
    events = [
        Event(20.0, "kill", "ps:1", 1200), Event(20.1, "move", "ps:1", 1200),
        Event(21.0, "session", "chief:0", 1200), Event(21.5, "session", "worker:0", 1200),
        Event(22.0, "resumed", "ps:1", 1201), Event(24.0, "recovered", "chief:0", 1300),
        *[Event(22.0 + i, "session", "worker:0", 1300) for i in range(1, 6)],  # refused: one session a second
        Event(60.0, "kill", "ps:2", 2000), Event(61.0, "session", "chief:0", 2000), Event(62.0, "resumed", "ps:2", 2001),
    ]
    # 100 records a second each before the kill; after it the chief at 200/s from 22 s, the worker never again.
    chief = [(t0 + t, 100) for t in range(1, 21)] + [(t0 + t, 200) for t in range(22, 61)] + [(t0 + 63, 200)]
    worker = [(t0 + t, 100) for t in range(1, 21)]
    first, second = trainer_entries(events, {"chief:0": chief, "worker:0": worker, "ps:0": [(t0 + 5, 1)]}, t0)
    assert set(first) == {"chief:0", "worker:0"}  # trainers only
    assert first["chief:0"] == {"seconds_to_first_step": 2.0, "records_after": 39 * 200, "sessions": 1,
                                "samples_per_sec_before": 100.0, "samples_per_sec_after": 200.0}
    # (19 datagrams of 100 in the 19 s from its first one to the kill)
    assert first["worker:0"] == {"seconds_to_first_step": None, "records_after": 0, "sessions": 6,
                                 "samples_per_sec_before": 100.0, "samples_per_sec_after": None}
    # The second failure's rates before start after the first one's recovery (24 s): 40..60 s.
    assert second["chief:0"] == {"seconds_to_first_step": 3.0, "records_after": 200, "sessions": 1,
                                 "samples_per_sec_before": 200.0, "samples_per_sec_after": None}
    assert second["worker:0"]["records_after"] == 0 and second["worker:0"]["samples_per_sec_before"] == 0.0


def test_steps_a_first_recovery_undid_are_not_rolled_back_again_by_a_ps_killed_during_its_rebuild():
    """ps:1 killed at 300 (`--spare-ps`); its T0 settlement undid 6 returned steps (the job goes on from 297) and
    its rows are rebuilt in the background; ps:2 killed then, at 297, before any trainer resumed, and rebuilt with
    it.  The steps 298-300, reported before the first kill, were the first recovery's to settle (undone), not
    the second's: the events of such a job (2+2 on 4 PS, `--kill ps:2@rebuild`), where the second kill's
    entry said 3 steps rolled back and none was."""
    t0 = 1000.0
    events = [
        Event(26.556, "kill", "ps:1", 300),
        Event(29.885, "rebuilding", "chief:0", 297, {"lost_ps": [1], "steps_undone": 6}),
        Event(29.978, "kill", "ps:2", 297),
        Event(32.075, "rebuilding", "chief:0", 297, {"lost_ps": [1, 2], "steps_undone": 0}),
        Event(32.347, "resumed", "ps:2", 297),
        Event(32.347, "resumed", "ps:1", 297),
        Event(57.646, "recovered", "chief:0", 660, {"method": "parity", "lost_ps": [1, 2], "steps_undone": 0}),
    ]
    timeline = [(t0 + 25.0, 298, 128), (t0 + 26.5, 300, 128), (t0 + 32.4, 299, 128)]
    first, second = recovery_entries(events, "ecrec", timeline, t0)
    assert first["method"] == second["method"] == "parity"
    assert first["reached_step"] == 300 and first["resumed_from_step"] == 297, first
    assert second["reached_step"] == 297 and second["resumed_from_step"] == 297, second
    assert second["steps_rolled_back"] == 0, second


def test_the_steady_rate_counts_overlapping_failure_windows_once():
    """A PS and the chief killed while another PS's recovery was under way: three windows, overlapping, lost
    once (seen: their sum exceeded the run, and the report printed 220,928,000,000,000 samples/s)."""
    t0 = 1000.0
    timeline = [(t0 + t, t * 10, 100) for t in range(1, 61) if not 20 < t < 50]
    events = [Event(20.0, "kill", "ps:1", 200), Event(23.0, "kill", "ps:2", 195), Event(23.0, "kill", "chief:0", 195),
              Event(49.5, "resumed", "ps:2", 195), Event(49.5, "resumed", "chief:0", 195),
              Event(49.6, "resumed", "ps:1", 195)]
    steady, effective = steady_rates(timeline, events, t0, warmup_step=50)
    # warm-up ends at t=5; records after it: t=6..20 and 50..60 = 26 datagrams; lost: 20 -> 49.6
    assert steady == pytest.approx(2600 / (55 - 29.6))
    assert effective == pytest.approx(2600 / 55)
