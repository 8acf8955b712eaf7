"""One launched task's link to the job master: membership, leased data, progress hooks.

The launcher (`tf_ecrec.launcher.supervisor`) passes the master's address
and token in the environment (``TF_ECREC_MASTER_ADDRESS``,
``TF_ECREC_MASTER_TOKEN``; never in TF_CONFIG).  A task then::

    link = TaskLink.connect(job, cluster)     # register + join membership (bounded)
    ...                                       # PS: serve; trainers:
    link.register_dataset(source)
    estimator.train(lambda: link.dataset(source, ...), hooks=[..., *link.hooks()],
                    saving_listeners=link.saving_listeners(), max_steps=None)
    link.leave()                              # deregister: leases go back, not failed
    link.close()

Membership: with the embedded backend the task heartbeats to the master
(`EmbeddedMembership`, which re-registers by itself after being declared
lost); with ``--zk`` it registers with the master for a generation and
keeps an ephemeral znode carrying it (`ZooKeeperMembership`).

Data: the Estimator re-initializes its input iterator with every new
session (after a PS failure, for instance), which drops whatever the
pipeline had prefetched.  Each start of the pipeline is therefore an
*incarnation*: the leases the previous one had started and not finished are
given back to the master (``ReportFailure`` with their shard ids), and a
lease that an abandoned incarnation receives late is given back too.  The
records a step trained are attributed to the current incarnation's leases
in reading order (`ShardTracker`), and acknowledged off the training thread
(`ShardProgressHook`).

The lease loop, per incarnation::

    GetShard -> SHARD: yield it  -> GetShard ...
             -> WAIT / DRAIN: sleep, ask again (others, or we, still hold shards)
             -> END: the dataset is finished; the input ends, training ends
             -> MembershipLost: register again (new generation), ask again
             -> MasterUnavailable: ask again until UNAVAILABLE_DEADLINE_SECS
             -> stop requested (SIGTERM, --remove-worker): end the input
"""

from __future__ import annotations

import functools
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from tf_ecrec.config import ClusterConfig
from tf_ecrec.errors import ConfigError, EcRecError, MasterError, MasterUnavailable, MembershipLost
from tf_ecrec.launcher.spec import JobSpec

_LOG = logging.getLogger(__name__)

ENV_MASTER_ADDRESS = "TF_ECREC_MASTER_ADDRESS"
ENV_MASTER_TOKEN = "TF_ECREC_MASTER_TOKEN"
DATASET = "train"
# A shard released this often (failed tasks, rebuilt pipelines) is given up and reported.
MAX_SHARD_FAILURES = 10
# How long the lease loop rides through an unreachable master (a restart takes seconds).
UNAVAILABLE_DEADLINE_SECS = 120.0
# How long a worker waits for shards others hold before it gives up with an error.
WAIT_DEADLINE_SECS = 600.0
_POLL_SECS = 0.5
_JOIN_DEADLINE_SECS = 30.0


def master_environment(address: str, token: str | None) -> dict[str, str]:
    """The environment a task needs to reach the master (set by the launcher)."""
    env = {ENV_MASTER_ADDRESS: address}
    if token:
        env[ENV_MASTER_TOKEN] = token
    return env


def dataset_shape(job: JobSpec, num_records: int) -> tuple[int, int]:
    """``(records per epoch, epochs)`` of the job's dataset.

    Synthetic data has ``steps * batch_size`` records (one epoch); Criteo
    files are read in whole epochs, as many as cover ``steps * batch_size``.
    """
    wanted = job.steps * job.batch_size
    return num_records, max(1, math.ceil(wanted / num_records))


class _PipelineTracker:
    """A `ShardTracker` that a rebuilt input pipeline can start over.

    Duck-types what `ShardProgressHook` calls (``record_trained``,
    ``untracked_records``); `reset` swaps in a fresh tracker and returns the
    leases the old one had not finished.
    """

    def __init__(self) -> None:
        from tf_ecrec.master.progress_reporter import ShardTracker

        self._new = ShardTracker
        self._lock = threading.Lock()
        self._inner = ShardTracker()

    def add(self, lease: Any) -> None:
        with self._lock:
            self._inner.add(lease)

    def record_trained(self, records: int) -> list[Any]:
        with self._lock:
            return self._inner.record_trained(records)

    @property
    def untracked_records(self) -> int:
        with self._lock:
            return self._inner.untracked_records

    def reset(self) -> list[Any]:
        with self._lock:
            open_leases = [u.lease for u in self._inner.open_leases()]
            self._inner = self._new()
            return open_leases


class TaskLink:
    """A task's membership and data link to the job master.  Use `connect`.

    Thread-safety: `dataset`'s generator runs on a tf.data thread, the hooks
    on the training thread, membership on its own; shared state is locked.
    """

    def __init__(self, job: JobSpec, cluster: ClusterConfig, address: str, token: str | None) -> None:
        self.job = job
        self.cluster = cluster
        self.master_address = address
        self._token = token
        self._membership: Any = None
        self.client: Any = None
        self.stop_requested = threading.Event()
        self._lock = threading.Lock()
        self._rejoin_lock = threading.Lock()
        self._incarnation = 0
        self._tracker = _PipelineTracker()
        self._records_per_epoch = 0
        self.failure: BaseException | None = None
        self._recovery_method: str | None = None  # of the last erasure-coded session creation

    # ---- membership -------------------------------------------------------------------

    @classmethod
    def connect(cls, job: JobSpec, cluster: ClusterConfig, environ: Any = None) -> TaskLink | None:
        """Registers this task with the master and joins the membership; None when the job has no master.

        Raises:
          ConfigError: the job uses a master but the environment does not name it.
          MembershipTimeout, MasterUnavailable: the master or ZooKeeper was not
            reachable within the join deadline.
        """
        environ = os.environ if environ is None else environ
        if not job.uses_master:
            return None
        address = environ.get(ENV_MASTER_ADDRESS)
        if not address:
            raise ConfigError(
                f"the job uses a job master but {ENV_MASTER_ADDRESS} is not set; start tasks with `tf-ecrec run` "
                f"or set it to the master's HOST:PORT; source: environment variable {ENV_MASTER_ADDRESS}"
            )
        link = cls(job, cluster, address, environ.get(ENV_MASTER_TOKEN) or None)
        link._join()
        return link

    def _join(self) -> None:
        from tf_ecrec.membership.base import Member

        member = Member(self.cluster.task_type, self.cluster.task_index, self.cluster.address)
        if self.job.zk:
            from tf_ecrec.master.client import MasterClient
            from tf_ecrec.membership.zookeeper import ZooKeeperMembership
            from tf_ecrec.retry import Retry

            self.client = MasterClient(
                self.master_address, member.task_type, member.task_index, token=self._token, timeout=2.0,
                retry=Retry(max_tries=60, delay=0.1, max_delay=1.0, deadline=_JOIN_DEADLINE_SECS),
            )
            self.client.register(member.address)
            self._membership = ZooKeeperMembership.from_url(self.job.zk)
            self._membership.join(Member(member.task_type, member.task_index, member.address, self.client.generation))
        else:
            from tf_ecrec.master.membership import EmbeddedMembership

            self._membership = EmbeddedMembership(self.master_address, token=self._token, timeout=_JOIN_DEADLINE_SECS)
            self._membership.join(member)
            self.client = self._membership.client
        _LOG.info("%s joined the job through master %s (generation %d, %s membership)", self.cluster.task,
                  self.master_address, self.client.generation, "ZooKeeper" if self.job.zk else "embedded")

    def _rejoin(self, cause: Exception) -> None:
        """Registers again after the master declared this task lost (new generation)."""
        with self._rejoin_lock:
            _LOG.warning("%s was declared lost by the master (%s); registering again", self.cluster.task, cause)
            self.client.register(self.cluster.address)
            if self.job.zk:
                from tf_ecrec.membership.base import Member

                self._membership.join(Member(self.cluster.task_type, self.cluster.task_index, self.cluster.address,
                                             self.client.generation))

    def leave(self) -> None:
        """Leaves the job for good: the master releases this task's leases (not as failures)."""
        try:
            if self.job.zk:
                self.client.deregister()
                self._membership.leave()
            else:
                self._membership.leave()
        except EcRecError as exc:
            _LOG.warning("%s could not leave the job cleanly (%s); the master will declare it lost", self.cluster.task, exc)

    def close(self) -> None:
        if self._membership is not None:
            self._membership.close()
        if self.job.zk and self.client is not None:
            self.client.close()

    def install_stop_signal(self) -> None:
        """SIGTERM asks training to stop after the current step (then the task leaves the job)."""

        def on_term(signum: int, frame: Any) -> None:
            _LOG.info("%s got signal %d: stopping after the current step and leaving the job", self.cluster.task, signum)
            self.stop_requested.set()

        signal.signal(signal.SIGTERM, on_term)

    # ---- data -------------------------------------------------------------------------

    def register_dataset(self, num_records: int) -> None:
        """Registers the job's dataset (idempotent: every trainer does it, the same way)."""
        per_epoch, epochs = dataset_shape(self.job, num_records)
        self._records_per_epoch = per_epoch
        created, stats = self.client.register_dataset(
            DATASET, per_epoch, self.job.shard_batches * self.job.batch_size, epochs,
            max_shard_failures=MAX_SHARD_FAILURES,
        )
        _LOG.info("Dataset %r %s: %d records (%d x %d epochs), %d trained so far", DATASET,
                  "registered" if created else "already registered", stats.records_total, per_epoch, epochs,
                  stats.records_trained)

    def dataset(self, source: Any, batch_size: int, table_sizes: Sequence[int]) -> Any:
        """The input_fn's dataset: batches of the leases this task gets from the master."""
        from tf_ecrec.data.pipeline import make_leased_dataset

        if not self._records_per_epoch:
            raise ConfigError("TaskLink.dataset before register_dataset; source: TaskLink")
        return make_leased_dataset(source, self._open_ranges, batch_size, table_sizes)

    def _open_ranges(self) -> Iterator[Any]:
        from tf_ecrec.data.pipeline import LeasedRange

        with self._lock:
            self._incarnation += 1
            incarnation = self._incarnation
            stale = self._tracker.reset()
        if stale:
            self._give_back(stale, "the input pipeline was rebuilt with a new session")
        try:
            for lease in self._leases(incarnation):
                base = lease.epoch * self._records_per_epoch
                yield LeasedRange(
                    base + lease.start,
                    base + lease.end,
                    on_start=functools.partial(self._start_lease, incarnation, lease),
                    on_empty=functools.partial(self._ack_unreadable, lease),
                )
        except EcRecError as exc:
            self.failure = exc  # the task re-raises it: a TF error would hide the type
            raise

    def _leases(self, incarnation: int) -> Iterator[Any]:
        from tf_ecrec.master.sharding import ShardStatus

        unavailable_since: float | None = None
        waiting_since: float | None = None
        while not self.stop_requested.is_set() and incarnation == self._incarnation:
            try:
                try:
                    reply = self.client.get_shard(DATASET)
                except MembershipLost as exc:
                    self._rejoin(exc)
                    continue
            except MasterUnavailable as exc:
                now = time.monotonic()
                unavailable_since = unavailable_since or now
                if now - unavailable_since > UNAVAILABLE_DEADLINE_SECS:
                    raise MasterUnavailable(
                        f"{self.cluster.task} could not reach the master at {self.master_address} for "
                        f"{UNAVAILABLE_DEADLINE_SECS:g}s to get data: {exc}"
                    ) from exc
                time.sleep(_POLL_SECS)
                continue
            unavailable_since = None
            if reply.status is ShardStatus.END:
                _LOG.info("%s: dataset %r finished", self.cluster.task, DATASET)
                return
            if reply.status is ShardStatus.SHARD:
                waiting_since = None
                if incarnation != self._incarnation:  # abandoned while we asked
                    self._give_back([reply.lease], "it reached an abandoned input pipeline")
                    return
                yield reply.lease
                continue
            now = time.monotonic()  # WAIT or DRAIN: shards are held (maybe by us); ask again
            waiting_since = waiting_since or now
            if now - waiting_since > WAIT_DEADLINE_SECS:
                raise MasterError(
                    f"{self.cluster.task}: no shard of dataset {DATASET!r} became free within "
                    f"{WAIT_DEADLINE_SECS:g}s while other tasks hold the rest"
                )
            time.sleep(max(_POLL_SECS, min(reply.retry_after, 2.0)))

    def _start_lease(self, incarnation: int, lease: Any) -> None:
        with self._lock:
            if incarnation == self._incarnation:
                self._tracker.add(lease)
                return
        self._give_back([lease], "it reached an abandoned input pipeline")

    def _ack_unreadable(self, lease: Any) -> None:
        _LOG.warning("%s: records [%d, %d) of epoch %d are all corrupt; acknowledged without training",
                     self.cluster.task, lease.start, lease.end, lease.epoch)
        try:
            self.client.report_progress(lease, lease.size)
        except EcRecError as exc:
            _LOG.warning("Could not acknowledge the unreadable shard %d: %s", lease.shard_id, exc)

    def _give_back(self, leases: Sequence[Any], why: str) -> None:
        try:
            requeued = self.client.report_failure(
                reason=f"{self.cluster.task} dropped them: {why}", dataset=DATASET,
                shard_ids=sorted({lease.shard_id for lease in leases}), not_a_failure=True,
            )
        except EcRecError as exc:
            _LOG.warning("Could not give %d leases back (%s); the master re-queues them when this task is lost",
                         len(leases), exc)
            return
        _LOG.info("%s gave %d leases (%d records) back: %s", self.cluster.task, len(leases), requeued, why)

    # ---- hooks ------------------------------------------------------------------------

    def hooks(self) -> list[Any]:
        """Progress acknowledgement, stop on request, and (chief) shard-state rollback with the model."""
        import tensorflow as tf

        from tf_ecrec.data.pipeline import BATCH_RECORDS_COLLECTION, CORRUPT_RECORDS_COLLECTION
        from tf_ecrec.hooks.shard_progress import ShardProgressHook
        from tf_ecrec.hooks.stop_request import StopRequestHook

        def consumed() -> Any:
            # Records a step consumed of its leases: trained labels plus skipped corrupt lines.
            counts = tf.compat.v1.get_collection(BATCH_RECORDS_COLLECTION)
            counts += tf.compat.v1.get_collection(CORRUPT_RECORDS_COLLECTION)
            if not counts:
                raise ConfigError(
                    f"no records-per-step tensor in {BATCH_RECORDS_COLLECTION!r}; wrap the model_fn with "
                    "with_data_accounting; source: TaskLink.hooks"
                )
            return tf.add_n([tf.cast(c, tf.int64) for c in counts])

        hooks: list[Any] = [ShardProgressHook(self.client, self._tracker, records=consumed),
                            StopRequestHook(self.stop_requested)]
        if self.cluster.is_chief and self._saves_checkpoints():
            from tf_ecrec.hooks.shard_rollback import ShardRollbackHook

            restored = self._restored_checkpoint if self.job.fault_tolerance == "ecrec" else None
            self._rollback = ShardRollbackHook(self.client, DATASET, self.job.model_dir, restored=restored)
            hooks.append(self._rollback)
        return hooks

    def recovery_listener(self, inner: Any) -> Any:
        """Wraps an erasure-coded model's recovery listener to learn whether a session restored the checkpoint."""

        def listener(result: Any) -> None:
            if result.method not in ("rebuilt", "settled"):  # those come from background threads, not a session's creation
                self._recovery_method = result.method
            inner(result)

        return listener

    def _restored_checkpoint(self) -> bool:
        # tf_ecrec.recovery reads the checkpoint only for method "checkpoint" (too many PS lost, or all of them).
        method, self._recovery_method = self._recovery_method, None
        return method == "checkpoint"

    def saving_listeners(self) -> list[Any]:
        """The chief's checkpoint listeners (shard progress saved with every checkpoint); call after `hooks`."""
        rollback = getattr(self, "_rollback", None)
        return [rollback.listener] if rollback is not None else []

    def _saves_checkpoints(self) -> bool:
        interval = self.job.checkpoint_interval
        return bool(interval["save_checkpoints_steps"] or interval["save_checkpoints_secs"])

    def raise_failure(self) -> None:
        """Re-raises the lease loop's error (it reaches the training loop wrapped in a TF error)."""
        if self.failure is not None:
            raise self.failure
