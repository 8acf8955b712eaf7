"""``tf-ecrec run --strategy pss``: a Keras model trained by ``fit`` under TF2 ParameterServerStrategy.

The tasks: every PS and worker is a ``tf.distribute.Server`` with the op
library loaded (`serve`); the chief is the strategy's coordinator (`train`):
it builds the model module's ``keras_model(params)`` in the scope of a
strategy protected by `tf_ecrec.pss.protect` (``--ec``), compiles it with the
protection's optimizer wrapper (``--optimizer``, ``--learning-rate``), trains
``--steps`` steps with `tf_ecrec.pss.fit` and reports to the launcher as
the Estimator path does: a ``step`` datagram as the iteration count moves
(`_StepReporter`), ``session`` when training resumes after a
recovery, ``recovered`` per recovery (method ``parity``, or ``memory``/``disk`` when more PS were lost
than the code covers and ``--flash-checkpoint-steps`` snapshots were restored: `tf_ecrec.pss.flash`), and at the end the
digest the launcher's report prints (parity check and ``variables_sha256``,
computed by the chief: the strategy's variables have no names another
process could read them by), in ``<model_dir>/digest.json``.  Recoveries are
also appended to ``<model_dir>/recovery.jsonl``.

Each worker's input is the synthetic records (the same for every worker: the strategy makes one input
pipeline and runs it on each), written once into ``<model_dir>/input`` and loaded by the pipeline
(`tf_ecrec.data.saved_shares`).  Not
supported with ``--strategy pss`` (each refused by `tf_ecrec.launcher.job.pss_rules.validate`): Criteo
files, the job master and its data sharding, elastic workers, spare PS,
``--restart-at new-port`` (a survivor PS cannot reach a moved PS:
`tf_ecrec.pss.recovery`), ``--deterministic``, and protection other than
``--fault-tolerance ecrec``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

from tf_ecrec.cluster.tf_config import ClusterConfig
from tf_ecrec.errors import ConfigError
from tf_ecrec.launcher.job import model_dir
from tf_ecrec.launcher.job.models import data_sizes, load_model, model_params
from tf_ecrec.launcher.job.spec import JobSpec
from tf_ecrec.launcher.job.status import StatusKind

_LOG = logging.getLogger(__name__)

STEP_REPORT_SECS = 0.25
STEP_REPORT_LAG_SECS = 1.0
MAX_RECORDS_PER_WORKER = 1 << 20
REBUILD_REPORT_SECS = 3600.0
"""How long the report of a background rebuild's end waits for it (then the job's end tells what it did)."""
"""A worker's input holds at most this many records (then repeats them), written to the model dir once."""


def serve(cluster: ClusterConfig) -> None:
    """A PS or worker task: a server that runs what the coordinator sends, until the launcher stops it."""
    from tf_ecrec.cluster.ps_session import cluster_server
    from tf_ecrec.ops import load_library

    load_library()
    server = cluster_server(cluster)
    _LOG.info("%s serving at %s", cluster.task, cluster.address)
    server.join()


def _report_rebuilt(sender: Any, result: Any, reporter: Any) -> None:
    """Once a recovery's background rebuild installed every row: "recovered", with its bytes and seconds."""
    rebuild = result.rebuild
    if not rebuild.wait(REBUILD_REPORT_SECS):
        return  # stopped by a failure: the next recovery reports
    sender.send(StatusKind.RECOVERED, method="parity", lost_ps=result.lost, bytes_rebuilt=rebuild.bytes,
                rebuild_seconds=round(rebuild.job.seconds or 0.0, 3), step=reporter.last_step, phases={},
                steps_undone=0, steps_finished=0, folds_rolled_back=0)


def _steps_per_epoch(steps: int) -> int:
    """The largest divisor of `steps` up to 200: fit's epochs then add up to exactly `steps`."""
    return max(d for d in range(1, min(steps, 200) + 1) if steps % d == 0)


def train(job: JobSpec, cluster: ClusterConfig, sender: Any) -> None:
    """The chief: builds, trains and digests the model (see the module doc)."""
    import tensorflow as tf

    import tf_ecrec.pss
    from tf_ecrec.data.saved_shares import SavedShares
    from tf_ecrec.data.synthetic import SyntheticCriteo
    from tf_ecrec.erasure.code import ECConfig

    # Every PS and worker of TF_CONFIG (this task's cluster) serving first: the strategy connects to all of
    # them at once, and TensorFlow 2.15's coordinator aborts the process when one is not listening yet.
    tf_ecrec.pss.prepare_process(wait_secs=120.0)
    module = load_model(job.model, keras=True)
    params = model_params(job, module)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({k: list(v) for k, v in cluster.cluster.items()}), task_type="chief", task_id=0,
        rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf_ecrec.pss.ECPartitioner())
    protection = tf_ecrec.pss.protect(strategy, ECConfig.parse(job.ec))
    make_optimizer = getattr(module, "keras_optimizer", None) or _keras_optimizer
    tf.keras.utils.set_random_seed(job.seed)
    with strategy.scope():
        model = module.keras_model(params)
        model.compile(optimizer=protection.optimizer(make_optimizer(params["optimizer"], params["learning_rate"])),
                      loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    source = SyntheticCriteo(data_sizes(params), job.steps * job.batch_size, seed=job.seed)

    # The strategy traces the dataset_fn once, with one input pipeline, and runs that function on every worker:
    # each worker reads the same records (TensorFlow's tutorial says so of its own input).
    shares = SavedShares(source, 1, os.path.join(job.model_dir, "input"), job.batch_size, MAX_RECORDS_PER_WORKER)
    shares.write()

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        if context.num_input_pipelines != shares.num_shares:
            raise ConfigError(f"{context.num_input_pipelines} input pipelines; rule: {shares.num_shares}, what "
                              "TensorFlow 2.15's ParameterServerStrategy gives; source: the strategy's InputContext")
        return shares.dataset(context.input_pipeline_id)

    reporter = _StepReporter(model, sender, job.batch_size)
    log_path = os.path.join(job.model_dir, "recovery.jsonl")

    def on_recovery(result: Any) -> None:
        rolled_back = max(0, reporter.last_step - result.step) if result.method != "parity" else 0
        entry = {"time": round(time.time(), 3), "task": cluster.task, "method": result.method, "lost_ps": result.lost,
                 "step_before": reporter.last_step, "global_step": result.step, "steps_rolled_back": rolled_back,
                 "bytes_rebuilt": result.bytes_rebuilt, "seconds": round(result.seconds, 3),
                 "steps_undone": result.settled.get("undone", 0), "steps_finished": result.settled.get("finished", 0)}
        with open(log_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")
        if sender is not None:
            settled = {"steps_undone": entry["steps_undone"], "steps_finished": entry["steps_finished"],
                       "folds_rolled_back": 0}
            phases = {"reconnect": round(result.reconnect_seconds, 3)}
            if result.rebuild is None:  # parity before training resumed, or a restore (flash snapshot, checkpoint)
                sender.send(StatusKind.RECOVERED, method=result.method, lost_ps=result.lost, bytes_rebuilt=result.bytes_rebuilt,
                            rebuild_seconds=round(result.seconds - result.reconnect_seconds, 3), step=result.step,
                            phases=phases, **settled)
            else:  # training resumes now, the tables' rows installed meanwhile ("recovered" once they are)
                sender.send(StatusKind.REBUILDING, lost_ps=result.lost, seconds=round(result.seconds, 3), step=result.step,
                            phases=phases, **settled)
                threading.Thread(target=_report_rebuilt, args=(sender, result, reporter), daemon=True).start()
            sender.send(StatusKind.SESSION, step=result.step, session=1 + len(reporter.sessions))
        reporter.sessions.append(result.step)

    spe = _steps_per_epoch(job.steps)
    # Keras' BackupAndRestore, as the TF tutorial uses it: a chief (the coordinator) killed and restarted
    # resumes from the backup of the last epoch's end instead of step 0 (tf_ecrec.pss.backup).
    backup = tf.keras.callbacks.BackupAndRestore(os.path.join(job.model_dir, "backup"))
    try:
        result = tf_ecrec.pss.fit(model, tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=job.steps // spe,
                                  steps_per_epoch=spe, verbose=2, on_recovery=on_recovery, callbacks=[backup],
                                  flash=job.flash, flash_dir=job.model_dir,
                                  on_failure=lambda exc: reporter.pause(), on_resume=reporter.resume,
                                  on_restored=lambda step: _restored(log_path, cluster.task, step, sender))
    finally:
        reporter.stop()
    digest = _digest(model)
    with open(model_dir.digest_file(job.model_dir), "w", encoding="utf-8") as fh:
        json.dump(digest, fh)
    if sender is not None:
        sender.send(StatusKind.DONE, step=result.steps, records=result.steps * job.batch_size, steps=result.steps,
                    corrupt_records=0)


def _restored(log_path: str, task: str, step: int, sender: Any) -> None:
    """A restarted chief began from its backup of `step`: logged, and a session at that step for the report."""
    _LOG.warning("resumed from the backup of step %d", step)
    with open(log_path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"time": round(time.time(), 3), "task": task, "method": "backup", "global_step": step}) + "\n")
    if sender is not None:
        sender.send(StatusKind.SESSION, step=step, session=1, restored="backup")


def _keras_optimizer(name: str, learning_rate: float) -> Any:
    import tensorflow as tf

    kinds = {"adagrad": tf.keras.optimizers.Adagrad, "sgd": tf.keras.optimizers.SGD,
             "adam": tf.keras.optimizers.Adam, "ftrl": tf.keras.optimizers.Ftrl}
    if name not in kinds:
        raise ConfigError(f"--optimizer {name}: --strategy pss trains with one of {sorted(kinds)}; source: --optimizer")
    return kinds[name](learning_rate)


def _digest(model: Any) -> dict[str, Any]:
    """The parity check and the digest of the model's variables (parity and replicas left out), by name."""
    from tf_ecrec.check.live_cluster import ArrayReader, streamed_digest
    from tf_ecrec.check.verify import check_parity, redundancy_names
    from tf_ecrec.pss.keras_optimizer import protected_values

    meta = model.optimizer.describe()
    arrays = protected_values(model)
    redundant = redundancy_names(meta)
    names = sorted(n for n in arrays if n not in redundant)
    digest, nbytes = streamed_digest(ArrayReader(arrays), names)
    return {"parity": check_parity(meta, arrays), "variables_sha256": digest, "variables": len(names), "bytes": nbytes}


class _StepReporter:
    """Sends a ``step`` datagram when the iteration count moved, `STEP_REPORT_LAG_SECS` after it saw it.

    The lag keeps the steps still in flight when a PS dies (counted before
    the error reaches fit) from reading as training resumed: a failure
    `pause`s the reporter and drops what it holds; the recovery's ``session``
    datagram gives the step training resumes from, and `resume` goes on.
    """

    def __init__(self, model: Any, sender: Any, batch_size: int) -> None:
        self.last_step = 0
        self.sessions: list[int] = []
        self._model = model
        self._sender = sender
        self._batch = batch_size
        self._held: tuple[int, float] | None = None  # (step, first seen)
        self._paused = False
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ec-step-reporter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import tensorflow as tf

        while not self._stopped.wait(STEP_REPORT_SECS):
            try:
                step = int(self._model.optimizer.iterations.numpy())
            except (tf.errors.OpError, ValueError):  # its PS is down, or being rebuilt
                continue
            with self._lock:
                if self._paused or step == self.last_step:
                    continue
                if self._held is None or self._held[0] != step:
                    self._held = (step, self._held[1] if self._held else time.monotonic())
                if time.monotonic() - self._held[1] < STEP_REPORT_LAG_SECS:
                    continue
                if self._sender is not None:
                    self._sender.send(StatusKind.STEP, step=step, records=max(0, step - self.last_step) * self._batch)
                self.last_step, self._held = step, None

    def pause(self) -> None:
        with self._lock:
            self._paused, self._held = True, None

    def resume(self) -> None:
        with self._lock:
            self._paused = False

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
