"""The master over real gRPC on 127.0.0.1, port 0: API, status codes, barriers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from tf_ecrec.base.retry import Retry
from tf_ecrec.errors import (
    AuthenticationError,
    BarrierTimeout,
    ConfigError,
    InvalidRequestError,
    MasterError,
    MasterUnavailable,
    MembershipLost,
    NotFoundError,
    StaleGenerationError,
)
from tf_ecrec.master.client import MasterClient
from tf_ecrec.master.proto import master_pb2 as pb
from tf_ecrec.master.proto import master_pb2_grpc as pb_grpc
from tf_ecrec.master.server import MasterHandle, start_master
from tf_ecrec.master.sharding import ShardStatus
from tf_ecrec.master.wire import ERROR_KEY


@pytest.fixture
def master(tmp_path) -> Iterator[MasterHandle]:
    handle = start_master(state_dir=str(tmp_path / "state"), heartbeat_timeout=30.0,
                          fsync=False)
    yield handle
    handle.stop(grace=0)


def client(master: MasterHandle, task: str, **kwargs) -> MasterClient:
    task_type, _, index = task.partition(":")
    return MasterClient(master.address, task_type, int(index), **kwargs)


def registered(master: MasterHandle, task: str, port: int = 2000) -> MasterClient:
    c = client(master, task)
    c.register(f"127.0.0.1:{port}")
    return c


def raw_error(master: MasterHandle, method: str, request) -> grpc.RpcError:
    with grpc.insecure_channel(master.address) as channel, pytest.raises(grpc.RpcError) as info:
        getattr(pb_grpc.MasterStub(channel), method)(request, timeout=5)
    return info.value


def error_name(error: grpc.RpcError) -> str:
    return dict(error.trailing_metadata() or ()).get(ERROR_KEY, "")


def test_master_binds_to_loopback_by_default(master) -> None:
    assert master.address.startswith("127.0.0.1:") and master.port > 0


def test_unknown_task_id_is_not_found_naming_the_task(master) -> None:
    error = raw_error(master, "Heartbeat", pb.HeartbeatRequest(
        task=pb.TaskRef(task_id="worker:9", generation=1)))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "worker:9" in error.details() and error_name(error) == "NotFoundError"


def test_malformed_requests_are_invalid_argument_with_value_and_rule(master) -> None:
    error = raw_error(master, "Register", pb.RegisterRequest(
        task_type="gpu", task_index=0, address="127.0.0.1:1"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'gpu'" in error.details() and "rule" in error.details()
    error = raw_error(master, "Heartbeat", pb.HeartbeatRequest(
        task=pb.TaskRef(task_id="worker-1", generation=1)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    c = client(master, "worker:0")
    with pytest.raises(InvalidRequestError, match="'nohost'"):
        c.register("nohost")
    for address in ("127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:http"):
        with pytest.raises(InvalidRequestError, match=f"{address!r} is malformed; rule: 'host:port' with 0 < port < 65536"):
            c.register(address)
    with pytest.raises(InvalidRequestError, match=r"shard_records=0; rule: an integer >= 1"):
        c.register_dataset("train", 100, 0)


def test_stale_generation_is_failed_precondition_and_typed(master) -> None:
    old = registered(master, "worker:0")
    new = registered(master, "worker:0", port=2001)
    assert new.generation == old.generation + 1
    with pytest.raises(StaleGenerationError, match="generation 1 is stale"):
        old.heartbeat()
    error = raw_error(master, "Heartbeat", pb.HeartbeatRequest(
        task=pb.TaskRef(task_id="worker:0", generation=1)))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_token_mismatch_is_unauthenticated(tmp_path) -> None:
    with start_master(token="s3cret", fsync=False) as handle:
        good = MasterClient(handle.address, "worker", 0, token="s3cret")
        good.register("127.0.0.1:2000")
        for token in ("wrong", None):
            bad = MasterClient(handle.address, "worker", 1, token=token)
            with pytest.raises(AuthenticationError, match="does not match the job token"):
                bad.get_cluster()
        error = raw_error(handle, "GetCluster", pb.GetClusterRequest())
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED


def test_register_is_idempotent_per_process_and_versions_track_changes(master) -> None:
    ps = client(master, "ps:0")
    first = ps.register("127.0.0.1:3000")
    again = ps.register("127.0.0.1:3000")  # A retry: same generation, no bump.
    assert (again.version, again.ps_version, ps.generation) == (first.version,
                                                               first.ps_version, 1)
    worker = registered(master, "worker:0")
    cluster = worker.get_cluster()
    assert (cluster.version, cluster.ps_version) == (first.version + 1, first.ps_version)
    moved = ps.update_address("127.0.0.1:3001")
    assert (moved.version, moved.ps_version) == (cluster.version + 1, cluster.ps_version + 1)
    assert ps.update_address("127.0.0.1:3001").version == moved.version
    restarted = client(master, "ps:0").register("127.0.0.1:3001")  # New process, new gen.
    assert restarted.ps_version == moved.ps_version + 1
    assert restarted.tf_cluster() == {"ps": ["127.0.0.1:3001"], "worker": ["127.0.0.1:2000"]}


def test_get_shard_distinguishes_wait_drain_and_end(master) -> None:
    a, b = registered(master, "worker:0"), registered(master, "worker:1")
    a.register_dataset("train", 100, 60)
    first, second = a.get_shard("train"), a.get_shard("train")
    assert (first.lease.start, first.lease.end, second.lease.start, second.lease.end) == (
        0, 60, 60, 100)
    assert b.get_shard("train").status is ShardStatus.WAIT   # Holds nothing: stand by.
    assert a.get_shard("train").status is ShardStatus.DRAIN  # Finish your own shards.
    a.report_progress(first.lease, 60)
    a.report_progress(second.lease, 40)
    assert b.get_shard("train").status is ShardStatus.END
    state = b.data_state("train")
    assert (state.records_total, state.records_trained, state.finished) == (100, 100, True)


def test_waiting_for_a_shard_is_bounded_by_wait_timeout(master) -> None:
    holder, waiter = registered(master, "worker:0"), registered(master, "worker:1")
    holder.register_dataset("train", 10, 10)
    holder.get_shard("train")
    naps = []
    with pytest.raises(MasterError, match=r"no shard became free within 0.3s"):
        for _ in waiter.iter_shards("train", wait_timeout=0.3,
                                    sleep=lambda s: (naps.append(s), time.sleep(0.1))):
            pass
    assert naps and all(s == 0.5 for s in naps)  # The master's retry_after.


def test_a_retried_get_shard_returns_the_same_lease(master) -> None:
    worker = registered(master, "worker:0")
    worker.register_dataset("train", 1000, 100)
    request = pb.GetShardRequest(task=pb.TaskRef(task_id="worker:0", generation=1),
                                 dataset="train", request_id=42)
    with grpc.insecure_channel(master.address) as channel:
        stub = pb_grpc.MasterStub(channel)
        first, retry = stub.GetShard(request, timeout=5), stub.GetShard(request, timeout=5)
        request.request_id = 43
        nxt = stub.GetShard(request, timeout=5)
    assert first.shard == retry.shard
    assert nxt.shard.shard_id == first.shard.shard_id + 1


def test_unknown_dataset_is_not_found(master) -> None:
    worker = registered(master, "worker:0")
    with pytest.raises(NotFoundError, match="dataset 'nope' is not registered"):
        worker.get_shard("nope")


def test_conflicting_dataset_definition_is_refused(master) -> None:
    worker = registered(master, "worker:0")
    assert worker.register_dataset("train", 100, 10)[0] is True
    assert worker.register_dataset("train", 100, 10)[0] is False
    with pytest.raises(MasterError, match="one definition per dataset name"):
        worker.register_dataset("train", 200, 10)


def test_a_silent_task_is_declared_lost_and_its_records_requeued(tmp_path) -> None:
    with start_master(heartbeat_timeout=0.5, fsync=False) as handle:
        silent, other = registered(handle, "worker:0"), registered(handle, "worker:1")
        silent.register_dataset("train", 100, 100)
        lease = silent.get_shard("train").lease
        silent.report_progress(lease, 30)
        version = other.get_cluster().version
        deadline = time.monotonic() + 5
        while other.get_shard("train").status is ShardStatus.WAIT:
            other.heartbeat()
            assert time.monotonic() < deadline, "the silent task was never declared lost"
            time.sleep(0.05)
        state = other.data_state("train")
        assert (state.records_requeued, state.records_in_flight) == (70, 70)
        cluster = other.get_cluster()
        assert cluster.version == version + 1
        assert cluster.alive().keys() == {"worker:1"}
        with pytest.raises(MembershipLost, match="worker:0 generation 1 is lost"):
            silent.report_progress(lease, 50)


def test_reported_shard_failures_requeue_then_give_up(master) -> None:
    worker = registered(master, "worker:0")
    worker.register_dataset("train", 50, 50, max_shard_failures=1)
    for expected_requeued in (50, 50):
        lease = worker.get_shard("train").lease
        assert worker.report_failure(reason="corrupt record", dataset="train",
                                     shard_ids=[lease.shard_id]) == expected_requeued
    state = worker.data_state("train")
    assert (state.shards_failed, state.records_failed, state.finished) == (1, 50, True)
    assert worker.get_shard("train").status is ShardStatus.END


def test_shards_given_back_after_a_session_recreation_are_not_failures(master) -> None:
    worker = registered(master, "worker:0")
    worker.register_dataset("train", 50, 50, max_shard_failures=1)
    for _ in range(5):  # a crash-looping PS: the pipeline is rebuilt again and again
        lease = worker.get_shard("train").lease
        assert worker.report_failure(reason="pipeline rebuilt", dataset="train", shard_ids=[lease.shard_id],
                                     not_a_failure=True) == 50
    state = worker.data_state("train")
    assert (state.shards_failed, state.records_failed, state.finished) == (0, 0, False)
    lease = worker.get_shard("train").lease
    worker.report_progress(lease, 50)
    assert worker.data_state("train").records_trained == 50


def test_reporting_a_task_failure_requeues_its_records(master) -> None:
    worker, launcher = registered(master, "worker:0"), MasterClient(master.address, None)
    worker.register_dataset("train", 100, 40)
    worker.get_shard("train")
    worker.get_shard("train")
    with pytest.raises(InvalidRequestError, match="generation 0; rule: a task failure names the generation"):
        launcher.report_failure("worker:0", reason="no generation")  # the protobuf default is not a wildcard
    assert "worker:0" in launcher.get_cluster().alive()
    assert launcher.report_failure("worker:0", reason="process exited 137", generation=worker.generation) == 80
    assert launcher.get_cluster().alive() == {}


def test_barrier_passes_when_everyone_arrives_and_is_scoped_by_generation(master) -> None:
    tasks = [registered(master, f"worker:{i}") for i in range(3)]
    results = {}

    def arrive(c: MasterClient, generation: int) -> None:
        results[(c.task_id, generation)] = c.barrier("migrate", generation, timeout=10)

    for generation in (1, 2):
        threads = [threading.Thread(target=arrive, args=(c, generation)) for c in tasks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
    assert len(results) == 6
    assert all(arrived == ["worker:0", "worker:1", "worker:2"] for arrived in results.values())
    # A finished barrier passes at once for a late arrival; a new scope does not.
    assert tasks[0].barrier("migrate", 1, timeout=1) == ["worker:0", "worker:1", "worker:2"]
    with pytest.raises(BarrierTimeout):
        tasks[0].barrier("migrate", 3, timeout=0.3)


def test_barrier_times_out_within_its_deadline_naming_the_missing(master) -> None:
    present, _absent = registered(master, "chief:0"), registered(master, "worker:0")
    started = time.monotonic()
    with pytest.raises(BarrierTimeout, match=r"still waiting for \['worker:0'\] after 0.5s"):
        present.barrier("checkpoint", 7, timeout=0.5)
    assert time.monotonic() - started < 3
    error = raw_error(master, "Barrier", pb.BarrierRequest(
        task=pb.TaskRef(task_id="chief:0", generation=1), name="checkpoint", generation=8,
        timeout_s=0.2))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_barrier_stops_waiting_for_a_task_declared_lost(master) -> None:
    chief, worker = registered(master, "chief:0"), registered(master, "worker:0")
    launcher = MasterClient(master.address, None)
    threading.Timer(0.3, lambda: launcher.report_failure("worker:0", reason="killed", generation=worker.generation)).start()
    assert chief.barrier("migrate", 1, timeout=10) == ["chief:0"]


def test_barrier_without_timeout_is_invalid(master) -> None:
    chief = registered(master, "chief:0")
    with pytest.raises(InvalidRequestError, match="timeout_s=0"):
        chief.barrier("x", 1, timeout=0)


def test_shard_checkpoint_round_trips_through_the_service(master) -> None:
    worker = registered(master, "worker:0")
    worker.register_dataset("train", 300, 100)
    lease = worker.get_shard("train").lease
    worker.report_progress(lease, 100)
    blob = worker.shard_checkpoint("train")
    lease2 = worker.get_shard("train").lease
    worker.report_progress(lease2, 100)
    state = worker.restore_shard_checkpoint("train", blob)
    assert (state.records_trained, state.records_in_flight) == (200, 0)
    with pytest.raises(StaleGenerationError):
        worker.report_progress(lease2, 100)
    again = worker.get_shard("train").lease
    assert (again.start, again.end) == (100, 200)
    worker.report_progress(again, 100)
    assert worker.data_state("train").records_retrained == 100
    with pytest.raises(InvalidRequestError, match="not valid JSON"):
        worker.restore_shard_checkpoint("train", b"\x00garbage")
    # A structurally wrong checkpoint is refused before anything changes: the lease stays valid.
    import json
    good = json.loads(blob)
    held = worker.get_shard("train").lease
    before = worker.data_state("train")
    for broken in ({**good, "pending": [{"shard_id": 0}]}, {**good, "epoch": -1}, {k: v for k, v in good.items() if k != "failed"}):
        with pytest.raises(InvalidRequestError, match="shard checkpoint"):
            worker.restore_shard_checkpoint("train", json.dumps(broken).encode())
    assert worker.data_state("train") == before
    worker.report_progress(held, held.end - held.start)


def test_stopped_master_fails_calls_fast_and_releases_barrier_waiters(tmp_path) -> None:
    handle = start_master(fsync=False)
    chief = client(handle, "chief:0", retry=Retry(max_tries=2, delay=0.1))
    chief.register("127.0.0.1:2000")
    registered(handle, "worker:0")
    outcome = {}

    def wait() -> None:
        try:
            chief.barrier("never", 1, timeout=30)
        except Exception as exc:  # recorded for the assertion.
            outcome["error"] = exc

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)
    started = time.monotonic()
    handle.stop(grace=1.0)
    assert time.monotonic() - started < 3
    fast = MasterClient(handle.address, None, timeout=0.5,
                        retry=Retry(max_tries=50, delay=0.05, deadline=1.0))
    started = time.monotonic()
    with pytest.raises(MasterUnavailable, match="gave up after"):
        fast.get_cluster()
    assert time.monotonic() - started < 2.5
    waiter.join(40)
    assert isinstance(outcome.get("error"), MasterUnavailable)


@pytest.mark.parametrize("port", [-1, 65536, 70000, "50051", True])
def test_a_master_port_out_of_range_is_a_config_error_before_anything_starts(port) -> None:
    with pytest.raises(ConfigError, match=f"master port {port!r}; rule: 0 \\(any free port\\) or 1..65535"):
        start_master(port=port)
