"""`ECOptimizerV2`: a TF2 Keras optimizer whose every update keeps parity and replicas exact.

Made by `PSSProtection.optimizer(tf.keras.optimizers.Adagrad(0.05))` and
given to ``model.compile``.  It reads the wrapped optimizer's rule
(`tf_ecrec.step.update_rule.UpdateRule.of_keras`) and builds the step of
`tf_ecrec.step.optimizer.ECOptimizer` (applies with deltas, folds into parity and
replicas, the count, the two commit rounds of `tf_ecrec.step.steplog`) inside
the `tf.function` Keras schedules on a worker: the ops placed on PS devices
run there, so a step moves deltas PS to PS as in the Estimator path.

Its variables (slots, parity, replicas, the iteration count's replicas)
are created on the first trace, lifted out of the function as Keras' own
optimizers do, and placed by the protection's anchors; `variables` lists
them for checkpoints.  ``iterations`` is the job's global step: counted once
per step with its ``r`` replicas.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from tf_ecrec.errors import ConfigError
from tf_ecrec.layout.device import variable_name
from tf_ecrec.step.optimizer import ECOptimizer
from tf_ecrec.step.update_rule import UpdateRule

if TYPE_CHECKING:
    from tf_ecrec.pss.protection import PSSProtection


class ECOptimizerV2(tf.keras.optimizers.Optimizer):
    """Wraps a TF2 Keras SGD, Adagrad, Adam or Ftrl (see the module doc).

    Args:
      optimizer: the Keras optimizer whose rule and hyperparameters apply.
      protection: the strategy's `PSSProtection`.
      name: the optimizer's name.

    Raises:
      ConfigError: an optimizer or a setting the delta ops cannot apply.
    """

    def __init__(self, optimizer: tf.keras.optimizers.Optimizer, protection: PSSProtection, name: str = "ECOptimizerV2") -> None:
        self.rule = UpdateRule.of_keras(optimizer)
        with protection.strategy.scope():
            super().__init__(name=name)
        # Not tracked: its variables (a `learning_rate` the strategy put on some PS) are none of the model's
        # state, and a checkpoint would read them from a PS that a recovery rebuilt without them.
        object.__setattr__(self, "wrapped", optimizer)
        self.protection = protection
        self.protector = ECOptimizer(None, ec=protection.ec, name=name, rule=self.rule)
        self._protection_built = False
        protection.optimizers.append(self)

    @property
    def learning_rate(self) -> float:
        """The base learning rate (a constant of the rule)."""
        return self.rule.learning_rate

    def build(self, var_list: Iterable[tf.Variable]) -> None:
        """Creates the slots, parity and replicas of `var_list` and the iteration count's replicas, once."""
        var_list = list(var_list)
        super().build(var_list)
        if self._protection_built:
            return
        protection = self.protection
        # At the cluster's generation: a job that restored a backup before its first step raised it already.
        self.protector.bind(protection.collections, protection.num_ps, protection.ec, protection.generation)
        protection.placement.create(lambda: self.protector.create_variables(var_list, self.iterations))
        self._variables.extend(self.protection_variables())
        self._protection_built = True

    def protection_variables(self) -> list[tf.Variable]:
        """Every variable this optimizer added: slots, parity, replicas."""
        v = self.protector.variables
        out = [s for slots in v.slots.values() for s in slots]
        out += [p for parity in v.parity.values() for p in parity.values()]
        out += [r for reps in v.replicas.values() for r in reps]
        return out

    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, tf.Variable]], name: str | None = None,
                        skip_gradients_aggregation: bool = False, **kwargs: Any) -> tf.Variable:
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if not pairs:
            return self.iterations
        known = {variable_name(v) for _, v in pairs}
        if self._protection_built and not known <= set(self.protector.variables.slots):
            raise ConfigError(
                f"ECOptimizerV2 was built for other variables; new ones: {sorted(known - set(self.protector.variables.slots))}; "
                "source: the model's trainable variables"
            )
        self.build([v for _, v in pairs])
        self.protector.apply_gradients(pairs, global_step=self.iterations, name=name)
        return self.iterations

    def update_step(self, gradient: Any, variable: tf.Variable) -> None:
        raise ConfigError("ECOptimizerV2 applies whole steps (apply_gradients); source: ECOptimizerV2.update_step")

    def describe(self) -> dict[str, Any]:
        """What protects what, by variable name (`tf_ecrec.check.verify.check_parity` reads it)."""
        return self.protector.describe()

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["wrapped"] = tf.keras.optimizers.serialize(self.wrapped)
        return config


def protected_optimizer(model: Any, protection: PSSProtection) -> ECOptimizerV2:
    """`model`'s optimizer, made by `protection.optimizer(...)`; else a typed error (training would leave parity
    stale: no update of a stock optimizer goes through the delta ops, and a recovery would rebuild old rows)."""
    optimizer = getattr(model, "optimizer", None)
    if isinstance(optimizer, ECOptimizerV2) and optimizer.protection is protection:
        return optimizer
    what = "none (the model is not compiled)" if optimizer is None else f"{type(optimizer).__module__}.{type(optimizer).__name__}"
    if isinstance(optimizer, ECOptimizerV2):
        what += " of another strategy's protection"
    raise ConfigError(
        f"the model's optimizer is {what}; rule: compile with the protection's wrapper, "
        "model.compile(optimizer=protection.optimizer(tf.keras.optimizers.Adagrad(...)), ...), in the strategy's "
        "scope; source: model.compile"
    )


def protected_values(model: Any) -> dict[str, Any]:
    """Every trainable variable of `model`, its protection's (slots, parity, replicas) and the iteration count, read
    by name (call it when no step is in flight): what a parity check and a digest of the model read."""
    optimizer = model.optimizer
    variables = [*model.trainable_variables, *optimizer.protection_variables(), optimizer.iterations]
    return {variable_name(v): v.numpy() for v in variables}
