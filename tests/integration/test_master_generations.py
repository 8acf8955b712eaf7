"""Every master call that changes state checks the caller's generation (issue 30, case 5).

A process superseded by a restarted incarnation of its task (a new registration, a new generation)
may still be running its last lines: its calls must change nothing.  Over real gRPC on 127.0.0.1,
port 0, with a client per process (each registers with its own instance id, as processes do).

The audit of the state-changing RPCs (`tf_ecrec.master.servicer`):

========================  =====================================================================
RPC                       the caller's generation
========================  =====================================================================
Register                  issues one (a retry by the same process keeps it)
Heartbeat, Deregister,    checked (TaskRef), as before
UpdateTaskAddress,
Barrier, GetShard,
ReportProgress
ReportFailure             whole task: the generation reported lost, checked (any caller may
                          report it); with shard ids: the holder's, checked here (was skipped,
                          and the client sent none)
RestoreShardCheckpoint    checked here (TaskRef in the request; was anyone's)
Register (again)          refused to a process a later one superseded (its instance id; it
                          re-registered, releasing its successor's leases, and each took the
                          slot from the other in turn); a process declared lost may rejoin
RegisterDataset           no caller: idempotent, one definition per name
ExtendDataset             no caller: the job driver's stream watermark
========================  =====================================================================
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from tf_ecrec.errors import InvalidRequestError, StaleGenerationError
from tf_ecrec.master.client import MasterClient
from tf_ecrec.master.proto import master_pb2 as pb
from tf_ecrec.master.proto import master_pb2_grpc as pb_grpc
from tf_ecrec.master.server import MasterHandle, start_master


@pytest.fixture
def master(tmp_path) -> Iterator[MasterHandle]:
    handle = start_master(state_dir=str(tmp_path / "state"), heartbeat_timeout=30.0, fsync=False)
    yield handle
    handle.stop(grace=0)


def process(master: MasterHandle, task: str) -> MasterClient:
    """One process of `task`, registered (a new generation of the task)."""
    task_type, _, index = task.partition(":")
    client = MasterClient(master.address, task_type, int(index))
    client.register(f"127.0.0.1:{2000 + int(index)}")
    return client


def test_a_superseded_trainer_cannot_give_back_its_successors_lease(master) -> None:
    old = process(master, "worker:0")
    old.register_dataset("train", 20, 10)
    first = old.get_shard("train").lease
    assert (first.shard_id, first.start, first.end) == (0, 0, 10)
    new = process(master, "worker:0")  # worker:0 restarted: generation 2; the old lease is requeued
    assert (old.generation, new.generation) == (1, 2)
    lease = new.get_shard("train").lease
    assert (lease.shard_id, lease.start, lease.end) == (0, 0, 10) and lease.attempt > first.attempt
    new.report_progress(lease, 3)
    before = new.data_state("train")
    # What LeasedData does when it stops (`_give_back`): the generation-1 process gives shard 0 back.
    with pytest.raises(StaleGenerationError, match="worker:0 generation 1 is stale"):
        old.report_failure(reason="worker:0 dropped them: stopped", dataset="train", shard_ids=[0],
                           not_a_failure=True)
    after = new.data_state("train")
    assert after == before and after.records_requeued == 10 and after.lease_holders == ("worker:0",), after
    other = process(master, "worker:1")
    assert other.get_shard("train").lease.shard_id == 1  # shard 0 is not handed to worker:1
    assert new.report_progress(lease, 10) is True  # generation 2's acknowledgement stands
    state = new.data_state("train")
    assert (state.records_trained, state.records_retrained, state.records_in_flight) == (10, 0, 10), state


def test_shards_given_back_name_the_generation_that_holds_them(master) -> None:
    worker = process(master, "worker:0")
    worker.register_dataset("train", 20, 10)
    lease = worker.get_shard("train").lease
    with grpc.insecure_channel(master.address) as channel:
        stub = pb_grpc.MasterStub(channel)
        with pytest.raises(grpc.RpcError) as info:  # a raw request without a generation: not a wildcard
            stub.ReportFailure(pb.ReportFailureRequest(task_id="worker:0", shard_ids=[lease.shard_id],
                                                       dataset="train", not_a_failure=True), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "names the generation holding the shards" in info.value.details()
    assert worker.data_state("train").lease_holders == ("worker:0",)
    # The live holder gives its own lease back (the client sends its generation).
    assert worker.report_failure(reason="rebuilt", dataset="train", shard_ids=[lease.shard_id],
                                 not_a_failure=True) == 10


def test_a_superseded_chief_cannot_roll_the_progress_back(master) -> None:
    old = process(master, "chief:0")
    old.register_dataset("train", 30, 10)
    blob = old.shard_checkpoint("train")
    lease = old.get_shard("train").lease
    new = process(master, "chief:0")
    lease = new.get_shard("train").lease
    new.report_progress(lease, 10)
    with pytest.raises(StaleGenerationError, match="chief:0 generation 1 is stale"):
        old.restore_shard_checkpoint("train", blob)
    assert new.data_state("train").records_trained == 10
    with grpc.insecure_channel(master.address) as channel, pytest.raises(grpc.RpcError) as info:
        pb_grpc.MasterStub(channel).RestoreShardCheckpoint(pb.ShardCheckpoint(dataset="train", blob=blob), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "names its caller" in info.value.details()
    assert new.data_state("train").records_trained == 10
    state = new.restore_shard_checkpoint("train", blob)  # the current chief may
    assert (state.records_trained, state.records_in_flight) == (10, 0), state


def test_a_task_less_client_cannot_restore(master) -> None:
    process(master, "chief:0").register_dataset("train", 30, 10)
    launcher = MasterClient(master.address, None)
    with pytest.raises(InvalidRequestError, match="names its caller"):
        launcher.restore_shard_checkpoint("train", launcher.shard_checkpoint("train"))


def test_a_superseded_process_cannot_register_again_over_its_successor(master) -> None:
    old = process(master, "worker:0")
    old.register_dataset("train", 20, 10)
    new = process(master, "worker:0")
    lease = new.get_shard("train").lease
    # What the old process's membership thread did on its heartbeat's StaleGenerationError: register again.
    with pytest.raises(StaleGenerationError, match=r"worker:0: this process .* was superseded by generation 2"):
        old.register("127.0.0.1:2000")
    assert new.generation == 2 and new.report_progress(lease, 10) is True  # the successor keeps its lease
    assert new.get_cluster().alive()["worker:0"].generation == 2
    # A process declared lost (not superseded) registers again, as before: a new generation.
    launcher = MasterClient(master.address, None)
    launcher.report_failure("worker:0", reason="silent", generation=2)
    new.register("127.0.0.1:2000")
    assert new.generation == 3


def test_a_superseded_processs_membership_stops_instead_of_taking_the_slot_back(master) -> None:
    import time

    from tf_ecrec.master.membership import EmbeddedMembership
    from tf_ecrec.membership.base import EventKind, Member

    old, new = (EmbeddedMembership(master.address, heartbeat_interval=0.1, timeout=5.0) for _ in range(2))
    events: list[EventKind] = []
    old.watch(lambda event: events.append(event.kind))
    try:
        old.join(Member("worker", 0, "127.0.0.1:2000"))
        new.join(Member("worker", 0, "127.0.0.1:2000"))  # worker:0 restarted while the old process still runs
        time.sleep(1.5)  # 15 heartbeat intervals: the old one's heartbeat is refused, its rejoin too
        assert old.member is None and EventKind.SELF_LOST in events and EventKind.SELF_REJOINED not in events, events
        with MasterClient(master.address, None) as observer:
            assert observer.get_cluster().alive()["worker:0"].generation == 2
        assert new.member is not None and new.member.generation == 2
    finally:
        old.close()
        new.close()
