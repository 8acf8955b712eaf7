"""The variables `ECOptimizer` adds: optimizer slots, parity of the tables, replicas of the rest.

Each is created on first use, on its PS, with its initial value computed
from the initial values of what it protects (`tf_ecrec.layout.stripe_encoding`
encodes parity from the data PS's words; a replica is the k = 1 code of a
variable and its slots, i.e. their words).  The graph's initializer runs
every initializer in one ``session.run``, where each initial-value tensor is
computed once and feeds both a variable and its parity: the ordinary
initializer leaves them consistent.  `tf_ecrec.recovery`'s fresh start does
not use these initializers for parity and replicas: it encodes them from the
initialised data PS to PS in slices (`tf_ecrec.rebuild`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_ecrec.base import unfolded
from tf_ecrec.errors import ConfigError
from tf_ecrec.layout.device import initial_value_of, on_ps, ps_index, variable_name
from tf_ecrec.layout.stripe_encoding import encode_parity_chunk, row_words
from tf_ecrec.step.embedding import EmbeddingCollection
from tf_ecrec.step.update_rule import UpdateRule


class ProtectionVariables:
    """The slots, parity and replicas of one optimizer's variables, by name; create them with the ``*_for`` methods.

    Args:
      rule: the update rule (its slots are created for every updated variable), unless `rules` names
        another for a variable (an `ECOptimizer` with parts: `tf_ecrec.step.optimizer_parts`).

    Attributes:
      slots: variable name -> its slot variables, in the rule's order.
      parity: collection name -> PS -> the parity variable of that PS.
      replicas: variable name -> its replicas (dense variables and the global step).
      protected: variable name -> the replicated variable (dense ones and the global step).
    """

    def __init__(self, rule: UpdateRule) -> None:
        self.rule = rule
        self.rules: dict[str, UpdateRule] = {}  # variable name -> its rule, where not `rule`
        self.slots: dict[str, list[tf.Variable]] = {}
        self.parity: dict[str, dict[int, tf.Variable]] = {}
        self.replicas: dict[str, list[tf.Variable]] = {}
        self.protected: dict[str, tf.Variable] = {}

    def redundancy_names(self) -> set[str]:
        """Names of the variables derived from others: every parity and every replica."""
        names = {variable_name(v) for parity in self.parity.values() for v in parity.values()}
        return names | {variable_name(r) for reps in self.replicas.values() for r in reps}

    def rule_of(self, var: tf.Variable) -> UpdateRule:
        """The update rule of `var`."""
        return self.rules.get(variable_name(var), self.rule)

    def slots_of(self, var: tf.Variable) -> list[tf.Variable]:
        """The slots of `var`, if they were created."""
        return self.slots.get(variable_name(var), [])

    def slots_for(self, var: tf.Variable) -> list[tf.Variable]:
        """The slots of `var`, created on its PS on first use."""
        if variable_name(var) not in self.slots:
            slots = []
            with on_ps(ps_index(var.device)):
                for slot_name, initial in self.rule_of(var).slots:
                    slots.append(
                        tf.compat.v1.Variable(
                            unfolded.filled(var.shape.as_list(), initial, tf.float32),
                            name=f"{variable_name(var)}/{slot_name}",
                            trainable=False,
                            use_resource=True,
                            dtype=tf.float32,
                            shape=var.shape,
                        )
                    )
            self.slots[variable_name(var)] = slots
        return self.slots[variable_name(var)]

    def parity_for(self, coll: EmbeddingCollection) -> dict[int, tf.Variable]:
        """PS -> the parity variable of `coll` there (its parity chunks stacked), created on first use."""
        if coll.name in self.parity:
            return self.parity[coll.name]
        code = coll.code
        layout = coll.table_layout
        c = coll.chunk_rows
        words = {}
        for p, var in coll.data.items():
            with tf.compat.v1.device(var.device):  # on the data's PS, not the chief (see embedding._masked)
                values = [initial_value_of(var)] + [initial_value_of(s) for s in self.slots_for(var)]
                words[p] = row_words(values, int(var.shape[0]))
        kinds = sorted({str(self.rule_of(v).kind) for v in coll.data.values()})
        if len(kinds) > 1:  # a stripe's rows and slots are encoded together: one layout of slots per collection
            raise ConfigError(f"collection {coll.name!r} is updated by the rules {kinds}; rule: one update rule per "
                              "embedding collection; source: the optimizers given its variables")
        width = (1 + len(self.rule_of(next(iter(coll.data.values()))).slots)) * coll.dim
        parity: dict[int, tf.Variable] = {}
        for q, chunks in coll.parity_chunks_on.items():
            if not chunks:
                continue
            with on_ps(q):
                parts = [encode_parity_chunk(layout, code, pc, words) for pc in chunks]
                parity[q] = tf.compat.v1.Variable(
                    tf.concat(parts, axis=0),
                    name=f"ec/{coll.name}/ps{q}/parity",
                    trainable=False,
                    use_resource=True,
                    dtype=tf.int32,
                    shape=[len(chunks) * c, width],
                )
        self.parity[coll.name] = parity
        return parity

    def replicas_for(self, var: tf.Variable, slots: list[tf.Variable], r: int, num_ps: int) -> list[tf.Variable]:
        """The `r` replicas of dense `var` and its slots (their words) on the next PS tasks, created on first use."""
        if variable_name(var) in self.replicas:
            return self.replicas[variable_name(var)]
        primary = ps_index(var.device)
        with tf.compat.v1.device(var.device):
            words = row_words([initial_value_of(v) for v in [var, *slots]], int(var.shape[0]))
        replicas = []
        for j in range(r):
            with on_ps((primary + 1 + j) % num_ps):
                replicas.append(
                    tf.compat.v1.Variable(
                        words, name=f"{variable_name(var)}/ec_replica_{j}", trainable=False, use_resource=True, dtype=tf.int32
                    )
                )
        self.replicas[variable_name(var)] = replicas
        self.protected[variable_name(var)] = var
        return replicas

    def step_replicas(self, global_step: tf.Variable, r: int, num_ps: int) -> list[tf.Variable]:
        """The `r` replicas of the global step on the next PS tasks, created on first use."""
        name = variable_name(global_step)
        if name not in self.replicas:
            primary = ps_index(global_step.device)
            replicas = []
            for j in range(r):
                with on_ps((primary + 1 + j) % num_ps):
                    replicas.append(
                        tf.compat.v1.Variable(
                            initial_value_of(global_step),
                            name=f"{name}/ec_replica_{j}",
                            trainable=False,
                            use_resource=True,
                            dtype=global_step.dtype.base_dtype,
                        )
                    )
            self.replicas[name] = replicas
            self.protected[name] = global_step
        return self.replicas[name]

    def create_all(self, var_list: Sequence[tf.Variable], collections: Sequence[EmbeddingCollection], r: int,
                   num_ps: int, global_step: tf.Variable | None) -> None:
        """Creates, up front, what updates of `var_list` need: slots, the parity of `collections`, dense replicas.

        A TF2 step cannot create variables when it is scheduled, so a bound
        `ECOptimizer` creates them before its first trace runs; the
        Estimator path creates them on first use instead.

        Raises:
          ConfigError: a scalar variable (a replica covers rows).
        """
        owner = {variable_name(v): c for c in collections for v in c.data.values()}
        for var in var_list:
            slots = self.slots_for(var)
            if variable_name(var) in owner:
                self.parity_for(owner[variable_name(var)])
            elif var.shape.rank == 0:
                raise ConfigError(f"ECOptimizer cannot protect the scalar variable {variable_name(var)}; source: the model")
            else:
                self.replicas_for(var, slots, r, num_ps)
        if global_step is not None:
            self.step_replicas(global_step, r, num_ps)


def describe(opt: Any, colls: dict[str, Any], ec: Any) -> dict[str, Any]:
    """What `opt` (an ECOptimizer) protects, by variable name (JSON-able; for verification and recovery)."""
    slots = opt.variables.slots
    out: dict[str, Any] = {
        "code": [ec.k, ec.r] if ec else None,
        "optimizer": opt.rule.kind.value,
        "slots": [n for n, _ in opt.rule.slots],
        "collections": [],
        "replicas": {name: [variable_name(r) for r in reps] for name, reps in opt.replicas.items()},
        "replica_slots": {name: [variable_name(s) for s in slots.get(name, [])] for name in opt.replicas},
        "rules": {name: rule.kind.value for name, rule in sorted(opt.variables.rules.items())},  # where not "optimizer"
    }
    for name, parity in opt.parity.items():
        coll = colls[name]
        out["collections"].append(
            {
                "name": name,
                "dim": coll.dim,
                "layout": coll.layout.to_json(),
                "data": {str(p): variable_name(v) for p, v in coll.data.items()},
                "slots": {str(p): [variable_name(s) for s in slots[variable_name(v)]] for p, v in coll.data.items()},
                "parity": {str(q): variable_name(v) for q, v in parity.items()},
            }
        )
    return out
