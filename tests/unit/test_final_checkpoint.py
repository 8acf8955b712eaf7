"""The launcher's final save (`tf_ecrec.hooks.final_checkpoint`) on an in-process session: it saves when
training ends and `final()` says so, and nothing when a session ends to follow a moved PS."""

import os

import tensorflow as tf

from tf_ecrec.hooks.final_checkpoint import FinalCheckpointHook


def _train(model_dir: str, steps: int, final) -> None:
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        weight = tf.compat.v1.get_variable("w", initializer=tf.constant([1.0, 2.0]))
        train = tf.group(step.assign_add(1), weight.assign_add([0.5, 0.5]))
        hooks = [FinalCheckpointHook(model_dir, final), tf.compat.v1.train.StopAtStepHook(last_step=steps)]
        with tf.compat.v1.train.MonitoredSession(hooks=hooks) as sess:
            while not sess.should_stop():
                sess.run(train)


def test_it_saves_every_variable_at_the_last_step_when_training_is_over(tmp_path):
    _train(str(tmp_path), 3, lambda: True)
    path = tf.train.latest_checkpoint(str(tmp_path))
    assert os.path.basename(path) == "model.ckpt-3"
    reader = tf.train.load_checkpoint(path)
    assert reader.get_tensor("global_step") == 3 and list(reader.get_tensor("w")) == [2.5, 3.5]


def test_it_saves_nothing_when_the_session_ends_to_follow_a_moved_ps(tmp_path):
    _train(str(tmp_path), 3, lambda: False)
    assert tf.train.latest_checkpoint(str(tmp_path)) is None and not os.listdir(tmp_path)
