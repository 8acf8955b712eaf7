"""A standalone master killed with SIGKILL mid-job and restarted loses and repeats nothing."""

from __future__ import annotations

import collections
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

import tf_ecrec
from tf_ecrec.base.retry import Retry
from tf_ecrec.errors import MasterError
from tf_ecrec.master.client import MasterClient
from tf_ecrec.master.membership import EmbeddedMembership
from tf_ecrec.master.server import main
from tf_ecrec.master.sharding import DatasetSpec
from tf_ecrec.master.state.master_state import MasterState
from tf_ecrec.master.state.snapshot import SnapshotStore
from tf_ecrec.membership.base import Member

_REPO = str(pathlib.Path(tf_ecrec.__file__).resolve().parents[1])
BATCH = 64


class MasterProcess:
    """``python -m tf_ecrec.master.server`` as a child process."""

    def __init__(self, state_dir: str, port: int = 0) -> None:
        env = dict(os.environ, PYTHONPATH=_REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tf_ecrec.master.server", "--port", str(port),
             "--state-dir", state_dir, "--heartbeat-timeout", "2", "--log-level", "WARNING"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.address = self._read_address(timeout=30.0)

    def _read_address(self, timeout: float) -> str:
        found: list[str] = []
        reader = threading.Thread(target=lambda: found.append(self.process.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(timeout)
        line = found[0] if found else ""
        if "listening on" not in line:
            self.process.kill()
            raise AssertionError(f"master did not start: {line!r} {self.process.stderr.read()}")
        return line.rsplit(" ", 1)[1].strip()

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])


class SimulatedWorker(threading.Thread):
    """Trains leases batch by batch, acknowledging after each batch.

    With ``crash_after`` it trains that many batches, then dies before
    acknowledging the last one (its heartbeats stop, nothing is reported).
    """

    def __init__(self, address: str, index: int, trained: Counter, lock: threading.Lock,
                 crash_after: int | None = None) -> None:
        super().__init__(name=f"worker-{index}", daemon=True)
        self.address, self.index = address, index
        self.trained, self.lock, self.crash_after = trained, lock, crash_after
        self.unacked_at_crash = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._train()
        except BaseException as exc:  # surfaced by the test.
            self.error = exc

    def _train(self) -> None:
        membership = EmbeddedMembership(self.address, heartbeat_interval=0.2, timeout=20.0)
        membership.join(Member("worker", self.index, f"127.0.0.1:{4000 + self.index}"))
        client = membership.client
        batches = 0
        for lease in client.iter_shards("train", wait_timeout=30):
            done = 0
            while done < lease.size:
                n = min(BATCH, lease.size - done)
                with self.lock:
                    self.trained.update((lease.epoch, r) for r in
                                        range(lease.start + done, lease.start + done + n))
                done += n
                batches += 1
                if batches == self.crash_after:
                    self.unacked_at_crash = n
                    membership.close()
                    return
                client.report_progress(lease, done)
                time.sleep(0.005)
        membership.leave()
        membership.close()


def test_sigkilled_master_restarts_and_the_job_trains_every_record_once(tmp_path) -> None:
    state_dir = str(tmp_path / "state")
    master = MasterProcess(state_dir)
    observer = MasterClient(master.address, None, retry=Retry(max_tries=40, delay=0.05,
                                                              max_delay=0.5, deadline=20))
    total, epochs = 12000, 2
    observer.register_dataset("train", total, 200, epochs, shuffle_seed=11)
    trained: Counter[tuple[int, int]] = collections.Counter()
    lock = threading.Lock()
    workers = [SimulatedWorker(master.address, i, trained, lock, crash_after=40 if i == 2 else None)
               for i in range(3)]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + 30
    while observer.data_state("train").records_trained < total * epochs // 3:
        assert time.monotonic() < deadline, "training made no progress"
        time.sleep(0.02)
    at_kill = observer.data_state("train")
    master.process.send_signal(signal.SIGKILL)
    master.process.wait(10)
    assert at_kill.records_trained < total * epochs and at_kill.records_in_flight > 0
    restarted = MasterProcess(state_dir, port=master.port)
    for worker in workers:
        worker.join(60)
        assert not worker.is_alive() and worker.error is None, worker.error
    state = observer.data_state("train")
    restarted.process.send_signal(signal.SIGTERM)
    assert restarted.process.wait(15) == 0  # A graceful stop.

    assert state.finished
    assert state.records_trained == state.records_total == total * epochs
    assert state.records_retrained == 0 and state.records_failed == 0
    assert set(trained) == {(e, r) for e in range(epochs) for r in range(total)}
    repeats = sum(count - 1 for count in trained.values())
    # The master's restart repeated nothing; the crashed worker's unacknowledged
    # batch, and only it, was trained twice, within the in-flight bound.
    assert repeats == workers[2].unacked_at_crash > 0
    assert repeats <= state.records_requeued


def test_restarted_state_keeps_leases_with_their_tasks(tmp_path) -> None:
    store = SnapshotStore(str(tmp_path), fsync=False)
    state = MasterState(store)
    state.register("worker", 0, "127.0.0.1:2000", "instance-a")
    state.register_dataset(DatasetSpec("train", 1000, 100))
    _, lease = state.get_shard("worker:0", 1, "train", request_id=1)
    state.report_progress("worker:0", 1, "train", lease.shard_id, lease.attempt, 30)
    store.close()  # The process dies; the snapshot on disk is all that remains.

    again = MasterState(SnapshotStore(str(tmp_path), fsync=False))
    status, held = again.get_shard("worker:0", 1, "train", request_id=1)  # A retried request.
    assert (status, held.shard_id, held.attempt, held.owner, held.acked) == (
        "shard", lease.shard_id, lease.attempt, "worker:0", 30)
    assert again.report_progress("worker:0", 1, "train", lease.shard_id, lease.attempt, 100)
    assert again.data_stats("train").records_trained == 100


def test_a_second_master_on_the_same_state_dir_is_refused(tmp_path) -> None:
    first = SnapshotStore(str(tmp_path))
    with pytest.raises(MasterError, match="in use by another master"):
        SnapshotStore(str(tmp_path))
    first.close()
    SnapshotStore(str(tmp_path)).close()


def test_a_corrupt_snapshot_is_an_error_not_a_fresh_start(tmp_path) -> None:
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(MasterError, match="unreadable"):
        MasterState(SnapshotStore(str(tmp_path)))


@pytest.mark.parametrize("text", [
    '[1, 2]',
    '{"format": 1, "version": 3}',
    '{"format": 1, "version": 0, "ps_version": 0, "tasks": 5, "datasets": [], "barriers": []}',
    '{"format": 1, "version": 0, "ps_version": 0, "tasks": [{"task_id": "worker:0"}], "datasets": [], "barriers": []}',
])
def test_a_structurally_wrong_snapshot_is_a_master_error(tmp_path, text) -> None:
    (tmp_path / "state.json").write_text(text)
    with pytest.raises(MasterError, match=r"master state (is malformed|format)"):
        MasterState(SnapshotStore(str(tmp_path)))


def test_standalone_main_rejects_an_empty_token_file(tmp_path, capsys) -> None:
    token = tmp_path / "token"
    token.write_text("\n")
    assert main(["--port", "0", "--token-file", str(token)]) == 2
    assert "is empty" in capsys.readouterr().err
