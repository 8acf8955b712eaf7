"""Reading leased record ranges (`make_leased_dataset`) and rolling shard progress back with a checkpoint."""

import json
import os

import numpy as np
import tensorflow as tf

from tf_ecrec.data.criteo import CriteoFiles
from tf_ecrec.data.pipeline import CORRUPT_KEY, LeasedRange, _attribute_corrupt, make_leased_dataset
from tf_ecrec.data.synthetic import SyntheticCriteo, write_criteo_tsv
from tf_ecrec.hooks.shard_rollback import ShardRollbackHook, newest_shard_state

SIZES = [50] * 26


def test_corrupt_counts_go_to_the_nearest_readable_batch_of_the_range():
    a, b = [b"a"], [b"b1", b"b2"]
    # records per batch: 3, 3, 3, 3, 2 -> lines kept: 0, 1, 0, 2, 0
    out = _attribute_corrupt([([], 3), (a, 3), ([], 3), (b, 3), ([], 2)])
    # leading 3 and own 2 -> a; the next 3 -> a; b: own 1 + trailing 2
    assert out == [(a, 8), (b, 3)]
    assert sum(len(lines) + bad for lines, bad in out) == 14
    assert _attribute_corrupt([([], 3), ([], 1)]) == []


def _ranges(log, *bounds):
    def open_ranges():
        log.append("open")
        for start, end in bounds:
            yield LeasedRange(start, end, on_start=lambda s=start: log.append(("start", s)),
                              on_empty=lambda s=start: log.append(("empty", s)))
    return open_ranges


def _batches(ds):
    return [(int(tf.size(y)), int(x[CORRUPT_KEY])) for x, y in ds]


def test_synthetic_ranges_are_read_in_order_batch_by_batch_and_reopened_per_pipeline():
    source = SyntheticCriteo(SIZES, 1000, seed=3)
    log = []
    ds = make_leased_dataset(source, _ranges(log, (0, 250), (500, 600)), 100, SIZES)
    assert _batches(ds) == [(100, 0), (100, 0), (50, 0), (100, 0)]
    assert log == ["open", ("start", 0), ("start", 500)]
    # The records are the source's: the last batch is records [500, 600).
    *_, (_, label) = list(ds.take(4))
    np.testing.assert_array_equal(label.numpy(), source.read(500, 600).label)
    _batches(ds)  # a new iterator (a new session) opens the ranges again
    assert log.count("open") == 3


def test_criteo_ranges_count_every_line_once_and_unreadable_ranges_are_reported(tmp_path):
    good, bad = str(tmp_path / "good.tsv"), str(tmp_path / "bad.tsv")
    write_criteo_tsv(good, 100, seed=1, corrupt_every=7)  # lines 6, 13, ... corrupt
    write_criteo_tsv(bad, 20, seed=1, corrupt_every=1)  # every line corrupt
    source = CriteoFiles([good, bad], on_corrupt="skip")
    log = []
    batches = _batches(make_leased_dataset(source, _ranges(log, (0, 100), (100, 120)), 30, SIZES))
    assert sum(n + c for n, c in batches) == 100  # every line of [0, 100) in exactly one batch
    assert sum(c for _, c in batches) == len(range(6, 100, 7))
    assert log == ["open", ("start", 0), ("empty", 100)]


class FakeClient:
    """The two MasterClient calls the rollback hook makes; blobs number the saves."""

    def __init__(self):
        self.saves = 0
        self.restored = []

    def shard_checkpoint(self, dataset):
        self.saves += 1
        return json.dumps({"dataset": dataset, "save": self.saves}).encode()

    def restore_shard_checkpoint(self, dataset, blob):
        self.restored.append(json.loads(blob))


def _train(model_dir, hook, steps):
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.assign_add(step, 1)
        saver = tf.compat.v1.train.CheckpointSaverHook(model_dir, save_steps=2, listeners=[hook.listener])
        with tf.compat.v1.train.MonitoredTrainingSession(
            checkpoint_dir=model_dir, chief_only_hooks=[saver], hooks=[hook],
            save_checkpoint_secs=None, save_summaries_steps=None, log_step_count_steps=None,
        ) as sess:
            for _ in range(steps):
                sess.run(train_op)


def _state(model_dir, step):
    with open(os.path.join(model_dir, f"shard_state-train-{step}.json"), encoding="utf-8") as fh:
        return json.load(fh)


def test_a_restarted_chief_rolls_the_shard_progress_back_to_the_restored_checkpoint(tmp_path):
    model_dir = str(tmp_path)
    first = FakeClient()
    _train(model_dir, ShardRollbackHook(first, "train", model_dir), steps=5)
    assert first.restored == []  # a fresh start restores nothing
    # Saves at 0 (creation), 2, 4 and 5 (the end), each with the progress of its time.
    assert [_state(model_dir, s)["save"] for s in (0, 2, 4, 5)] == [1, 2, 3, 4]

    second = FakeClient()
    hook = ShardRollbackHook(second, "train", model_dir)
    _train(model_dir, hook, steps=1)  # a new chief process: the stock session restores step 5
    assert second.restored == [{"dataset": "train", "save": 4}]
    assert hook.rollbacks == [(5, 5)]
    # The creation save's progress was taken after the rollback, not before.
    assert _state(model_dir, 5)["save"] == 1


def test_no_rollback_when_the_session_kept_its_state(tmp_path):
    model_dir = str(tmp_path)
    _train(model_dir, ShardRollbackHook(FakeClient(), "train", model_dir), steps=3)
    client = FakeClient()
    _train(model_dir, ShardRollbackHook(client, "train", model_dir, restored=lambda: False), steps=1)
    assert client.restored == []


def test_a_missing_shard_state_falls_back_to_an_older_one(tmp_path):
    for step in (0, 150, 300):
        (tmp_path / f"shard_state-train-{step}.json").write_text("{}")
    (tmp_path / "shard_state-other-290.json").write_text("{}")
    assert newest_shard_state(str(tmp_path), "train", 299) == (150, str(tmp_path / "shard_state-train-150.json"))
    assert newest_shard_state(str(tmp_path), "train", 300)[0] == 300
    assert newest_shard_state(str(tmp_path), "other", 100) is None



# ---- the leased-data client against a real master (port 0) -------------------------------------------


def test_leased_data_reads_leases_in_order_and_gives_an_abandoned_pipelines_leases_back():
    import threading

    from tf_ecrec.data.leased import LeasedData
    from tf_ecrec.master.client import MasterClient
    from tf_ecrec.master.server import start_master

    master = start_master(fsync=False)
    try:
        client = MasterClient(master.address, "worker", 0, timeout=2.0)
        client.register("127.0.0.1:2000")
        rejoined = []
        stop = threading.Event()
        data = LeasedData(client, "worker:0", "train", rejoin=rejoined.append, stop=stop)
        data.register(1000, 100, 1)
        source = SyntheticCriteo(SIZES, 1000, seed=3)
        first = iter(data.dataset(source, 100, SIZES))
        _, label = next(first)  # one shard of 100 records: one batch
        np.testing.assert_array_equal(label.numpy(), source.read(0, 100).label)
        assert data.tracker.record_trained(100)  # what ShardProgressHook does after the step
        in_flight = client.data_state("train").records_in_flight
        assert in_flight >= 100  # the pipeline prefetches further leases
        # A new session re-creates the iterator: the leases the first one started go back at once.
        second = iter(data.dataset(source, 100, SIZES))
        next(second)
        state = client.data_state("train")
        assert state.records_requeued > 0 and rejoined == [] and data.failure is None
        stop.set()  # as SIGTERM does: the input ends after the current lease
        assert sum(1 for _ in second) < 10
    finally:
        master.stop(grace=0)
