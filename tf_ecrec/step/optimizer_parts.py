"""Several optimizers in one protected step: `ECOptimizer.part` (a canned wide-and-deep estimator's two).

A model_fn that trains its variables with two optimizers (TensorFlow's
``DNNLinearCombinedClassifier``: Adagrad for the deep part, FTRL for the
linear part, each its own ``minimize``) is protected whole as one step::

    dnn = tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.05))
    linear = dnn.part(tf.compat.v1.train.FtrlOptimizer(0.1))
    tf.compat.v1.estimator.DNNLinearCombinedClassifier(..., dnn_optimizer=dnn, linear_optimizer=linear)

Every ``minimize`` of the owner or of a part records its gradients, each
variable with the rule of the optimizer that got it, and returns a no-op;
`tf_ecrec.ec_model_fn` then builds one step of all of them (one step id,
one log entry per variable, one count of the global step) and makes it the
EstimatorSpec's train op (`finish`). The model_fn's own train op is read,
not run: it may be the recorded no-ops, groups of them, the global step's
increment by one (the canned estimators' ``_train_op_fn``: the step counts
it) and ``UPDATE_OPS`` (kept); anything else is refused with a ConfigError
naming the op, since the protected step would not run it. A variable given
to two optimizers, and an embedding collection whose variables two rules
update, are refused too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_ecrec.base.graph_registry import GraphRegistry
from tf_ecrec.errors import ConfigError
from tf_ecrec.layout.device import variable_name
from tf_ecrec.step.embedding import current_context
from tf_ecrec.step.update_rule import UpdateRule

# Per graph, the ECOptimizers with parts whose updates are recorded and not yet built.
_PENDING: GraphRegistry[Any] = GraphRegistry()
_SOURCE = "ECOptimizer.part"


class ECOptimizerPart(tf.compat.v1.train.Optimizer):
    """Another v1 optimizer's rule inside an ECOptimizer's step (made by `ECOptimizer.part`; see the module doc)."""

    def __init__(self, owner: Any, optimizer: tf.compat.v1.train.Optimizer, name: str) -> None:
        super().__init__(use_locking=True, name=name)
        self.owner = owner
        self.rule = UpdateRule.of(optimizer)
        self._base = optimizer

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, tf.Variable]]:
        return self._base.compute_gradients(*args, **kwargs)

    def get_slot_names(self) -> list[str]:
        return [name for name, _ in self.rule.slots]

    def apply_gradients(self, grads_and_vars: Sequence[tuple[Any, tf.Variable]], global_step: tf.Variable | None = None,
                        name: str | None = None) -> tf.Operation:
        return self.owner.deferred.record(grads_and_vars, self.rule, global_step)


class Deferred:
    """The updates an ECOptimizer with parts recorded in the graph being built, until `finish` builds them."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self.building = False
        self._pairs: list[tuple[Any, tf.Variable]] = []
        self._rules: dict[str, Any] = {}
        self._step: tf.Variable | None = None
        self.graph: tf.Graph | None = None
        self.placeholders: set[tf.Operation] = set()

    def record(self, grads_and_vars: Sequence[tuple[Any, tf.Variable]], rule: UpdateRule,
               global_step: tf.Variable | None) -> tf.Operation:
        graph = tf.compat.v1.get_default_graph()
        if current_context(graph) is None:  # nothing would build the recorded updates: a model that never trains
            raise ConfigError("an ECOptimizer with parts applied gradients outside tf_ecrec.ec_model_fn; rule: its step "
                              "is built by ec_model_fn (tf_ecrec.train / train_and_evaluate wrap the model_fn); "
                              f"source: {_SOURCE}")
        if self.graph is not graph:  # a new graph (the Estimator builds one per mode and run): start over
            self._pairs, self._rules, self._step, self.placeholders, self.graph = [], {}, None, set(), graph
            _PENDING.add(self, graph)
        for grad, var in grads_and_vars:
            if grad is None:
                continue
            name = variable_name(var)
            if name in self._rules:
                raise ConfigError(f"variable {name!r} is given to two optimizers of one ECOptimizer; rule: each "
                                  f"variable is updated by one of them; source: {_SOURCE}")
            self._rules[name] = rule
            self._pairs.append((grad, var))
        self._step = self._step if global_step is None else global_step
        op = tf.no_op(name="ec_recorded_update")
        self.placeholders.add(op)
        return op

    def finish(self, train_op: Any) -> tf.Operation:
        """The step of every recorded update, to run instead of the model_fn's `train_op` (checked, module doc)."""
        global_step = self._step if self._step is not None else tf.compat.v1.train.get_global_step()
        if global_step is None:
            raise ConfigError(f"the model_fn has no global step; rule: a protected step counts one; source: {_SOURCE}")
        keep = _other_ops(train_op, self.placeholders, global_step)
        self.owner.variables.rules.update({n: r for n, r in self._rules.items() if r is not self.owner.rule})
        self.building = True
        try:
            step = self.owner.apply_gradients(self._pairs, global_step=global_step)
        finally:
            self.building = False
            self.graph = None
        return tf.group(step, *keep, name="ec_step_and_updates") if keep else step


def finish_pending(graph: tf.Graph | None = None) -> Deferred | None:
    """The one ECOptimizer with parts that recorded updates in `graph`, if any (two are refused)."""
    graph = graph or tf.compat.v1.get_default_graph()
    pending = [d for d in dict.fromkeys(_PENDING.items(graph)) if d.graph is graph]
    if len(pending) > 1:
        raise ConfigError(f"{len(pending)} ECOptimizers with parts updated variables in one model_fn; rule: one, "
                          f"its parts for the other optimizers; source: {_SOURCE}")
    return pending[0] if pending else None


def _other_ops(train_op: Any, placeholders: set[tf.Operation], global_step: tf.Variable) -> list[tf.Operation]:
    """The ``UPDATE_OPS`` that `train_op` runs; a ConfigError if it runs anything else the step does not."""
    updates = set(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS))
    step_handle = getattr(global_step, "handle", None)
    keep: list[tf.Operation] = []
    seen: set[tf.Operation] = set()
    todo = [getattr(train_op, "op", train_op)]
    while todo:
        op = todo.pop()
        if op in seen or op in placeholders:
            continue
        seen.add(op)
        if op in updates:
            keep.append(op)
            continue
        increments = op.type in ("AssignAddVariableOp", "AssignAdd") and tf.get_static_value(op.inputs[1]) == 1 and (
            (step_handle is not None and op.inputs[0].op is step_handle.op) or op.inputs[0].op is global_step.op)
        if op.type == "NoOp" or increments:  # a group, or the global step's increment (the step counts it)
            todo.extend(op.control_inputs)
            todo.extend(t.op for t in op.inputs if op.type == "NoOp")
            continue
        raise ConfigError(f"the model_fn's train op runs {op.name!r} ({op.type}) beside the ECOptimizer's updates; "
                          "rule: with parts, the train op is the optimizers' minimize ops, the global step's increment "
                          f"and UPDATE_OPS (the protected step replaces it); source: {_SOURCE}")
    return keep
