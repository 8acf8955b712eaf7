"""A trainer's step generation follows the cluster, per session (issue 33: every trainer back after a move).

In-process PS cluster, real sessions.  The chief's recovery raises the PS logs' minimum
generation when a PS moved (`Reconciler.set_generation`, as `RecoveryPlan.prepare` does); a
trainer that followed the move in place keeps its graph, so its steps must take the new
generation from the cluster when its session is re-created: from the version it now follows
(the failover loop's retarget), or from what the PS logs admit.  A session created before the
raise keeps its generation: its steps stay refused.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from test_ec_training import cluster  # noqa: F401  (the module-wide in-process cluster fixture)

import tf_ecrec
from tf_ecrec.recovery.generation import SessionGenerationHook
from tf_ecrec.recovery.plan import RecoveryPlan
from tf_ecrec.step.embedding import ECContext, set_context
from tf_ecrec.step.step_program import GENERATION_SHIFT


def _trainer(cluster, version=0):  # noqa: F811
    """A trainer's graph built for cluster `version`, with the hook ec_model_fn gives every trainer."""
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device(tf_ecrec.ECDeviceFn(num_ps=3, worker_device="/job:worker")):
        step = tf.compat.v1.train.get_or_create_global_step()
        context = ECContext(tf_ecrec.ECConfig(2, 1), 3, version)
        set_context(context)
        coll = tf_ecrec.EmbeddingCollection("gen", [("a", 60)], 4)
        ids = tf.compat.v1.placeholder(tf.int64, [None, 1])
        loss = tf.reduce_mean(tf.square(tf.reshape(coll.lookup_all(ids), [-1, 4]) - 1.0))
        opt = tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
        train = opt.minimize(loss, global_step=step)
        plan = RecoveryPlan(opt, background=False)
        hook = SessionGenerationHook(context.steps, opt.logs)
        hook.begin()
        init = tf.compat.v1.global_variables_initializer()
        sid = opt.sid
    feed = {ids: np.arange(16).reshape(-1, 1) % 60}
    return graph, context, plan, hook, init, lambda sess: sess.run([train, sid], feed)[1]


def _session(cluster, graph, hook):  # noqa: F811
    """A session created as MonitoredSession creates one: the hooks see it before its first step."""
    sess = tf.compat.v1.Session(cluster["targets"][0], graph=graph)
    hook.after_create_session(sess, None)
    return sess


def _raise(plan, sess, generation):
    """What the chief's recovery does in a session of a moved cluster of `generation`."""
    plan.reconciler.set_generation(sess, plan.reconciler_ps(), generation)


def test_a_trainer_that_follows_a_move_in_place_is_admitted_by_the_raised_cluster(cluster):  # noqa: F811
    graph, context, plan, hook, init, step = _trainer(cluster)
    old = _session(cluster, graph, hook)
    old.run(init)
    before = hook.sessions[-1][2]
    assert step(old) >> GENERATION_SHIFT == before
    moved = before + 1
    # The failover loop's retarget: the graph's target follows the moved cluster's version before any
    # session reaches it (tests/unit/test_failover.py checks the loop does this).
    context.steps.follow(moved)
    _raise(plan, old, moved)  # the chief's recovery in its retargeted session
    with pytest.raises(tf.errors.AbortedError, match="generation"):
        step(old)  # a session created before the raise stays fenced
    new = _session(cluster, graph, hook)  # MonitoredSession re-creates it (in the e2e job: for the moved PS)
    assert step(new) >> GENERATION_SHIFT == moved
    assert hook.sessions[-1] == (moved, moved, moved)
    for _ in range(3):
        step(new)  # it keeps training
    old.close()
    new.close()


def test_a_session_takes_the_generation_the_ps_admit_when_its_trainer_counts_an_older_version(cluster):  # noqa: F811
    """A trainer restarted with a TF_CONFIG version that counts moves differently (a Kubernetes operator's)."""
    graph, context, plan, hook, init, step = _trainer(cluster, version=0)
    first = _session(cluster, graph, hook)
    first.run(init)
    admitted = hook.sessions[-1][1] + 2
    _raise(plan, first, admitted)
    with pytest.raises(tf.errors.AbortedError, match="generation"):
        step(first)
    again = _session(cluster, graph, hook)
    assert context.generation == 0 and hook.sessions[-1] == (0, admitted, admitted)
    assert step(again) >> GENERATION_SHIFT == admitted
    first.close()
    again.close()
