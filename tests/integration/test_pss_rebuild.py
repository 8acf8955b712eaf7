"""A lost PS's tables rebuilt under TF2 while ``model.fit`` trains on (`tf_ecrec.pss.rebuild`).

Real PS and worker processes (`harness.pss_cluster`), the interpreter is the coordinator.  The walk over
the lost chunks is held back (no walker) until the test starts it, so that what is asserted does not
depend on timing: steps run while the PS's rows are pending, their lookups have the rows they read
installed first (counted on the rebuild), a ``ModelCheckpoint`` save waits for the rest, and the backups
of ``BackupAndRestore`` skip the epochs that end meanwhile (so nothing stops training).  The oracles: the
rows still pending on the PS (its recovery view), exact parity once the walk is done, a checkpoint that
reads back as the model's values at the end (a row saved while pending would read back as zeros), and no
backup file written while rows were pending.  Each check fails with its rule removed (the gate's wait,
the backups' skip).
"""

from __future__ import annotations

import glob
import os
import tempfile
import threading
import time
from typing import Any

import numpy as np
from harness.pss_cluster import exit_with
from integration.test_pss import TOTAL_TIMEOUT, _check_parity, _data, _model, _setup, _values


def _pending(rebuild: Any, ps: int) -> int:
    """Rows pending on `ps` now (its recovery view)."""
    return int(rebuild.session.built.view_stats(rebuild.session, [ps])[ps][0])


def training_during_rebuild_case() -> None:
    def case() -> None:
        import tensorflow as tf

        import tf_ecrec.pss
        from tf_ecrec.pss.recovery import PSSRecovery

        cluster, protection = _setup()
        try:
            model = _model(tf, "m", tf.keras.optimizers.Adagrad(0.1), protection)
            recovery = PSSRecovery(protection, model)
            recovery.rebuild_walkers = 0  # only the rows lookups ask for, until the test starts the walk
            model.fit(_data(tf), epochs=1, steps_per_epoch=10, verbose=0)
            cluster.kill("ps", 1)
            cluster.restart("ps", 1)
            result = recovery.recover(timeout_secs=120)
            assert result.lost == [1] and result.rebuilt_in_background, result
            rebuild = recovery.rebuilding
            assert rebuild is not None and _pending(rebuild, 1) > 0
            model.fit(_data(tf), epochs=1, steps_per_epoch=10, verbose=0)  # over a PS whose rows are pending
            assert int(model.optimizer.iterations.numpy()) == 20
            assert rebuild.job.rows_installed_on_demand > 0, "no lookup waited for a pending row"
            assert _pending(rebuild, 1) > 0 and not rebuild.finished  # the rest waits for the walk

            # A save at an epoch's end waits for the rebuild: the walk starts only once the epoch's steps are
            # done, and the checkpoint must read back as the model's values (pending rows would be zeros).
            def walk_later() -> None:
                while int(model.optimizer.iterations.numpy()) < 30:
                    time.sleep(0.05)
                time.sleep(1.0)
                rebuild.start(walkers=2)

            walker = threading.Thread(target=walk_later, daemon=True)
            walker.start()
            with tempfile.TemporaryDirectory() as saved_dir:
                path = os.path.join(saved_dir, "weights")
                saver = tf.keras.callbacks.ModelCheckpoint(path, save_weights_only=True)
                fitted = tf_ecrec.pss.fit(model, _data(tf), epochs=3, steps_per_epoch=10, verbose=0, timeout_secs=120,
                                          recovery=recovery, callbacks=[saver])
                walker.join(timeout=60)
                assert fitted.steps == 30 and not fitted.recoveries, fitted
                assert rebuild.finished and _pending(rebuild, 1) == 0 and recovery.wait_rebuilt(1)
                held = _values(model)
                model.load_weights(path)
                back = _values(model)
                different = [n for n in held if not np.array_equal(held[n], back[n])]
                assert not different, f"the checkpoint saved during the rebuild reads back differently: {different}"
            _check_parity(model)

            # BackupAndRestore alone: its backups skip the epochs that end during the rebuild instead of waiting,
            # so every step is trained before the walk even starts (it starts at the last step).
            cluster.kill("ps", 2)
            cluster.restart("ps", 2)
            assert recovery.recover(timeout_secs=120).lost == [2]
            rebuild = recovery.rebuilding
            walked_at: list[int] = []

            def walk_at_the_end() -> None:
                while int(model.optimizer.iterations.numpy()) < 60:
                    time.sleep(0.05)
                walked_at.append(int(model.optimizer.iterations.numpy()))
                rebuild.start(walkers=2)

            walker = threading.Thread(target=walk_at_the_end, daemon=True)
            walker.start()
            with tempfile.TemporaryDirectory() as backup_dir:
                backup = tf.keras.callbacks.BackupAndRestore(backup_dir, delete_checkpoint=False)
                fitted = tf_ecrec.pss.fit(model, _data(tf), epochs=6, steps_per_epoch=10, verbose=0, timeout_secs=120,
                                          recovery=recovery, callbacks=[backup])
                written = glob.glob(os.path.join(backup_dir, "**", "*.index"), recursive=True)
                assert not written, f"backups written while rows were pending: {written}"
            walker.join(timeout=60)
            assert walked_at == [60] and fitted.steps == 60 and not fitted.recoveries, (walked_at, fitted)
            assert rebuild.job.rows_installed_on_demand > 0 and rebuild.finished
            _check_parity(model)
        finally:
            cluster.close()

    exit_with(case)


def test_training_goes_on_while_a_lost_ps_is_rebuilt_and_a_save_waits_for_it(fresh_process: Any) -> None:
    fresh_process("integration.test_pss_rebuild:training_during_rebuild_case", timeout=TOTAL_TIMEOUT)
