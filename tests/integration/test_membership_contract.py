"""One contract for every MembershipBackend: fake, embedded (master), ZooKeeper.

Each backend comes with a harness that knows how to start its server, crash
a member, expire a member's session and restart the server.  The same tests
run on all three; the ZooKeeper ones against the real server of the
``zookeeper`` fixture, the embedded ones against a real master on port 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient

from tf_ecrec.errors import MembershipTimeout
from tf_ecrec.master.client import MasterClient
from tf_ecrec.master.membership import EmbeddedMembership
from tf_ecrec.master.server import start_master
from tf_ecrec.membership.base import EventKind, Member, MembershipBackend, MembershipEvent
from tf_ecrec.membership.fake import FakeMembership, FakeMembershipServer
from tf_ecrec.membership.zookeeper import ZooKeeperMembership

WORKER0 = Member("worker", 0, "127.0.0.1:2000")
WORKER1 = Member("worker", 1, "127.0.0.1:2001")
PS0 = Member("ps", 0, "127.0.0.1:3000")


class Recorder:
    """Collects watch events; waits for a condition on them with a deadline."""

    def __init__(self) -> None:
        self.events: list[MembershipEvent] = []
        self._cond = threading.Condition()

    def __call__(self, event: MembershipEvent) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[list[MembershipEvent]], bool],
                 timeout: float) -> list[MembershipEvent]:
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self.events), timeout):
                raise AssertionError(f"condition not met within {timeout}s; events: "
                                     f"{[(e.kind.value, sorted(e.members)) for e in self.events]}")
            return list(self.events)

    def kinds(self) -> list[EventKind]:
        with self._cond:
            return [e.kind for e in self.events]


def _last_view(events: list[MembershipEvent]) -> dict:
    views = [e for e in events if e.kind is EventKind.CHANGED]
    return dict(views[-1].members) if views else {}


class FakeHarness:
    loss_deadline = 2.0
    restart_disconnects = False

    def __init__(self) -> None:
        self.server = FakeMembershipServer()
        self._backends: list[MembershipBackend] = []

    def backend(self) -> MembershipBackend:
        backend = FakeMembership(self.server)
        self._backends.append(backend)
        return backend

    def expire(self, backend: MembershipBackend, member: Member) -> None:
        self.server.expire(member.key)

    def restart_server(self) -> None:
        pass  # Nothing to restart; the registry lives in memory.

    def unreachable_backend(self) -> MembershipBackend:
        server = FakeMembershipServer()
        server.reachable = False
        return FakeMembership(server)

    def close(self) -> None:
        for backend in self._backends:
            backend.close()


class EmbeddedHarness:
    loss_deadline = 5.0  # heartbeat timeout 1 s + reaper + poll, with slack.
    restart_disconnects = True

    def __init__(self, state_dir: str, free_port: Callable[[], int]) -> None:
        self.free_port = free_port
        self.state_dir = state_dir
        self.master = start_master(state_dir=state_dir, heartbeat_timeout=1.0, fsync=False)
        self._backends: list[MembershipBackend] = []

    def backend(self) -> MembershipBackend:
        backend = EmbeddedMembership(self.master.address, heartbeat_interval=0.1, timeout=5.0)
        self._backends.append(backend)
        return backend

    def expire(self, backend: MembershipBackend, member: Member) -> None:
        with MasterClient(self.master.address, None) as observer:
            generation = observer.get_cluster().alive()[member.key].generation
            observer.report_failure(member.key, reason="expired by the test", generation=generation)

    def restart_server(self) -> None:
        port = self.master.port
        self.master.stop(grace=0)
        time.sleep(0.3)
        self.master = start_master(port=port, state_dir=self.state_dir, heartbeat_timeout=1.0,
                                   fsync=False)

    def unreachable_backend(self) -> MembershipBackend:
        return EmbeddedMembership(f"127.0.0.1:{self.free_port()}", timeout=1.0)

    def close(self) -> None:
        for backend in self._backends:
            backend.close()
        self.master.stop(grace=0)


class ZooKeeperHarness:
    loss_deadline = 5.0
    restart_disconnects = True

    def __init__(self, zookeeper, job_path: str, free_port: Callable[[], int]) -> None:
        self.free_port = free_port
        self.zookeeper = zookeeper
        self.job_path = job_path
        self._backends: list[MembershipBackend] = []

    def backend(self) -> MembershipBackend:
        backend = ZooKeeperMembership(self.zookeeper.hosts, self.job_path, session_timeout=4.0,
                                      connect_timeout=5.0, op_timeout=8.0)
        self._backends.append(backend)
        return backend

    def expire(self, backend: MembershipBackend, member: Member) -> None:
        # kazoo's way: a second client joins the session, then closes it.
        assert isinstance(backend, ZooKeeperMembership)
        intruder = KazooClient(self.zookeeper.hosts, client_id=backend.kazoo_client.client_id,
                               timeout=4.0)
        intruder.start(timeout=5.0)
        intruder.stop()
        intruder.close()

    def restart_server(self) -> None:
        self.zookeeper.restart(down_for=0.5)

    def unreachable_backend(self) -> MembershipBackend:
        return ZooKeeperMembership(f"127.0.0.1:{self.free_port()}", self.job_path,
                                   connect_timeout=1.0)

    def close(self) -> None:
        for backend in self._backends:
            backend.close()


@pytest.fixture(params=["fake", "embedded", "zookeeper"])
def harness(request: pytest.FixtureRequest, tmp_path, unused_port) -> Iterator[object]:
    if request.param == "fake":
        h: object = FakeHarness()
    elif request.param == "embedded":
        h = EmbeddedHarness(str(tmp_path / "master"), unused_port)
    else:
        h = ZooKeeperHarness(request.getfixturevalue("zookeeper"),
                             request.getfixturevalue("zk_job_path"), unused_port)
    yield h
    h.close()  # type: ignore[attr-defined]


def test_joined_member_is_visible_to_another_process_with_its_address(harness) -> None:
    worker, observer = harness.backend(), harness.backend()
    worker.join(WORKER0)
    members = observer.members()
    assert list(members) == ["worker:0"]
    assert members["worker:0"].address == WORKER0.address


def test_watch_reports_the_current_view_first_then_joins_and_leaves(harness) -> None:
    first, second, observer = harness.backend(), harness.backend(), harness.backend()
    first.join(WORKER0)
    recorder = Recorder()
    observer.watch(recorder)
    recorder.wait_for(lambda ev: ev and set(ev[0].members) == {"worker:0"}, 5.0)
    second.join(PS0)
    events = recorder.wait_for(lambda ev: set(_last_view(ev)) == {"worker:0", "ps:0"}, 5.0)
    assert any("ps:0" in e.joined for e in events)
    second.leave()
    events = recorder.wait_for(lambda ev: set(_last_view(ev)) == {"worker:0"}, 5.0)
    assert any("ps:0" in e.departed for e in events)


def test_member_that_stops_without_leaving_departs_within_the_liveness_deadline(harness) -> None:
    crashed, observer = harness.backend(), harness.backend()
    crashed.join(WORKER1)
    recorder = Recorder()
    observer.watch(recorder)
    recorder.wait_for(lambda ev: "worker:1" in _last_view(ev), 5.0)
    started = time.monotonic()
    crashed.close()
    events = recorder.wait_for(lambda ev: any("worker:1" in e.departed for e in ev),
                               harness.loss_deadline)
    assert time.monotonic() - started <= harness.loss_deadline
    assert "worker:1" not in _last_view(events)
    assert "worker:1" not in observer.members()


def test_expired_membership_is_reported_to_the_member_which_then_rejoins(harness) -> None:
    member, observer = harness.backend(), harness.backend()
    member.join(WORKER0)
    own = Recorder()
    member.watch(own)
    others = Recorder()
    observer.watch(others)
    harness.expire(member, WORKER0)
    own.wait_for(lambda ev: EventKind.SELF_LOST in [e.kind for e in ev], 10.0)
    kinds = [e.kind for e in own.wait_for(
        lambda ev: EventKind.SELF_REJOINED in [e.kind for e in ev], 10.0)]
    assert kinds.index(EventKind.SELF_LOST) < kinds.index(EventKind.SELF_REJOINED)
    before = others.wait_for(lambda ev: bool(ev), 5.0)[0].members["worker:0"]
    # Observers see the old incarnation end, even if the member came back
    # before they looked: the new one has another incarnation.
    events = others.wait_for(lambda ev: any("worker:0" in e.departed for e in ev), 10.0)
    ended = [e.departed_members["worker:0"] for e in events if "worker:0" in e.departed]
    assert ended[0] == before
    deadline = time.monotonic() + 10.0
    while "worker:0" not in observer.members():
        assert time.monotonic() < deadline, "the member did not come back"
        time.sleep(0.1)


def test_members_and_watches_survive_a_server_restart(harness) -> None:
    worker, observer, late = harness.backend(), harness.backend(), harness.backend()
    worker.join(WORKER0)
    recorder = Recorder()
    observer.watch(recorder)
    recorder.wait_for(lambda ev: "worker:0" in _last_view(ev), 5.0)
    harness.restart_server()
    late.join(WORKER1)  # Retries through the restart within its deadline.
    events = recorder.wait_for(lambda ev: set(_last_view(ev)) == {"worker:0", "worker:1"}, 15.0)
    assert not any("worker:0" in e.departed for e in events)
    if harness.restart_disconnects:
        kinds = recorder.wait_for(
            lambda ev: EventKind.RESUMED in [e.kind for e in ev], 10.0)
        kinds = [e.kind for e in kinds]
        assert EventKind.SUSPENDED in kinds
        assert kinds.index(EventKind.SUSPENDED) < kinds.index(EventKind.RESUMED)
    assert set(observer.members()) == {"worker:0", "worker:1"}


def test_join_against_an_unreachable_server_raises_membership_timeout_in_time(harness) -> None:
    backend = harness.unreachable_backend()
    started = time.monotonic()
    with pytest.raises(MembershipTimeout):
        backend.join(WORKER0)
    assert time.monotonic() - started < 6.0
    backend.close()


def test_a_failing_watch_callback_does_not_end_the_watch(harness) -> None:
    worker, other, observer = harness.backend(), harness.backend(), harness.backend()

    def broken(event: MembershipEvent) -> None:
        raise RuntimeError("a watcher's bug")

    observer.watch(broken)
    recorder = Recorder()
    observer.watch(recorder)
    worker.join(WORKER0)
    recorder.wait_for(lambda ev: "worker:0" in _last_view(ev), 5.0)
    other.join(WORKER1)
    recorder.wait_for(lambda ev: "worker:1" in _last_view(ev), 5.0)


def test_leave_removes_the_member_at_once_and_a_later_join_returns_it(harness) -> None:
    worker, observer = harness.backend(), harness.backend()
    worker.join(WORKER0)
    worker.leave()
    worker.leave()  # Idempotent.
    assert "worker:0" not in observer.members()
    worker.join(WORKER0)
    assert "worker:0" in observer.members()
