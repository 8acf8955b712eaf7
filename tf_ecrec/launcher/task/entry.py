"""The entry of one task process of a launched job: ``python -m tf_ecrec.launcher.task.entry JOB_JSON``.

The task reads its place in the cluster from TF_CONFIG (set by the launcher,
or by any TF_CONFIG-driven launcher such as a Kubeflow TFJob), starts its
TensorFlow server, and then:

- a PS serves until it is killed;
- a spare PS (``TF_ECREC_SPARE_ADDRESS`` set, `--spare-ps`) boots as a
  one-task job of its own at that address and stands by; when the cluster
  file names its address as ``ps:I`` it has taken that role (TensorFlow's
  cluster propagation gives its devices the name ``/job:ps/task:I`` in the
  trainers' sessions), joins the job master as ``ps:I`` and serves;
- the chief and the workers train the job's model with a stock
  `tf.estimator.Estimator` (`estimator.train`), reporting progress to the
  launcher's status channel when ``TF_ECREC_STATUS_ADDRESS`` is set.

The chief also writes the variable manifest (``<model_dir>/variables.json``) that lets the launcher
read every variable back from the PS tasks, a checkpoint at the end when no interval saved one, and,
under ecrec, ``<model_dir>/recovery.jsonl`` (one line per recovery, as `tf_ecrec.session.recovery_log.RecoveryLog`
writes it), the report a job started by another launcher (``deploy/``, `tf_ecrec.launcher.k8s`) has.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from tf_ecrec.cluster.ps_session import cluster_server, own_server
from tf_ecrec.cluster.tf_config import ClusterConfig, tf_config_env
from tf_ecrec.errors import ConfigError, DataError, EcRecError, RecoveryError
from tf_ecrec.launcher.job.intervals import final_checkpoint_hooks
from tf_ecrec.launcher.job.model_dir import manifest_file
from tf_ecrec.launcher.job.models import data_sizes, load_model, model_params
from tf_ecrec.launcher.job.spec import ENV_SPARE_ADDRESS, FaultTolerance, JobSpec, Strategy
from tf_ecrec.launcher.job.status import ENV_STATUS_ADDRESS, StatusKind, StatusSender
from tf_ecrec.launcher.task.master_connection import ENV_MASTER_ADDRESS, MasterConnection
from tf_ecrec.launcher.task.process import consume_memory_on_signal, wait_forever
from tf_ecrec.session.cluster_source import ENV_CLUSTER_FILE, FileClusterSource, MasterClusterSource

_LOG = logging.getLogger(__name__)

SPARE_POLL_SECS = 0.2


def make_source(job: JobSpec, params: dict[str, Any]) -> Any:
    from tf_ecrec.data.criteo import CriteoFiles
    from tf_ecrec.data.synthetic import SyntheticCriteo

    if job.data == "synthetic":
        return SyntheticCriteo(data_sizes(params), job.steps * job.batch_size, seed=job.seed)
    if job.stream_dir is not None:
        from tf_ecrec.data.stream import open_stream

        return open_stream(job.stream_dir, on_corrupt=job.on_corrupt.value)
    return CriteoFiles(job.criteo_paths, on_corrupt=job.on_corrupt.value)


def _status_sender(cluster: ClusterConfig) -> StatusSender | None:
    """The sender of this task's reports to the launcher, when one listens."""
    address = os.environ.get(ENV_STATUS_ADDRESS)
    return StatusSender(address, cluster.task) if address else None


def _exit_stuck(cluster: ClusterConfig) -> Any:
    """Reports a RecoveryError the training thread did not stop for, then ends the process as `main` would."""
    from tf_ecrec.session.migration import exit_process

    def stuck(error: RecoveryError) -> None:
        sender = _status_sender(cluster)
        if sender is not None:
            with contextlib.suppress(Exception):
                sender.send(StatusKind.ERROR, error=f"{type(error).__name__}: {error}")
        exit_process(error)

    return stuck


def _report_recovery(cluster: ClusterConfig) -> Any:
    sender = _status_sender(cluster)

    def listener(result: Any) -> None:
        if sender is None:
            return
        settled = {"steps_undone": result.steps_undone, "steps_finished": result.steps_finished,
                   "folds_rolled_back": result.folds_rolled_back}
        if result.method == "parity" and result.background:
            # Trainers resume now; the rows are installed while they train ("rebuilt" follows).
            sender.send(StatusKind.REBUILDING, lost_ps=result.lost_ps, seconds=round(result.seconds, 3), step=result.global_step,
                        phases=result.phases, **settled)  # the steps T0's settlement cut: the failure's, not the finish's
        elif result.method in ("parity", "checkpoint", "memory", "disk", "rebuilt") or (
                result.method == "init" and result.lost_ps):  # lost PS with no copy: initialised, data owed to 0
            sender.send(
                StatusKind.RECOVERED,
                method="parity" if result.method == "rebuilt" else result.method,
                lost_ps=result.lost_ps,
                bytes_rebuilt=result.bytes_rebuilt,
                rebuild_seconds=round(result.seconds, 3),
                phases=result.phases,
                step=result.global_step,
                **settled,
            )
        elif result.steps_undone or result.steps_finished:
            sender.send(StatusKind.SETTLED, step=result.global_step, **settled)

    return listener


def cluster_source(cluster: ClusterConfig, master: MasterConnection | None) -> Any:
    """Where a trainer learns the PS addresses: the launcher's cluster file, else the job master, else nowhere.

    With a source, the trainer runs under the failover loop (`tf_ecrec.session.failover`).
    """
    if cluster.task_type == "ps":
        return None
    path = os.environ.get(ENV_CLUSTER_FILE)
    if path:
        return FileClusterSource(path, cluster.num_ps)
    if master is not None:
        return MasterClusterSource(master.client, cluster.num_ps)
    return None


def _report_failover(cluster: ClusterConfig) -> Any:
    sender = _status_sender(cluster)

    def on_transition(state: Any, reason: str) -> None:
        if sender is not None and state.value in ("wait", "build", "retarget"):
            sender.send(StatusKind.FAILOVER, state=state.value, reason=reason)

    return on_transition


def train(job: JobSpec, cluster: ClusterConfig, master: MasterConnection | None = None) -> None:
    """Trains the job's model as this worker.

    With a job master (`master`) the input is the shards this worker leases and
    training ends when the dataset is finished; without one, static shards
    until the global step reaches job.steps.
    """
    import tensorflow as tf

    from tf_ecrec.data.pipeline import (
        StaticShards,
        make_dataset,
        step_keyed_input_fn,
        with_data_accounting,
        with_step_keyed_data,
    )
    from tf_ecrec.hooks.manifest import VariableManifestHook
    from tf_ecrec.hooks.throughput import ThroughputHook

    module = load_model(job.model)
    params = model_params(job, module)
    model_fn = module.model_fn
    extra_hooks: list[Any] = []
    if job.fault_tolerance.ours:
        recovery = _report_recovery(cluster)
        if cluster.is_chief:  # <model_dir>/recovery.jsonl, as tf_ecrec.train writes it (read without a launcher)
            from tf_ecrec.session.recovery_log import RECOVERY_FILE, RecoveryLog, StepWatch

            watch = StepWatch()
            extra_hooks.append(watch)
            recovery = RecoveryLog(os.path.join(job.model_dir, RECOVERY_FILE), cluster.task, watch, then=recovery)
    if job.fault_tolerance is FaultTolerance.FLASH:
        from tf_ecrec.flash.stock import flash_model_fn

        model_fn = flash_model_fn(model_fn, job.flash, recovery_listener=recovery,
                                  listeners=master.flash_listeners() if master is not None else ())
    elif job.fault_tolerance is FaultTolerance.ECREC:
        from tf_ecrec.erasure.code import ECConfig
        from tf_ecrec.estimator.model_fn import ec_model_fn

        params["ec"] = True
        model_fn = ec_model_fn(model_fn, ECConfig.parse(job.ec), recovery_listener=recovery,
                               rebuild_slice_bytes=max(1, int(job.rebuild_slice_mb * (1 << 20))),
                               rebuild_share=job.rebuild_share, flash=job.flash,
                               flash_listeners=master.flash_listeners() if master is not None else ())
    else:
        from tf_ecrec.recovery.deadline_session import long_deadline_model_fn

        # Initialisation, checkpoint saves and restores of a large model outlast the session timeout.
        model_fn = long_deadline_model_fn(model_fn)
    source = make_source(job, params)
    if master is not None:
        master.register_dataset(source.num_records)

        def input_fn() -> tf.data.Dataset:
            return master.data.dataset(source, job.batch_size, data_sizes(params))

    else:
        shards = StaticShards(
            source.num_records, job.shard_batches * job.batch_size, cluster.num_workers, cluster.worker_position
        )

        def input_fn() -> tf.data.Dataset:
            return make_dataset(source, shards, job.batch_size, data_sizes(params))

    model_fn = with_data_accounting(model_fn)
    if job.deterministic:
        # The batch of each step is a function of the global step, so a step a
        # failure cut is retried on the same records (see with_step_keyed_data).
        model_fn = with_step_keyed_data(model_fn, source, job.batch_size, data_sizes(params))
        input_fn = step_keyed_input_fn

    hooks: list[Any] = [
        ThroughputHook(
            _status_sender(cluster),
            summary_dir=job.model_dir if cluster.is_chief else None,
            batch_size=job.batch_size,
        )
    ]
    if cluster.is_chief:
        hooks += [VariableManifestHook(manifest_file(job.model_dir), ps=list(cluster.ps_addresses)),
                  *final_checkpoint_hooks(job, lambda: not getattr(runner, "moving", False))]  # runner: below
    hooks += master.hooks() if master is not None else []
    hooks += extra_hooks

    def build(at: ClusterConfig, session_config: Any = None) -> Any:
        with tf_config_env(at):
            run_config = tf.estimator.RunConfig(
                model_dir=job.model_dir,
                tf_random_seed=job.seed,
                keep_checkpoint_max=3,
                log_step_count_steps=1000,
                session_config=session_config,
                **job.checkpoint_interval,
            )
        if job.fault_tolerance is FaultTolerance.ECREC:
            from tf_ecrec.layout.device import ECDeviceFn

            run_config = run_config.replace(device_fn=ECDeviceFn.from_run_config(run_config))
        return tf.estimator.Estimator(model_fn=model_fn, params=params, config=run_config)

    ps_source = cluster_source(cluster, master)
    if ps_source is None:
        runner: Any = build(cluster)
    else:
        from tf_ecrec.session.failover import FailoverLoop

        runner = FailoverLoop(
            cluster, build, ps_source, session_timeout_secs=job.session_timeout, wait_secs=job.ps_wait,
            on_transition=_report_failover(cluster), on_stuck=_exit_stuck(cluster),
        )
    try:
        runner.train(
            lambda: input_fn(),
            max_steps=None if master is not None else job.steps,  # with a master: until the data is finished
            hooks=hooks,
            saving_listeners=master.saving_listeners() if master is not None else None,
        )
    except tf.errors.OpError as exc:
        if master is not None:
            master.raise_failure()  # the lease loop's own error (master unreachable, ...)
        # A DataError raised by the reader inside the input pipeline reaches us
        # wrapped in a TensorFlow error; surface it as itself.
        found = re.search(r"DataError: (.*)", exc.message or "")
        if found:
            raise DataError(found.group(1)) from exc
        raise


def run(job: JobSpec, cluster: ClusterConfig) -> None:
    from tf_ecrec.step.failpoints import ENV_TASK  # imports TensorFlow

    os.environ[ENV_TASK] = cluster.task  # read by the failpoint op (tf_ecrec.step.failpoints)
    if job.deterministic:
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    if job.fault_tolerance.ours:
        # Every process that executes our ops needs their kernels registered: the PS tasks run the
        # delta and parity ops of the training graph, and the ready op's wait for their markers.
        from tf_ecrec.ops import load_library

        load_library()
    if job.strategy is Strategy.PSS:  # TF2 ParameterServerStrategy: servers, and the chief coordinates
        from tf_ecrec.launcher.task import pss_job

        if cluster.is_chief:
            pss_job.train(job, cluster, _status_sender(cluster))
        else:
            pss_job.serve(cluster)
        return
    if os.environ.get(ENV_SPARE_ADDRESS):
        stand_by(job, os.environ[ENV_SPARE_ADDRESS], cluster.num_ps)
        return
    if cluster.task_type != "ps" and (os.environ.get(ENV_CLUSTER_FILE) or os.environ.get(ENV_MASTER_ADDRESS)):
        # A trainer under the failover loop: its sessions carry the cluster (tf_ecrec.session.failover).
        server = own_server(cluster.address)
    else:
        server = cluster_server(cluster)
    master = MasterConnection.connect(job, cluster)  # None without a job master
    if cluster.task_type == "ps":
        _LOG.info("%s serving at %s", cluster.task, cluster.address)
        consume_memory_on_signal()  # --inject oom:ps:I@step=N
        if job.flash is None:
            wait_forever(server)  # not server.join(): signal handlers run only while Python code does
        else:
            serve_persisting(job, cluster.task_index, server)
        return
    if master is None:
        train(job, cluster)
        return
    master.install_stop_signal()  # SIGTERM (--remove-worker): finish the step, report, leave
    try:
        train(job, cluster, master)
        master.leave()
    finally:
        master.close()


def serve_persisting(job: JobSpec, ps: int, server: Any) -> None:
    """A PS of a job with flash checkpoints: serves until SIGTERM, then persists its newest snapshot (`tf_ecrec.flash.persist`)."""
    import signal

    from tf_ecrec.flash.persist import persist_newest

    def on_term(signum: int, frame: Any) -> None:
        manifest = persist_newest(job.flash, job.model_dir, ps)
        _LOG.warning("SIGTERM: flash checkpoint %s persisted", f"of step {manifest.global_step}" if manifest else "not")
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    wait_forever(server)


def stand_by(job: JobSpec, address: str, num_ps: int) -> None:
    """A spare PS: serve at `address`, wait until the cluster file gives it a PS's role, take it, serve on."""
    server = own_server(address, ps=True)
    path = os.environ.get(ENV_CLUSTER_FILE)
    if not path:
        raise ConfigError(f"a spare PS needs the cluster file to learn its role; {ENV_CLUSTER_FILE} is not set; "
                          f"source: environment variable {ENV_CLUSTER_FILE}")
    _LOG.info("spare PS standing by at %s", address)
    source = FileClusterSource(path, num_ps)
    while True:
        try:
            addresses = source.ps_addresses()
        except EcRecError as exc:  # the file is being replaced, or not written yet
            _LOG.debug("cluster file not readable yet: %s", exc)
            addresses = []
        if address in addresses:
            break
        time.sleep(SPARE_POLL_SECS)
    index = addresses.index(address)
    # Only the role's identity matters to the master connection; a PS that is down (no address in the
    # file) gets a placeholder, unique and never dialled, so that the config validates.
    ps = tuple(a or f"0.0.0.0:{65535 - i}" for i, a in enumerate(addresses))
    role = ClusterConfig({"ps": ps}, "ps", index)
    _LOG.info("spare PS at %s takes the role of %s", address, role.task)
    master = MasterConnection.connect(job, role)  # the job master learns ps:I's new address from it
    server.join()
    if master is not None:
        master.close()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if len(argv) != 1:
        print("usage: python -m tf_ecrec.launcher.task.entry JOB_JSON  (TF_CONFIG in the environment)", file=sys.stderr)
        return 2
    cluster: ClusterConfig | None = None
    try:
        job = JobSpec.load(argv[0])
        cluster = ClusterConfig.from_environment()
        run(job, cluster)
    except EcRecError as exc:
        _LOG.error("%s: %s", type(exc).__name__, exc)
        sender = _status_sender(cluster) if cluster is not None else None
        if sender is not None:
            sender.send(StatusKind.ERROR, error=f"{type(exc).__name__}: {exc}")
        return 3
    return 0


if __name__ == "__main__":
    from tf_ecrec.base.process_end import end_process

    end_process(main())  # TensorFlow's interpreter teardown would keep a finished task alive for a second
