"""Flash checkpoints of a TF2 job (`tf_ecrec.pss.flash`): taken while ``fit`` trains, restored beyond the code.

Real PS and worker processes (`harness.pss_cluster`); the interpreter is the coordinator.  Two PS of a
2+1 code are killed during ``fit`` (more than the code covers): the recovery restores the newest snapshot
complete on every PS.  The oracles are the model's own values: every variable of the model and its
protection read at each capture (training paused there), and read again right after the restore, bit
for bit; the restored step is the newest snapshot whose files were complete before the kill or a newer
captured one; parity exact at the end, and every step of the job in the iteration count.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from typing import Any

import numpy as np
from harness.pss_cluster import exit_with, fit_started
from integration.test_pss import TOTAL_TIMEOUT, _check_parity, _data, _model, _setup, _values

EVERY = 8


def beyond_the_code_restores_the_flash_snapshot_case() -> None:
    def case() -> None:
        import tensorflow as tf

        import tf_ecrec.pss
        from tf_ecrec.flash.config import FlashConfig
        from tf_ecrec.layout.device import variable_name
        from tf_ecrec.pss.recovery import PSSRecovery

        cluster, protection = _setup()
        try:
            model = _model(tf, "m", tf.keras.optimizers.Adagrad(0.1), protection)
            recovery = PSSRecovery(protection, model)
            captured: dict[int, dict[str, np.ndarray]] = {}
            complete_at_kill: list[int] = []
            after_restore: dict[str, np.ndarray] = {}
            started = fit_started()
            killed = threading.Event()

            class HoldUntilKilled(tf.keras.callbacks.Callback):
                """Holds training at the end of the fifth of six epochs until the kill (bounded): on a loaded
                machine the snapshots' writes lag the steps (a round is not due while the last one is being
                written), and a job that ended before its second snapshot was complete would be killed after
                it, with nothing to recover. The writes go on while training waits here."""

                def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                    if epoch == 4 and not killed.wait(90):
                        raise AssertionError("the kill did not come within 90 s of the fifth epoch's end")

            with tempfile.TemporaryDirectory() as tmp:
                flash = FlashConfig(every_steps=EVERY, shm_dir=os.path.join(tmp, "shm"), persist_every=2)

                def killer() -> None:
                    started.event.wait(120)
                    while recovery.flash is None or len(recovery.flash.snapshots) < 2:
                        time.sleep(0.01)
                    complete_at_kill.extend(step for _, step in recovery.flash.snapshots)
                    cluster.kill("ps", 1)
                    cluster.kill("ps", 2)
                    killed.set()
                    time.sleep(0.5)
                    cluster.restart("ps", 1)
                    cluster.restart("ps", 2)

                def on_recovery(result: Any) -> None:
                    after_restore.update(_values(model))  # before fit runs again: the restored values

                thread = threading.Thread(target=killer, daemon=True)
                thread.start()
                # The listener reads every value while the round has training paused (the coordinator joined).
                result = tf_ecrec.pss.fit(model, _data(tf), epochs=6, steps_per_epoch=10, verbose=0, timeout_secs=120,
                                          recovery=recovery, callbacks=[started, HoldUntilKilled()], on_recovery=on_recovery, flash=flash,
                                          flash_dir=os.path.join(tmp, "job"),
                                          flash_listeners=[lambda step: captured.setdefault(step, _values(model))])
                thread.join(timeout=60)
                disk = sorted(os.listdir(os.path.join(tmp, "job", "flash")))
            (recovered,) = result.recoveries
            assert recovered.method == "memory" and recovered.lost == [1, 2], recovered
            assert recovered.step in captured, (recovered.step, sorted(captured))
            assert recovered.step >= max(complete_at_kill), (recovered.step, complete_at_kill)
            expected = captured[recovered.step]
            assert after_restore.keys() == expected.keys()
            differ = [n for n in expected if not np.array_equal(expected[n], after_restore[n])]
            assert not differ, f"restored values differ from the capture of step {recovered.step}: {differ}"
            assert int(after_restore[variable_name(model.optimizer.iterations)]) == recovered.step
            assert result.steps == 60 and int(model.optimizer.iterations.numpy()) == 60, result
            assert disk == ["ps0", "ps1", "ps2"], disk  # every second snapshot persisted under flash_dir
            assert result.flash_snapshots, result
            _check_parity(model)
        finally:
            cluster.close()

    exit_with(case)


def test_a_loss_beyond_the_code_restores_the_newest_flash_snapshot(fresh_process: Any) -> None:
    fresh_process("integration.test_pss_flash:beyond_the_code_restores_the_flash_snapshot_case", timeout=TOTAL_TIMEOUT)
