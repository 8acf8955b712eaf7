"""The failover loop's states and waits, its cluster sources (file and a real master), the migration hook's source mode.

The loop's Estimator is a scripted stand-in here (the logic under test is the
state machine); tests/e2e/test_ecrec.py runs the same transitions with real
TensorFlow servers, a PS moved to a new port or to a spare, and the chief's rebuild.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import tensorflow as tf

from tf_ecrec.cluster.ps_session import session_config
from tf_ecrec.cluster.tf_config import ClusterConfig
from tf_ecrec.errors import ConfigError, RecoveryError
from tf_ecrec.master.client import MasterClient
from tf_ecrec.master.server import start_master
from tf_ecrec.session.cluster_source import FileClusterSource, MasterClusterSource, write_cluster_file
from tf_ecrec.session.failover import FailoverLoop, State
from tf_ecrec.session.migration import ClusterSourceMigrationHook

PS = ["127.0.0.1:3000", "127.0.0.1:3001", "127.0.0.1:3002"]


def _cluster(task_type="chief", index=0, ps=PS):
    return ClusterConfig({"ps": tuple(ps), "chief": ("127.0.0.1:2000",), "worker": ("127.0.0.1:2001",)}, task_type, index)


class Source:
    """A scripted cluster source: a list of answers, the last one repeated."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = 0

    def ps_addresses(self):
        self.calls += 1
        return list(self.answers[min(self.calls - 1, len(self.answers) - 1)])


class Estimator:
    """Runs one scripted outcome per train() call: "ok", an exception, or "migrate" (drives the hook)."""

    def __init__(self, outcome, seen):
        self.outcome = outcome
        self.seen = seen

    def train(self, input_fn, max_steps=None, hooks=(), saving_listeners=None):
        self.seen.append({"tf_config": json.loads(os.environ["TF_CONFIG"]), "max_steps": max_steps, "hooks": list(hooks)})
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        if self.outcome == "migrate":
            hook = hooks[-1]
            hook.begin()
            deadline = time.time() + 5
            stopped = []
            while not stopped and time.time() < deadline:
                hook.after_run(type("Ctx", (), {"request_stop": lambda self: stopped.append(1)})(), None)
                time.sleep(0.01)
            hook.end(None)
            assert stopped, "the hook never requested a stop"


def _loop(outcomes, source, **kwargs):
    seen, configs = [], []
    script = iter(outcomes)

    def build(cluster, config):
        configs.append((cluster, config))
        return Estimator(next(script), seen)

    kwargs.setdefault("poll_secs", 0.01)
    return FailoverLoop(_cluster(), build, source, **kwargs), seen, configs


def test_training_that_ends_normally_builds_once_and_is_done(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    loop, seen, configs = _loop(["ok"], Source(PS))
    loop.train(lambda: None, max_steps=7, hooks=["user-hook"])
    assert [s for _, s, _ in loop.history] == [State.BUILD, State.TRAIN, State.DONE]
    assert seen[0]["tf_config"]["cluster"]["ps"] == PS and seen[0]["max_steps"] == 7
    assert seen[0]["hooks"][0] == "user-hook" and isinstance(seen[0]["hooks"][1], ClusterSourceMigrationHook)
    assert len(configs) == 1


def test_a_failed_session_waits_for_the_moved_ps_and_rebuilds_for_its_new_address(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    moved = [PS[0], "127.0.0.1:4001", PS[2]]
    source = Source([PS[0], None, PS[2]], [PS[0], None, PS[2]], moved)
    error = tf.errors.DeadlineExceededError(None, None, "Timed out waiting for /job:ps/task:1")
    loop, seen, configs = _loop([error, "ok"], source)
    loop.train(lambda: None)
    states = [s for _, s, _ in loop.history]
    assert states == [State.BUILD, State.TRAIN, State.WAIT, State.BUILD, State.TRAIN, State.DONE]
    assert "DeadlineExceededError" in loop.history[2][2]
    assert "PS moved" in loop.history[3][2] and "127.0.0.1:4001" in loop.history[3][2]
    assert seen[1]["tf_config"]["cluster"]["ps"] == moved  # TF_CONFIG rebuilt before the Estimator
    assert list(configs[1][0].ps_addresses) == moved and loop.cluster.ps_addresses == tuple(moved)
    # The session of the rebuilt Estimator carries the new cluster.
    jobs = {j.name: dict(j.tasks) for j in configs[1][1].cluster_def.job}
    assert jobs == {"ps": dict(enumerate(moved)), "chief": {0: "127.0.0.1:2000"}}


def test_the_migration_hook_stops_a_live_session_and_the_loop_follows(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    moved = ["127.0.0.1:5000", PS[1], PS[2]]
    loop, seen, _ = _loop(["migrate", "ok"], Source(PS, PS, moved))
    loop.train(lambda: None)
    assert [s for _, s, _ in loop.history] == [State.BUILD, State.TRAIN, State.WAIT, State.BUILD, State.TRAIN, State.DONE]
    assert "migration hook" in loop.history[2][2]
    assert seen[1]["tf_config"]["cluster"]["ps"] == moved


def test_a_ps_back_at_its_old_address_rebuilds_with_the_same_cluster(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    loop, seen, _ = _loop([tf.errors.UnavailableError(None, None, "Socket closed"), "ok"], Source(PS))
    loop.train(lambda: None)
    assert "same addresses" in loop.history[3][2] and seen[1]["tf_config"]["cluster"]["ps"] == PS


class RecreatingEstimator:
    """An Estimator holding the session config like tf.estimator's: its train() fails a session while the PS
    moves, then re-creates sessions from that same config (as MonitoredSession does) until one reaches the
    moved PS; the hook sees each creation and each step."""

    def __init__(self, config, moved, seen):
        self._session_config = config
        self.moved = moved
        self.seen = seen

    def train(self, input_fn, max_steps=None, hooks=(), saving_listeners=None):
        hook = hooks[-1]
        hook.begin()
        ctx = type("Ctx", (), {"request_stop": lambda self: self.stops.append(1), "stops": []})()
        hook.after_create_session(None, None)
        hook.after_run(ctx, None)  # a step on the first session
        deadline = time.time() + 5
        creations = 0
        while time.time() < deadline:  # the PS died: MonitoredSession re-creates from the same config
            creations += 1
            ps = {j.name: dict(j.tasks) for j in self._session_config.cluster_def.job}["ps"]
            if list(ps.values()) == self.moved:
                break
            time.sleep(0.01)
        hook.after_create_session(None, None)
        hook.after_run(ctx, None)
        hook.after_run(ctx, None)
        hook.end(None)
        self.seen.append({"creations": creations, "stops": len(ctx.stops)})


def test_a_step_tensorflow_cancelled_is_a_session_failure_and_training_goes_on(monkeypatch):
    # What a fold round on a worker raised once (CI, the zombie test): only a peer's cancelled RecvTensor reached
    # the master, so TensorFlow reported CANCELLED. Before, it left the trainer with exit code 1.
    monkeypatch.delenv("TF_CONFIG", raising=False)
    error = tf.errors.CancelledError(None, None, '{"grpc_status":1} [[ECOptimizer/fold_round/EcRec>DeltaLogCommitEach_1]]')
    loop, seen, _ = _loop([error, "ok"], Source(PS))
    loop.train(lambda: None)
    assert [s for _, s, _ in loop.history] == [State.BUILD, State.TRAIN, State.WAIT, State.BUILD, State.TRAIN,
                                               State.DONE]
    assert "CancelledError" in loop.history[2][2] and len(seen) == 2


def test_a_move_seen_while_training_retargets_the_live_session_config_and_training_goes_on(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    moved = [PS[0], "127.0.0.1:4001", PS[2]]
    seen, transitions = [], []
    loop = FailoverLoop(_cluster(), lambda c, config: RecreatingEstimator(config, moved, seen),
                        Source(PS, PS, [PS[0], None, PS[2]], moved), poll_secs=0.01,
                        on_transition=lambda state, reason: transitions.append(state))
    loop.train(lambda: None)
    # One Estimator, one train() call: the re-created session reached the moved PS, and no stop was asked.
    assert [s for _, s, _ in loop.history] == [State.BUILD, State.TRAIN, State.RETARGET, State.DONE]
    assert len(seen) == 1 and seen[0]["stops"] == 0 and seen[0]["creations"] >= 1
    assert "127.0.0.1:4001" in loop.history[2][2] and loop.cluster.ps_addresses == tuple(moved)
    assert transitions == [State.BUILD, State.TRAIN, State.RETARGET, State.DONE]


@pytest.mark.parametrize("published", [7, None])
def test_a_retarget_raises_the_graphs_step_generation_to_the_moved_clusters_version(monkeypatch, tmp_path, published):
    """Issue 33: a trainer that follows a move in place keeps its graph; the generation its next sessions' steps
    carry is the cluster's version (the file's when it publishes one, else one more per move), raised before the
    session config names the new cluster.  Before the fix it stayed the graph's build version (0)."""
    from tf_ecrec.erasure.code import ECConfig
    from tf_ecrec.step.embedding import ECContext, set_context

    monkeypatch.delenv("TF_CONFIG", raising=False)
    moved = [PS[0], "127.0.0.1:4001", PS[2]]
    if published is None:
        source = Source(PS, PS, moved)
    else:
        path = str(tmp_path / "cluster.json")
        write_cluster_file(path, {"ps": moved, "chief": ["127.0.0.1:2000"]}, version=published)
        source = FileClusterSource(path, 3)
    seen = []
    with tf.Graph().as_default():  # the graph Estimator.train builds: ec_model_fn sets its context
        context = ECContext(ECConfig(2, 1), 3, 0)
        set_context(context)
        loop = FailoverLoop(_cluster(), lambda c, config: RecreatingEstimator(config, moved, seen), source, poll_secs=0.01)
        loop.train(lambda: None)
    expected = 1 if published is None else published
    assert [s for _, s, _ in loop.history] == [State.BUILD, State.TRAIN, State.RETARGET, State.DONE]
    assert loop.cluster.version == expected and context.generation == expected
    assert context.steps.value == 0  # raised for the steps of the next session only (SessionGenerationHook)
    assert f"cluster version {expected}" in loop.history[2][2]


def test_the_file_source_reads_the_version_the_launcher_writes_beside_the_jobs(tmp_path):
    from tf_ecrec.session.cluster_source import read_view

    path = str(tmp_path / "cluster.json")
    write_cluster_file(path, {"ps": PS}, version=3)
    assert read_view(FileClusterSource(path, 3)).version == 3 and FileClusterSource(path, 3).ps_addresses() == PS
    write_cluster_file(path, {"ps": PS})
    assert read_view(FileClusterSource(path, 3)).version is None  # an operator's file without one
    assert read_view(Source(PS)).version is None  # a source that publishes none
    with open(path, "w") as fh:
        json.dump({"ps": PS, "version": -1}, fh)
    with pytest.raises(ConfigError, match=r"version=-1; rule: an integer >= 0"):
        FileClusterSource(path, 3).ps_addresses()


def test_the_file_source_reads_an_unchanged_file_with_a_stat_and_sees_every_replacement(tmp_path, monkeypatch):
    """Trainers poll the cluster file every 20 ms (`FileClusterSource.poll_secs`): an unchanged file is not read
    again, and every version the launcher writes (an atomic replace) is seen at the next poll."""
    import tf_ecrec.session.cluster_source as cluster_source

    path = str(tmp_path / "cluster.json")
    write_cluster_file(path, {"ps": PS}, version=1)
    source = FileClusterSource(path, 3)
    assert FailoverLoop(_cluster(), lambda c, config: None, source)._poll == FileClusterSource.poll_secs
    view = source.ps_view()
    view.addresses[0] = "mutated by a caller"
    loads = []
    real_load = json.load
    monkeypatch.setattr(cluster_source.json, "load", lambda fh: loads.append(fh.name) or real_load(fh))
    assert source.ps_view() == cluster_source.PsView(PS, 1) and loads == []  # a stat, no read
    moved = [PS[0], "127.0.0.1:4001", PS[2]]
    for version in (2, 3):  # two replacements in a row, as fast as the launcher can write them
        write_cluster_file(path, {"ps": moved if version == 2 else PS}, version=version)
        assert source.ps_view() == cluster_source.PsView(moved if version == 2 else PS, version)
    assert loads == [path, path]


def test_a_session_created_before_a_retarget_is_stopped_and_rebuilt():
    """A session still on the old cluster (its PS alive) must not go on after the move: the hook stops it."""
    stops = []
    ctx = type("Ctx", (), {"request_stop": lambda self: stops.append(1)})()
    targets = []
    hook = ClusterSourceMigrationHook(Source(PS, ["127.0.0.1:5000", PS[1], PS[2]]), PS, poll_secs=0.01,
                                      retarget=lambda addresses, version, steps: targets.append(addresses))
    hook.begin()
    hook.after_create_session(None, None)
    deadline = time.time() + 5
    while not targets and time.time() < deadline:
        time.sleep(0.01)
    hook.after_run(ctx, None)
    hook.end(None)
    assert targets == [["127.0.0.1:5000", PS[1], PS[2]]] and hook.retargets == 1
    assert stops == [1] and hook.migration is not None


def test_a_stop_asked_of_a_stale_session_is_withdrawn_when_a_session_for_the_new_cluster_replaces_it():
    """The stale session fails before it stops (its next step meets the moved PS) and MonitoredSession creates
    the next one itself, after the retarget: that one trains on, and Estimator.train's end is no migration
    (else the loop would rebuild the Estimator for nothing).  A change no retarget followed stays a migration."""
    stops = []
    ctx = type("Ctx", (), {"request_stop": lambda self: stops.append(1)})()
    moved = ["127.0.0.1:5000", PS[1], PS[2]]
    for follows in (True, False):
        def retarget(addresses, version, steps, follows=follows):
            if not follows:
                raise RuntimeError("no live config")

        stops.clear()
        hook = ClusterSourceMigrationHook(Source(PS, moved), PS, poll_secs=0.01, retarget=retarget)
        hook.begin()
        hook.after_create_session(None, None)
        deadline = time.time() + 5
        while not hook.retargets and not hook._changed.is_set() and time.time() < deadline:
            time.sleep(0.01)
        hook.after_run(ctx, None)  # a step of the session from before the move completes: stop it
        assert stops == [1] and hook.migration is not None
        hook.after_create_session(None, None)  # it failed instead; MonitoredSession made the next one
        for _ in range(3):
            hook.after_run(ctx, None)
        hook.end(None)
        if follows:
            assert hook.retargets == 1 and hook.migration is None and stops == [1]
        else:
            assert hook.retargets == 0 and hook.migration is not None and stops == [1]


def test_a_retarget_that_fails_stops_the_session_instead():
    stops = []
    ctx = type("Ctx", (), {"request_stop": lambda self: stops.append(1)})()

    def broken(addresses, version, steps):
        raise RuntimeError("no live config")

    hook = ClusterSourceMigrationHook(Source(PS, ["127.0.0.1:5000", PS[1], PS[2]]), PS, poll_secs=0.01,
                                      retarget=broken)
    hook.begin()
    hook.after_create_session(None, None)
    deadline = time.time() + 5
    while not stops and time.time() < deadline:
        hook.after_run(ctx, None)
        time.sleep(0.01)
    hook.end(None)
    assert stops == [1] and hook.retargets == 0


def test_a_real_estimator_creates_its_sessions_from_the_config_the_loop_retargets(tmp_path):
    """The contract retargeting rests on, checked on tf.estimator itself: the ConfigProto the Estimator passes
    to its sessions is found from the one `build` was given, also when RunConfig.replace copied it."""
    from tf_ecrec.cluster.ps_session import live_session_config

    config = session_config(_cluster(), 5.0)
    run_config = tf.estimator.RunConfig(model_dir=str(tmp_path), session_config=config)
    run_config = run_config.replace(save_summary_steps=7)  # deep-copies the ConfigProto
    estimator = tf.estimator.Estimator(model_fn=lambda features, labels, mode: None, config=run_config)
    live = live_session_config(estimator, config)
    assert live is not None and live.cluster_def == config.cluster_def
    # What the Estimator hands to MonitoredTrainingSession is that very object.
    assert live is estimator._session_config
    other = session_config(_cluster(ps=["127.0.0.1:9", PS[1], PS[2]]), 5.0)
    assert live_session_config(estimator, other) is None  # a build that ignored its config: no retarget


def test_a_ps_that_never_comes_back_is_a_recovery_error_within_the_wait(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    loop, _, _ = _loop([tf.errors.UnavailableError(None, None, "down")], Source([PS[0], None, PS[2]]), wait_secs=0.3)
    start = time.monotonic()
    with pytest.raises(RecoveryError, match=r"chief:0: PS tasks ps:1 not alive within 0 s"):
        loop.train(lambda: None)
    assert time.monotonic() - start < 3


def test_failovers_beyond_the_limit_are_a_recovery_error(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    errors = [tf.errors.AbortedError(None, None, "again")] * 3
    loop, _, _ = _loop(errors, Source(PS), max_failovers=2)
    with pytest.raises(RecoveryError, match=r"2 failovers in a row without a completed step, more than max_failovers = 2"):
        loop.train(lambda: None)


def test_failovers_between_which_steps_complete_do_not_add_up(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)

    class Stepping(Estimator):
        def train(self, input_fn, max_steps=None, hooks=(), saving_listeners=None):
            hooks[-1].after_run(type("Ctx", (), {"request_stop": lambda self: None})(), None)  # one step done
            super().train(input_fn, max_steps, hooks, saving_listeners)

    seen = []
    script = iter([tf.errors.AbortedError(None, None, "again")] * 4 + ["ok"])
    loop = FailoverLoop(_cluster(), lambda c, s: Stepping(next(script), seen), Source(PS), max_failovers=1, poll_secs=0.01)
    loop.train(lambda: None)
    assert len(seen) == 5 and loop.history[-1][1] is State.DONE


def test_other_errors_are_not_failovers(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    loop, _, _ = _loop([tf.errors.InvalidArgumentError(None, None, "bad ids")], Source(PS))
    with pytest.raises(tf.errors.InvalidArgumentError):
        loop.train(lambda: None)
    assert [s for _, s, _ in loop.history] == [State.BUILD, State.TRAIN]


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match=r"runs trainers, not ps:0"):
        FailoverLoop(_cluster("ps", 0), lambda c, s: None, Source(PS))
    with pytest.raises(ConfigError, match=r"wait_secs=0"):
        FailoverLoop(_cluster(), lambda c, s: None, Source(PS), wait_secs=0)
    with pytest.raises(ConfigError, match=r"session timeout 0 s"):
        session_config(_cluster(), 0)


def test_session_config_propagates_the_cluster_with_shared_state_and_a_timeout():
    base = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    config = session_config(_cluster("worker", 0), 7.5, base)
    jobs = {j.name: dict(j.tasks) for j in config.cluster_def.job}
    assert jobs == {"ps": dict(enumerate(PS)), "worker": {0: "127.0.0.1:2001"}}
    assert config.experimental.share_session_state_in_clusterspec_propagation
    assert config.rpc_options.use_rpc_for_inprocess_master
    assert config.operation_timeout_in_ms == 7500 and config.allow_soft_placement


# ---- sources ------------------------------------------------------------------------------------------


def test_file_source_reads_what_the_writer_replaced(tmp_path):
    path = str(tmp_path / "cluster.json")
    write_cluster_file(path, {"ps": PS, "chief": ["127.0.0.1:2000"]})
    source = FileClusterSource(path, 3)
    assert source.ps_addresses() == PS
    write_cluster_file(path, {"ps": [PS[0], "", PS[2]], "chief": ["127.0.0.1:2000"]})
    assert source.ps_addresses() == [PS[0], None, PS[2]]
    assert os.listdir(tmp_path) == ["cluster.json"]  # no temporary left behind
    with pytest.raises(ConfigError, match=r"lists 3 PS tasks, the job has 2"):
        FileClusterSource(path, 2).ps_addresses()
    with pytest.raises(ConfigError, match=r"not readable JSON"):
        FileClusterSource(str(tmp_path / "missing.json"), 3).ps_addresses()


def test_master_source_reports_alive_ps_at_their_last_address():
    master = start_master(fsync=False)
    try:
        clients = [MasterClient(master.address, "ps", i, timeout=2.0) for i in range(3)]
        for client, address in zip(clients, PS):
            client.register(address)
        watcher = MasterClient(master.address, "chief", 0, timeout=2.0)
        source = MasterClusterSource(watcher, 3)
        assert source.ps_addresses() == PS
        watcher.report_failure("ps:1", reason="killed by the test", generation=clients[1].generation)
        assert source.ps_addresses() == [PS[0], None, PS[2]]
        MasterClient(master.address, "ps", 1, timeout=2.0).register("127.0.0.1:4001")
        assert source.ps_addresses() == [PS[0], "127.0.0.1:4001", PS[2]]
    finally:
        master.stop(grace=0)


def test_the_file_and_the_master_agree_on_the_same_story(tmp_path):
    # The same three moments through both sources: all up, ps:1 down, ps:1 at a new port.
    path = str(tmp_path / "cluster.json")
    moments = [PS, [PS[0], None, PS[2]], [PS[0], "127.0.0.1:4001", PS[2]]]
    master = start_master(fsync=False)
    try:
        ps = [MasterClient(master.address, "ps", i, timeout=2.0) for i in range(len(PS))]
        for client, address in zip(ps, PS):
            client.register(address)
        watcher = MasterClient(master.address, "chief", 0, timeout=2.0)
        by_master, by_file = [], []
        for k, moment in enumerate(moments):
            if k == 1:
                watcher.report_failure("ps:1", reason="down", generation=ps[1].generation)
            if k == 2:
                MasterClient(master.address, "ps", 1, timeout=2.0).register(moment[1])
            write_cluster_file(path, {"ps": [a or "" for a in moment]})
            by_master.append(MasterClusterSource(watcher, 3).ps_addresses())
            by_file.append(FileClusterSource(path, 3).ps_addresses())
        assert by_master == by_file == moments
    finally:
        master.stop(grace=0)


def test_hook_in_source_mode_ignores_a_ps_that_is_down_and_one_back_at_its_address():
    answers = Source(PS, [PS[0], None, PS[2]], PS, PS)
    hook = ClusterSourceMigrationHook(answers, PS, poll_secs=0.01)
    hook.begin()
    deadline = time.time() + 0.5
    while answers.calls < 4 and time.time() < deadline:
        time.sleep(0.01)
    stopped = []
    hook.after_run(type("Ctx", (), {"request_stop": lambda self: stopped.append(1)})(), None)
    hook.end(None)
    assert answers.calls >= 4 and not stopped and hook.migration is None
    with pytest.raises(ConfigError, match=r"needs source= and expected_ps="):
        ClusterSourceMigrationHook(answers, None)
    with pytest.raises(ConfigError, match=r"poll_secs=0; rule: > 0"):
        ClusterSourceMigrationHook(answers, PS, poll_secs=0)


def test_fast_reconnect_sets_grpc_backoff_options_unless_the_user_set_them(monkeypatch):
    from tf_ecrec.cluster.ps_session import GRPC_RECONNECT_OPTIONS, fast_reconnect

    monkeypatch.delenv("TF_GRPC_DEFAULT_OPTIONS", raising=False)
    fast_reconnect()
    assert os.environ["TF_GRPC_DEFAULT_OPTIONS"] == GRPC_RECONNECT_OPTIONS
    assert "grpc.min_reconnect_backoff_ms=200" in GRPC_RECONNECT_OPTIONS
    monkeypatch.setenv("TF_GRPC_DEFAULT_OPTIONS", "grpc.keepalive_time_ms=1000")
    fast_reconnect()
    assert os.environ["TF_GRPC_DEFAULT_OPTIONS"] == "grpc.keepalive_time_ms=1000"


def test_the_trainers_sessions_run_without_grappler_unless_asked_or_given_a_base(monkeypatch):
    """A recovery is a dozen first calls on a new session, each optimised by Grappler when it is on: the sessions the
    loop makes turn it off (measured: 0.4-0.5 s less from a PS kill to the first step); TF_ECREC_GRAPPLER=on keeps
    TensorFlow's default, and a base config's graph options are the caller's."""
    from tf_ecrec.cluster.ps_session import ENV_GRAPPLER, propagated_config

    monkeypatch.delenv(ENV_GRAPPLER, raising=False)
    cluster = {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}
    assert propagated_config(cluster, 5).graph_options.rewrite_options.disable_meta_optimizer
    base = tf.compat.v1.ConfigProto()
    base.graph_options.rewrite_options.constant_folding = 2  # OFF, the caller's choice
    kept = propagated_config(cluster, 5, base).graph_options.rewrite_options
    assert not kept.disable_meta_optimizer and kept.constant_folding == 2
    monkeypatch.setenv(ENV_GRAPPLER, "on")
    assert not propagated_config(cluster, 5).graph_options.rewrite_options.disable_meta_optimizer
