"""Strict flash checkpoint rounds (jobs without delta logs: ``--fault-tolerance flash``) against real
concurrent trainers, with an oracle.

Three trainers (this process's threads, each with its own session on a real in-process cluster of
two PS) run steps with the real gate hook (`FlashGateHook`), start and end sessions at random, and
one of them gives up waiting for a release after 3 ms; the chief runs real rounds
(`FlashCheckpointHook(strict=True).round`) between its own steps.

The oracle needs no logs: trainer k's step adds 1 to ``a[k]`` on PS 0, sleeps on the client, adds 1
to ``b[k]`` on PS 1, then 1 to the global step.  A copy holds the state of a step boundary exactly
when ``a == b`` and ``sum(a) == global step``; every kept capture's shadows are read back and checked.
Two mutations (no strictness; strict waiting without the slot-write count) must be caught.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from integration.tf_cluster import tf_cluster

from tf_ecrec.flash.config import FlashConfig
from tf_ecrec.flash.hooks import FlashCheckpointHook, FlashGateHook
from tf_ecrec.flash.snapshots import FlashSnapshots
from tf_ecrec.layout.device import variable_name

cluster = tf_cluster(num_ps=2)
TRAINERS = 3
STEP_SLEEP = 0.004  # between a step's two writes: a capture during a step almost surely splits it


class _NoCount(FlashCheckpointHook):
    """Mutation: strict waiting, but a trainer that stops waiting during the capture is not noticed."""

    def _quiet(self, sess, activity):
        return True


class _Rig:
    def __init__(self, target: str, tmp: str) -> None:
        self.target = target
        self.graph = tf.Graph()
        with self.graph.as_default():
            with tf.device("/job:ps/task:0"):
                self.step = tf.compat.v1.train.get_or_create_global_step()
                a = tf.compat.v1.get_variable("a", [TRAINERS], tf.int64, tf.zeros_initializer(), use_resource=True)
                ballast0 = tf.compat.v1.get_variable("ballast0", [1 << 21], tf.float32, tf.zeros_initializer(),
                                                     use_resource=True)
            with tf.device("/job:ps/task:1"):
                b = tf.compat.v1.get_variable("b", [TRAINERS], tf.int64, tf.zeros_initializer(), use_resource=True)
                ballast1 = tf.compat.v1.get_variable("ballast1", [1 << 21], tf.float32, tf.zeros_initializer(),
                                                     use_resource=True)
            self.k = tf.compat.v1.placeholder(tf.int32, [])
            with tf.device("/job:ps/task:0"):
                inc_a = tf.raw_ops.ResourceScatterAdd(resource=a.handle, indices=[self.k], updates=tf.ones([1], tf.int64))
            with tf.device("/job:chief/task:0"), tf.control_dependencies([inc_a]):
                slept = tf.numpy_function(lambda k: (time.sleep(STEP_SLEEP), k)[1], [self.k], tf.int32, stateful=True)
            with tf.device("/job:ps/task:1"), tf.control_dependencies([slept]):
                inc_b = tf.raw_ops.ResourceScatterAdd(resource=b.handle, indices=[self.k], updates=tf.ones([1], tf.int64))
            with tf.device("/job:ps/task:0"), tf.control_dependencies([inc_b]):
                self.train = self.step.assign_add(1)
            self.snap = FlashSnapshots(FlashConfig(every_steps=1, shm_dir=os.path.join(tmp, "shm"), park_secs=0.5),
                                       os.path.join(tmp, "model"), {}, 2, TRAINERS)
            self.shadows = {}
            for v in (a, b, self.step):
                with tf.device(v.device):
                    handle = tf.raw_ops.VarHandleOp(dtype=v.dtype.base_dtype, shape=v.shape,
                                                    shared_name=f"ec_flash_shadow/{variable_name(v)}")
                    self.shadows[variable_name(v)] = tf.raw_ops.ReadVariableOp(resource=handle, dtype=v.dtype.base_dtype)
            self.init = tf.group(tf.compat.v1.global_variables_initializer())
            del ballast0, ballast1

    def session(self) -> tf.compat.v1.Session:
        return tf.compat.v1.Session(self.target, graph=self.graph)

    def trainer(self, k: int, wait_secs: float, stop: threading.Event, errors: list, gates: list) -> None:
        rng = np.random.default_rng(k)
        gate = FlashGateHook(self.snap, k, wait_secs=wait_secs)
        gates.append(gate)
        try:
            while not stop.is_set():
                with self.session() as sess:
                    gate.after_create_session(sess, None)
                    for _ in range(int(rng.integers(5, 40))):
                        if stop.is_set():
                            break
                        _, value = sess.run([self.train, self.snap.gate_value], {self.k: k})
                        gate.after_run(SimpleNamespace(session=sess), SimpleNamespace(results=value))
                    gate.end(sess)
                time.sleep(float(rng.uniform(0, 0.05)))
        except Exception as exc:  # reported by the test
            errors.append(exc)

    def check(self, sess: tf.compat.v1.Session, step: int) -> str | None:
        """None if the kept copy is the state of a step boundary, else what is wrong with it."""
        got = sess.run(self.shadows)
        a, b, gs = got["a"], got["b"], int(got["global_step"])
        if gs != step or not np.array_equal(a, b) or int(a.sum()) != gs:
            return f"captured at step {step}: a={a.tolist()} b={b.tolist()} global step {gs}"
        return None


def _run(rig: _Rig, hook_class=FlashCheckpointHook, strict: bool = True, rounds: int = 40, until_caught: bool = False,
         budget_secs: float = 60.0):
    stop, errors, gates = threading.Event(), [], []
    with rig.session() as sess:
        sess.run(rig.init)
        rig.snap.init_gate(sess)
        threads = [threading.Thread(target=rig.trainer, args=(k, wait, stop, errors, gates), daemon=True)
                   for k, wait in ((1, 10.0), (2, 0.003))]
        for t in threads:
            t.start()
        with rig.graph.as_default():
            hook = hook_class(rig.snap, lock=lambda: _Null(), busy=lambda: False, trainer=0, strict=strict)
        kept, violations, started = 0, [], time.monotonic()
        try:
            while kept < rounds and time.monotonic() - started < budget_secs:
                for _ in range(3):
                    sess.run(rig.train, {rig.k: 0})
                step = hook.round(sess)
                hook._join_writer()
                if step is None:
                    continue
                kept += 1
                problem = rig.check(sess, step)
                if problem is not None:
                    violations.append(problem)
                    if until_caught:
                        break
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
    assert not errors, errors
    return SimpleNamespace(kept=kept, skipped=hook.skipped, violations=violations,
                           timeouts=sum(g.timeouts for g in gates), parks=sum(g.parks for g in gates))


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def rig(cluster, tmp_path):
    cluster.reset()
    return _Rig(cluster.target("chief"), str(tmp_path))


def test_strict_rounds_keep_only_copies_of_a_step_boundary_while_trainers_come_go_and_give_up(rig):
    result = _run(rig, rounds=40)
    assert result.violations == [], result.violations
    assert result.kept >= 20, result  # the rounds do keep copies
    assert result.parks > 0 and result.timeouts > 0, result  # trainers parked, and one gave up waiting


def test_the_oracle_catches_rounds_that_do_not_wait_for_every_trainer(rig):
    rig.snap.config = FlashConfig(every_steps=1, shm_dir=rig.snap.config.shm_dir, park_secs=0.001)
    result = _run(rig, strict=False, rounds=200, until_caught=True)
    assert result.violations, result


def test_the_oracle_catches_strict_rounds_that_ignore_a_trainer_giving_up(rig):
    result = _run(rig, hook_class=_NoCount, rounds=300, until_caught=True, budget_secs=120.0)
    assert result.violations, result


def test_a_ps_lost_with_no_copy_to_go_back_to_takes_the_data_back_to_the_start(cluster, tmp_path):
    """`FlashRecovery.prepare` with neither a snapshot nor a checkpoint: the first start initialises and
    owes nothing; a loss after training (one PS, then every PS) initialises and owes the data back to step 0,
    so the records trained before are trained again instead of being counted while the model forgot them."""
    from tf_ecrec.flash.stock import FlashRecovery
    from tf_ecrec.recovery.graph import whole_marker
    from tf_ecrec.recovery.owed import owed, owed_path
    from tf_ecrec.recovery.result import RecoveryMethod

    cluster.reset()
    model_dir = str(tmp_path / "model")
    graph = tf.Graph()
    with graph.as_default():
        with tf.device("/job:ps/task:0"):
            step = tf.compat.v1.train.get_or_create_global_step()
        with tf.device("/job:ps/task:1"):
            b = tf.compat.v1.get_variable("b", [4], tf.int64, tf.zeros_initializer(), use_resource=True)
        with tf.control_dependencies([b.assign_add(tf.ones([4], tf.int64))]):
            train = step.assign_add(1)
        snapshots = FlashSnapshots(FlashConfig(every_steps=1000, shm_dir=str(tmp_path / "shm")), model_dir, {}, 2, 1)
        markers = {p: whole_marker(p) for p in range(2)}
        recovery = FlashRecovery(snapshots, markers, model_dir)
        lose = {p: tf.group(*[tf.raw_ops.DestroyResourceOp(resource=v.handle, ignore_lookup_error=True)
                              for v in [*tf.compat.v1.global_variables(), markers[p]] if v.device.endswith(f"task:{p}")])
                for p in range(2)}
    with tf.compat.v1.Session(cluster.target("chief"), graph=graph) as sess:
        first = recovery.prepare(sess, restore=None)
        assert first.method is RecoveryMethod.INIT and first.lost_ps == [0, 1] and owed(model_dir) is None
        for _ in range(5):
            sess.run(train)
        sess.run(lose[1])  # one PS lost: PS 0 still holds step 5
        one = recovery.prepare(sess, restore=None)
        assert one.method is RecoveryMethod.INIT and one.lost_ps == [1], one
        debt = owed(model_dir)
        assert debt is not None and debt.step == 0, debt
        assert sess.run(step) == 0 and sess.run(b).tolist() == [0] * 4
        os.remove(owed_path(model_dir))  # paid
        for _ in range(3):
            sess.run(train)
        sess.run([lose[0], lose[1]])  # every PS lost: only the job's started marker tells it had trained
        every = recovery.prepare(sess, restore=None)
        assert every.method is RecoveryMethod.INIT and every.lost_ps == [0, 1], every
        debt = owed(model_dir)
        assert debt is not None and debt.step == 0, debt
