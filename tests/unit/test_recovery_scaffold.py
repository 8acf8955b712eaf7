"""`scaffold_for` composes with the model_fn's own Scaffold: its fields survive, its init_fn runs after ours."""

from __future__ import annotations

import tensorflow as tf

from tf_ecrec.recovery.scaffold import ECSaver, scaffold_for


class _FakePlan:
    """What `scaffold_for` asks of a `RecoveryPlan` on the chief: prepare at session creation."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    @property
    def whole_markers(self) -> dict[int, tf.Variable]:
        """One PS's marker, here a local variable: the chief's kernel check probes its device first."""
        return {0: tf.compat.v1.Variable(False, name="ec_whole_marker_ps0")}

    def prepare(self, sess: tf.compat.v1.Session, restore: object) -> None:
        assert restore is None
        self.calls.append("prepare")


def test_a_base_scaffolds_fields_survive_and_its_init_fn_runs_after_ours():
    calls: list[str] = []
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.Variable(1.0, name="v")
        local_init = tf.no_op(name="user_local_init")
        summary = tf.constant("s", name="user_summary")
        user_ready = tf.constant(["user_not_ready"], name="user_ready")
        user_ready_local = tf.constant(["user_not_ready_local"], name="user_ready_local")
        base = tf.compat.v1.train.Scaffold(
            init_fn=lambda scaffold, sess: calls.append("user init_fn"),
            ready_op=user_ready,
            ready_for_local_init_op=user_ready_local,
            local_init_op=local_init,
            summary_op=summary,
            local_init_feed_dict={"x:0": 1},
        )
        scaffold = scaffold_for(_FakePlan(calls), base, chief=True)
        assert scaffold.local_init_op is local_init
        assert scaffold.summary_op is summary
        assert scaffold.local_init_feed_dict == {"x:0": 1}
        assert isinstance(scaffold.saver, ECSaver)
        with tf.compat.v1.Session(graph=graph) as sess:
            scaffold.init_fn(sess)
            assert calls == ["prepare", "user init_fn"]
            # The chief's own ready ops report nothing; the base's names are kept.
            assert list(sess.run(scaffold.ready_op)) == [b"user_not_ready"]
            assert list(sess.run(scaffold.ready_for_local_init_op)) == [b"user_not_ready_local"]


def test_without_a_base_the_scaffold_is_ours_alone():
    calls: list[str] = []
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.Variable(1.0, name="v")
        scaffold = scaffold_for(_FakePlan(calls), None, chief=True)
        with tf.compat.v1.Session(graph=graph) as sess:
            scaffold.init_fn(sess)
            assert calls == ["prepare"]
            assert sess.run(scaffold.ready_op).size == 0


def test_the_saver_keeps_the_checkpoints_the_run_config_asks_for():
    from tf_ecrec.recovery.deadline_session import long_deadline_scaffold

    config = tf.estimator.RunConfig(keep_checkpoint_max=7, keep_checkpoint_every_n_hours=2)
    with tf.Graph().as_default():
        tf.compat.v1.Variable(1.0, name="v")
        ours = scaffold_for(_FakePlan([]), None, chief=True, config=config).saver
        unprotected = long_deadline_scaffold(None, config).saver
        default = scaffold_for(_FakePlan([]), None, chief=True).saver
    for saver in (ours, unprotected):
        assert (saver._max_to_keep, saver._keep_checkpoint_every_n_hours) == (7, 2)
    assert default._max_to_keep == tf.estimator.RunConfig().keep_checkpoint_max
