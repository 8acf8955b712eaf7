"""Reporting trained records to the master, and saving shard progress with checkpoints.

:class:`ShardProgressHook` follows the SessionRunHook contract::

    __init__        validate arguments (nothing touches the graph or the network)
    begin           resolve the records-per-step tensor; start the sender thread
    before_run      fetch that tensor with the step (SessionRunArgs)
    after_run       attribute the step's records to leases (ShardTracker) once the step is
                    durable; queue the cumulative counts (never blocks, never calls the master)
    end             commit the last step, attribute it; flush the sender for at most
                    ``flush_timeout`` seconds; stop it

With a protected step whose commit the next run carries (`tf_ecrec.step.carried_commit`), a
step's records are attributed one run later, once its commit ran OK; the records of a
step that never commits (its session failed first) are never acknowledged, so the
master hands them out again: a step a failure undoes is retrained, never lost.

The step never waits on the master: a background
:class:`~tf_ecrec.master.progress_reporter.ProgressSender` delivers the counts, keeps
them while the master is unreachable (warning at most every
``warn_every_secs``), and coalesces them if the queue is full.

:class:`ShardCheckpointListener` saves the master's shard progress next to
every model checkpoint.  It asks the master in ``before_save`` (so the blob
never claims records the saved variables have not seen) and writes
``shard_state-<dataset>-<step>.json`` in ``after_save``, neither while a data
rollback is owed (`tf_ecrec.recovery.owed`: the progress then counts records
the model lost);
:func:`load_shard_checkpoint` finds the blob of a checkpoint for
``MasterClient.restore_shard_checkpoint`` when a job restarts.

Usage::

    tracker = ShardTracker()
    leases = track(client.iter_shards("train"), tracker)   # feeds the input_fn
    hooks = [ShardProgressHook(client, tracker, records="batch_size:0")]
    listeners = [ShardCheckpointListener(client, "train", model_dir)]
"""

from __future__ import annotations

import collections
import logging
import os
import re
import threading
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_ecrec.base.retry import Retry
from tf_ecrec.errors import ConfigError, EcRecError
from tf_ecrec.master.client import MasterClient
from tf_ecrec.master.progress_reporter import ProgressSender, ShardTracker
from tf_ecrec.master.rate_limited_log import RateLimitedLogger
from tf_ecrec.master.replies import ShardLease
from tf_ecrec.recovery.owed import owed
from tf_ecrec.step.carried_commit import CarriedCommit, carried_commits

_LOG = logging.getLogger(__name__)

RecordsSpec = int | str | Callable[[], Any]
_SEND_RETRY = Retry(max_tries=2, delay=0.1, deadline=2.0)


class ShardProgressHook(tf.compat.v1.train.SessionRunHook):
    """Acknowledges the records each step trained, without blocking the step.

    Args:
      client: The task's registered :class:`MasterClient`.
      tracker: The :class:`ShardTracker` the input pipeline registers leases in.
      records: Records one step trains: an int for a fixed batch, or the name
        of (or a function building) a scalar tensor with the actual count,
        e.g. ``tf.shape(labels)[0]``, for a last batch that is shorter.
      flush_timeout: Seconds ``end`` waits for the last reports.
      max_queue: Capacity of the report queue.
      warn_every_secs: Minimum seconds between "master unreachable" warnings.
      sender: Injected sender (tests); default one built on ``client``.
    """

    def __init__(self, client: MasterClient, tracker: ShardTracker, records: RecordsSpec, *,
                 flush_timeout: float = 10.0, max_queue: int = 1024,
                 warn_every_secs: float = 30.0, sender: ProgressSender | None = None) -> None:
        if isinstance(records, bool) or not (
                (isinstance(records, int) and records > 0) or isinstance(records, str)
                or callable(records)):
            raise ConfigError(f"ShardProgressHook records={records!r}; rule: an int > 0, a "
                              "tensor name, or a function returning a tensor")
        if flush_timeout < 0:
            raise ConfigError(f"ShardProgressHook flush_timeout={flush_timeout}; rule: >= 0")
        self._client = client
        self._tracker = tracker
        self._records = records
        self._flush_timeout = flush_timeout
        self._sender = sender or ProgressSender(self._send, max_queue=max_queue,
                                                warn_every_secs=warn_every_secs)
        self._untracked = RateLimitedLogger(_LOG, warn_every_secs)
        self._tensor: Any = None
        self._carried: list[CarriedCommit] = []
        self._runs = 0  # runs that returned OK (numbered as CarriedCommit numbers them)
        self._waiting: collections.deque[tuple[int, int]] = collections.deque()  # (run, records) not durable yet
        self._lock = threading.Lock()  # the training thread and a CarriedCommit's resolving thread
        self.records_dropped = 0  # records of steps that never became durable

    def _send(self, lease: ShardLease, records: int) -> bool:
        return self._client.report_progress(lease, records, timeout=1.0, retry=_SEND_RETRY)

    @property
    def sender(self) -> ProgressSender:
        return self._sender

    def begin(self) -> None:
        if isinstance(self._records, str):
            self._tensor = tf.compat.v1.get_default_graph().get_tensor_by_name(self._records)
        elif callable(self._records):
            self._tensor = self._records()
        self._sender.start()
        with self._lock:
            # A new graph (the failover loop builds a new Estimator after a session failed, and then this
            # hook's `end` never ran): its commits number their runs from 1 again, so this hook does too.
            # The runs still waiting belong to the previous graph's commits, which will never resolve them
            # now: their records are not claimed (their leases go back with the old input pipeline).
            # Numbering on from the old graph's runs asked the new commits about runs they would reach
            # only hundreds of steps later: no record was acknowledged meanwhile, the master handed out
            # no more shards, and both trainers' steps waited for data until their deadline, again and
            # again (a job that never ended, seen after a chief died during a spare's rebuild).
            self.records_dropped += sum(records for _, records in self._waiting)
            self._waiting.clear()
            self._runs = 0
            self._carried = carried_commits()
        for commit in self._carried:  # a run made durable off the training thread is reported at once
            commit.on_resolved(self._attribute_durable)

    def before_run(self, run_context: Any) -> Any:
        if self._tensor is None:
            return None
        return tf.compat.v1.train.SessionRunArgs(self._tensor)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        records = self._records if self._tensor is None else int(run_values.results)
        assert isinstance(records, int)  # without a tensor (built in begin), records is the int count
        with self._lock:
            self._runs += 1
            self._waiting.append((self._runs, records))
        self._attribute_durable()

    def _attribute_durable(self) -> None:
        with self._lock:
            while self._waiting:
                run, records = self._waiting[0]
                states = {commit.resolved(run) for commit in self._carried}
                if "pending" in states:
                    return
                self._waiting.popleft()
                if "lost" in states:
                    self.records_dropped += records
                    continue
                self._attribute(records)

    def _attribute(self, records: int) -> None:
        before = self._tracker.untracked_records
        for update in self._tracker.record_trained(records):
            self._sender.submit(update)
        if self._tracker.untracked_records > before:
            self._untracked.warning(
                "%d records trained that belong to no lease; is the input pipeline reading "
                "shards it did not register with the ShardTracker?",
                self._tracker.untracked_records)

    def end(self, session: Any) -> None:
        for commit in self._carried:  # the last step's commit (idempotent: whichever hook ends first runs it)
            commit.flush(session)
        self._attribute_durable()
        with self._lock:
            if self._waiting:  # not resolved (cannot happen once flushed): never claim them
                self.records_dropped += sum(r for _, r in self._waiting)
                self._waiting.clear()
        if not self._sender.flush(self._flush_timeout):
            unsent = self._sender.unsent
            _LOG.warning("%d shard progress reports (%d records) not delivered within %.1fs; "
                         "those records will be trained again", len(unsent),
                         sum(u.records for u in unsent), self._flush_timeout)
        self._sender.stop(timeout=1.0)


class ShardCheckpointListener(tf.compat.v1.train.CheckpointSaverListener):
    """Saves the dataset's shard progress beside every model checkpoint.

    Args:
      client: A :class:`MasterClient` (an observer client is enough).
      dataset: The dataset name.
      checkpoint_dir: The Estimator's ``model_dir``.
    """

    def __init__(self, client: MasterClient, dataset: str, checkpoint_dir: str) -> None:
        if not dataset:
            raise ConfigError("ShardCheckpointListener dataset is empty")
        self._client = client
        self._dataset = dataset
        self._dir = checkpoint_dir
        self._blob: bytes | None = None

    def before_save(self, session: Any, global_step_value: int) -> None:
        self._blob = None
        if owed(self._dir) is not None:  # the master's progress counts records the model lost
            _LOG.warning("Checkpoint at step %d saved without shard progress: a data rollback is owed",
                         global_step_value)
            return
        try:
            self._blob = self._client.shard_checkpoint(self._dataset)
        except EcRecError as exc:
            _LOG.warning("Checkpoint at step %d saved without shard progress: %s",
                         global_step_value, exc)

    def after_save(self, session: Any, global_step_value: int) -> None:
        if self._blob is None or owed(self._dir) is not None:  # a restore since before_save
            self._blob = None
            return
        path = shard_checkpoint_path(self._dir, self._dataset, global_step_value)
        tmp = path + ".tmp"
        with tf.io.gfile.GFile(tmp, "wb") as handle:
            handle.write(self._blob)
        tf.io.gfile.rename(tmp, path, overwrite=True)
        self._blob = None


def shard_checkpoint_path(checkpoint_dir: str, dataset: str, step: int) -> str:
    """Where the shard progress of ``dataset`` at ``step`` is saved."""
    return os.path.join(checkpoint_dir, f"shard_state-{dataset}-{step}.json")


def load_shard_checkpoint(checkpoint_path: str, dataset: str) -> bytes | None:
    """Returns the shard progress saved with a checkpoint (``.../model.ckpt-123``).

    Returns:
      The blob for ``MasterClient.restore_shard_checkpoint``, or ``None`` if
      that checkpoint was saved without one.
    """
    match = re.search(r"-(\d+)$", checkpoint_path)
    if match is None:
        raise ConfigError(f"checkpoint path {checkpoint_path!r} has no '-<step>' suffix")
    path = shard_checkpoint_path(os.path.dirname(checkpoint_path), dataset, int(match.group(1)))
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "rb") as handle:
        return handle.read()
