"""Recovery of a lost PS under TF2 ParameterServerStrategy: settle, re-create, rebuild from parity.

When a PS dies, ``model.fit`` (its `ClusterCoordinator`) raises ``UnavailableError``.  Once the PS is
back (restarted at its address, or at a new one the cluster resolver names), `PSSRecovery.recover`:

1. reconnects the coordinator's eager context to the cluster (``update_server_def``); the survivors
   keep their variables and their delta logs (`tests/integration/test_pss_facts.py` pins this);
2. finds the lost PS tasks: those whose anchor variable is dead;
3. raises the step generation above the highest one any surviving log admits (the cluster's, whichever
   recovery object raised it last), so a step still in flight from before is refused, and settles the
   steps the failure cut, on the survivors, with the Estimator path's settlement
   (`tf_ecrec.step.steplog.Reconciler`, run through `tf_ecrec.pss.function_session`);
4. re-creates every variable of the lost PS (a `tf.Variable` whose PS restarted is dead for good) on
   the restarted PS with the layout's placement, and points the model's layers, the tables, the
   optimizer and the protection at the new objects;
5. rebuilds them: dense variables and the iteration count copied from a surviving replica; table chunks
   with their slots, and parity, decoded PS to PS in slices while ``fit`` trains on (`tf_ecrec.pss.rebuild`:
   their rows pending, a lookup waits for the rows it reads), or before it with ``background=False``;
6. drops the model's traced step so the next ``fit`` retraces it over the new variables.

Training stops for steps 1-4 and 5's start (the coordinator stopped with the error); `tf_ecrec.pss.fit`
resumes at the step the job was at.  A task failure during them (the restarted PS not answering yet, a
channel still backing off, the PS lost again) starts the recovery over from step 1; a PS whose
variables a cut attempt re-created stays lost until an attempt finishes it, although its new anchor
answers.  A loss beyond what the code covers (more than ``r`` chunks of a stripe, a dense variable with
no surviving copy) or a model variable outside the protection on a lost PS (a BatchNormalization
statistic, say) raises `RecoveryError`: the job falls back to its flash snapshot or checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import tensorflow as tf
from tensorflow.python.eager import context

from tf_ecrec.errors import RecoveryError
from tf_ecrec.layout.device import ps_index, variable_name
from tf_ecrec.pss.anchors import resolver_of
from tf_ecrec.pss.function_session import FunctionSession
from tf_ecrec.pss.keras_optimizer import protected_optimizer
from tf_ecrec.pss.rebuild import TableRebuild, copy_dense, delta_logs, sync
from tf_ecrec.pss.repoint import repoint
from tf_ecrec.rebuild.rebuilder import DEFAULT_SLICE_BYTES
from tf_ecrec.step.step_program import MAX_GENERATION
from tf_ecrec.step.steplog import STALE_SECS, Reconciler

_LOG = logging.getLogger(__name__)

# Keras' own bookkeeping variables of a model (created in the strategy's scope, so on some PS): the batch
# counters, reset by every fit/evaluate/predict call, and steps_per_execution, set by compile.  A lost one
# is re-created with the value it had when the recovery was made.
KERAS_BOOKKEEPING = ("_train_counter", "_test_counter", "_predict_counter", "_steps_per_execution")


@dataclasses.dataclass
class PSSRecoveryResult:
    """What one recovery did."""
    lost: list[int]
    method: str = "parity"
    step: int = 0
    settled: dict[str, int] = dataclasses.field(default_factory=dict)
    variables_rebuilt: int = 0
    bytes_rebuilt: int = 0
    seconds: float = 0.0
    reconnect_seconds: float = 0.0
    attempts: int = 1
    rebuilt_in_background: bool = False  # bytes_rebuilt counts the dense copies; the tables follow (`rebuild`)
    rebuild: TableRebuild | None = dataclasses.field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "rebuild"}


def is_ps_failure(exc: BaseException) -> bool:
    """Whether an error from ``model.fit`` or a coordinator's ``schedule``/``join`` means a task failed.

    ``UnavailableError`` (a task down), or an ``AbortedError`` naming an
    unknown context or another device incarnation: the PS died and was
    already restarted before any call saw it down (the coordinator passes
    those through as they are).
    """
    if isinstance(exc, tf.errors.UnavailableError):
        return True
    message = str(exc)
    return isinstance(exc, tf.errors.AbortedError) and ("context_id" in message or "device incarnation" in message)


def _read_int(variable: tf.Variable, default: int) -> int:
    """The variable's value; `default` if its PS is already gone (Keras' default for its bookkeeping)."""
    try:
        return int(variable.numpy())
    except (tf.errors.OpError, ValueError):
        return default


class PSSRecovery:
    """Recovers `model` (compiled with the protection's optimizer) after a PS failure.

    Args:
      protection: the strategy's `tf_ecrec.pss.PSSProtection`.
      model: the Keras model trained under the strategy.
      slice_bytes: bytes of a chunk read per rebuild call (bounds what is in flight).
      background: rebuild the tables while training goes on (`tf_ecrec.pss.rebuild`); else before it.
    """

    def __init__(self, protection: Any, model: tf.keras.Model, slice_bytes: int = DEFAULT_SLICE_BYTES,
                 background: bool = True) -> None:
        self.protection = protection
        self.model = model
        self.slice_bytes = int(slice_bytes)
        self.background, self.rebuild_walkers = bool(background), None  # walkers: None, `BackgroundRebuild`'s default
        self.rebuilding: TableRebuild | None = None  # the background rebuild under way, if any
        self.flash: Any = None  # the job's flash checkpoints (`tf_ecrec.pss.flash.PSSFlash`), restored beyond the code
        self.generation = 0  # the generation this object last set on the logs (`raise_generation`)
        self._stale: FunctionSession | None = None  # the settlement of stale steps (rebuilt after a recovery)
        self.unfinished: set[int] = set()  # PS whose re-created variables a cut recovery left unfilled
        self._bookkeeping = {
            name: _read_int(v, 1 if name == "_steps_per_execution" else 0)
            for name in KERAS_BOOKKEEPING if isinstance(v := getattr(model, name, None), tf.Variable)
        }

    @property
    def optimizer(self) -> Any:
        return protected_optimizer(self.model, self.protection)  # a typed error for a stock optimizer

    # ---- the procedure ---------------------------------------------------------------------------

    def recover(self, timeout_secs: float = 300.0, checkpoint: str | None = None) -> PSSRecoveryResult:
        """Steps 1-6 of the module doc; returns what was done (no lost PS: nothing but the reconnect).

        A loss beyond the code raises `RecoveryError`, or, given a `checkpoint`
        written by `tf_ecrec.pss.checkpoint.save` or flash snapshots (``self.flash``),
        restores every variable from the newer (method "checkpoint", "memory" or
        "disk": the steps since it are rolled back).

        A task failure during the recovery (the restarted PS not answering
        yet, or lost again) starts it over, until `timeout_secs`: a PS whose
        variables were re-created by the cut attempt counts as lost until an
        attempt finishes it, although its new anchor answers (``attempts``
        in the result counts them).

        Raises:
          RecoveryError: the loss is beyond the code (and no checkpoint), a
            task moved, or the recovery did not finish within `timeout_secs`.
        """
        started = time.monotonic()
        deadline = started + timeout_secs
        attempts = 0
        if self.rebuilding is not None:  # a failure during a background rebuild: its PS are still unfinished
            self.rebuilding.stop()
            self.rebuilding = None
        while True:
            attempts += 1
            try:
                result = self._recover_once(started, deadline, checkpoint)
            except (tf.errors.UnavailableError, tf.errors.AbortedError) as exc:
                if not is_ps_failure(exc):
                    raise
                if time.monotonic() > deadline:
                    raise RecoveryError(
                        f"the recovery of PS {sorted(self.unfinished)} did not finish within {timeout_secs:.0f}s over "
                        f"{attempts} attempts; the last failure: {str(exc).splitlines()[0][:200]}; source: PSSRecovery"
                    ) from exc
                _LOG.warning("a task failed during the recovery of PS %s (%s); starting it over", sorted(self.unfinished),
                             str(exc).splitlines()[0][:200])
                time.sleep(1.0)
                continue
            result.attempts = attempts
            return result

    def _recover_once(self, started: float, deadline: float, checkpoint: str | None) -> PSSRecoveryResult:
        self._reconnect(max(deadline - time.monotonic(), 0.0))
        reconnected = time.monotonic() - started
        lost = sorted(set(self.lost_tasks()) | self.unfinished)
        result = PSSRecoveryResult(lost=lost, reconnect_seconds=reconnected)
        if not lost:
            return result
        try:
            self._check_recoverable(lost)
        except RecoveryError as exc:
            from tf_ecrec.pss.checkpoint import fall_back

            return fall_back(self, lost, checkpoint, result, started, exc)  # the flash snapshot or checkpoint, or raise
        alive = [p for p in range(self.protection.num_ps) if p not in lost]
        # From here the lost PS's variables are re-created and refilled: until the end, they are lost whatever
        # their new anchors say.
        self.unfinished = set(lost)
        # 3. refuse the steps of the traced step from now on (one still in flight on a worker), then settle
        #    what the failure cut, on the survivors (docs/settlement.md, invariant vi).
        settle = self.reconciler()
        self.raise_generation(settle, alive)
        result.settled = settle.built.settle(settle, alive, lost).counts()
        # 4. new variables on the restarted PS, the references re-pointed.
        replaced = self.replace_lost(lost)
        # 5. rebuild them: the tables in the background (T0 now, before any step) or now.
        rebuild, stats = self._rebuild_tables(lost)
        copy_dense(self.optimizer.protector, replaced)
        self.resume(settle)
        result.variables_rebuilt = len(replaced)
        result.bytes_rebuilt = stats.bytes
        result.step = int(self.optimizer.iterations.numpy())
        result.seconds = time.monotonic() - started
        if rebuild is None:
            self.unfinished = set()
        else:  # unfinished until every row is installed
            result.rebuilt_in_background, result.rebuild, self.rebuilding = True, rebuild, rebuild
            rebuild.start(lambda done: self._rebuilt(done, result), self.rebuild_walkers)
        _LOG.warning("recovered PS %s from parity at step %d in %.1fs (tables in the background: %s): %s", lost,
                     result.step, result.seconds, rebuild is not None, result.settled)
        return result

    def _rebuild_tables(self, lost: list[int]) -> tuple[TableRebuild | None, Any]:
        """The T0 of the `lost` PS's tables' background rebuild (returned, not started), or their rebuild now."""
        if not self.background:
            return None, sync(self.protection, self.optimizer.protector, lost, self.slice_bytes)
        rebuild = TableRebuild(self.protection, self.optimizer.protector, lost, self.slice_bytes)
        return rebuild, rebuild.begin().stats

    def _rebuilt(self, rebuild: TableRebuild, result: PSSRecoveryResult) -> None:  # from its last walking thread
        result.bytes_rebuilt = rebuild.bytes
        if self.rebuilding is rebuild:
            self.unfinished -= set(rebuild.lost)

    def wait_rebuilt(self, timeout_secs: float = 600.0) -> bool:
        """Waits for a background rebuild under way; whether no PS is left unfinished (False: stopped, or timed out)."""
        rebuilding = self.rebuilding
        if rebuilding is not None and not rebuilding.wait(timeout_secs):
            return False
        return not self.unfinished

    def raise_generation(self, settle: FunctionSession, alive: list[int]) -> int:
        """Sets, on the `alive` logs, one above the highest generation any of them admits (or this object
        set): the cluster's generation, not a count of this object's (`fit` and a coordinator loop make one
        recovery object per call or per failure, and a log never lowers what it admits)."""
        top = settle.built.propagate_generation(settle, alive, floor=self.generation)
        self.generation = min(top + 1, MAX_GENERATION)
        settle.built.set_generation(settle, alive, self.generation)
        return self.generation

    def resume(self, settle: FunctionSession | None = None) -> None:
        """Every log at the new generation (a rebuilt PS's fresh one too: `settle`'s handles reach it), the step bound to it."""
        settle = settle or self.reconciler()
        settle.built.set_generation(settle, range(self.protection.num_ps), self.generation)
        self.optimizer.protector.bind(self.protection.collections, self.protection.num_ps, self.protection.ec,
                                      self.generation)
        self.model.train_function = None  # 6. the next fit traces its step again
        self.model.test_function = None
        self.model.predict_function = None
        self._stale = None

    def settle_stale(self, stale_secs: float = STALE_SECS) -> dict[str, int] | None:
        """Settles the steps a dead worker left (pending `stale_secs`, waiting on nothing), training going on,
        as the chief does on the Estimator path (`Reconciler.settle_stale`): later steps' round-1 commits
        wait behind them, and the strategy runs the dead worker's closure again under a new step id.

        Its ops cover the targets logged so far, and are made again once there are more (``model.fit``
        traces its step beside this thread: ops made before the trace ended could not finish its folds).
        """
        if self._stale is None or self._stale.built.targets.keys() != self.optimizer.protector.targets.keys():
            self._stale = self.reconciler()
        report = self._stale.built.settle_stale(self._stale, range(self.protection.num_ps), stale_secs)
        return report.counts() if report is not None else None

    def forget_stale(self) -> None:
        self._stale = None  # the next `settle_stale` makes its ops again

    def _reconnect(self, timeout_secs: float) -> None:
        """Updates the eager context's cluster until every task answers.

        Raises:
          RecoveryError: a PS the resolver now names at another address.
            TensorFlow 2.15's PS servers keep the cluster they started with
            and a step moves deltas PS to PS, so a survivor would keep dialing
            the old address (`tests/integration/test_pss_facts.py` shows it):
            restart the job's tasks with the new cluster and restore from the
            last checkpoint.
        """
        deadline = time.monotonic() + timeout_secs
        server_def = context.get_server_def()
        current = {job.name: dict(job.tasks) for job in server_def.cluster.job}
        wanted = resolver_of(self.protection.strategy).cluster_spec().as_dict()
        moved = {
            f"{name}:{i}": (current.get(name, {}).get(i), address)
            for name in ("ps", "worker") for i, address in enumerate(wanted.get(name, []))
            if current.get(name, {}).get(i) != address
        }
        if moved:
            raise RecoveryError(f"tasks moved to new addresses {moved}: the PS servers of TensorFlow 2.15 keep the "
                                "cluster they started with, so the survivors cannot reach a moved PS; rule: a recovered "
                                "task keeps its address (a StatefulSet or TFJob service name does); restart the job with "
                                "the new cluster and restore its last checkpoint; source: the cluster resolver")
        while True:
            try:
                return context.context().update_server_def(server_def)
            except (tf.errors.UnavailableError, tf.errors.InvalidArgumentError, tf.errors.AbortedError) as exc:
                if time.monotonic() > deadline:
                    raise RecoveryError(f"the cluster did not come back within {timeout_secs:.0f}s: {exc}; source: PSSRecovery") from exc
                time.sleep(1.0)

    def lost_tasks(self, confirm_reads: int = 3, pause_secs: float = 0.5) -> list[int]:
        """The PS tasks whose anchor variable is dead (their process restarted).

        A dead anchor stays dead: a PS is lost only when `confirm_reads` reads, `pause_secs` apart, all
        fail (a read cut by the coordinator re-connecting a restarted worker fails once, and re-creating a
        live PS would drop its state).  A PS that does not answer is not lost either (``UnavailableError``
        goes up, and `recover` tries again once the cluster answers).
        """
        lost = []
        for p, anchor in sorted(self.protection.placement.anchors.items()):
            for read in range(confirm_reads):
                if read:
                    time.sleep(pause_secs)
                try:
                    anchor.read_value().numpy()
                    break
                except (tf.errors.InvalidArgumentError, tf.errors.AbortedError, tf.errors.NotFoundError,
                        tf.errors.FailedPreconditionError) as exc:
                    _LOG.info("the anchor of PS %d did not read (%d of %d): %s", p, read + 1, confirm_reads,
                              str(exc).splitlines()[0][:200])
            else:
                lost.append(p)
        return lost

    def _check_recoverable(self, lost: list[int]) -> None:
        protector = self.optimizer.protector
        for coll in self.protection.collections:
            for stripe in coll.table_layout.stripes:
                gone = [ch for ch in stripe.chunks if ch.ps in lost]
                if len(gone) > coll.code.r:
                    raise RecoveryError(
                        f"PS {lost} held {len(gone)} chunks of stripe {stripe.index} of {coll.name!r}, more than "
                        f"r = {coll.code.r}; rule: at most r chunks of a stripe may be lost; source: the layout"
                    )
        for name, primary in protector.protected.items():
            copies = [primary, *protector.replicas[name]]
            if all(ps_index(v.device) in lost for v in copies):
                raise RecoveryError(f"every copy of {name} was on PS {lost}; rule: one copy must survive; source: the replicas")
        covered = {id(v) for v in self._protection_variables() + self._restartable()}
        for v in self.model.variables:
            if id(v) not in covered and ps_index(v.device) in lost:
                raise RecoveryError(
                    f"model variable {variable_name(v)} was on lost PS {ps_index(v.device)} and no parity or replica "
                    "covers it (tf_ecrec protects the tables and what the optimizer updates); source: the model"
                )

    def _restartable(self) -> list[tf.Variable]:
        """Variables a lost PS may take whose value is not the model's: Keras bookkeeping, metric accumulators
        (reset every epoch; those of an epoch a failure cut restart at zero)."""
        out = [v for name in self._bookkeeping if isinstance(v := getattr(self.model, name, None), tf.Variable)]
        return out + [v for m in self.model.metrics for v in m.variables]

    def _protection_variables(self) -> list[tf.Variable]:
        protector = self.optimizer.protector
        out = [v for c in self.protection.collections for v in c.data.values()]
        out += list(protector.protected.values()) + self.optimizer.protection_variables()
        return out

    def reconciler(self) -> FunctionSession:
        protector = self.optimizer.protector

        def build() -> Reconciler:
            return Reconciler(protector.targets, delta_logs(self.protection.num_ps), protector.expected_folds,
                              protector.commit_timeout_ms)

        return FunctionSession(build)

    # ---- re-creating the lost PS's variables ------------------------------------------------------

    def replace_lost(self, lost: list[int]) -> dict[int, tuple[tf.Variable, tf.Variable]]:
        """New variables for every variable of the `lost` PS; id(old) -> (old, new); references updated."""
        placement = self.protection.placement
        for p in lost:
            placement.replace_anchor(p)
        initial = {id(v): self._bookkeeping[name] for name in self._bookkeeping if (v := getattr(self.model, name, None)) is not None}
        candidates = self._protection_variables() + self._restartable()
        replaced: dict[int, tuple[tf.Variable, tf.Variable]] = {}
        for old in candidates:
            p = ps_index(old.device)
            if p not in lost or id(old) in replaced:
                continue
            with placement.scope(p):
                value = tf.fill(old.shape, tf.constant(initial.get(id(old), 0), old.dtype))
                new = tf.Variable(value, name=variable_name(old), trainable=old.trainable)
            replaced[id(old)] = (old, new)
        repoint(self.model, self.protection, self._bookkeeping, {k: new for k, (_, new) in replaced.items()})
        return replaced

    # ---- rebuilding them ---------------------------------------------------------------------------
