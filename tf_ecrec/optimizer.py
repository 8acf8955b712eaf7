"""`ECOptimizer`: applies every update through the delta ops and keeps parity and replicas in step.

Wrap the v1 optimizer a model_fn already uses::

    optimizer = tf_ecrec.ECOptimizer(tf.compat.v1.train.AdagradOptimizer(0.05))
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())

Supported: GradientDescent, Adagrad, Adam (applied lazily: only the touched
rows' moments change, as in LazyAdam) and Ftrl, with their hyperparameters
read from the wrapped optimizer.

For each step, `apply_gradients` builds:

- for the data variable of an `EmbeddingCollection` on PS ``p``: one
  ``SparseApply*WithDelta`` op on ``p`` (rows deduplicated by summing their
  gradients, as TensorFlow's optimizers do), whose output, the bitwise
  ``old ^ new`` of every touched row of the variable and its slots, is routed
  to the parity chunks of the rows' stripes: for parity ``j`` and PS ``q``
  one ``ParityUpdate`` op on ``q`` folds ``coef(j, i) * delta`` into the
  parity rows (XOR for r = 1).  XOR and GF(2^16) multiplication commute, so
  concurrent workers may fold their deltas in any order: whenever no step is
  in flight, parity equals the code of data and slots, bit for bit;
- for every other trainable variable (dense, replicated): the same delta op
  over all rows, whose delta is XORed into each of its ``r`` replicas on the
  next PS tasks (a replica is the k = 1 code of the variable and its slots:
  its bits equal theirs at quiescence, whatever the order of the updates);
- the global step increment, applied to the global step and its ``r``
  replicas (integer additions commute too).

Parity, slots and replicas are variables created here, on first use, with
initial values computed from the initial-value tensors of the variables they
protect.  The graph's initializer runs every initializer in one
``session.run``, where each initial-value tensor is computed once and feeds
both the variable and its parity: the ordinary initializer leaves them
consistent (running a parity initializer on its own would not; recovery
re-encodes parity from the live data instead).  `tf_ecrec.recovery`'s fresh
start does not use them: it initialises the protected variables in bounded
batches and encodes parity and replicas from them PS to PS in slices, so a
PS never holds its whole share of initial values at once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_ecrec import codec, failpoints, gf16, placement, steplog, unfolded
from tf_ecrec import ops as ec_ops
from tf_ecrec.ec_config import ECConfig
from tf_ecrec.device import on_ps, ps_device
from tf_ecrec.embedding import EmbeddingCollection, collections, current_context, device_task
from tf_ecrec.errors import ConfigError

_LOG = logging.getLogger(__name__)

# Graph collection holding the ECOptimizer that protects the graph's variables.
EC_PROTECTION = "tf_ecrec_protection"


@dataclasses.dataclass(frozen=True)
class UpdateRule:
    """An optimizer's update as the delta ops apply it.

    Attributes:
      kind: "sgd", "adagrad", "adam" or "ftrl".
      learning_rate: the base learning rate.
      slots: (slot name, initial value) of each optimizer slot, in op order.
      hyper: the other hyperparameters.
    """

    kind: str
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
            return cls("sgd", float(optimizer._learning_rate), (), {})
        if type(optimizer) is t.AdagradOptimizer:
            init = float(optimizer._initial_accumulator_value)
            return cls("adagrad", float(optimizer._learning_rate), (("Adagrad", init),), {})
        if type(optimizer) is t.AdamOptimizer:
            hyper = {"beta1": float(optimizer._beta1), "beta2": float(optimizer._beta2), "epsilon": float(optimizer._epsilon)}
            return cls("adam", float(optimizer._lr), (("Adam", 0.0), ("Adam_1", 0.0)), hyper)
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
            return cls("ftrl", lr, (("Ftrl", init), ("Ftrl_1", 0.0)), hyper)
        raise ConfigError(
            f"ECOptimizer cannot apply {type(optimizer).__name__} with parity deltas; supported: "
            "GradientDescentOptimizer, AdagradOptimizer, AdamOptimizer (applied lazily), FtrlOptimizer "
            "from tf.compat.v1.train; source: the model_fn's optimizer"
        )


class ECOptimizer(tf.compat.v1.train.Optimizer):
    """Wraps a v1 optimizer so that every update keeps parity and replicas exact.

    Args:
      optimizer: a stock tf.compat.v1.train optimizer (see `UpdateRule.of`).
      ec: the code for dense replicas and the global step (r replicas); default:
        the code of `tf_ecrec.ec_model_fn`, else that of the graph's
        embedding collections.
      name: name prefix of the ops.
      commit_timeout_ms: how long a step's round-1 commit waits behind an
        earlier step's uncommitted update of the same variable (a dead
        task's step, until the chief settles it) before the step fails with
        ``AbortedError``; 0 fails at once.
    """

    def __init__(
        self,
        optimizer: tf.compat.v1.train.Optimizer,
        ec: ECConfig | None = None,
        name: str = "ECOptimizer",
        commit_timeout_ms: int = steplog.ROUND1_TIMEOUT_MS,
    ) -> None:
        super().__init__(use_locking=True, name=name)
        self.commit_timeout_ms = int(commit_timeout_ms)
        self._base = optimizer
        self.rule = UpdateRule.of(optimizer)
        self._ec = ec
        self._slot_vars: dict[str, list[tf.Variable]] = {}
        self.parity: dict[str, dict[int, tf.Variable]] = {}  # collection -> PS -> parity variable
        self._route_cache: dict[tuple[str, int], list[_Route]] = {}  # (collection, data PS) -> where its deltas fold
        self.replicas: dict[str, list[tf.Variable]] = {}  # variable name -> replicas
        self.protected: dict[str, tf.Variable] = {}  # variable name -> variable (dense + global step)
        self.targets: dict[int, steplog.Target] = {}  # logged variable groups by id (tf_ecrec.steplog)
        self._tid: dict[str, int] = {}
        self.logs: dict[int, tf.Tensor] = {}  # PS task -> delta log handle
        self._sid: tf.Tensor | None = None
        self._fold_plan: dict[int, Any] = {}  # data target id -> how its deltas fold
        self._collections: dict[str, EmbeddingCollection] = {}

    # ---- the Optimizer interface ---------------------------------------------------------------------------

    def redundancy_names(self) -> set[str]:
        """Names of the variables derived from others: every parity and every replica."""
        names = {v.op.name for parity in self.parity.values() for v in parity.values()}
        return names | {r.op.name for reps in self.replicas.values() for r in reps}

    def describe(self) -> dict[str, Any]:
        """What protects what, by variable name (JSON-able; for verification and recovery)."""
        colls = self._collections
        out: dict[str, Any] = {
            "code": [self._ec.k, self._ec.r] if self._ec else None,
            "optimizer": self.rule.kind,
            "slots": [n for n, _ in self.rule.slots],
            "collections": [],
            "replicas": {name: [r.op.name for r in reps] for name, reps in self.replicas.items()},
            "replica_slots": {
                name: [s.op.name for s in self._slot_vars.get(name, [])] for name in self.replicas
            },
        }
        for name, parity in self.parity.items():
            coll = colls[name]
            out["collections"].append(
                {
                    "name": name,
                    "dim": coll.dim,
                    "layout": coll.layout.to_json(),
                    "data": {str(p): v.op.name for p, v in coll.data.items()},
                    "slots": {str(p): [s.op.name for s in self._slot_vars[v.op.name]] for p, v in coll.data.items()},
                    "parity": {str(q): v.op.name for q, v in parity.items()},
                }
            )
        return out

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, tf.Variable]]:
        return self._base.compute_gradients(*args, **kwargs)

    def get_slot_names(self) -> list[str]:
        return [name for name, _ in self.rule.slots]

    def apply_gradients(self, grads_and_vars: Sequence[tuple[Any, tf.Variable]], global_step: tf.Variable | None = None, name: str | None = None) -> tf.Operation:
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if not pairs:
            raise ConfigError("ECOptimizer got no gradients; source: apply_gradients")
        colls = collections()
        ec = self._ec or (current_context().ec if current_context() else None) or (colls[0].ec if colls else None)
        if ec is None:
            raise ConfigError(
                "ECOptimizer needs the erasure code: use it in a model_fn wrapped with tf_ecrec.ec_model_fn "
                "or pass ec=; source: ECOptimizer"
            )
        self._ec = ec
        self._collections = {c.name: c for c in colls}
        owner = {v.op.name: (c, p) for c in colls for p, v in c.data.items()}
        step = global_step
        step_value = _read(global_step) if global_step is not None else tf.constant(0, tf.int64)
        generation = current_context().generation if current_context() is not None else 0
        with tf.name_scope(name or self._name):
            # A feedable step id: tests drive a step one op at a time with their own ids.
            self._sid = tf.compat.v1.placeholder_with_default(steplog.new_step_id(generation), [], name="sid")
            # Phase 1: every variable's update, each with its bitwise delta.
            applied = []
            for grad, var in pairs:
                if var.op.name in owner:
                    coll, p = owner[var.op.name]
                    applied.append(self._apply_protected(coll, p, var, grad, step))
                else:
                    applied.append(self._apply_replicated(var, grad, step))
            after_apply = self._failpoints_after_apply(applied, step_value)
            # Phase 2: fold the deltas into parity and replicas.
            with tf.control_dependencies(after_apply):
                fold_ops = {a.tid: a.fold() for a in applied}
            folds = [tf.group(*ops) if ops else tf.group(a.delta) for a, ops in zip(applied, fold_ops.values())]
            # The ops themselves (not groups on the worker) so that what waits for them does so PS to PS.
            after_fold = self._failpoints_after_fold(
                [op for a, ops in zip(applied, fold_ops.values()) for op in (ops or [a.delta.op])], step_value
            )
            # Each later op reads a "gate": a tensor on its own PS that carries the
            # op's predecessors as control dependencies (PS to PS, no hop through
            # the worker). Feeding a gate runs its op alone (the fault-schedule
            # harness drives steps that way).
            # Phase 3: count the step, after its folds.  Counting beside the folds was tried and
            # reverted: a counted step is finished, so a data PS lost in its folds left the step kept
            # on the survivors and rolled back on the lost PS (docs/settlement.md, Costs).
            counts: dict[int, tuple[tf.Tensor, tf.Operation]] = {}
            if global_step is not None:
                counts = self._increment(global_step, after_fold)
            counted = self._failpoints_after_count(
                [op for _, op in counts.values()] or after_fold, sorted({a.device for a in applied}), step_value
            )
            # Phase 4: commit, round 1 on the PS tasks that applied (in the order of
            # their applies), then round 2 everywhere (tf_ecrec.steplog).
            round1 = {}
            for p in sorted({device_task(a.device) for a in applied}):
                gate = _gate(self._sid, self.logs[p].device, counted)
                round1[p] = (gate, ec_ops.delta_log_commit_in_order(self.logs[p], gate, timeout_ms=self.commit_timeout_ms))
            round2 = {}
            for p, log in sorted(self.logs.items()):
                gate = _gate(self._sid, log.device, [op for _, op in round1.values()])
                round2[p] = (gate, ec_ops.delta_log_commit(log, gate))
            train_op = tf.group(*[op for _, op in round2.values()], name="ec_commit")
        # The ops ending each phase, for tests that cut a step between phases.
        self.phases = {
            "apply": tf.group(*[a.delta for a in applied]),
            "fold": tf.group(*folds),
            "count": tf.group(*counted),
        }
        self.program = StepProgram(
            sid=self._sid,
            applies={a.tid: (a.indices, a.delta, a.seq) for a in applied},
            folds=fold_ops,
            counts=counts,
            round1=round1,
            round2=round2,
        )
        tf.compat.v1.add_to_collection(EC_PROTECTION, self)
        return train_op

    def _log(self, ps: int) -> tf.Tensor:
        if ps not in self.logs:
            with on_ps(ps):
                self.logs[ps] = ec_ops.delta_log(name=f"ec_delta_log_ps{ps}")
        return self.logs[ps]

    def _target(self, name: str, ps: int, variables: list[tf.Variable], kind: str, source: int = -1) -> int:
        if name not in self._tid:
            tid = len(self._tid)
            self._tid[name] = tid
            ordered = kind in ("data", "counter")
            self.targets[tid] = steplog.Target(tid, ps, variables, kind, source, ordered)
        return self._tid[name]

    def _logged(self, ps: int, tid: int, **more: Any) -> dict[str, Any]:
        return {"log": self._log(ps), "sid": self._sid, "target": tid, **more}

    def expected_folds(self, tid: int, rows: np.ndarray, delta: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray, int]]:
        """The folds a data update of target `tid` on `rows` causes: (target, rows, delta, coef) each."""
        plan = self._fold_plan[tid]
        out = []
        if plan[0] == "replicas":
            for rep_tid in plan[1]:
                out.append((rep_tid, rows, delta, 1))
            return out
        _, coll, p = plan
        c = coll.chunk_rows
        lc = rows // c
        for route in self._routes_of(coll, p):
            sel = np.isin(lc, route.local_chunks)
            if sel.any():
                prow = route.parity_base[lc[sel]] + rows[sel] % c
                parity = self.parity[coll.name][route.ps]
                out.append((self._tid[parity.op.name], prow, delta[sel], route.coef))
        return out

    def _failpoints_after_apply(self, applied: list[_Applied], step: tf.Tensor) -> list[Any]:
        # Without an armed failpoint there is no phase barrier: each fold waits for
        # its own delta only, and the step runs as concurrently as TF schedules it.
        if failpoints.armed() is None:
            return []
        deps: list[Any] = [a.delta for a in applied]
        for device in sorted({a.device for a in applied}):
            fp = failpoints.failpoint("ps_after_apply", device, step, [a.delta for a in applied if a.device == device])
            if fp is not None:
                deps.append(fp)
        fp = failpoints.failpoint("worker_after_apply", "", step, [a.delta.op for a in applied])
        if fp is not None:
            deps.append(fp)
        return deps

    def _failpoints_after_fold(self, folds: list[Any], step: tf.Tensor) -> list[Any]:
        deps = list(folds)
        if failpoints.armed() is None:
            return deps
        by_device: dict[str, list[Any]] = {}
        for f in folds:
            for op in (f.control_inputs if isinstance(f, tf.Operation) and f.type == "NoOp" else [f]):
                by_device.setdefault(op.device, []).append(op)
        for device, ops in sorted(by_device.items()):
            if "/job:ps" in device:
                fp = failpoints.failpoint("parity_ps_after_fold", device, step, ops)
                if fp is not None:
                    deps.append(fp)
        fp = failpoints.failpoint("worker_before_commit", "", step, folds)
        if fp is not None:
            deps.append(fp)
        return deps

    def _failpoints_after_count(self, counted: list[Any], devices: list[str], step: tf.Tensor) -> list[Any]:
        deps = list(counted)
        if failpoints.armed() is None:
            return deps
        for device in devices:
            if "/job:ps" in device:
                fp = failpoints.failpoint("ps_after_count", device, step, counted)
                if fp is not None:
                    deps.append(fp)
        return deps

    # ---- protected embedding variables ------------------------------------------------------------------

    def _slots_for(self, var: tf.Variable) -> list[tf.Variable]:
        if var.op.name not in self._slot_vars:
            slots = []
            with on_ps(device_task(var.device)):
                for slot_name, initial in self.rule.slots:
                    slots.append(
                        tf.compat.v1.Variable(
                            unfolded.filled(var.shape.as_list(), initial, tf.float32),
                            name=f"{var.op.name}/{slot_name}",
                            trainable=False,
                            use_resource=True,
                            dtype=tf.float32,
                            shape=var.shape,
                        )
                    )
            self._slot_vars[var.op.name] = slots
        return self._slot_vars[var.op.name]

    def slots_of(self, var: tf.Variable) -> list[tf.Variable]:
        """The optimizer slots of a variable this optimizer updated."""
        return self._slot_vars.get(var.op.name, [])

    def _routes_of(self, coll: EmbeddingCollection, p: int) -> list[_Route]:
        key = (coll.name, p)
        if key not in self._route_cache:
            self._route_cache[key] = _routes(coll, codec.Code(coll.ec.k, coll.ec.r), p)
        return self._route_cache[key]

    def _parity_for(self, coll: EmbeddingCollection) -> dict[int, tf.Variable]:
        if coll.name in self.parity:
            return self.parity[coll.name]
        code = codec.Code(coll.ec.k, coll.ec.r)
        c = coll.chunk_rows
        bits = {}
        for p, var in coll.data.items():
            with tf.compat.v1.device(var.device):  # on the data's PS, not the chief (see embedding._masked)
                values = [var.initial_value] + [s.initial_value for s in self._slots_for(var)]
                bits[p] = tf.bitcast(tf.concat(values, axis=1), tf.int32)
        width = (1 + len(self.rule.slots)) * coll.dim
        parity: dict[int, tf.Variable] = {}
        for q, chunks in coll.parity_chunks_on.items():
            if not chunks:
                continue
            with on_ps(q):
                parts = []
                for pc in chunks:
                    stripe = coll.table_layout.stripes[pc.stripe]
                    acc = None
                    for dc in stripe.data:
                        lo, hi = coll.table_layout.local_rows(dc)
                        rows = bits[dc.ps][lo:hi]
                        term = _gf_mul_words(code.coef(pc.position, dc.position), rows)
                        acc = term if acc is None else tf.bitwise.bitwise_xor(acc, term)
                    parts.append(acc)
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

    def _apply_protected(self, coll: EmbeddingCollection, p: int, var: tf.Variable, grad: Any, step: tf.Variable | None) -> _Applied:
        slots = self._slots_for(var)
        parity = self._parity_for(coll)
        tid = self._target(var.op.name, p, [var, *slots], "data")
        self._fold_plan[tid] = ("parity", coll, p)
        indices, values = _dedup(grad, var)
        with tf.device(var.device):
            delta = self._apply_op(var, slots, values, indices, step, self._logged(p, tid))
            with tf.control_dependencies([delta]):
                seq = ec_ops.delta_log_seq_of(self._log(p), self._sid, tid)

        def fold() -> list[tf.Operation]:
            updates = []
            routes = self._routes_of(coll, p)
            with tf.device(var.device):  # one op splits the delta by route, on the data's PS
                split = ec_ops.route_deltas(
                    indices, delta, np.stack([route.parity_base for route in routes]), coll.chunk_rows
                )
            for route, (prow, sel_delta) in zip(routes, split):
                target = parity[route.ps]
                ptid = self._target(target.op.name, route.ps, [target], "parity")
                with tf.device(ps_device(route.ps)):
                    updates.append(
                        ec_ops.parity_update(
                            target, prow, sel_delta, coef=route.coef,
                            **self._logged(route.ps, ptid, source=tid, source_seq=seq),
                        )
                    )
            return updates

        return _Applied(delta, var.device, fold, tid, seq, indices)

    # ---- replicated dense variables ------------------------------------------------------------------

    def _apply_replicated(self, var: tf.Variable, grad: Any, step: tf.Variable | None) -> _Applied:
        if var.shape.rank == 0:
            raise ConfigError(f"ECOptimizer cannot protect the scalar variable {var.op.name}; source: the model")
        slots = self._slots_for(var)
        replicas = self._replicas_for(var, slots)
        primary = device_task(var.device)
        tid = self._target(var.op.name, primary, [var, *slots], "data")
        rep_tids = [self._target(r.op.name, device_task(r.device), [r], "replica", tid) for r in replicas]
        self._fold_plan[tid] = ("replicas", rep_tids)
        indices, values = _dedup(grad, var)
        with tf.device(var.device):
            delta = self._apply_op(var, slots, values, indices, step, self._logged(primary, tid))
            with tf.control_dependencies([delta]):
                seq = ec_ops.delta_log_seq_of(self._log(primary), self._sid, tid)

        def fold() -> list[tf.Operation]:
            updates = []
            for replica, rep_tid in zip(replicas, rep_tids):
                q = device_task(replica.device)
                with tf.device(replica.device):
                    updates.append(
                        ec_ops.parity_update(
                            replica, indices, delta, coef=1, **self._logged(q, rep_tid, source=tid, source_seq=seq)
                        )
                    )
            return updates

        return _Applied(delta, var.device, fold, tid, seq, indices)

    def _replicas_for(self, var: tf.Variable, slots: list[tf.Variable]) -> list[tf.Variable]:
        if var.op.name in self.replicas:
            return self.replicas[var.op.name]
        num_ps = _num_ps(var)
        primary = device_task(var.device)
        rows = int(var.shape[0])
        with tf.compat.v1.device(var.device):
            values = [tf.reshape(v.initial_value, [rows, -1]) for v in [var, *slots]]
            bits = tf.bitcast(tf.concat(values, axis=1), tf.int32)
        replicas = []
        for j in range(self._ec.r):
            q = (primary + 1 + j) % num_ps
            with on_ps(q):
                replicas.append(
                    tf.compat.v1.Variable(
                        bits,
                        name=f"{var.op.name}/ec_replica_{j}",
                        trainable=False,
                        use_resource=True,
                        dtype=tf.int32,
                    )
                )
        self.replicas[var.op.name] = replicas
        self.protected[var.op.name] = var
        return replicas

    # ---- the global step ------------------------------------------------------------------

    def _increment(self, global_step: tf.Variable, after: list[Any]) -> dict[int, tuple[tf.Tensor, tf.Operation]]:
        name = global_step.op.name
        if name not in self.replicas:
            num_ps = _num_ps(global_step)
            primary = device_task(global_step.device)
            replicas = []
            for j in range(self._ec.r):
                with on_ps((primary + 1 + j) % num_ps):
                    replicas.append(
                        tf.compat.v1.Variable(
                            global_step.initial_value,
                            name=f"{name}/ec_replica_{j}",
                            trainable=False,
                            use_resource=True,
                            dtype=global_step.dtype.base_dtype,
                        )
                    )
            self.replicas[name] = replicas
            self.protected[name] = global_step
        ops = {}
        one = tf.constant(1, global_step.dtype.base_dtype)
        gs_tid = self._target(name, device_task(global_step.device), [global_step], "counter")
        for copy in [global_step, *self.replicas[name]]:
            q = device_task(copy.device)
            tid = self._target(copy.op.name, q, [copy], "counter", -1 if copy is global_step else gs_tid)
            gate = _gate(one, copy.device, after)
            with tf.device(copy.device):
                ops[tid] = (gate, ec_ops.assign_add_logged(copy, gate, **self._logged(q, tid)))
        return ops

    # ---- the delta op of the rule ------------------------------------------------------------------

    def _apply_op(self, var: tf.Variable, slots: list[tf.Variable], values: tf.Tensor, indices: tf.Tensor, step: tf.Variable | None, logged: dict[str, Any]) -> tf.Tensor:
        rule = self.rule
        lr = tf.constant(rule.learning_rate, tf.float32)
        if rule.kind == "sgd":
            return ec_ops.sparse_apply_sgd_with_delta(var, values, indices, lr, **logged)
        if rule.kind == "adagrad":
            return ec_ops.sparse_apply_adagrad_with_delta(var, slots[0], values, indices, lr, **logged)
        if rule.kind == "adam":
            if step is None:
                raise ConfigError("ECOptimizer applies Adam with the global step: pass global_step to minimize(); source: model_fn")
            t = tf.cast(step.read_value() + 1, tf.float32) if hasattr(step, "read_value") else tf.cast(step + 1, tf.float32)
            b1, b2 = rule.hyper["beta1"], rule.hyper["beta2"]
            lr_t = ec_ops.lazy_adam_learning_rate(lr, tf.pow(b1, t), tf.pow(b2, t))
            return ec_ops.sparse_apply_adam_with_delta(
                var, slots[0], slots[1], values, indices, lr_t, beta1=b1, beta2=b2, epsilon=rule.hyper["epsilon"], **logged
            )
        h = rule.hyper
        return ec_ops.sparse_apply_ftrl_with_delta(
            var, slots[0], slots[1], values, indices, lr, l1=h["l1"], l2=h["l2"], lr_power=h["lr_power"],
            l2_shrinkage=h["l2_shrinkage"] if h["l2_shrinkage"] > 0 else None, **logged,
        )


@dataclasses.dataclass(frozen=True)
class _Applied:
    """One variable's update of a step: its delta, where it was applied, how to fold it."""

    delta: tf.Tensor
    device: str
    fold: Callable[[], list[tf.Operation]]
    tid: int
    seq: tf.Tensor
    indices: tf.Tensor


@dataclasses.dataclass(frozen=True)
class StepProgram:
    """A protected step's ops, phase by phase, each runnable alone by feeding its inputs.

    Attributes:
      sid: the step id (a placeholder with a fresh random default).
      applies: data target id -> (row indices, delta, seq) of its apply.
      folds: data target id -> its fold ops (inputs: that apply's indices,
        delta and seq, fed to run a fold alone).
      counts: counter target id -> (gate, increment op): the gate is the 1 it
        adds; feed it to run the increment alone. Empty without a global step.
      round1, round2: PS task -> (gate, that round's commit op): the gate is
        the sid as the op reads it; feed it to run the op alone.
    """

    sid: tf.Tensor
    applies: dict[int, tuple[tf.Tensor, tf.Tensor, tf.Tensor]]
    folds: dict[int, list[tf.Operation]]
    counts: dict[int, tuple[tf.Tensor, tf.Operation]]
    round1: dict[int, tuple[tf.Tensor, tf.Operation]]
    round2: dict[int, tuple[tf.Tensor, tf.Operation]]


def _gate(value: tf.Tensor, device: str, after: list[Any]) -> tf.Tensor:
    """`value` on `device` once `after` ran: what an op of a later phase reads (see apply_gradients)."""
    with tf.device(device), tf.control_dependencies(after):
        return tf.identity(value, name="gate")


def _read(variable: Any) -> tf.Tensor:
    return tf.cast(variable.read_value() if hasattr(variable, "read_value") else variable, tf.int64)


@dataclasses.dataclass(frozen=True)
class _Route:
    """Where the deltas of some local chunks of a data variable go: one parity of one PS."""

    ps: int
    coef: int
    local_chunks: np.ndarray  # local chunk indices routed here
    parity_base: np.ndarray  # per local chunk of the PS: first parity row of its stripe's parity on `ps` (-1: elsewhere)


def _routes(coll: EmbeddingCollection, code: codec.Code, p: int) -> list[_Route]:
    """The data of PS `p` grouped by where it folds (the layout says where; the code with what coefficient)."""
    layout = coll.table_layout
    groups: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    for lc, dc, pc in layout.folds_from(p):
        key = (pc.position, pc.ps, code.coef(pc.position, dc.position))
        groups.setdefault(key, []).append((lc, layout.local_rows(pc)[0]))
    routes = []
    for (_, q, coef), members in sorted(groups.items()):
        base = np.full(len(layout.chunks_on(p, placement.DATA)), -1, dtype=np.int64)
        for lc, first in members:
            base[lc] = first
        routes.append(_Route(q, coef, np.array([lc for lc, _ in members], dtype=np.int64), base))
    return routes


def _dedup(grad: Any, var: tf.Variable) -> tuple[tf.Tensor, tf.Tensor]:
    """(unique row indices, summed gradient rows), as TensorFlow's optimizers deduplicate."""
    if isinstance(grad, tf.IndexedSlices):
        unique, positions = tf.unique(tf.cast(grad.indices, tf.int64))
        summed = tf.math.unsorted_segment_sum(grad.values, positions, tf.shape(unique)[0])
        return unique, summed
    rows = int(var.shape[0])
    return tf.range(rows, dtype=tf.int64), tf.convert_to_tensor(grad)


def _num_ps(var: tf.Variable) -> int:
    ctx = current_context()
    if ctx is not None:
        return ctx.num_ps
    colls = collections()
    if colls:
        return colls[0].num_ps
    raise ConfigError(f"cannot tell the PS count to replicate {var.op.name}; use tf_ecrec.ec_model_fn; source: ECOptimizer")


def _gf_mul_words(coef: int, words: tf.Tensor) -> tf.Tensor:
    """coef * each 16-bit little-endian symbol of int32 words, in GF(2^16) (the codec's field)."""
    if coef == 1:
        return words
    t = gf16.mul_tables(coef).astype(np.int64)
    lo_t, hi_t = tf.constant(t[0]), tf.constant(t[1])
    w = tf.bitwise.bitwise_and(tf.cast(words, tf.int64), 0xFFFFFFFF)

    def byte(shift: int) -> tf.Tensor:
        return tf.bitwise.bitwise_and(tf.bitwise.right_shift(w, shift), 0xFF)

    lo = tf.bitwise.bitwise_xor(tf.gather(lo_t, byte(0)), tf.gather(hi_t, byte(8)))
    hi = tf.bitwise.bitwise_xor(tf.gather(lo_t, byte(16)), tf.gather(hi_t, byte(24)))
    return tf.cast(tf.bitwise.bitwise_or(lo, tf.bitwise.left_shift(hi, 16)), tf.int32)
