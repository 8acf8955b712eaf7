"""TF2 recoveries in generated sequences: the step generation comes from the cluster, not from one
`PSSRecovery` object (issue 30, case 4), and every recovery leaves the values it must.

`tf_ecrec.pss.fit` makes a recovery object per call, and the documented coordinator loop one per
failure; the PS delta logs only ever raise the minimum generation they admit.  A second recovery
object that counted from 0 set generation 1 on logs that admitted 2 and later: the next step was
refused (``AbortedError``), and a loop of new objects stayed at generation 1, fencing nothing.

A seeded sequence (`generated_case`) trains a few steps between failures, and each failure is one
of: a PS lost and recovered by the object that recovered the last one; a PS lost and recovered by a
new object; two PS lost (beyond the 2+1 code) and restored from a checkpoint written earlier in the
sequence, by either.  After a first failure recovered by the first object, every kind comes at
least once, in an order, with step counts and on PS the seed draws.  The
oracle, after each recovery (no step in flight):

- every PS's log admits exactly one generation above the highest admitted before the failure, and
  the object says the same (a checkpoint restore raises it too: a straggler of the old generation
  is refused after the restore);
- a PS rebuilt from parity holds, bit for bit, every value it held; a checkpoint restore leaves
  every variable as the checkpoint had it, the survivors' too;

and at the end, `tf_ecrec.pss.fit` (its own object) trains over the raised generation, and parity
is exact.  The mutation test runs the same sequences with an object that counts generations from
its own counter, the bug of case 4, and requires the oracle to fail.

Runs in a fresh interpreter against real PS and worker processes (`harness.pss_cluster`).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
import pytest
from harness.pss_cluster import exit_with

TOTAL_TIMEOUT = 420
SEED = 7
KINDS = ("same", "new", "checkpoint")


def _admitted(recovery: Any) -> list[int]:
    """The minimum generation each PS's delta log admits, in PS order (read with no step in flight)."""
    settle = recovery.reconciler()
    return [settle.built.propagate_generation(settle, [p]) for p in range(recovery.protection.num_ps)]


def _schedule(rng: np.random.Generator) -> list[str]:
    """The first failure recovered by the first object; then every kind once and one drawn, in a drawn
    order (so that a new object always meets logs a recovery raised, and a checkpoint exists before
    the first restore from one)."""
    return ["same", *(str(k) for k in rng.permutation([*KINDS, *rng.choice(KINDS, size=1)]))]


def generated_case(seed: int = SEED, counts_its_own: bool = False) -> None:
    def case() -> None:
        import tensorflow as tf
        from integration.test_pss import _check_parity, _data, _model, _setup, _values

        import tf_ecrec.pss
        from tf_ecrec.pss.checkpoint import save
        from tf_ecrec.pss.recovery import PSSRecovery
        from tf_ecrec.step.step_program import MAX_GENERATION

        class CountsItsOwn(PSSRecovery):
            """Broken on purpose (issue 30, case 4): the generation is this object's own count."""

            def raise_generation(self, settle: Any, alive: list[int]) -> int:
                self.generation = min(self.generation + 1, MAX_GENERATION)
                settle.built.set_generation(settle, alive, self.generation)
                return self.generation

        recovery_class = CountsItsOwn if counts_its_own else PSSRecovery
        rng = np.random.default_rng(seed)
        schedule = _schedule(rng)
        print("schedule:", schedule, flush=True)
        cluster, protection = _setup()
        num_ps = 3
        try:
            model = _model(tf, "m", tf.keras.optimizers.Adagrad(0.1), protection)
            recovery = recovery_class(protection, model)
            checkpoints = tempfile.mkdtemp(prefix="pss-generations-")
            saved: tuple[str, dict[str, np.ndarray]] | None = None
            for i, kind in enumerate(schedule):
                model.fit(_data(tf), epochs=1, steps_per_epoch=int(rng.integers(2, 7)), verbose=0)
                if saved is None or rng.random() < 0.5:  # a checkpoint now and then, with no step in flight
                    saved = (save(recovery, os.path.join(checkpoints, f"c{i}")), _values(model))
                held = _values(model)
                before = max(_admitted(recovery))
                if kind == "checkpoint":
                    lost = sorted(int(p) for p in rng.choice(num_ps, size=2, replace=False))
                else:
                    lost = [int(rng.integers(num_ps))]
                for ps in lost:
                    cluster.kill("ps", ps)
                for ps in lost:
                    cluster.restart("ps", ps)
                if kind == "new" or (kind == "checkpoint" and rng.random() < 0.5):
                    recovery = recovery_class(protection, model)
                where = f"failure {i} ({kind}, PS {lost}, schedule {schedule}, seed {seed})"
                result = recovery.recover(timeout_secs=120, checkpoint=saved[0] if kind == "checkpoint" else None)
                assert result.lost == lost, (where, result)
                assert recovery.wait_rebuilt(120), (where, result)  # the tables rebuilt in the background
                admitted = _admitted(recovery)
                assert admitted == [before + 1] * num_ps and recovery.generation == before + 1, (
                    f"{where}: the logs admit generations {admitted} and the object says {recovery.generation}, "
                    f"after {before} was admitted before the failure")
                expected = saved[1] if kind == "checkpoint" else held
                assert result.method == ("checkpoint" if kind == "checkpoint" else "parity"), (where, result)
                now = _values(model)
                different = [n for n in expected if not np.array_equal(expected[n], now[n])]
                assert sorted(now) == sorted(expected) and not different, f"{where}: values differ: {different}"
            done = int(model.optimizer.iterations.numpy())
            # fit (its own recovery object) trains over the raised generation; refused steps would raise
            # AbortedError "... is of generation 1 but this PS admits 2 and later" here.
            fitted = tf_ecrec.pss.fit(model, _data(tf), epochs=1, steps_per_epoch=done + 6, verbose=0,
                                      timeout_secs=120)
            assert not fitted.recoveries and fitted.steps == done + 6, fitted
            _check_parity(model)
        finally:
            cluster.close()

    exit_with(case)


def broken_case() -> None:
    generated_case(counts_its_own=True)


def test_generated_recoveries_by_old_and_new_objects_raise_the_cluster_generation(fresh_process: Any) -> None:
    fresh_process("integration.test_pss_generations:generated_case", timeout=TOTAL_TIMEOUT)


def test_the_oracle_catches_an_object_that_counts_generations_from_its_own_counter(fresh_process: Any) -> None:
    with pytest.raises(AssertionError, match=r"the logs admit generations .* after \d+ was admitted"):
        fresh_process("integration.test_pss_generations:broken_case", timeout=TOTAL_TIMEOUT)
