"""The update rule of a stock v1 optimizer, read once, and the delta op that applies it.

`UpdateRule.of` reads the learning rate, slots and hyperparameters of a
``tf.compat.v1.train`` optimizer (through its attributes: TensorFlow has no
public accessor for them); `UpdateRule.apply` builds the
``SparseApply*WithDelta`` op of that rule on a variable and its slots.
Supported: GradientDescent, Adagrad, Adam (applied lazily: only the touched
rows' moments change, as in LazyAdam), Ftrl, Momentum (with or without
Nesterov) and RMSProp (centered or not, with or without momentum).
Hyperparameters must be numbers: the rule holds them as constants, so a
tensor or a callable (a schedule) is refused.
"""

from __future__ import annotations

import dataclasses
import enum
import numbers
from typing import Any

import numpy as np
import tensorflow as tf

from tf_ecrec import ops as ec_ops
from tf_ecrec.errors import ConfigError


class RuleKind(str, enum.Enum):
    """The update rules the delta ops implement (the values are the names `ECOptimizer.describe` reports)."""

    SGD = "sgd"
    ADAGRAD = "adagrad"
    ADAM = "adam"
    FTRL = "ftrl"
    MOMENTUM = "momentum"
    RMSPROP = "rmsprop"

    def __str__(self) -> str:
        return self.value


def _kind_of(optimizer: Any) -> RuleKind | None:
    """The rule of a stock v1 optimizer's exact class (a subclass may change the update: not read)."""
    t = tf.compat.v1.train
    kinds = {
        t.GradientDescentOptimizer: RuleKind.SGD,
        t.AdagradOptimizer: RuleKind.ADAGRAD,
        t.AdamOptimizer: RuleKind.ADAM,
        t.FtrlOptimizer: RuleKind.FTRL,
        t.MomentumOptimizer: RuleKind.MOMENTUM,
        t.RMSPropOptimizer: RuleKind.RMSPROP,
    }
    return kinds.get(type(optimizer))


def _number(optimizer: Any, attr: str, kind: RuleKind) -> float:
    """The hyperparameter `attr` of `optimizer` as a float; ConfigError unless it is a number."""
    value = getattr(optimizer, attr)
    if isinstance(value, numbers.Real) or (
        isinstance(value, np.ndarray) and value.shape == () and np.issubdtype(value.dtype, np.number)
    ):
        return float(value)
    raise ConfigError(
        f"ECOptimizer cannot read {attr.lstrip('_')}={value!r} of {type(optimizer).__name__}: the {kind} rule "
        "applies its hyperparameters as constants, so each must be a number, not a tensor or a callable "
        "(a schedule); source: the model_fn's optimizer"
    )


def _ftrl_hyper(lr: float, l1: float, l2: float, beta: float, l2_shrinkage: float, lr_power: float) -> dict[str, float]:
    """Ftrl's kernel hyperparameters; beta is folded into l2 as TensorFlow's Ftrl optimizers fold it."""
    return {"l1": l1, "l2": l2 + beta / (2.0 * lr), "l2_shrinkage": l2_shrinkage, "lr_power": lr_power}


@dataclasses.dataclass(frozen=True)
class UpdateRule:
    """An optimizer's update as the delta ops apply it.

    Attributes:
      kind: which rule.
      learning_rate: the base learning rate.
      slots: (slot name, initial value) of each optimizer slot, in op order.
      hyper: the other hyperparameters (Momentum's ``use_nesterov`` and
        RMSProp's ``centered`` are booleans).
    """

    kind: RuleKind
    learning_rate: float
    slots: tuple[tuple[str, float], ...]
    hyper: dict[str, float]

    @classmethod
    def of(cls, optimizer: tf.compat.v1.train.Optimizer) -> UpdateRule:
        """Reads the update rule of a stock v1 optimizer.

        The slots of Momentum and RMSProp are named as the optimizer names its
        own (``optimizer.get_name()``, then ``_1``, ``_2`` in creation order)
        and start where its own do: RMSProp's mean square at ones, the others
        at zeros.

        Raises:
          ConfigError: an optimizer class tf_ecrec cannot apply with deltas, or a
            hyperparameter that is not a number.
        """
        kind = _kind_of(optimizer)
        if kind is None:
            raise ConfigError(
                f"ECOptimizer cannot apply {type(optimizer).__name__} with parity deltas; supported: "
                "GradientDescentOptimizer, AdagradOptimizer, AdamOptimizer (applied lazily), FtrlOptimizer, "
                "MomentumOptimizer, RMSPropOptimizer from tf.compat.v1.train; source: the model_fn's optimizer"
            )

        def number(attr: str) -> float:
            return _number(optimizer, attr, kind)

        if kind == RuleKind.SGD:
            return cls(kind, number("_learning_rate"), (), {})
        if kind == RuleKind.ADAGRAD:
            return cls(kind, number("_learning_rate"), (("Adagrad", number("_initial_accumulator_value")),), {})
        if kind == RuleKind.ADAM:
            hyper = {"beta1": number("_beta1"), "beta2": number("_beta2"), "epsilon": number("_epsilon")}
            return cls(kind, number("_lr"), (("Adam", 0.0), ("Adam_1", 0.0)), hyper)
        if kind == RuleKind.FTRL:
            lr = number("_learning_rate")
            hyper = _ftrl_hyper(lr, number("_l1_regularization_strength"), number("_l2_regularization_strength"),
                                number("_beta"), number("_l2_shrinkage_regularization_strength"),
                                number("_learning_rate_power"))
            return cls(kind, lr, (("Ftrl", number("_initial_accumulator_value")), ("Ftrl_1", 0.0)), hyper)
        name = optimizer.get_name()
        if kind == RuleKind.MOMENTUM:
            hyper = {"momentum": number("_momentum"), "use_nesterov": bool(optimizer._use_nesterov)}
            return cls(kind, number("_learning_rate"), ((name, 0.0),), hyper)
        hyper = {
            "rho": number("_decay"),
            "momentum": number("_momentum"),
            "epsilon": number("_epsilon"),
            "centered": bool(optimizer._centered),
        }
        # RMSPropOptimizer creates rms (ones), then mg if centered, then momentum; the ops take (mg,) ms, mom.
        if hyper["centered"]:
            slots: tuple[tuple[str, float], ...] = ((f"{name}_1", 0.0), (name, 1.0), (f"{name}_2", 0.0))
        else:
            slots = ((name, 1.0), (f"{name}_1", 0.0))
        return cls(kind, number("_learning_rate"), slots, hyper)

    @classmethod
    def of_keras(cls, optimizer: Any) -> UpdateRule:
        """Reads the update rule of a TF2 Keras optimizer (SGD, Adagrad, Adam, Ftrl, RMSprop), from its config.

        The ``tf.keras.optimizers.legacy`` classes of the same five (TensorFlow's parameter-server
        tutorial uses them) are read the same way: their configs hold the same hyperparameters, and their
        inverse-time ``decay`` must be 0 (the rule's learning rate is a constant).

        The rule is the sparse kernel rule of the same family, with the
        optimizer's hyperparameters: Keras computes its update with other ops
        (Adagrad adds its ``epsilon`` under the square root, Adam decays every
        row's moments, SGD's momentum is the velocity form), and the delta ops
        apply TensorFlow's sparse kernels: SGD as ``ResourceScatterAdd``
        (momentum > 0: the Momentum rule, the same update for a constant
        learning rate), Adagrad as ``ResourceSparseApplyAdagrad`` (no epsilon),
        Adam lazily (LazyAdam), Ftrl as ``ResourceSparseApplyFtrlV2``, RMSprop as
        ``ResourceSparseApplyRMSProp`` / ``...CenteredRMSProp`` (Keras adds its ``epsilon`` outside the
        square root, the kernel inside; the mean square starts at zeros, as Keras' does).

        Raises:
          ConfigError: another optimizer class, a learning-rate schedule, or a
            setting the rule cannot apply (weight decay, clipping, EMA, AMSGrad).
        """
        import keras  # the Keras of tf.keras (2.15)

        families = {
            keras.optimizers.SGD: RuleKind.SGD,
            keras.optimizers.Adagrad: RuleKind.ADAGRAD,
            keras.optimizers.Adam: RuleKind.ADAM,
            keras.optimizers.Ftrl: RuleKind.FTRL,
            keras.optimizers.legacy.SGD: RuleKind.SGD,
            keras.optimizers.legacy.Adagrad: RuleKind.ADAGRAD,
            keras.optimizers.legacy.Adam: RuleKind.ADAM,
            keras.optimizers.legacy.Ftrl: RuleKind.FTRL,
            keras.optimizers.RMSprop: RuleKind.RMSPROP,
            keras.optimizers.legacy.RMSprop: RuleKind.RMSPROP,  # the tutorial's optimizer
        }
        kind = families.get(type(optimizer))
        if kind is None:
            raise ConfigError(
                f"tf_ecrec cannot apply {type(optimizer).__module__}.{type(optimizer).__name__} with parity deltas; "
                "supported: tf.keras.optimizers.SGD, Adagrad, Adam (applied lazily), Ftrl and RMSprop, and their "
                "tf.keras.optimizers.legacy classes; source: the model's optimizer"
            )
        config = optimizer.get_config()
        name = type(optimizer).__name__
        for key, neutral in (("weight_decay", None), ("clipnorm", None), ("global_clipnorm", None),
                             ("clipvalue", None), ("use_ema", False), ("amsgrad", False), ("decay", 0.0)):
            if config.get(key, neutral) != neutral:
                raise ConfigError(
                    f"tf_ecrec cannot apply {name} with {key}={config[key]!r}: the delta ops apply the plain sparse "
                    f"rule, so {key} must be {neutral!r}; source: the model's optimizer"
                )

        def number(key: str) -> float:
            value = config[key]
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                return float(value)
            raise ConfigError(
                f"tf_ecrec cannot read {key}={value!r} of {name}: the {kind} rule applies its hyperparameters as "
                "constants, so each must be a number, not a schedule; source: the model's optimizer"
            )

        lr = number("learning_rate")
        if kind == RuleKind.SGD:
            if number("momentum") == 0.0:
                return cls(kind, lr, (), {})
            hyper = {"momentum": number("momentum"), "use_nesterov": bool(config["nesterov"])}
            return cls(RuleKind.MOMENTUM, lr, (("momentum", 0.0),), hyper)
        if kind == RuleKind.ADAGRAD:
            return cls(kind, lr, (("accumulator", number("initial_accumulator_value")),), {})
        if kind == RuleKind.ADAM:
            hyper = {"beta1": number("beta_1"), "beta2": number("beta_2"), "epsilon": number("epsilon")}
            return cls(kind, lr, (("m", 0.0), ("v", 0.0)), hyper)
        if kind == RuleKind.RMSPROP:  # Keras' velocity (and average gradient) start at zeros; the ops take (mg,) ms, mom
            hyper = {"rho": number("rho"), "momentum": number("momentum"), "epsilon": number("epsilon"),
                     "centered": bool(config["centered"])}
            mean_square = (("average_gradient", 0.0),) if hyper["centered"] else ()
            return cls(kind, lr, (*mean_square, ("velocity", 0.0), ("momentum", 0.0)), hyper)
        hyper = _ftrl_hyper(lr, number("l1_regularization_strength"), number("l2_regularization_strength"),
                            number("beta"), number("l2_shrinkage_regularization_strength"), number("learning_rate_power"))
        return cls(kind, lr, (("accumulator", number("initial_accumulator_value")), ("linear", 0.0)), hyper)

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
        if self.kind == RuleKind.MOMENTUM:
            return ec_ops.sparse_apply_momentum_with_delta(
                var, slots[0], values, indices, lr, h["momentum"], use_nesterov=bool(h["use_nesterov"]), **logged
            )
        if self.kind == RuleKind.RMSPROP:
            rho, momentum, epsilon = h["rho"], h["momentum"], h["epsilon"]
            if h["centered"]:
                return ec_ops.sparse_apply_centered_rms_prop_with_delta(
                    var, slots[0], slots[1], slots[2], values, indices, lr, rho=rho, momentum=momentum,
                    epsilon=epsilon, **logged
                )
            return ec_ops.sparse_apply_rms_prop_with_delta(var, slots[0], slots[1], values, indices, lr, rho=rho,
                                                           momentum=momentum, epsilon=epsilon, **logged)
        return ec_ops.sparse_apply_ftrl_with_delta(
            var, slots[0], slots[1], values, indices, lr, l1=h["l1"], l2=h["l2"], lr_power=h["lr_power"],
            l2_shrinkage=h["l2_shrinkage"] if h["l2_shrinkage"] > 0 else None, **logged,
        )
