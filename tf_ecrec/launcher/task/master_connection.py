"""A launched task's connection to the job master: membership, its leased data, the hooks that go with them.

The launcher (`tf_ecrec.launcher.supervisor`) passes the master's address
and token in the environment (``TF_ECREC_MASTER_ADDRESS``,
``TF_ECREC_MASTER_TOKEN``; never in TF_CONFIG).  A task then::

    conn = MasterConnection.connect(job, cluster)   # register + join membership (bounded)
    ...                                             # PS: serve; trainers:
    conn.register_dataset(source.num_records)
    estimator.train(lambda: conn.data.dataset(source, ...), hooks=[..., *conn.hooks()],
                    saving_listeners=conn.saving_listeners(), max_steps=None)
    conn.leave()                                    # deregister: leases go back, not failed
    conn.close()

Membership: with the embedded backend the task heartbeats to the master
(`EmbeddedMembership`, which re-registers by itself after being declared
lost); with ``--zk`` it registers with the master for a generation and
keeps an ephemeral znode carrying it (`ZooKeeperMembership`).

Data: the shards of the job's dataset (`DATASET`) are leased through
`tf_ecrec.data.leased.LeasedData`; when the master declared this task
lost, the lease loop calls back here to register again.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
from typing import Any

from tf_ecrec.cluster.tf_config import ClusterConfig
from tf_ecrec.errors import ConfigError, EcRecError
from tf_ecrec.launcher.job.spec import JobSpec

_LOG = logging.getLogger(__name__)

ENV_MASTER_ADDRESS = "TF_ECREC_MASTER_ADDRESS"
ENV_MASTER_TOKEN = "TF_ECREC_MASTER_TOKEN"
DATASET = "train"
"""The name of a launched job's dataset at the master."""
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


class MasterConnection:
    """A task's membership in the job and its leased data.  Use `connect`.

    Attributes:
      client: this task's registered `MasterClient`.
      data: the job's dataset as this task leases it (`LeasedData`).
      stop_requested: set by SIGTERM (`install_stop_signal`): the input ends
        and training stops after the current step.
    """

    def __init__(self, job: JobSpec, cluster: ClusterConfig, address: str, token: str | None) -> None:
        self.job = job
        self.cluster = cluster
        self.master_address = address
        self._token = token
        self._membership: Any = None
        self.client: Any = None
        self.data: Any = None
        self.stop_requested = threading.Event()
        self._rejoin_lock = threading.Lock()
        self._rollback: Any = None

    # ---- membership -------------------------------------------------------------------

    @classmethod
    def connect(cls, job: JobSpec, cluster: ClusterConfig, environ: Any = None) -> MasterConnection | None:
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
        conn = cls(job, cluster, address, environ.get(ENV_MASTER_TOKEN) or None)
        conn._join()
        return conn

    def _join(self) -> None:
        from tf_ecrec.membership.base import Member

        member = Member(self.cluster.task_type, self.cluster.task_index, self.cluster.address)
        if self.job.zk:
            from tf_ecrec.base.retry import Retry
            from tf_ecrec.master.client import MasterClient
            from tf_ecrec.membership.zookeeper import ZooKeeperMembership

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
        from tf_ecrec.data.leased import LeasedData

        self.data = LeasedData(self.client, self.cluster.task, DATASET, rejoin=self._rejoin, stop=self.stop_requested)

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
        if self.job.stream_dir is not None:  # records arrive while the job trains; the launcher extends it
            from tf_ecrec.data.stream import CAPACITY

            self.data.register(CAPACITY, self.job.shard_batches * self.job.batch_size, 1, stream=True)
            return
        per_epoch, epochs = dataset_shape(self.job, num_records)
        self.data.register(per_epoch, self.job.shard_batches * self.job.batch_size, epochs)

    # ---- hooks ------------------------------------------------------------------------

    def hooks(self) -> list[Any]:
        """Progress acknowledgement, stop on request, and (chief) the shard-state rollbacks restores owe."""
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
                    "with_data_accounting; source: MasterConnection.hooks"
                )
            return tf.add_n([tf.cast(c, tf.int64) for c in counts])

        hooks: list[Any] = [ShardProgressHook(self.client, self.data.tracker, records=consumed),
                            StopRequestHook(self.stop_requested)]
        if not self.cluster.is_chief or not (self.job.fault_tolerance.ours or self._saves_checkpoints()):
            return hooks
        from tf_ecrec.hooks.shard_rollback import OwedRollbackHook, ShardRollbackHook

        # A restore owes the data rollback in the model dir before it writes a PS (tf_ecrec.recovery.owed):
        # the payer rolls the master back, at every session creation and from a thread while the master is away.
        payer = OwedRollbackHook(self.client, DATASET, self.job.model_dir, task=self.cluster.task)
        hooks.append(payer)
        if self._saves_checkpoints():
            # tf_ecrec's recovery owes its own restores; a stock session restores whenever a checkpoint exists.
            restored = (lambda: False) if self.job.fault_tolerance.ours else None
            self._rollback = ShardRollbackHook(self.client, DATASET, self.job.model_dir, restored=restored, payer=payer)
            hooks.append(self._rollback)
        return hooks

    def flash_listeners(self) -> list[Any]:
        """The chief's flash checkpoint listeners: the shard progress saved with every snapshot."""
        from tf_ecrec.hooks.shard_progress import ShardCheckpointListener

        return [ShardCheckpointListener(self.client, DATASET, self.job.model_dir)] if self.cluster.is_chief else []

    def saving_listeners(self) -> list[Any]:
        """The chief's checkpoint listeners (shard progress saved with every checkpoint); call after `hooks`."""
        return [self._rollback.listener] if self._rollback is not None else []

    def _saves_checkpoints(self) -> bool:
        interval = self.job.checkpoint_interval
        return bool(interval["save_checkpoints_steps"] or interval["save_checkpoints_secs"])

    def raise_failure(self) -> None:
        """Re-raises the lease loop's error (it reaches the training loop wrapped in a TF error)."""
        self.data.raise_failure()
