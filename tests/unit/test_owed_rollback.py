"""The data rollback a restore owes (tf_ecrec.recovery.owed) and the chief's hook that pays it (issue 30, case 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from tf_ecrec.base.retry import Retry
from tf_ecrec.errors import MasterUnavailable, RecoveryError
from tf_ecrec.hooks.shard_progress import ShardCheckpointListener
from tf_ecrec.hooks.shard_rollback import OwedRollbackHook, roll_back_shards
from tf_ecrec.recovery.owed import OWED_FILE, clear, owe, owed


class Master:
    """The master's two shard-state calls; down while `down` is set."""

    def __init__(self, down: bool = False) -> None:
        self.down = threading.Event()
        if down:
            self.down.set()
        self.restored: list[dict] = []
        self.progress = 700

    def shard_checkpoint(self, dataset):
        if self.down.is_set():
            raise MasterUnavailable("down")
        return json.dumps({"progress": self.progress}).encode()

    def restore_shard_checkpoint(self, dataset, blob):
        if self.down.is_set():
            raise MasterUnavailable("down")
        self.restored.append(json.loads(blob))


def _states(tmp_path, **steps):
    for step, progress in steps.items():
        (tmp_path / f"shard_state-train-{step[1:]}.json").write_text(json.dumps({"progress": progress}))


def test_a_debt_keeps_the_lowest_step_and_is_cleared_only_by_whoever_read_it(tmp_path):
    d = str(tmp_path)
    assert owed(d) is None and owe(None, 5, "checkpoint") is None
    first = owe(d, 197, "flash checkpoint")
    assert owed(d) == first
    second = owe(d, 300, "checkpoint")  # a second restore before the first was paid: the lower step stays
    assert (second.step, second.what) == (197, "flash checkpoint") and second.token != first.token
    assert not clear(d, first)  # read before the second restore: the record now holds another debt
    assert owed(d) == second
    assert clear(d, second) and owed(d) is None


def test_an_unreadable_debt_is_an_error_not_nothing_owed(tmp_path):
    (tmp_path / OWED_FILE).write_text("{not json")
    with pytest.raises(RecoveryError, match=r"rollback_owed\.json"):
        owed(str(tmp_path))


def test_paying_rolls_back_to_the_newest_state_at_or_before_the_step_and_drops_the_newer_ones(tmp_path):
    _states(tmp_path, s101=100, s196=190, s297=290)
    master = Master()
    assert roll_back_shards(master, "train", str(tmp_path), 250, "flash checkpoint") == 196
    assert master.restored == [{"progress": 190}]
    # 297 counted records of steps the restore threw away: no later restore may take it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard_state-train-101.json", "shard_state-train-196.json"]


def test_a_master_away_keeps_the_debt_and_a_thread_pays_it_once_the_master_is_back(tmp_path):
    d = str(tmp_path)
    _states(tmp_path, s196=190)
    owe(d, 197, "flash checkpoint")
    master = Master(down=True)
    hook = OwedRollbackHook(master, "train", d, retry=Retry(max_tries=400, delay=0.01, max_delay=0.02))
    hook.after_create_session(None, None)  # does not raise: the chief trains on, the debt is kept
    assert owed(d) is not None and master.restored == []
    master.down.clear()
    for _ in range(500):
        if owed(d) is None:
            break
        threading.Event().wait(0.01)
    hook.end(None)
    assert owed(d) is None and master.restored == [{"progress": 190}] and hook.rollbacks == [(197, 196)]


def test_the_next_chief_pays_a_debt_its_predecessor_left(tmp_path):
    d = str(tmp_path)
    _states(tmp_path, s101=100)
    owe(d, 150, "checkpoint")  # the restore's record; its chief died before any hook ran
    master = Master()
    OwedRollbackHook(master, "train", d).after_create_session(None, None)  # a new process, a new hook
    assert master.restored == [{"progress": 100}] and owed(d) is None


def test_no_shard_progress_is_saved_while_a_rollback_is_owed(tmp_path):
    d = str(tmp_path)
    master = Master()
    listener = ShardCheckpointListener(master, "train", d)
    listener.before_save(None, 10)
    owe(d, 5, "flash checkpoint")  # a restore between the ask and the write: the blob counts lost records
    listener.after_save(None, 10)
    listener.before_save(None, 12)
    listener.after_save(None, 12)
    assert not list(tmp_path.glob("shard_state-*"))
    clear(d, owed(d))
    listener.before_save(None, 14)
    listener.after_save(None, 14)
    assert [p.name for p in tmp_path.glob("shard_state-*")] == ["shard_state-train-14.json"]


def test_the_failpoint_after_a_restore_kills_the_named_task_once(tmp_path):
    from tf_ecrec.step.failpoints import FailPoint, fire_in_python

    code = ("from tf_ecrec.step.failpoints import FailPoint, fire_in_python; "
            "fire_in_python(FailPoint.CHIEF_AFTER_RESTORE, 'chief:0', 197); print('alive')")
    env = {"TF_ECREC_FAILPOINT": "chief_after_restore@chief:0@step=0", "TF_ECREC_FAILPOINT_DIR": str(tmp_path),
           "TF_CPP_MIN_LOG_LEVEL": "3", **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "PYTHONPATH")}}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == -9, first.stderr[-2000:]
    assert (tmp_path / "tf_ecrec_failpoint_chief_after_restore_chief_0").read_text() == "197"
    fire_in_python(FailPoint.CHIEF_AFTER_RESTORE, "chief:0", 300, environ=env)  # fired once per job: alive
    fire_in_python(FailPoint.CHIEF_AFTER_RESTORE, "worker:0", 300, environ=env)  # not armed for this task
