"""tf_ecrec under TF2 ParameterServerStrategy: placement, exact parity under async fit, recovery from parity.

Each case runs in a fresh interpreter (a strategy binds the process's eager context to its
cluster) against real PS and worker processes (`harness.pss_cluster`); the interpreter is the
coordinator.  The oracles: the layout (every variable's device), re-encoding every stripe from
the data (`tf_ecrec.check.verify.check_parity`), and, for recovery, the values every variable held
before the failure (read when no step was in flight), compared bit for bit.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import threading
import time
from typing import Any

import numpy as np
from harness.pss_cluster import exit_with, fit_started
from harness.serving import serve_without_tf_ecrec, sha256

TOTAL_TIMEOUT = 420


def _setup(num_ps: int = 3, num_workers: int = 2, ec: str = "2+1") -> tuple[Any, Any]:
    from harness.pss_cluster import PSSCluster

    import tf_ecrec.pss

    tf_ecrec.pss.prepare_process()
    import tensorflow as tf

    cluster = PSSCluster(num_ps, num_workers)
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        cluster.resolver(), variable_partitioner=tf_ecrec.pss.ECPartitioner())
    return cluster, tf_ecrec.pss.protect(strategy, ec)


def _model(tf: Any, name: str, optimizer: Any, protection: Any) -> Any:
    import tf_ecrec.keras

    class Model(tf.keras.Model):
        def __init__(self) -> None:
            super().__init__(name=name)
            self.emb = tf_ecrec.keras.ECEmbeddings([("a", 300), ("b", 77)], 4, name=f"{name}_emb")
            self.dense = tf.keras.layers.Dense(1)

        def call(self, x: Any) -> Any:
            return self.dense(tf.reshape(self.emb(x), [-1, 8]))

    with protection.strategy.scope():
        model = Model()
        model.compile(optimizer=protection.optimizer(optimizer), loss="mse")
    return model


def _dataset_fn(tf: Any) -> Any:
    def dataset_fn(ctx: Any) -> Any:
        rng = np.random.default_rng(ctx.input_pipeline_id if ctx else 0)
        ids = np.stack([rng.integers(0, 300, 1024), rng.integers(0, 77, 1024)], 1)
        y = rng.normal(size=(1024, 1)).astype(np.float32)
        return tf.data.Dataset.from_tensor_slices((ids, y)).repeat().batch(16)

    return dataset_fn


def _data(tf: Any) -> Any:
    return tf.keras.utils.experimental.DatasetCreator(_dataset_fn(tf))


def _values(model: Any) -> dict[str, np.ndarray]:
    """Every variable of the model and its protection, by name (read when no step is in flight)."""
    from tf_ecrec.layout.device import variable_name

    opt = model.optimizer
    variables = list(model.trainable_variables) + opt.protection_variables() + [opt.iterations]
    return {variable_name(v): v.numpy() for v in variables}


def _check_parity(model: Any) -> dict[str, Any]:
    from tf_ecrec.check.verify import check_parity

    report = check_parity(model.optimizer.describe(), _values(model))
    assert report["stripes_checked"] > 0 and report["replicas_checked"] > 0, report
    assert report["mismatches"] == 0 and report["replica_mismatches"] == 0, report
    return report


# ---- placement and exact parity ---------------------------------------------------------------------


def placement_and_parity_case() -> None:
    def case() -> None:
        import tensorflow as tf

        import tf_ecrec.keras
        import tf_ecrec.pss
        from tf_ecrec.errors import ConfigError
        from tf_ecrec.layout.device import ps_index

        cluster, protection = _setup()
        try:
            optimizers = {
                "sgd": tf.keras.optimizers.SGD(0.1),
                "adagrad": tf.keras.optimizers.Adagrad(0.1),
                "adam": tf.keras.optimizers.Adam(0.01),
                "ftrl": tf.keras.optimizers.Ftrl(0.1),
                "legacy_adagrad": tf.keras.optimizers.legacy.Adagrad(0.1),  # what TensorFlow's PSS tutorial uses
            }
            for name, optimizer in optimizers.items():
                model = _model(tf, name, optimizer, protection)
                model.fit(_data(tf), epochs=2, steps_per_epoch=12, verbose=0)
                before = {n: v for n, v in _values(model).items() if "/data" in n and not n.endswith(("accumulator", "/m", "/v", "linear"))}
                coll = model.emb.collection
                # Placement: the layout's PS for every data chunk and parity chunk; slots with their
                # variable; replicas on the next r PS; never the creation counter's guess unchecked.
                for p, var in coll.data.items():
                    assert ps_index(var.device) == p and coll.data_chunks_on[p], (name, var.device)
                opt = model.optimizer.protector
                for q, var in opt.parity[coll.name].items():
                    assert ps_index(var.device) == q and coll.parity_chunks_on[q], (name, var.device)
                for var_name, slots in opt.variables.slots.items():
                    owner = next(v for v in [*coll.data.values(), *opt.protected.values()] if v.name.startswith(var_name + ":"))
                    assert all(ps_index(s.device) == ps_index(owner.device) for s in slots), var_name
                for var_name, reps in opt.replicas.items():
                    primary = ps_index(opt.protected[var_name].device)
                    assert [ps_index(r.device) for r in reps] == [(primary + 1) % 3], var_name
                assert int(model.optimizer.iterations.numpy()) == 24, name
                report = _check_parity(model)
                assert report["rows_checked"] == coll.table_layout.chunk_rows * coll.table_layout.num_stripes, report
                # Training changes the tables (parity equal to the code of untouched data proves little).
                model.fit(_data(tf), epochs=1, steps_per_epoch=4, verbose=0)
                after = _values(model)
                assert any(not np.array_equal(before[n], after[n]) for n in before), name
                _check_parity(model)
            # A model compiled with the stock optimizer, not the protection's wrapper, is refused before it
            # trains unprotected (it once trained to the end and only its recovery failed, untyped).
            with protection.strategy.scope():
                stock = tf.keras.Sequential([tf_ecrec.keras.ECEmbeddings([("s", 50)], 4, name="stock_emb")])
                stock.compile(optimizer=tf.keras.optimizers.Adagrad(0.1), loss="mse")
            try:
                tf_ecrec.pss.fit(stock, _data(tf), epochs=1, steps_per_epoch=2, verbose=0)
            except ConfigError as exc:
                assert "keras" in str(exc) and "protection.optimizer(" in str(exc), exc
            else:
                raise AssertionError("a model compiled with a stock optimizer trained under tf_ecrec.pss.fit")
        finally:
            cluster.close()

    exit_with(case)


# ---- recovery -------------------------------------------------------------------------------------------


def rebuild_is_exact_case() -> None:
    """The deterministic comparison: with no step in flight, a rebuilt PS holds what it held, bit for bit
    (PS 1, then PS 0), and training goes on over it; the recovery of PS 1 is cut once midway and started over."""

    def case() -> None:
        import tensorflow as tf

        from tf_ecrec.pss.recovery import PSSRecovery

        class CutOnce(PSSRecovery):
            """Its first table rebuild fails as a dropped channel would, after the lost PS's variables (and its
            anchor, which then answers) were re-created: the next attempt must still rebuild that PS."""

            cuts = 1

            def _rebuild_tables(self, lost: list[int]) -> Any:
                if self.cuts:  # after T0: the lost rows pending, the survivors preserving
                    self.cuts -= 1
                    super()._rebuild_tables(lost)[0].stop()
                    raise tf.errors.UnavailableError(None, None, "injected: a channel dropped during the rebuild")
                return super()._rebuild_tables(lost)

        cluster, protection = _setup()
        try:
            model = _model(tf, "m", tf.keras.optimizers.Adagrad(0.1), protection)
            recovery = CutOnce(protection, model)
            for ps, attempts in ((1, 2), (0, 1)):
                model.fit(_data(tf), epochs=1, steps_per_epoch=10, verbose=0)
                held = _values(model)
                cluster.kill("ps", ps)
                cluster.restart("ps", ps)
                result = recovery.recover(timeout_secs=120)
                assert result.lost == [ps] and result.attempts == attempts, result
                assert result.settled == {"undone": 0, "finished": 0, "committed": 0}, result
                assert result.rebuilt_in_background and recovery.wait_rebuilt(120), result  # the walk, no lookup
                assert result.variables_rebuilt > 0 and result.bytes_rebuilt > 0, result
                now = _values(model)
                assert sorted(now) == sorted(held)
                different = [n for n in held if not np.array_equal(held[n], now[n])]
                assert not different, f"PS {ps} rebuilt differently: {different}"
                assert result.step == int(held["iteration"])
            model.fit(_data(tf), epochs=1, steps_per_epoch=6, verbose=0)  # the retraced step over the new variables
            assert int(model.optimizer.iterations.numpy()) == 26
            _check_parity(model)
        finally:
            cluster.close()

    exit_with(case)


def kill_during_fit_case() -> None:
    """PS killed while asynchronous workers train, twice in sequence (PS 1, then PS 0): each is rebuilt
    from parity, fit goes on from the step it was at (no step lost but the cut ones settlement undid),
    and parity is exact at the end.  Then what a user does with the model: weights saved and restored
    bit for bit, and the model exported as a SavedModel that serves without tf_ecrec."""

    def case() -> None:
        import tensorflow as tf

        import tf_ecrec.pss
        from tf_ecrec.pss.recovery import PSSRecovery

        cluster, protection = _setup()
        try:
            model = _model(tf, "m", tf.keras.optimizers.Adagrad(0.1), protection)
            seen: dict[int, int] = {}
            started = fit_started()

            recovery = PSSRecovery(protection, model)

            def rebuilding() -> bool:  # PS 0 lost while PS 1 is rebuilt would be two chunks of a stripe: beyond r
                return recovery.rebuilding is None or not recovery.rebuilding.finished

            def killer() -> None:
                started.event.wait(120)
                for ps, at in ((1, 20), (0, 45)):
                    while int(model.optimizer.iterations.numpy()) < at or (ps == 0 and rebuilding()):
                        time.sleep(0.01)
                    seen[ps] = int(model.optimizer.iterations.numpy())
                    cluster.kill("ps", ps)
                    time.sleep(0.5)
                    cluster.restart("ps", ps)

            thread = threading.Thread(target=killer, daemon=True)
            thread.start()
            result = tf_ecrec.pss.fit(model, _data(tf), epochs=4, steps_per_epoch=20, verbose=0, timeout_secs=120,
                                      callbacks=[started], recovery=recovery)
            thread.join(timeout=60)
            assert [r.lost for r in result.recoveries] == [[1], [0]], result
            assert all(r.rebuilt_in_background for r in result.recoveries), result
            for r, ps in zip(result.recoveries, (1, 0)):
                # No rollback: the job resumes at least where it was seen before the kill, less the cut
                # steps settlement undid (a rolled-back job would resume at a checkpoint's step).
                assert r.step >= seen[ps] - r.settled["undone"], (r, seen)
            assert result.steps == 80 and int(model.optimizer.iterations.numpy()) == 80
            _check_parity(model)
            # What Keras' ModelCheckpoint and BackupAndRestore do after the recoveries: a save (it once failed,
            # "A list element was replaced", the recovery having re-pointed tracked lists in place) that
            # restores bit for bit, every variable of the model and its protection, after more training.
            with tempfile.TemporaryDirectory() as saved_dir:
                path = os.path.join(saved_dir, "after_recovery")
                model.save_weights(path)
                saved = _values(model)
                model.fit(_data(tf), epochs=1, steps_per_epoch=4, verbose=0)
                assert any(not np.array_equal(saved[n], v) for n, v in _values(model).items())
                model.load_weights(path)
                restored = _values(model)
                assert restored.keys() == saved.keys()
                assert [n for n in saved if not np.array_equal(saved[n], restored[n])] == []
                _assert_served_without_tf_ecrec(tf, model, saved_dir)
            _check_parity(model)
        finally:
            cluster.close()

    exit_with(case)


def backup_and_restore_case() -> None:
    """Keras' BackupAndRestore given to `tf_ecrec.pss.fit`: a PS killed mid-epoch is rebuilt from parity and the job
    goes on from where it was (the backup is not restored over the recovered state), a backup is written at every
    epoch's end with parity exact in it, and a restarted job (a new model object, as a new coordinator makes)
    begins from the last backup, bit for bit, trains only the steps after it, and keeps parity exact.  The PS
    killed is the one holding the wrapped Keras optimizer's ``learning_rate`` variable, which no recovery re-creates
    (the protection's rule holds the rate): Keras' backups after the recovery must not read it."""

    def case() -> None:
        import tensorflow as tf

        import tf_ecrec.pss

        def digest(model: Any) -> list[str]:  # the model's weights (names differ between the two models' objects)
            return sorted(hashlib.sha256(v.numpy().tobytes()).hexdigest() for v in model.trainable_variables)

        cluster, protection = _setup()
        try:
            with tempfile.TemporaryDirectory() as backup_dir:
                with protection.strategy.scope():  # as the TF tutorial makes it: its learning_rate variable on a PS
                    adagrad = tf.keras.optimizers.Adagrad(0.1)
                model = _model(tf, "first", adagrad, protection)
                where = tf.DeviceSpec.from_string(adagrad._learning_rate.device)
                assert where.job == "ps", where
                victim = int(where.task)
                # `fit` called in the strategy's scope still keeps Keras' backup state on the coordinator (made in
                # the scope, its variables would go to some PS, which a failure could take with them).
                from tf_ecrec.pss.backup import Backups

                with protection.strategy.scope():
                    state = Backups(model, [tf.keras.callbacks.BackupAndRestore(backup_dir)])._states[0]
                for v in (state._ckpt_saved_epoch, state.write_checkpoint_manager.checkpoint.save_counter):
                    assert "/job:ps/" not in v.device, v.device
                started = fit_started()
                seen: list[int] = []

                def killer() -> None:
                    started.event.wait(120)
                    while int(model.optimizer.iterations.numpy()) < 30:  # inside the second epoch
                        time.sleep(0.01)
                    seen.append(int(model.optimizer.iterations.numpy()))
                    cluster.kill("ps", victim)
                    time.sleep(0.5)
                    cluster.restart("ps", victim)

                thread = threading.Thread(target=killer, daemon=True)
                thread.start()
                steps_at: list[int] = []  # the iteration count at every model.fit start and epoch end: never back

                class Steps(tf.keras.callbacks.Callback):
                    def on_train_begin(self, logs: Any = None) -> None:
                        steps_at.append(int(self.model.optimizer.iterations.numpy()))

                    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                        steps_at.append(int(self.model.optimizer.iterations.numpy()))

                keep = tf.keras.callbacks.BackupAndRestore(backup_dir, delete_checkpoint=False)
                result = tf_ecrec.pss.fit(model, _data(tf), epochs=3, steps_per_epoch=20, verbose=0, timeout_secs=120,
                                          callbacks=[keep, Steps(), started])
                thread.join(timeout=60)
                assert steps_at == sorted(steps_at) and steps_at[-1] == 60, steps_at
                assert result.restored_step is None and [r.lost for r in result.recoveries] == [[victim]], result
                (recovered,) = result.recoveries
                assert recovered.step >= seen[0] - recovered.settled["undone"] > 20, (recovered, seen)  # no rollback
                assert result.steps == 60 and int(model.optimizer.iterations.numpy()) == 60
                _check_parity(model)
                latest = tf.train.latest_checkpoint(os.path.join(backup_dir, "chief"))
                assert latest and int(tf.train.load_variable(latest, "ckpt_saved_epoch/.ATTRIBUTES/VARIABLE_VALUE")) == 2
                at_backup = digest(model)

                # The job started again: a new model object restores the backup and trains the fourth epoch only,
                # at a learning rate of 0, so that its weights must end as the backup has them, bit for bit (a
                # model that began from its own initial values would end with those).
                again = _model(tf, "again", tf.keras.optimizers.Adagrad(0.0), protection)
                result = tf_ecrec.pss.fit(again, _data(tf), epochs=4, steps_per_epoch=20, verbose=0, timeout_secs=120,
                                          callbacks=[tf.keras.callbacks.BackupAndRestore(backup_dir)])
                assert result.restored_step == 60 and digest(again) == at_backup, result
                assert result.steps == 80 and len(result.histories) == 1, result
                _check_parity(again)
                assert not os.path.exists(os.path.join(backup_dir, "chief")), os.listdir(backup_dir)  # deleted at the end
        finally:
            cluster.close()

    exit_with(case)


def _assert_served_without_tf_ecrec(tf: Any, model: Any, directory: str) -> None:
    """The trained model exported two ways (Keras' ``model.save``, ``tf.saved_model.save``) serves in a process
    without tf_ecrec: its weights are the trained ones bit for bit, and it predicts what the model predicts
    here (to float rounding: the served graph may fuse the dense layer's ops, which the eager call does not)."""
    ids = np.stack([np.arange(64) % 300, (np.arange(64) * 7) % 77], 1).astype(np.int64)
    want = model(tf.constant(ids)).numpy()
    keras_path, tf_path = (os.path.join(directory, n) for n in ("keras_saved", "tf_saved"))
    model.save(keras_path)
    tf.saved_model.save(model, tf_path)
    served = serve_without_tf_ecrec([keras_path, tf_path], {"ids": ids}, directory)
    weights = sorted(sha256(v.numpy()) for v in model.trainable_variables)
    for how, got in served.items():
        assert got["trainable"] == weights, how
        (predictions,) = got["outputs"].values()
        np.testing.assert_allclose(np.asarray(predictions, np.float32), want, rtol=1e-6, atol=1e-7, err_msg=how)


def worker_killed_during_fit_case() -> None:
    """A worker killed in the middle of its steps and restarted: the strategy re-runs its closures, the
    steps it left half done are settled while training goes on, and parity is exact at the end."""

    def case() -> None:
        import tensorflow as tf

        import tf_ecrec.pss

        cluster, protection = _setup()
        try:
            model = _model(tf, "m", tf.keras.optimizers.Adagrad(0.1), protection)

            started = fit_started()

            def killer() -> None:
                started.event.wait(120)
                while int(model.optimizer.iterations.numpy()) < 15:
                    time.sleep(0.01)
                cluster.kill("worker", 1)
                time.sleep(0.5)
                cluster.restart("worker", 1)

            thread = threading.Thread(target=killer, daemon=True)
            thread.start()
            result = tf_ecrec.pss.fit(model, _data(tf), epochs=3, steps_per_epoch=20, verbose=0, timeout_secs=120,
                                      callbacks=[started])
            thread.join(timeout=60)
            assert not result.recoveries, result  # no PS was lost
            # At least the planned steps: the strategy runs a dead worker's closure again, and when the first
            # run had finished on the PS before the worker died, that step is counted twice.
            assert result.steps >= 60, result
            print("stale steps settled:", result.stale_settled, flush=True)
            assert not result.settle_errors, result.settle_errors
            _check_parity(model)
        finally:
            cluster.close()

    exit_with(case)


def worker_cut_in_a_step_case() -> None:
    """A worker that dies inside a step (a failpoint after every update, before the commit) and comes back
    4 s later: its step, left pending on the PS logs, is settled while training goes on, fit ends, and
    parity is exact."""

    def case() -> None:
        import tensorflow as tf

        import tf_ecrec.pss

        marker_dir = tempfile.mkdtemp(prefix="ec_failpoint_")
        os.environ["TF_ECREC_FAILPOINT"] = "worker_before_commit@worker:1@step=15"
        os.environ["TF_ECREC_FAILPOINT_DIR"] = marker_dir
        cluster, protection = _setup()
        try:
            model = _model(tf, "m", tf.keras.optimizers.Adagrad(0.1), protection)
            died = threading.Event()

            def restarter() -> None:
                proc = cluster.procs[("worker", 1)]
                try:
                    proc.wait(timeout=TOTAL_TIMEOUT)
                except subprocess.TimeoutExpired:
                    return
                died.set()
                time.sleep(4.0)  # a restart as slow as a rescheduled pod's: the dead step goes stale meanwhile
                cluster.restart("worker", 1)

            thread = threading.Thread(target=restarter, daemon=True)
            thread.start()
            result = tf_ecrec.pss.fit(model, _data(tf), epochs=3, steps_per_epoch=20, verbose=0, timeout_secs=120)
            assert died.is_set(), "the failpoint did not fire"
            assert os.listdir(marker_dir), "no failpoint marker"
            assert not result.recoveries, result
            assert result.steps >= 60, result
            assert not result.settle_errors, result.settle_errors
            assert result.stale_settled, f"the cut step was not settled while training went on: {result}"
            _check_parity(model)
        finally:
            os.environ.pop("TF_ECREC_FAILPOINT", None)
            cluster.close()

    exit_with(case)


def coordinator_loop_case() -> None:
    """A custom `ClusterCoordinator` loop with the wrapped optimizer: a PS killed between scheduled steps is
    recovered by `PSSRecovery.recover`, the loop makes its step function again (it captured the old
    variables) and its per-worker input, and goes on; parity exact at the end."""

    def case() -> None:
        import tensorflow as tf

        from tf_ecrec.pss.recovery import PSSRecovery, is_ps_failure

        cluster, protection = _setup()
        try:
            strategy = protection.strategy
            model = _model(tf, "m", tf.keras.optimizers.Ftrl(0.1), protection)
            coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)

            def make_iterator() -> Any:
                return iter(coordinator.create_per_worker_dataset(lambda: _dataset_fn(tf)(None)))

            iterator = make_iterator()

            def make_step() -> Any:
                @tf.function
                def step(it: Any) -> Any:
                    def replica(batch: Any) -> Any:
                        x, y = batch
                        with tf.GradientTape() as tape:
                            loss = tf.reduce_mean(tf.square(model(x) - y))
                        grads = tape.gradient(loss, model.trainable_variables)
                        model.optimizer.apply_gradients(zip(grads, model.trainable_variables))
                        return loss

                    return strategy.run(replica, args=(next(it),))

                return step

            step = make_step()
            recovery = PSSRecovery(protection, model)
            done, killed, recoveries = 0, False, []
            while done < 40:
                try:
                    for _ in range(10):
                        coordinator.schedule(step, args=(iterator,))
                    coordinator.join()
                except (tf.errors.UnavailableError, tf.errors.AbortedError) as exc:
                    assert is_ps_failure(exc), exc
                    result = recovery.recover(timeout_secs=120)
                    if result.lost:
                        assert result.lost == [2] and result.step >= 20 and not recoveries, (result, recoveries)
                        recoveries.append(result)
                        step = make_step()
                    else:
                        time.sleep(1.0)
                    # The closures the failure cancelled may have left a worker's iterator at its end (TF 2.15: a
                    # cancelled GetNext can end a repeated dataset); a loop makes its input again, as fit does.
                    iterator = make_iterator()
                done = int(model.optimizer.iterations.numpy())
                if done >= 20 and not killed:  # between two rounds: the next schedule finds PS 2 restarted
                    killed = True
                    cluster.kill("ps", 2)
                    cluster.restart("ps", 2)
            assert done >= 40 and len(recoveries) == 1, recoveries
            assert recovery.wait_rebuilt(120)
            _check_parity(model)
        finally:
            cluster.close()

    exit_with(case)


def beyond_the_code_case() -> None:
    """Two PS of a 2+1 code lost at once: each stripe lost two chunks; recovery refuses (checkpoint fallback)."""

    def case() -> None:
        import tensorflow as tf

        from tf_ecrec.errors import RecoveryError
        from tf_ecrec.pss.recovery import PSSRecovery

        cluster, protection = _setup()
        try:
            model = _model(tf, "m", tf.keras.optimizers.SGD(0.1), protection)
            model.fit(_data(tf), epochs=1, steps_per_epoch=4, verbose=0)
            for ps in (1, 2):
                cluster.restart("ps", ps)
            try:
                PSSRecovery(protection, model).recover(timeout_secs=120)
            except RecoveryError as exc:
                assert "more than r = 1" in str(exc), exc
            else:
                raise AssertionError("recovering two lost PS of a 2+1 code did not fail")
        finally:
            cluster.close()

    exit_with(case)


def beyond_the_code_falls_back_case() -> None:
    """With checkpoints, two PS of a 2+1 code lost during fit: every variable is restored from the last
    checkpoint (written between epochs), the steps since it are rolled back and trained again."""

    def case() -> None:
        import tempfile

        import tensorflow as tf

        import tf_ecrec.pss

        cluster, protection = _setup()
        try:
            model = _model(tf, "m", tf.keras.optimizers.Adagrad(0.1), protection)

            started = fit_started()

            def killer() -> None:
                started.event.wait(120)
                while int(model.optimizer.iterations.numpy()) < 25:
                    time.sleep(0.01)
                cluster.kill("ps", 1)
                cluster.kill("ps", 2)
                time.sleep(0.5)
                cluster.restart("ps", 1)
                cluster.restart("ps", 2)

            thread = threading.Thread(target=killer, daemon=True)
            thread.start()
            with tempfile.TemporaryDirectory() as checkpoints:
                result = tf_ecrec.pss.fit(model, _data(tf), epochs=4, steps_per_epoch=10, verbose=0, timeout_secs=120,
                                          checkpoint_dir=checkpoints, callbacks=[started])
            thread.join(timeout=60)
            (recovered,) = result.recoveries
            assert recovered.method == "checkpoint" and recovered.lost == [1, 2], recovered
            assert recovered.step == 20, recovered  # the checkpoint after epoch 2 (the kill came in epoch 3)
            assert result.steps == 40 and len(result.checkpoints) == 4, result
            _check_parity(model)
        finally:
            cluster.close()

    exit_with(case)


def test_fit_places_by_the_layout_and_keeps_parity_exact(fresh_process: Any) -> None:
    fresh_process("integration.test_pss:placement_and_parity_case", timeout=TOTAL_TIMEOUT)


def test_a_rebuilt_ps_holds_what_it_held(fresh_process: Any) -> None:
    fresh_process("integration.test_pss:rebuild_is_exact_case", timeout=TOTAL_TIMEOUT)


def test_ps_killed_during_fit_recovers_from_parity(fresh_process: Any) -> None:
    fresh_process("integration.test_pss:kill_during_fit_case", timeout=TOTAL_TIMEOUT)


def test_a_loss_beyond_the_code_is_refused(fresh_process: Any) -> None:
    fresh_process("integration.test_pss:beyond_the_code_case", timeout=TOTAL_TIMEOUT)


def test_a_worker_killed_during_fit_leaves_parity_exact(fresh_process: Any) -> None:
    fresh_process("integration.test_pss:worker_killed_during_fit_case", timeout=TOTAL_TIMEOUT)


def test_a_worker_cut_inside_a_step_is_settled_while_fit_goes_on(fresh_process: Any) -> None:
    fresh_process("integration.test_pss:worker_cut_in_a_step_case", timeout=TOTAL_TIMEOUT)


def test_a_loss_beyond_the_code_falls_back_to_the_last_checkpoint(fresh_process: Any) -> None:
    fresh_process("integration.test_pss:beyond_the_code_falls_back_case", timeout=TOTAL_TIMEOUT)


def test_a_cluster_coordinator_loop_recovers_a_ps_from_parity(fresh_process: Any) -> None:
    fresh_process("integration.test_pss:coordinator_loop_case", timeout=TOTAL_TIMEOUT)


def test_backup_and_restore_survives_a_recovery_and_a_restarted_job_resumes_from_its_backup(fresh_process: Any) -> None:
    fresh_process("integration.test_pss:backup_and_restore_case", timeout=TOTAL_TIMEOUT)
