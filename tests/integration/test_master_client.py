"""The client's bounded waits: the Retry policy, an unreachable master, a restart."""

from __future__ import annotations

import threading
import time

import pytest

from tf_ecrec.base.retry import Retry, retry_on
from tf_ecrec.errors import ConfigError, MasterUnavailable
from tf_ecrec.master.client import MasterClient
from tf_ecrec.master.replies import Cluster, TaskInfo
from tf_ecrec.master.server import start_master


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def fake_retry(clock: FakeTime, **kwargs) -> Retry:
    values = {"max_tries": 5, "delay": 1.0, "backoff": 2.0, "max_delay": 3.0, "max_jitter": 0.0,
                  "deadline": None, "retry_if": retry_on(ConnectionError), "sleep_func": clock.sleep,
                  "clock": clock.clock}
    values.update(kwargs)
    return Retry(**values)


def failing(times: int, error: Exception = ConnectionError("down")):
    calls = []

    def func() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise error
        return "ok"
    return func, calls


def test_retry_backs_off_exponentially_up_to_the_cap() -> None:
    clock = FakeTime()
    func, calls = failing(4)
    assert fake_retry(clock)(func) == "ok"
    assert (len(calls), clock.sleeps) == (5, [1.0, 2.0, 3.0, 3.0])


def test_retry_reraises_the_last_error_after_max_tries() -> None:
    clock = FakeTime()
    func, calls = failing(10)
    with pytest.raises(ConnectionError, match="down"):
        fake_retry(clock, max_tries=3)(func)
    assert len(calls) == 3


def test_retry_never_sleeps_past_its_deadline() -> None:
    clock = FakeTime()
    func, calls = failing(10)
    with pytest.raises(ConnectionError):
        fake_retry(clock, max_tries=100, deadline=4.5)(func)
    assert (len(calls), clock.sleeps) == (3, [1.0, 2.0])  # A 3 s sleep would end at 6 s.


def test_retry_does_not_retry_other_errors() -> None:
    clock = FakeTime()
    func, calls = failing(1, ValueError("bad"))
    with pytest.raises(ValueError):
        fake_retry(clock)(func)
    assert len(calls) == 1 and clock.sleeps == []


def test_retry_passes_each_attempt_the_time_left() -> None:
    clock = FakeTime()
    seen = []

    def func(remaining):
        seen.append(remaining)
        if len(seen) < 3:
            raise ConnectionError("down")
        return remaining

    assert fake_retry(clock, deadline=10.0).run(func) == 7.0
    assert seen == [10.0, 9.0, 7.0]


@pytest.mark.parametrize("kwargs", [{"max_tries": 0}, {"delay": -1}, {"backoff": 0.5},
                                    {"deadline": 0}])
def test_retry_rejects_unbounded_or_negative_settings(kwargs) -> None:
    with pytest.raises(ConfigError):
        Retry(**kwargs)


def test_unreachable_master_is_a_clear_error_within_the_deadline(unused_port) -> None:
    address = f"127.0.0.1:{unused_port()}"
    client = MasterClient(address, "worker", 0, timeout=0.5,
                          retry=Retry(max_tries=100, delay=0.05, deadline=1.5))
    started = time.monotonic()
    with pytest.raises(MasterUnavailable, match=f"master at {address} did not answer Register"):
        client.register("127.0.0.1:2000")
    assert time.monotonic() - started < 2.5


def test_a_blackholed_master_times_out_instead_of_hanging() -> None:
    import socket
    with socket.socket() as listener:  # Accepts TCP, never speaks HTTP/2.
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        client = MasterClient(address, None, timeout=0.3,
                              retry=Retry(max_tries=3, delay=0.05, deadline=2.0))
        started = time.monotonic()
        with pytest.raises(MasterUnavailable):
            client.get_cluster()
        assert time.monotonic() - started < 3.0


def test_calls_ride_through_a_master_restart(tmp_path) -> None:
    state_dir = str(tmp_path / "state")
    first = start_master(state_dir=state_dir, fsync=False)
    client = MasterClient(first.address, "worker", 0, timeout=1.0)
    client.register("127.0.0.1:2000")
    first.stop(grace=0)
    successor = {}
    timer = threading.Timer(0.5, lambda: successor.setdefault(
        "handle", start_master(port=first.port, state_dir=state_dir, fsync=False)))
    timer.start()
    try:
        version, _ = client.heartbeat()  # Fails, backs off, then reaches the successor.
        assert version == 1 and client.generation == 1
    finally:
        timer.join()
        successor["handle"].stop(grace=0)


def test_tf_cluster_needs_dense_indices() -> None:
    cluster = Cluster(3, 1, (TaskInfo("ps", 0, "a:1", 1, "alive"),
                             TaskInfo("worker", 1, "b:1", 1, "alive"),
                             TaskInfo("evaluator", 0, "c:1", 1, "alive")))
    with pytest.raises(ConfigError, match=r"worker indices \[1\] are not 0..n-1"):
        cluster.tf_cluster()
    dense = Cluster(3, 1, cluster.tasks[:1] + (TaskInfo("worker", 0, "b:1", 2, "lost"),))
    assert dense.tf_cluster() == {"ps": ["a:1"], "worker": ["b:1"]}


def test_a_stream_is_served_as_its_records_arrive_and_survives_a_master_restart(tmp_path) -> None:
    """A real master over gRPC: a stream dataset hands out only records the producer said arrived,
    waits meanwhile, keeps its watermark across a restart, and ends once closed and trained."""
    from tf_ecrec.errors import InvalidRequestError
    from tf_ecrec.master.sharding import ShardStatus

    state_dir = str(tmp_path / "state")
    master = start_master(state_dir=state_dir, fsync=False)
    try:
        client = MasterClient(master.address, "worker", 0, timeout=5.0)
        client.register("127.0.0.1:2000")
        client.register_dataset("s", 1 << 40, 10, stream=True)
        assert client.get_shard("s").status is ShardStatus.WAIT  # nothing arrived yet
        assert client.extend_dataset("s", 25).records_total == 25
        leases = [client.get_shard("s").lease for _ in range(2)]
        assert [(x.start, x.end) for x in leases] == [(0, 10), (10, 20)]
        for lease in leases:
            client.report_progress(lease, lease.end - lease.start)
        assert client.get_shard("s").status is ShardStatus.WAIT  # [20, 25): not a full shard, stream open
        with pytest.raises(InvalidRequestError):
            client.extend_dataset("s", 24)  # records only arrive
    finally:
        master.stop(grace=0)
    master = start_master(port=master.port, state_dir=state_dir, fsync=False)
    try:
        client = MasterClient(master.address, "worker", 0, timeout=5.0)
        client.register("127.0.0.1:2000")
        assert client.data_state("s").records_total == 25  # the watermark came back with the state
        client.extend_dataset("s", 25, closed=True)
        last = client.get_shard("s").lease
        assert (last.start, last.end) == (20, 25)
        client.report_progress(last, 5)
        assert client.get_shard("s").status is ShardStatus.END
        stats = client.data_state("s")
        assert stats.finished and stats.records_trained == 25
    finally:
        master.stop(grace=0)
