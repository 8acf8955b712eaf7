"""Where the protection's variables go under ParameterServerStrategy: colocation with per-PS anchors.

TensorFlow 2.15's `ParameterServerStrategy` places each variable (each
shard) on ``/job:ps/task:(n % num_ps)``, ``n`` a creation counter; a device
scope does not change it and a partitioner only says how many shards.  A
variable created under ``strategy.extended.colocate_vars_with(v)`` goes
where ``v`` is, unpartitioned (`tests/integration/test_pss_facts.py`).  So
`PSPlacement` creates one small *anchor* variable per PS, reading each
anchor's device (never trusting the counter), and places the storage the
layout (`tf_ecrec.layout.placement`) puts on PS ``p`` under
``colocate_vars_with(anchor[p])`` and ``tf.device(/job:ps/task:p)``.

The library's code declares that storage with `tf_ecrec.layout.device.on_ps`, as
it does for the Estimator path; `PSPlacement.active` makes ``on_ps`` enter
this placement's scope for the task, so the same table, slot, parity and
replica code serves both paths.  After a PS restarts, `replace_anchor`
makes a new anchor there (the old one died with the PS's resources).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import tensorflow as tf

from tf_ecrec.errors import ConfigError
from tf_ecrec.layout import device
from tf_ecrec.layout.device import ps_index

T = TypeVar("T")


def resolver_of(strategy: Any) -> Any:
    """The cluster resolver a ParameterServerStrategy was made with.

    TensorFlow 2.15's public ``strategy.cluster_resolver`` reads the
    extended object, where ParameterServerStrategy does not keep it (it
    returns None); the strategy itself holds the one it was given.
    """
    resolver = strategy.cluster_resolver or getattr(strategy, "_cluster_resolver", None)
    if resolver is None:
        raise ConfigError(
            f"{type(strategy).__name__} has no cluster resolver: tf_ecrec.pss protects "
            "tf.distribute.experimental.ParameterServerStrategy; source: the strategy"
        )
    return resolver


def num_ps_of(strategy: Any) -> int:
    """The PS count of a ParameterServerStrategy's cluster."""
    return len(resolver_of(strategy).cluster_spec().as_dict().get("ps", ()))


class PSPlacement:
    """One anchor variable per PS of `strategy`; `scope(p)` creates variables on PS ``p``.

    Args:
      strategy: a `tf.distribute.experimental.ParameterServerStrategy`.

    Raises:
      ConfigError: not a ParameterServerStrategy with PS tasks, or some PS
        got no anchor (the strategy does not place round robin).
    """

    def __init__(self, strategy: Any) -> None:
        if not isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
            raise ConfigError(
                f"tf_ecrec.pss protects a tf.distribute.experimental.ParameterServerStrategy, got "
                f"{type(strategy).__name__}; source: the strategy"
            )
        self.strategy = strategy
        self.num_ps = num_ps_of(strategy)
        if self.num_ps < 1:
            raise ConfigError("the strategy's cluster has no ps job; source: the cluster resolver")
        self.anchors: dict[int, tf.Variable] = {}
        self._serial = itertools.count()
        for p in range(self.num_ps):
            if p not in self.anchors:
                self.replace_anchor(p)

    def replace_anchor(self, task: int) -> tf.Variable:
        """Creates anchors (each on the PS the counter picks, read from its device) until PS `task` has a new one."""
        for _ in range(2 * self.num_ps):
            with self.strategy.scope():
                anchor = tf.Variable(0, dtype=tf.int32, trainable=False, name=f"ec_anchor_{next(self._serial)}")
            p = ps_index(anchor.device)
            if p not in self.anchors or p == task:
                self.anchors[p] = anchor
            if p == task:
                return anchor
        raise ConfigError(
            f"no anchor variable landed on PS {task} in {2 * self.num_ps} creations: the strategy does not place "
            "variables round robin over its PS tasks; source: ParameterServerStrategy"
        )

    @contextlib.contextmanager
    def scope(self, task: int) -> Iterator[None]:
        """Variables created inside go to PS `task`, unpartitioned; ops inside run there."""
        if task not in self.anchors:
            raise ConfigError(f"PS {task} is not a task of this cluster (0..{self.num_ps - 1}); source: the layout")
        with self.strategy.scope(), self.strategy.extended.colocate_vars_with(self.anchors[task]), tf.device(
            device.ps_device(task)
        ):
            yield

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """`tf_ecrec.layout.device.on_ps` places storage with this placement while inside."""
        with device.variable_placer(self.scope):
            yield

    def create(self, fn: Callable[[], T]) -> T:
        """Runs `fn` (which creates storage with `on_ps`) eagerly, in cross-replica context, placed.

        Keras builds a layer, and an optimizer its slots, in the first trace
        of the step, in a replica context: there the strategy's scope cannot
        be entered, so the creation goes through ``merge_call`` (cross-replica
        context) and ``tf.init_scope`` (out of the traced function), as
        TensorFlow's own optimizers lift theirs.
        """

        def run(*_: Any) -> T:
            with tf.init_scope(), self.active():
                return fn()

        if tf.distribute.in_cross_replica_context():
            return run()
        return tf.distribute.get_replica_context().merge_call(run)

    def task_of(self, variable: tf.Variable) -> int:
        """The PS a variable is on (ConfigError if not on a PS)."""
        return ps_index(variable.device)
