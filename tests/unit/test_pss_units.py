"""The pure parts of the TF2 ParameterServerStrategy path: rules read from Keras optimizers, the
partitioner, settlement's session over eager variables, step ids drawn in the graph, launcher rules."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_ecrec.errors import ConfigError
from tf_ecrec.step.update_rule import RuleKind, UpdateRule


@pytest.mark.parametrize("optimizer, kind, slots", [
    (lambda: tf.keras.optimizers.SGD(0.1), RuleKind.SGD, ()),
    (lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True), RuleKind.MOMENTUM, (("momentum", 0.0),)),
    (lambda: tf.keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.25), RuleKind.ADAGRAD, (("accumulator", 0.25),)),
    (lambda: tf.keras.optimizers.Adam(0.01, beta_1=0.8), RuleKind.ADAM, (("m", 0.0), ("v", 0.0))),
    (lambda: tf.keras.optimizers.Ftrl(0.1), RuleKind.FTRL, (("accumulator", 0.1), ("linear", 0.0))),
    # TensorFlow's parameter-server tutorial uses the legacy classes: the same rules.
    (lambda: tf.keras.optimizers.legacy.SGD(0.1), RuleKind.SGD, ()),
    (lambda: tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9, nesterov=True), RuleKind.MOMENTUM, (("momentum", 0.0),)),
    (lambda: tf.keras.optimizers.legacy.Adagrad(0.1, initial_accumulator_value=0.25), RuleKind.ADAGRAD,
     (("accumulator", 0.25),)),
    (lambda: tf.keras.optimizers.legacy.Adam(0.01, beta_1=0.8), RuleKind.ADAM, (("m", 0.0), ("v", 0.0))),
    (lambda: tf.keras.optimizers.legacy.Ftrl(0.1), RuleKind.FTRL, (("accumulator", 0.1), ("linear", 0.0))),
    (lambda: tf.keras.optimizers.legacy.RMSprop(0.1), RuleKind.RMSPROP, (("velocity", 0.0), ("momentum", 0.0))),
    (lambda: tf.keras.optimizers.RMSprop(0.1, centered=True, momentum=0.5), RuleKind.RMSPROP,
     (("average_gradient", 0.0), ("velocity", 0.0), ("momentum", 0.0))),
])
def test_the_rule_of_a_keras_optimizer(optimizer, kind, slots) -> None:
    rule = UpdateRule.of_keras(optimizer())
    assert rule.kind is kind and rule.slots == slots
    assert rule.learning_rate == pytest.approx(optimizer().get_config()["learning_rate"])
    if kind is RuleKind.ADAM:
        assert rule.hyper["beta1"] == pytest.approx(0.8)
    if kind is RuleKind.MOMENTUM:
        assert rule.hyper == {"momentum": pytest.approx(0.9), "use_nesterov": True}
    if kind is RuleKind.RMSPROP:
        config = optimizer().get_config()
        assert rule.hyper == {"rho": pytest.approx(0.9), "momentum": pytest.approx(config["momentum"]),
                              "epsilon": pytest.approx(1e-7), "centered": config["centered"]}


def test_ftrl_folds_beta_into_l2_as_the_v1_rule_does() -> None:
    rule = UpdateRule.of_keras(tf.keras.optimizers.Ftrl(0.5, beta=0.2, l2_regularization_strength=0.1))
    assert rule.hyper["l2"] == pytest.approx(0.1 + 0.2 / (2 * 0.5))


@pytest.mark.parametrize("optimizer, named", [
    (lambda: tf.keras.optimizers.Adadelta(0.1), "Adadelta"),
    (lambda: tf.keras.optimizers.legacy.RMSprop(0.1, decay=0.01), "decay=0.01"),
    (lambda: tf.keras.optimizers.legacy.Adagrad(0.1, decay=0.01), "decay=0.01"),
    (lambda: tf.keras.optimizers.legacy.SGD(0.1, clipnorm=1.0), "clipnorm=1.0"),
    (lambda: tf.keras.optimizers.Adagrad(0.1, clipnorm=1.0), "clipnorm=1.0"),
    (lambda: tf.keras.optimizers.Adam(0.1, amsgrad=True), "amsgrad=True"),
    (lambda: tf.keras.optimizers.SGD(0.1, weight_decay=0.01), "weight_decay=0.01"),
    (lambda: tf.keras.optimizers.SGD(tf.keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)), "learning_rate="),
])
def test_what_the_delta_ops_cannot_apply_is_refused_by_name(optimizer, named) -> None:
    with pytest.raises(ConfigError, match="source: the model's optimizer") as info:
        UpdateRule.of_keras(optimizer())
    assert named in str(info.value)


def test_the_partitioner_keeps_every_variable_whole() -> None:
    from tf_ecrec.pss import ECPartitioner

    partitioner = ECPartitioner()
    assert partitioner(tf.TensorShape([1000, 16]), tf.float32) == [1, 1]
    assert partitioner([7], tf.float32) == [1]


def test_protect_refuses_a_strategy_that_is_not_parameter_server() -> None:
    from tf_ecrec.pss.anchors import PSPlacement

    with pytest.raises(ConfigError, match="ParameterServerStrategy"):
        PSPlacement(tf.distribute.get_strategy())


def test_a_function_session_runs_nested_fetches_with_feeds_over_eager_variables() -> None:
    from tf_ecrec.pss.function_session import FunctionSession
    from tf_ecrec.step.steplog import FeedPairs, feeds

    var = tf.Variable(tf.zeros([4, 2]))

    def build() -> tuple:
        x = tf.compat.v1.placeholder(tf.float32, [None, 2])
        rows = tf.compat.v1.placeholder(tf.int64, [None])
        add = tf.raw_ops.ResourceScatterAdd(resource=var.handle, indices=rows, updates=x)
        return x, rows, add, var.read_value()

    session = FunctionSession(build)
    x, rows, add, read = session.built
    pairs = feeds((x, [[1.0, 2.0]]), (rows, [3]))
    assert isinstance(pairs, FeedPairs)  # eager: a function graph's tensors are not hashable
    assert session.run([add], pairs) == [None]
    out = session.run({"value": read, "twice": [read, read]})
    np.testing.assert_array_equal(out["value"][3], [1.0, 2.0])
    assert len(out["twice"]) == 2
    np.testing.assert_array_equal(var.numpy()[3], [1.0, 2.0])
    with tf.Graph().as_default():
        p = tf.compat.v1.placeholder(tf.int64, [])
        assert feeds((p, 1)) == {p: 1}  # a v1 session's graph: the ordinary dict


def test_step_ids_drawn_in_the_graph_differ_and_carry_the_generation() -> None:
    from tf_ecrec.step.step_program import GENERATION_SHIFT, new_step_id

    tf.random.set_seed(7)  # a global seed must not make two workers draw the same ids

    @tf.function
    def draw() -> tf.Tensor:
        return new_step_id(5, in_graph=True)

    ids = {int(draw()) for _ in range(20)}
    assert len(ids) == 20 and {i >> GENERATION_SHIFT for i in ids} == {5}
    tf.random.set_seed(7)
    assert int(draw()) not in ids  # the seed does not replay them


@pytest.mark.parametrize("flags, rule", [
    ({"fault_tolerance": "checkpoint"}, "--fault-tolerance ecrec"),
    ({"data": "criteo:/x"}, "--data synthetic only"),
    ({"spare_ps": 1}, "--spare-ps"),
    ({"restart_at": "new-port"}, "keeps its address"),
    ({"deterministic": True, "workers": 1}, "--deterministic"),
    ({"add_workers": (10,)}, "--add-worker"),
])
def test_the_launcher_refuses_what_pss_does_not_support(flags, rule) -> None:
    from tf_ecrec.launcher.job.spec import JobSpec

    base = {"model": "keras_dlrm", "strategy": "pss", "fault_tolerance": "ecrec", "steps": 100}
    with pytest.raises(ConfigError, match="source: --strategy") as info:
        JobSpec(**{**base, **flags})
    assert rule in str(info.value)


def test_a_pss_job_has_no_master_and_fits_exactly_its_steps() -> None:
    from tf_ecrec.launcher.job.spec import JobSpec
    from tf_ecrec.launcher.task.pss_job import _steps_per_epoch

    job = JobSpec(model="keras_dlrm", strategy="pss", fault_tolerance="ecrec", steps=240)
    assert not job.uses_master and job.to_json()["strategy"] == "pss"
    assert JobSpec.from_json(job.to_json()) == job
    for steps in (1, 7, 240, 997, 3000):
        spe = _steps_per_epoch(steps)
        assert steps % spe == 0 and 1 <= spe <= 200


@pytest.mark.parametrize("optimizer, named", [
    (lambda: tf.keras.optimizers.Adagrad(0.1), "keras.src.optimizers.adagrad.Adagrad"),
    (lambda: tf.keras.optimizers.legacy.Adagrad(0.1), "legacy"),
    (lambda: None, "not compiled"),
])
def test_a_model_not_compiled_with_the_protections_optimizer_is_refused_by_name(optimizer, named) -> None:
    import types

    from tf_ecrec.pss.keras_optimizer import protected_optimizer

    with pytest.raises(ConfigError, match=r"protection\.optimizer\(.*source: model\.compile") as info:
        protected_optimizer(types.SimpleNamespace(optimizer=optimizer()), protection=object())
    assert named in str(info.value)
