"""`ECOptimizer`: applies every update through the delta ops and keeps parity and replicas in step.

Wrap the v1 optimizer a model_fn already uses::

    optimizer = tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.05))
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())

Supported: the rules of `tf_ecrec.step.update_rule` (GradientDescent, Adagrad,
Adam applied lazily, Ftrl, Momentum, RMSProp), with their hyperparameters
read from the wrapped optimizer.

For each step, `apply_gradients` builds, on the PS tasks (docs/settlement.md):
one ``SparseApply*WithDelta`` op per updated variable (rows deduplicated as
TensorFlow's optimizers do), whose output ``old ^ new`` of every touched row
and slot is folded into the parity chunks of the rows' stripes
(``coef * delta``, XOR for r = 1) or XORed into a dense variable's ``r``
replicas; the global step increment on the step and its replicas; the two
commit rounds, in the run or carried by the next (`tf_ecrec.step.carried_commit`).
XOR, GF(2^16) products and integer additions commute, so whenever no step is
in flight parity and replicas equal the code of data and slots, bit for bit,
whatever the order of concurrent workers' updates.

Parity, slots and replicas are created on first use (`tf_ecrec.step.protection`);
where each delta folds comes from the layout (`TableLayout.fold_routes`);
armed failpoints (`tf_ecrec.step.failpoints`) are read once per step program.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_ecrec import ops as ec_ops
from tf_ecrec.base.graph_registry import GraphRegistry
from tf_ecrec.erasure.code import ECConfig
from tf_ecrec.errors import ConfigError
from tf_ecrec.layout.device import on_ps, ps_device, ps_index, variable_name
from tf_ecrec.step import failpoints, steplog
from tf_ecrec.step.batched_commit import BatchedCommit, batched_step
from tf_ecrec.step.carried_commit import MODES, CarriedCommit, commit_mode_from_environ
from tf_ecrec.step.embedding import EmbeddingCollection, collections, current_context
from tf_ecrec.step.optimizer_parts import Deferred, ECOptimizerPart
from tf_ecrec.step.protection import ProtectionVariables, describe
from tf_ecrec.step.step_program import (
    AppliedUpdate,
    Apply,
    Binding,
    Gated,
    ParityFolds,
    ReplicaFolds,
    StepGeneration,
    StepProgram,
    Target,
    TargetKind,
    all_rows,
    barrier,
    commit_rounds,
    dedup,
    gate_after,
    new_step_id,
    planned_folds,
    read_step,
)
from tf_ecrec.step.update_rule import UpdateRule

_LOG = logging.getLogger(__name__)

# Graph collection holding the ECOptimizer that protects the graph's variables.
# The ECOptimizers that built a protected step in a graph (ec_model_fn checks there is one, the
# manifest hook describes the last).
_PROTECTORS: GraphRegistry[ECOptimizer] = GraphRegistry()


def protectors(graph: tf.Graph | None = None) -> list[ECOptimizer]:
    """The ECOptimizers that applied gradients in `graph` (the default graph), in order."""
    return _PROTECTORS.items(graph)


class ECOptimizer(tf.compat.v1.train.Optimizer):
    """Wraps a v1 optimizer so that every update keeps parity and replicas exact.

    Args:
      optimizer: a stock tf.compat.v1.train optimizer (see `UpdateRule.of`); `part` adds others.
      ec: the code for dense replicas and the global step (r replicas); default: the code of
        `tf_ecrec.ec_model_fn`, else that of the graph's embedding collections.
      name: name prefix of the ops.
      commit_timeout_ms: how long a step's round-1 commit waits behind an earlier step's uncommitted
        update of the same variable (a dead task's step, until the chief settles it) before the step
        fails with ``AbortedError``; 0 fails at once.
      rule: the update rule, when there is no v1 optimizer to read it from (`tf_ecrec.pss` reads it
        from a Keras optimizer); ``optimizer`` is then None and `compute_gradients` is not available.
      commit: ``"carried"``: a step's run ends after its count, and its two commit rounds run in the
        trainer's next run (`tf_ecrec.step.carried_commit`: a `CarriedCommitHook` or `CarriedCommit.run`
        must drive the runs); ``"batched"``: a step is its applies and count, its folds and commit run
        in the trainer's fold rounds (`tf_ecrec.step.batched_commit`, driven the same way); ``"in_step"``:
        a run ends after its own commit.  Default: ``TF_ECREC_COMMIT`` if set, else in_step
        (`tf_ecrec.ec_model_fn` adds the hook either way).
    """

    def __init__(
        self,
        optimizer: tf.compat.v1.train.Optimizer | None,
        ec: ECConfig | None = None,
        name: str = "ECOptimizer",
        commit_timeout_ms: int = steplog.ROUND1_TIMEOUT_MS,
        rule: UpdateRule | None = None,
        commit: str | None = None,
    ) -> None:
        if commit is not None and commit not in MODES:
            raise ConfigError(f"ECOptimizer commit={commit!r}; rule: one of {MODES}; source: ECOptimizer")
        self._commit_mode = commit
        super().__init__(use_locking=True, name=name)
        self.commit_timeout_ms = int(commit_timeout_ms)
        self._base = optimizer
        self.rule = rule or UpdateRule.of(optimizer)
        self.ec = ec
        self._bound: Binding | None = None
        self.variables = ProtectionVariables(self.rule)
        # collection -> PS -> parity variable; variable name -> replicas; -> variable (dense ones, the global step)
        self.parity, self.replicas, self.protected = self.variables.parity, self.variables.replicas, self.variables.protected
        self.targets: dict[int, Target] = {}  # logged variable groups by id (tf_ecrec.step.steplog)
        self._tid: dict[str, int] = {}
        self.logs: dict[int, tf.Tensor] = {}  # PS task -> delta log handle
        self.sid: tf.Tensor | None = None
        self.carried_commit: CarriedCommit | BatchedCommit | None = None  # how the hooks drive a deferred commit
        self.fold_plan: dict[int, ParityFolds | ReplicaFolds] = {}  # data target id -> how its deltas fold
        self._collections: dict[str, EmbeddingCollection] = {}
        self.deferred: Deferred | None = None  # with parts: the updates recorded until ec_model_fn builds the step
        self._graph: tf.Graph | None = None  # the graph of the variables above (a bound TF2 step's: eager ones)

    # ---- the Optimizer interface ---------------------------------------------------------------------------

    def redundancy_names(self) -> set[str]:
        """Names of the variables derived from others: every parity and every replica."""
        return self.variables.redundancy_names()

    def slots_of(self, var: tf.Variable) -> list[tf.Variable]:
        """The optimizer slots of a variable this optimizer updated."""
        return self.variables.slots_of(var)

    def describe(self) -> dict[str, Any]:
        """What protects what, by variable name (JSON-able; for verification and recovery)."""
        return describe(self, self._collections, self.ec)

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, tf.Variable]]:
        if self._base is None:
            raise ConfigError("this ECOptimizer has an update rule and no v1 optimizer to compute gradients; source: ECOptimizer")
        return self._base.compute_gradients(*args, **kwargs)

    def bind(self, collections: Sequence[EmbeddingCollection], num_ps: int, ec: ECConfig, generation: int = 0) -> None:
        """Serves variables created eagerly (TF2 ParameterServerStrategy), not looked up in a graph.

        It protects `collections`, replicates the other variables over `num_ps`
        PS tasks, may be traced into many `tf.function` graphs, and draws step
        ids with an op (a remote worker runs no Python).  `create_variables`
        first: a scheduled function cannot create them.
        """
        self.ec = ec
        self._bound = Binding(tuple(collections), int(num_ps), int(generation))
        self._collections = {c.name: c for c in collections}

    def create_variables(self, var_list: Sequence[tf.Variable], global_step: tf.Variable | None) -> None:
        """Creates the slots, parity and replicas an update of `var_list` (and a count of `global_step`) needs."""
        assert self._bound is not None and self.ec is not None, "bind() first"
        self.variables.create_all(var_list, self._bound.collections, self.ec.r, self._bound.num_ps, global_step)

    def get_slot_names(self) -> list[str]:
        return [name for name, _ in self.rule.slots]

    def part(self, optimizer: tf.compat.v1.train.Optimizer, name: str | None = None) -> ECOptimizerPart:
        """`optimizer`'s rule for the variables it is given, in this ECOptimizer's step (`tf_ecrec.step.optimizer_parts`)."""
        self.deferred = self.deferred or Deferred(self)
        return ECOptimizerPart(self, optimizer, name or f"{self._name}_part")

    def apply_gradients(self, grads_and_vars: Sequence[tuple[Any, tf.Variable]], global_step: tf.Variable | None = None, name: str | None = None) -> tf.Operation:
        if self.deferred is not None and not self.deferred.building:  # parts: ec_model_fn builds one step of all
            return self.deferred.record(grads_and_vars, self.rule, global_step)
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if not pairs:
            raise ConfigError("ECOptimizer got no gradients; source: apply_gradients")
        colls = list(self._bound.collections) if self._bound else collections()
        ec = self.ec or (context.ec if (context := current_context()) else None) or (colls[0].ec if colls else None)
        if ec is None:
            raise ConfigError(
                "ECOptimizer needs the erasure code: use it in a model_fn wrapped with tf_ecrec.ec_model_fn "
                "or pass ec=; source: ECOptimizer"
            )
        self.ec = ec
        self._collections = {c.name: c for c in colls}
        self.logs = {}  # handles are per graph: a TF2 step is traced into a new graph each time
        if self._bound is None and self._graph is not (graph := tf.compat.v1.get_default_graph()):
            self._new_graph(graph)  # an Estimator's next graph (another train call, a failover's rebuild)
        owner = {variable_name(v): (c, p) for c in colls for p, v in c.data.items()}
        step = global_step
        step_value = read_step(global_step) if global_step is not None else tf.constant(0, tf.int64)
        step_context = current_context()
        # The graph's StepGeneration (read at each step: it follows the session); a bound (TF2) step's is fixed.
        generation: int | StepGeneration = step_context.steps if step_context is not None else 0
        if self._bound is not None:
            generation = self._bound.generation
        armed = failpoints.FailpointPlan.from_environ()  # the one read of the environment per step program
        with tf.name_scope(name or self._name):
            # A feedable step id: tests drive a step one op at a time with their own ids.
            self.sid = tf.compat.v1.placeholder_with_default(new_step_id(generation, in_graph=self._bound is not None), [], name="sid")
            # Phase 1: every variable's update, each with its bitwise delta.
            applied = []
            for grad, var in pairs:
                if variable_name(var) in owner:
                    coll, p = owner[variable_name(var)]
                    applied.append(self._apply_protected(coll, p, var, grad, step))
                else:
                    applied.append(self._apply_replicated(var, grad, step))
            after_apply = failpoints.after_apply(armed, [(a.device, a.delta) for a in applied], step_value)
            data_ps = sorted({ps_index(a.device) for a in applied})
            self.carried_commit = None
            # Batched: a count after the applies, folds in rounds (tf_ecrec.step.batched_commit); without a global step it commits in its run.
            if self._mode(step_context) == "batched" and global_step is not None:
                train_op, counts, counted = batched_step(self, applied, after_apply, global_step, armed, step_value, generation)
                fold_ops: dict[int, list[tf.Operation]] = {a.tid: [] for a in applied}
                folds = [tf.group(a.delta) for a in applied]
                round1: dict[int, Gated] = {}
                round2: dict[int, Gated] = {}
            else:
                # Phase 2: fold the deltas into parity and replicas.
                with tf.control_dependencies(after_apply):
                    fold_ops = {a.tid: a.fold() for a in applied}
                folds = [tf.group(*ops) if ops else tf.group(a.delta) for a, ops in zip(applied, fold_ops.values())]
                # The ops themselves (not groups on the worker) so that what waits for them does so PS to PS.
                after_fold = failpoints.after_fold(
                    armed, [op for a, ops in zip(applied, fold_ops.values()) for op in (ops or [a.delta.op])], step_value
                )
                # Each later op reads a "gate": a tensor on its own PS that carries the op's predecessors
                # as control dependencies (PS to PS); feeding a gate runs its op alone (the harness does).
                # Phase 3: count the step, after its folds (beside them, a data PS lost in its folds left
                # the counted step kept on the survivors and rolled back on the lost PS: settlement.md, Costs).
                counts = {}
                if global_step is not None:
                    hub = global_step.device  # the folds' barrier: one edge per fold, one per count copy
                    counts = self.increment(global_step, barrier(after_fold, self.ec.r + 1, hub, "folded"))
                counted = failpoints.after_count(
                    armed, [g.op for g in counts.values()] or after_fold, sorted({a.device for a in applied}), step_value
                )
                # Phase 4: commit, round 1 on the data PS (in the order of their applies), then round 2
                # everywhere (tf_ecrec.step.steplog): in this run, or carried by the next (tf_ecrec.step.carried_commit).
                if self._mode(step_context) == "carried":
                    carried = tf.compat.v1.placeholder(tf.int64, [], name="carried_sid")
                    round1, round2 = commit_rounds(carried, self.logs, data_ps, [], self.commit_timeout_ms)
                    train_op = tf.group(*counted, name="ec_step")
                    tail = tf.group(*[g.op for g in round2.values()], name="ec_carried_commit")
                    self.carried_commit = CarriedCommit(self.sid, carried, tail).register()
                else:
                    round1, round2 = commit_rounds(self.sid, self.logs, data_ps, counted, self.commit_timeout_ms)
                    train_op = tf.group(*[g.op for g in round2.values()], name="ec_commit")
        # The ops ending each phase, for tests that cut a step between phases.
        self.phases = {"apply": tf.group(*[a.delta for a in applied]), "fold": tf.group(*folds), "count": tf.group(*counted)}
        self.program = StepProgram(sid=self.sid, applies={a.tid: Apply(a.indices, a.delta, a.seq) for a in applied},
                                   folds=fold_ops, counts=counts, round1=round1, round2=round2)
        _PROTECTORS.add(self)
        return train_op

    def _new_graph(self, graph: tf.Graph) -> None:
        """Slots, parity, replicas and log targets are variables of one graph: made anew in the next."""
        rules, self.variables = self.variables.rules, ProtectionVariables(self.rule)
        self.variables.rules.update(rules)
        self.parity, self.replicas, self.protected = self.variables.parity, self.variables.replicas, self.variables.protected
        self.targets, self._tid, self.fold_plan, self._graph = {}, {}, {}, graph

    def _mode(self, step_context: Any) -> str:
        """How this step commits: "in_step", "carried" or "batched" (a TF2 step, bound, commits in its run)."""
        mode = "in_step" if self._bound is not None else (self._commit_mode or commit_mode_from_environ())
        return mode or (step_context.commit if step_context is not None else "in_step")

    def log_of(self, ps: int) -> tf.Tensor:
        if ps not in self.logs:
            with on_ps(ps):
                self.logs[ps] = ec_ops.delta_log(name=f"ec_delta_log_ps{ps}")
        return self.logs[ps]

    def target_id(self, name: str, ps: int, variables: list[tf.Variable], kind: TargetKind, source: int = -1) -> int:
        if name not in self._tid:
            tid = len(self._tid)
            self._tid[name] = tid
            ordered = kind in (TargetKind.DATA, TargetKind.COUNTER)
            self.targets[tid] = Target(tid, ps, variables, kind, source, ordered)
        return self._tid[name]

    def _logged(self, ps: int, tid: int, **more: Any) -> dict[str, Any]:
        return {"log": self.log_of(ps), "sid": self.sid, "target": tid, **more}

    def expected_folds(self, tid: int, rows: np.ndarray, delta: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray, int]]:
        """The folds a data update of target `tid` on `rows` causes: (target, rows, delta, coef) each."""
        return planned_folds(self.fold_plan[tid], lambda coll, ps: self._tid[variable_name(self.parity[coll][ps])], rows, delta)

    def _num_ps(self, var: tf.Variable) -> int:
        return self._bound.num_ps if self._bound is not None else _num_ps(var)

    # ---- protected embedding variables ------------------------------------------------------------------

    def _apply_protected(self, coll: EmbeddingCollection, p: int, var: tf.Variable, grad: Any, step: tf.Variable | None) -> AppliedUpdate:
        slots = self.variables.slots_for(var)
        parity = self.variables.parity_for(coll)
        tid = self.target_id(variable_name(var), p, [var, *slots], TargetKind.DATA)
        self.fold_plan[tid] = ParityFolds(coll, p)
        indices, values = dedup(grad, var)
        with tf.device(var.device):
            delta = self.variables.rule_of(var).apply(var, slots, values, indices, step, self._logged(p, tid))
            with tf.control_dependencies([delta]):
                seq = ec_ops.delta_log_seq_of(self.log_of(p), self.sid, tid)

        def fold() -> list[tf.Operation]:
            updates = []
            routes = coll.table_layout.fold_routes(p, coll.code)
            with tf.device(var.device):  # one op splits the delta by route, on the data's PS
                split = ec_ops.route_deltas(
                    indices, delta, np.stack([route.parity_base for route in routes]), coll.chunk_rows
                )
            for route, (prow, sel_delta) in zip(routes, split):
                target = parity[route.ps]
                ptid = self.target_id(variable_name(target), route.ps, [target], TargetKind.PARITY)
                with tf.device(ps_device(route.ps)):
                    updates.append(
                        ec_ops.parity_update(
                            target, prow, sel_delta, coef=route.coef,
                            **self._logged(route.ps, ptid, source=tid, source_seq=seq),
                        )
                    )
            return updates

        return AppliedUpdate(delta, var.device, fold, tid, seq, indices)

    # ---- replicated dense variables ------------------------------------------------------------------

    def _apply_replicated(self, var: tf.Variable, grad: Any, step: tf.Variable | None) -> AppliedUpdate:
        if var.shape.rank == 0:
            raise ConfigError(f"ECOptimizer cannot protect the scalar variable {variable_name(var)}; source: the model")
        slots = self.variables.slots_for(var)
        assert self.ec is not None  # apply_gradients set it
        replicas = self.replicas.get(variable_name(var)) or self.variables.replicas_for(var, slots, self.ec.r, self._num_ps(var))
        primary = ps_index(var.device)
        tid = self.target_id(variable_name(var), primary, [var, *slots], TargetKind.DATA)
        rep_tids = [self.target_id(variable_name(r), ps_index(r.device), [r], TargetKind.REPLICA, tid) for r in replicas]
        self.fold_plan[tid] = ReplicaFolds(tuple(rep_tids))
        indices, values = dedup(grad, var)
        dense = not isinstance(grad, tf.IndexedSlices)
        with tf.device(var.device):
            delta = self.variables.rule_of(var).apply(var, slots, values, indices, step, self._logged(primary, tid))
            with tf.control_dependencies([delta]):
                seq = ec_ops.delta_log_seq_of(self.log_of(primary), self.sid, tid)

        def fold() -> list[tf.Operation]:
            updates = []
            for replica, rep_tid in zip(replicas, rep_tids):
                q = ps_index(replica.device)
                rows = all_rows(var, replica.device) if dense else indices
                with tf.device(replica.device):
                    updates.append(
                        ec_ops.parity_update(
                            replica, rows, delta, coef=1, **self._logged(q, rep_tid, source=tid, source_seq=seq)
                        )
                    )
            return updates

        return AppliedUpdate(delta, var.device, fold, tid, seq, indices)

    # ---- the global step ------------------------------------------------------------------

    def increment(self, global_step: tf.Variable, after: list[Any]) -> dict[int, Gated]:
        name = variable_name(global_step)
        assert self.ec is not None  # apply_gradients set it
        if name not in self.replicas:
            self.variables.step_replicas(global_step, self.ec.r, self._num_ps(global_step))
        replicas = self.replicas[name]
        ops = {}
        one = tf.constant(1, global_step.dtype.base_dtype)
        gs_tid = self.target_id(name, ps_index(global_step.device), [global_step], TargetKind.COUNTER)
        for copy in [global_step, *replicas]:
            q = ps_index(copy.device)
            tid = self.target_id(variable_name(copy), q, [copy], TargetKind.COUNTER, -1 if copy is global_step else gs_tid)
            gate = gate_after(one, copy.device, after)  # `after`: one barrier op (apply_gradients)
            with tf.device(copy.device):
                ops[tid] = Gated(gate, ec_ops.assign_add_logged(copy, gate, **self._logged(q, tid)))
        return ops


def _num_ps(var: tf.Variable) -> int:
    ctx = current_context()
    if ctx is not None:
        return ctx.num_ps
    colls = collections()
    if colls:
        return colls[0].num_ps
    raise ConfigError(f"cannot tell the PS count to replicate {variable_name(var)}; use tf_ecrec.ec_model_fn; source: ECOptimizer")
