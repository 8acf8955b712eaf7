"""The TF2 step generation comes from the cluster, not from one `PSSRecovery` object (issue 30, case 4).

`tf_ecrec.pss.fit` makes a recovery object per call, and the documented coordinator loop one per
failure; the PS delta logs only ever raise the minimum generation they admit.  A second recovery
object that counted from 0 set generation 1 on logs that admitted 2 and later: the next step was
refused (``AbortedError``), and a loop of new objects stayed at generation 1, fencing nothing.

Runs in a fresh interpreter against real PS and worker processes (`harness.pss_cluster`); the
oracles are the generations the logs admit (read through a `Reconciler` on every PS), training
going on after each recovery, and parity re-encoded from the data.
"""

from __future__ import annotations

from typing import Any

from harness.pss_cluster import exit_with

TOTAL_TIMEOUT = 420


def _admitted(recovery: Any) -> list[int]:
    """The minimum generation each PS's delta log admits, in PS order (read with no step in flight)."""
    settle = recovery._reconciler()
    return [settle.built.propagate_generation(settle, [p]) for p in range(recovery.protection.num_ps)]


def second_recovery_object_case() -> None:
    """One `PSSRecovery` recovers PS 1 twice (generation 2 on every log), then new objects recover PS 2 and
    PS 0, as `fit` and the documented loop make them: each raises the cluster's generation by one, and
    ``fit`` trains over it."""

    def case() -> None:
        import tensorflow as tf
        from integration.test_pss import _check_parity, _data, _model, _setup

        import tf_ecrec.pss
        from tf_ecrec.pss.recovery import PSSRecovery

        cluster, protection = _setup()
        try:
            model = _model(tf, "m", tf.keras.optimizers.Adagrad(0.1), protection)
            first = PSSRecovery(protection, model)
            for _ in range(2):
                model.fit(_data(tf), epochs=1, steps_per_epoch=5, verbose=0)
                cluster.restart("ps", 1)
                assert first.recover(timeout_secs=120).lost == [1]
            assert _admitted(first) == [2, 2, 2], _admitted(first)
            expected = 2
            for ps in (2, 0):  # a new object per failure, as fit and the coordinator loop make them
                model.fit(_data(tf), epochs=1, steps_per_epoch=5, verbose=0)
                cluster.restart("ps", ps)
                recovery = PSSRecovery(protection, model)
                assert recovery.recover(timeout_secs=120).lost == [ps]
                expected += 1
                assert recovery.generation == expected, (recovery.generation, expected)
                assert _admitted(recovery) == [expected] * 3, (_admitted(recovery), expected)
            done = int(model.optimizer.iterations.numpy())
            # fit (its own recovery object) trains over the raised generation; refused steps would raise
            # AbortedError "... is of generation 1 but this PS admits 2 and later" here.
            result = tf_ecrec.pss.fit(model, _data(tf), epochs=1, steps_per_epoch=done + 6, verbose=0,
                                      timeout_secs=120)
            assert not result.recoveries and result.steps == done + 6, result
            _check_parity(model)
        finally:
            cluster.close()

    exit_with(case)


def test_a_second_recovery_object_raises_the_cluster_generation(fresh_process: Any) -> None:
    fresh_process("integration.test_pss_generations:second_recovery_object_case", timeout=TOTAL_TIMEOUT)
