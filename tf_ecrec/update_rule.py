"""The update rule of a stock v1 optimizer, read once, and the delta op that applies it.

`UpdateRule.of` reads the learning rate, slots and hyperparameters of a
``tf.compat.v1.train`` optimizer (through its attributes: TensorFlow has no
public accessor for them); `UpdateRule.apply` builds the
``SparseApply*WithDelta`` op of that rule on a variable and its slots.
Supported: GradientDescent, Adagrad, Adam (applied lazily: only the touched
rows' moments change, as in LazyAdam) and Ftrl.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import tensorflow as tf

from tf_ecrec import ops as ec_ops
from tf_ecrec.errors import ConfigError


class RuleKind(str, enum.Enum):
    """The update rules the delta ops implement (the values are the names `ECOptimizer.describe` reports)."""

    SGD = "sgd"
    ADAGRAD = "adagrad"
    ADAM = "adam"
    FTRL = "ftrl"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class UpdateRule:
    """An optimizer's update as the delta ops apply it.

    Attributes:
      kind: which rule.
      learning_rate: the base learning rate.
      slots: (slot name, initial value) of each optimizer slot, in op order.
      hyper: the other hyperparameters.
    """

    kind: RuleKind
    learning_rate: float
    slots: tuple[tuple[str, float], ...]
    hyper: dict[str, float]

    @classmethod
    def of(cls, optimizer: tf.compat.v1.train.Optimizer) -> UpdateRule:
        """Reads the update rule of a stock v1 optimizer.

        Raises:
          ConfigError: an optimizer class tf_ecrec cannot apply with deltas.
        """
        t = tf.compat.v1.train
        if type(optimizer) is t.GradientDescentOptimizer:
            return cls(RuleKind.SGD, float(optimizer._learning_rate), (), {})
        if type(optimizer) is t.AdagradOptimizer:
            init = float(optimizer._initial_accumulator_value)
            return cls(RuleKind.ADAGRAD, float(optimizer._learning_rate), (("Adagrad", init),), {})
        if type(optimizer) is t.AdamOptimizer:
            hyper = {"beta1": float(optimizer._beta1), "beta2": float(optimizer._beta2), "epsilon": float(optimizer._epsilon)}
            return cls(RuleKind.ADAM, float(optimizer._lr), (("Adam", 0.0), ("Adam_1", 0.0)), hyper)
        if type(optimizer) is t.FtrlOptimizer:
            lr = float(optimizer._learning_rate)
            hyper = {
                "l1": float(optimizer._l1_regularization_strength),
                # Ftrl folds beta into l2 the same way.
                "l2": float(optimizer._l2_regularization_strength) + float(optimizer._beta) / (2.0 * lr),
                "l2_shrinkage": float(optimizer._l2_shrinkage_regularization_strength),
                "lr_power": float(optimizer._learning_rate_power),
            }
            init = float(optimizer._initial_accumulator_value)
            return cls(RuleKind.FTRL, lr, (("Ftrl", init), ("Ftrl_1", 0.0)), hyper)
        raise ConfigError(
            f"ECOptimizer cannot apply {type(optimizer).__name__} with parity deltas; supported: "
            "GradientDescentOptimizer, AdagradOptimizer, AdamOptimizer (applied lazily), FtrlOptimizer "
            "from tf.compat.v1.train; source: the model_fn's optimizer"
        )

    def apply(self, var: tf.Variable, slots: list[tf.Variable], values: tf.Tensor, indices: tf.Tensor,
              step: tf.Variable | None, logged: dict[str, Any]) -> tf.Tensor:
        """The delta op of this rule: updates `var` and `slots` at `indices`; returns the bitwise delta.

        Args:
          var, slots: the variable and its slots (in `slots` order).
          values, indices: the deduplicated gradient rows and their row ids.
          step: the global step (Adam's bias correction needs it).
          logged: the delta-log arguments of the op (log, sid, target).

        Raises:
          ConfigError: Adam without a global step.
        """
        lr = tf.constant(self.learning_rate, tf.float32)
        h = self.hyper
        if self.kind == RuleKind.SGD:
            return ec_ops.sparse_apply_sgd_with_delta(var, values, indices, lr, **logged)
        if self.kind == RuleKind.ADAGRAD:
            return ec_ops.sparse_apply_adagrad_with_delta(var, slots[0], values, indices, lr, **logged)
        if self.kind == RuleKind.ADAM:
            if step is None:
                raise ConfigError("ECOptimizer applies Adam with the global step: pass global_step to minimize(); source: model_fn")
            t = tf.cast(step.read_value() + 1, tf.float32) if hasattr(step, "read_value") else tf.cast(step + 1, tf.float32)
            b1, b2 = h["beta1"], h["beta2"]
            lr_t = ec_ops.lazy_adam_learning_rate(lr, tf.pow(b1, t), tf.pow(b2, t))
            return ec_ops.sparse_apply_adam_with_delta(
                var, slots[0], slots[1], values, indices, lr_t, beta1=b1, beta2=b2, epsilon=h["epsilon"], **logged
            )
        return ec_ops.sparse_apply_ftrl_with_delta(
            var, slots[0], slots[1], values, indices, lr, l1=h["l1"], l2=h["l2"], lr_power=h["lr_power"],
            l2_shrinkage=h["l2_shrinkage"] if h["l2_shrinkage"] > 0 else None, **logged,
        )
