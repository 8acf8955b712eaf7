"""TensorFlow ops that keep erasure-code parity in step with embedding updates.

Importing this module loads the compiled library ``_ec_ops.so`` that sits
beside it (built by ``python ops/build.py``, or by ``pip install``) once, and
checks that it was built for the installed TensorFlow; if not, the import
raises :class:`tf_ecrec.errors.OpLibraryError`, which says how to rebuild.

Every process that *runs* these ops must import this module, including the
parameter-server processes, since that is where the variables live and where
the kernels execute.

A training step on a PS-held table, in graph mode::

    delta = sparse_apply_adagrad_with_delta(table, accum, grad, ids, lr)
    fold = parity_update(parity, parity_rows, delta, coef=code.coef(p, j))

``delta`` holds, per touched row, ``old ^ new`` of the table row and its
optimizer-slot rows as int32 words, taken under the variables' locks in the
same kernel that applies the update. Folding it into parity (times the code
coefficient of the chunk) keeps the parity equal to the code of the data.
The two ops are separate so that parity can live on another PS; running the
fold after the apply is the caller's job (e.g. a control dependency). Both
ops validate everything before they write: a failing op changes nothing.

In the deltas, ``dim`` is the number of elements in a row of the variable
(``prod(var.shape[1:])``), and the row's tables follow each other: var, then
the slots in argument order.

Each apply op writes the same bits as the stock TensorFlow 2.15 kernel of its
optimizer (see ``ops/cc/kernels/optimizer_rules.h``); Adam is the "lazy"
variant, since TensorFlow has no sparse Adam kernel.

Delta log (recovery of cut steps)
---------------------------------
Passing ``log=``, ``sid=`` and ``target=`` to an apply wrapper or to
:func:`parity_update` (and ``source=`` to the latter) selects the op's
``...Logged`` variant: it does the same update and, in the same kernel while
it still holds the variables' locks, appends one entry to ``log``, a per-PS
:func:`delta_log` resource, recording exactly the words it XORed into each
distinct row (rows ascending). :func:`assign_add_logged` is the logged
counterpart of ``assign_add`` (global step and its replicas). An entry
exists if and only if its update happened, so after a step is cut anywhere
the logs of the surviving PSs say which updates of each unfinished step are
in effect. Recovery (workers blocked) reads them (:func:`delta_log_read`,
:func:`parse_delta_log`); fences every step id found and not committed
anywhere on every surviving log (:func:`delta_log_fence`: a dead worker's
step may still have ops running on the PSs; once fenced they fail without
writing) and reads again; then, per such step id, either undoes its entries
(:func:`delta_log_undo`: XOR back and remove, atomically and idempotently;
reverse ``seq`` order for an optimizer's var and slots) or finishes the step
(runs the missing logged folds with the same ``sid`` and ``source`` and
``bypass_fence=True``), and finally commits the step id on every log
(:func:`delta_log_commit`). A step that completes normally commits its id on
every log it touched, after all its updates (control dependencies); a logged
op of a committed step id fails with ``tf.errors.AbortedError``.

Ids are the caller's: ``sid`` is unique per step (e.g. worker id in the high
bits, a per-worker counter below), ``target`` (>= 0) names a variable group
(a data variable with its slots, a parity or replica variable, a counter),
``source`` the target a folded delta came from (-1 for none).
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import threading
from types import ModuleType
from typing import Any, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from tf_ecrec.errors import OpLibraryError
from tf_ecrec.ops.build_info import parse_assignments

__all__ = [
    "BuildInfo",
    "DELTA_LOG_COMMITTED_CAPACITY",
    "DEFAULT_DELTA_LOG_NAME",
    "DeltaLogEntry",
    "DeltaLogSnapshot",
    "OP_NAMES",
    "as_words",
    "assign_add_logged",
    "check_build_info",
    "combine_rows",
    "delta_log",
    "delta_log_commit",
    "delta_log_commit_in_order",
    "delta_log_pending",
    "delta_log_seq_of",
    "delta_log_set_generation",
    "delta_log_drop",
    "delta_log_fence",
    "delta_log_read",
    "delta_log_undo",
    "lazy_adam_learning_rate",
    "load_library",
    "parity_update",
    "parse_delta_log",
    "read_build_info",
    "read_row_words",
    "sparse_apply_adagrad_with_delta",
    "sparse_apply_adam_with_delta",
    "sparse_apply_ftrl_with_delta",
    "sparse_apply_sgd_with_delta",
    "write_row_words",
    "xor_rows",
    "await_rebuilt_rows",
    "install_row_words",
    "preserve_end",
    "preserve_ranges",
    "read_preserved_row_words",
    "rebuild_begin_pending",
    "recovery_view_stats",
    "wait_wanted",
    "wanted_rows",
]

LIBRARY_DIR = os.path.dirname(os.path.abspath(__file__))
LIBRARY_NAME = "_ec_ops.so"
BUILD_INFO_NAME = "_build_info.py"
REBUILD_HINT = (
    "rebuild with: python ops/build.py (in a source checkout), or reinstall tf_ecrec "
    "with: pip install --no-build-isolation --force-reinstall <tf_ecrec source>"
)

OP_NAMES = (
    "EcRec>SparseApplySgdWithDelta",
    "EcRec>SparseApplyAdagradWithDelta",
    "EcRec>SparseApplyLazyAdamWithDelta",
    "EcRec>SparseApplyFtrlWithDelta",
    "EcRec>SparseApplyFtrlV2WithDelta",
    "EcRec>ParityUpdate",
    "EcRec>SparseApplySgdWithDeltaLogged",
    "EcRec>SparseApplyAdagradWithDeltaLogged",
    "EcRec>SparseApplyLazyAdamWithDeltaLogged",
    "EcRec>SparseApplyFtrlWithDeltaLogged",
    "EcRec>SparseApplyFtrlV2WithDeltaLogged",
    "EcRec>ParityUpdateLogged",
    "EcRec>AssignAddLogged",
    "EcRec>DeltaLogHandle",
    "EcRec>DeltaLogCommit",
    "EcRec>DeltaLogCommitInOrder",
    "EcRec>DeltaLogSetGeneration",
    "EcRec>DeltaLogSeqOf",
    "EcRec>DeltaLogPending",
    "EcRec>DeltaLogFence",
    "EcRec>DeltaLogDrop",
    "EcRec>DeltaLogRead",
    "EcRec>DeltaLogUndo",
    "EcRec>XorRows",
    "EcRec>ReadRowWords",
    "EcRec>CombineRows",
    "EcRec>WriteRowWords",
    "EcRec>RebuildBeginPending",
    "EcRec>RecoveryViewStats",
    "EcRec>AwaitRebuiltRows",
    "EcRec>WantedRows",
    "EcRec>WaitWanted",
    "EcRec>InstallRowWords",
    "EcRec>PreserveRanges",
    "EcRec>PreserveEnd",
    "EcRec>ReadPreservedRowWords",
)
"""Registered names of the ops in ``_ec_ops.so`` (those wrapped here)."""

DEFAULT_DELTA_LOG_NAME = "ec_rec_delta_log"
"""``shared_name`` of the per-process log that :func:`delta_log` names by default."""

DELTA_LOG_COMMITTED_CAPACITY = 65536
"""How many committed step ids a log remembers (the most recent ones)."""

VariableLike = Union[tf.Variable, tf.Tensor]
FloatLike = Union[float, tf.Tensor]
IntLike = Union[int, tf.Tensor]


# --- loading --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BuildInfo:
    """What a compiled op library was built against (from ``_build_info.py``).

    Attributes:
        tf_version: ``tf.__version__`` at build time.
        source_hash: SHA-256 of the C++ sources and compiler flags.
        path: Where the build info was read from, for messages.
    """

    tf_version: str
    source_hash: str
    path: str = "<memory>"


def read_build_info(path: str) -> BuildInfo:
    """Reads a ``_build_info.py`` written by ``ops/build.py`` without importing it.

    Raises:
        OpLibraryError: If the file is missing or malformed.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            values = parse_assignments(fh.read(), filename=path)
    except (OSError, SyntaxError) as exc:
        raise OpLibraryError(
            f"cannot read the op library's build info {path} ({exc}); {REBUILD_HINT}"
        ) from exc
    tf_version = values.get("TF_VERSION")
    source_hash = values.get("SOURCE_HASH")
    if not isinstance(tf_version, str) or not isinstance(source_hash, str):
        raise OpLibraryError(
            f"the op library's build info {path} lacks TF_VERSION or SOURCE_HASH; {REBUILD_HINT}"
        )
    return BuildInfo(tf_version=tf_version, source_hash=source_hash, path=path)


def check_build_info(info: BuildInfo, installed_tf_version: Optional[str] = None) -> None:
    """Refuses a library built for another TensorFlow than the installed one.

    Custom-op libraries link against TensorFlow's C++ ABI, which changes
    between releases; a mismatch fails with undefined symbols or, worse,
    loads and corrupts memory.

    Args:
        info: Build info of the library.
        installed_tf_version: Defaults to ``tf.__version__``.

    Raises:
        OpLibraryError: If the versions differ.
    """
    installed = tf.__version__ if installed_tf_version is None else installed_tf_version
    if info.tf_version != installed:
        raise OpLibraryError(
            f"the tf_ecrec op library was built for TensorFlow {info.tf_version} "
            f"(per {info.path}) but TensorFlow {installed} is installed; the versions must "
            f"be equal; {REBUILD_HINT}"
        )


_lock = threading.Lock()
_library: Optional[ModuleType] = None


def _load(directory: str) -> ModuleType:
    library_path = os.path.join(directory, LIBRARY_NAME)
    if not os.path.exists(library_path):
        raise OpLibraryError(f"the tf_ecrec op library {library_path} is missing; {REBUILD_HINT}")
    check_build_info(read_build_info(os.path.join(directory, BUILD_INFO_NAME)))
    try:
        return tf.load_op_library(library_path)
    except (tf.errors.OpError, OSError) as exc:
        raise OpLibraryError(
            f"TensorFlow {tf.__version__} could not load {library_path}: {exc}; {REBUILD_HINT}"
        ) from exc


def load_library(directory: Optional[str] = None) -> ModuleType:
    """Loads the op library, checking it against the installed TensorFlow.

    Args:
        directory: ``None`` (the default) loads the library beside this module,
            once per process, and caches it; import time does this. An
            explicit directory is checked and loaded on every call, uncached
            (for tools and tests).

    Returns:
        The module of generated op functions.

    Raises:
        OpLibraryError: If the library or its build info is missing, it was
            built for another TensorFlow, or TensorFlow cannot load it.
    """
    global _library
    if directory is not None:
        return _load(directory)
    with _lock:
        if _library is None:
            module = _load(LIBRARY_DIR)
            for op_name in OP_NAMES:
                try:
                    tf.no_gradient(op_name)
                except KeyError:  # already registered by an earlier import (reload)
                    pass
            _library = module
        return _library


_ops = load_library()


# --- wrappers --------------------------------------------------------------------------


def _handle(variable: VariableLike, what: str) -> tf.Tensor:
    """The resource handle of a resource variable (or a handle tensor)."""
    handle = getattr(variable, "handle", variable)
    if not isinstance(handle, tf.Tensor) or handle.dtype != tf.resource:
        raise TypeError(
            f"`{what}` must be a resource variable (tf.Variable created with resource semantics) "
            f"or its handle, got {type(variable).__name__}"
        )
    return handle


def _indices(indices: Union[tf.Tensor, object], what: str) -> tf.Tensor:
    tensor = tf.convert_to_tensor(indices, dtype_hint=tf.int64, name=what)
    if tensor.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"`{what}` must be int32 or int64, got {tensor.dtype.name}")
    return tensor


def _float(value: FloatLike, what: str) -> tf.Tensor:
    return tf.convert_to_tensor(value, dtype=tf.float32, name=what)


def _log_inputs(
    log: Optional[tf.Tensor], sid: Optional[IntLike], target: Optional[IntLike], bypass_fence: bool = False, **source: IntLike
) -> Optional[dict]:
    """The extra inputs (and attr) of a ``...Logged`` op, or ``None`` when ``log`` is ``None``."""
    if log is None:
        if sid is not None or target is not None or bypass_fence:
            raise ValueError("`sid`, `target` and `bypass_fence` are only meaningful with `log`")
        return None
    if sid is None or target is None:
        raise ValueError("a logged update needs `sid` (the step id) and `target` (the variable's id)")
    inputs = {
        "log": _handle(log, "log"),
        "sid": tf.convert_to_tensor(sid, dtype=tf.int64, name="sid"),
        "target": tf.convert_to_tensor(target, dtype=tf.int32, name="target"),
        "bypass_fence": bool(bypass_fence),
    }
    for key, value in source.items():
        dtype = tf.int64 if key == "source_seq" else tf.int32
        inputs[key] = tf.convert_to_tensor(value, dtype=dtype, name=key)
    return inputs


def sparse_apply_sgd_with_delta(
    var: VariableLike,
    grad: tf.Tensor,
    indices: tf.Tensor,
    lr: FloatLike,
    name: Optional[str] = None,
    *,
    log: Optional[tf.Tensor] = None,
    sid: Optional[IntLike] = None,
    target: Optional[IntLike] = None,
    bypass_fence: bool = False,
) -> tf.Tensor:
    """SGD on the rows ``indices`` of ``var``; returns the bitwise delta.

    ``var[indices[i]] += (-grad[i]) * lr`` for each ``i`` in order, the same
    bits as ``tf.compat.v1.train.GradientDescentOptimizer`` on a resource
    variable (``ResourceScatterAdd``).

    Args:
        var: float32 resource variable ``[rows, ...]``, e.g. a table ``[rows, dim]``.
        grad: float32 ``[n, ...]``, one row (shaped like ``var``'s) per id.
        indices: int32 or int64 ``[n]`` row ids in ``[0, rows)``; may repeat.
        lr: Learning rate, float32 scalar.
        name: Op name.
        log: A :func:`delta_log` handle on ``var``'s device: run the logged
            variant, which also appends the delta of each distinct row to it.
        sid: int64 step id of the logged update (with ``log``).
        target: int32 id (>= 0) of ``var`` and its slots (with ``log``).
        bypass_fence: Apply even if ``sid`` is fenced or committed in the
            log (recovery finishing a step); otherwise such an update fails
            with ``tf.errors.AbortedError`` and changes nothing.

    Returns:
        int32 ``[n, dim]``: ``bitcast(old) ^ bitcast(new)`` of each touched row
        at its first occurrence in ``indices``, zeros at later occurrences.

    Raises:
        tf.errors.InvalidArgumentError: At run time, for out-of-range ids or
            mismatched shapes (also at graph build time when shapes are static).
    """
    logged = _log_inputs(log, sid, target, bypass_fence)
    op = _ops.ec_rec_sparse_apply_sgd_with_delta if logged is None else _ops.ec_rec_sparse_apply_sgd_with_delta_logged
    return op(
        **(logged or {}),
        var=_handle(var, "var"),
        lr=_float(lr, "lr"),
        grad=tf.convert_to_tensor(grad, dtype=tf.float32, name="grad"),
        indices=_indices(indices, "indices"),
        name=name,
    )


def sparse_apply_adagrad_with_delta(
    var: VariableLike,
    accum: VariableLike,
    grad: tf.Tensor,
    indices: tf.Tensor,
    lr: FloatLike,
    name: Optional[str] = None,
    *,
    log: Optional[tf.Tensor] = None,
    sid: Optional[IntLike] = None,
    target: Optional[IntLike] = None,
    bypass_fence: bool = False,
) -> tf.Tensor:
    """Adagrad on the rows ``indices``; returns the bitwise delta of var and accum.

    Per occurrence: ``accum += grad**2; var -= lr * grad * rsqrt(accum)``, the
    same bits as ``ResourceSparseApplyAdagrad`` (``update_slots=True``, the
    kernel of ``tf.compat.v1.train.AdagradOptimizer``).

    Args:
        var: float32 resource variable ``[rows, ...]``, e.g. a table ``[rows, dim]``.
        accum: Its accumulator slot, shaped like ``var``.
        grad: float32 ``[n, ...]``, one row (shaped like ``var``'s) per id.
        indices: int32 or int64 ``[n]`` row ids in ``[0, rows)``; may repeat.
        lr: Learning rate, float32 scalar.
        name: Op name.
        log: A :func:`delta_log` handle on ``var``'s device: run the logged
            variant, which also appends the delta of each distinct row to it.
        sid: int64 step id of the logged update (with ``log``).
        target: int32 id (>= 0) of ``var`` and its slots (with ``log``).
        bypass_fence: Apply even if ``sid`` is fenced or committed in the
            log (recovery finishing a step); otherwise such an update fails
            with ``tf.errors.AbortedError`` and changes nothing.

    Returns:
        int32 ``[n, 2 * dim]``: ``[var | accum]`` old ^ new bits at the first
        occurrence of each id, zeros at later occurrences.
    """
    logged = _log_inputs(log, sid, target, bypass_fence)
    op = _ops.ec_rec_sparse_apply_adagrad_with_delta if logged is None else _ops.ec_rec_sparse_apply_adagrad_with_delta_logged
    return op(
        **(logged or {}),
        var=_handle(var, "var"),
        accum=_handle(accum, "accum"),
        lr=_float(lr, "lr"),
        grad=tf.convert_to_tensor(grad, dtype=tf.float32, name="grad"),
        indices=_indices(indices, "indices"),
        name=name,
    )


def lazy_adam_learning_rate(lr: FloatLike, beta1_power: FloatLike, beta2_power: FloatLike) -> tf.Tensor:
    """Bias-corrected rate ``lr * sqrt(1 - beta2^t) / (1 - beta1^t)``.

    Computed with the same float32 ops, in the same order, as
    ``tf.compat.v1.train.AdamOptimizer`` and ``LazyAdamOptimizer``.
    """
    lr = _float(lr, "lr")
    beta1_power = _float(beta1_power, "beta1_power")
    beta2_power = _float(beta2_power, "beta2_power")
    return lr * tf.sqrt(1 - beta2_power) / (1 - beta1_power)


def sparse_apply_adam_with_delta(
    var: VariableLike,
    m: VariableLike,
    v: VariableLike,
    grad: tf.Tensor,
    indices: tf.Tensor,
    lr: FloatLike,
    beta1: FloatLike = 0.9,
    beta2: FloatLike = 0.999,
    epsilon: FloatLike = 1e-8,
    name: Optional[str] = None,
    *,
    log: Optional[tf.Tensor] = None,
    sid: Optional[IntLike] = None,
    target: Optional[IntLike] = None,
    bypass_fence: bool = False,
) -> tf.Tensor:
    """Lazy Adam on the rows ``indices``; returns the bitwise delta of var, m, v.

    TensorFlow has no sparse Adam kernel (v1 ``AdamOptimizer`` decays all rows
    of ``m`` and ``v`` every step). This is lazy Adam, as
    ``tf.contrib.opt.LazyAdamOptimizer`` and ``tfa.optimizers.LazyAdam``: per
    occurrence, on the touched rows only::

        m = beta1 * m + (1 - beta1) * grad
        v = beta2 * v + (1 - beta2) * grad**2
        var -= lr * m / (sqrt(v) + epsilon)

    bit-identical to that formula written with stock ops (gather, math,
    scatter). ``lr`` must already be bias-corrected; see
    :func:`lazy_adam_learning_rate`. The caller keeps ``beta1^t`` and
    ``beta2^t`` (for example as non-slot variables, advanced once per step).

    Args:
        var: float32 resource variable ``[rows, ...]``, e.g. a table ``[rows, dim]``.
        m: First-moment slot, shaped like ``var``.
        v: Second-moment slot, shaped like ``var``.
        grad: float32 ``[n, ...]``, one row (shaped like ``var``'s) per id.
        indices: int32 or int64 ``[n]`` row ids in ``[0, rows)``; may repeat
            (occurrences apply one after another; deduplicate first, summing
            gradients, to match the optimizers).
        lr: Bias-corrected learning rate, float32 scalar.
        beta1: float32 scalar.
        beta2: float32 scalar.
        epsilon: float32 scalar.
        name: Op name.
        log: A :func:`delta_log` handle on ``var``'s device: run the logged
            variant, which also appends the delta of each distinct row to it.
        sid: int64 step id of the logged update (with ``log``).
        target: int32 id (>= 0) of ``var`` and its slots (with ``log``).
        bypass_fence: Apply even if ``sid`` is fenced or committed in the
            log (recovery finishing a step); otherwise such an update fails
            with ``tf.errors.AbortedError`` and changes nothing.

    Returns:
        int32 ``[n, 3 * dim]``: ``[var | m | v]`` old ^ new bits at the first
        occurrence of each id, zeros at later occurrences.
    """
    logged = _log_inputs(log, sid, target, bypass_fence)
    op = _ops.ec_rec_sparse_apply_lazy_adam_with_delta if logged is None else _ops.ec_rec_sparse_apply_lazy_adam_with_delta_logged
    return op(
        **(logged or {}),
        var=_handle(var, "var"),
        m=_handle(m, "m"),
        v=_handle(v, "v"),
        lr=_float(lr, "lr"),
        beta1=_float(beta1, "beta1"),
        beta2=_float(beta2, "beta2"),
        epsilon=_float(epsilon, "epsilon"),
        grad=tf.convert_to_tensor(grad, dtype=tf.float32, name="grad"),
        indices=_indices(indices, "indices"),
        name=name,
    )


def sparse_apply_ftrl_with_delta(
    var: VariableLike,
    accum: VariableLike,
    linear: VariableLike,
    grad: tf.Tensor,
    indices: tf.Tensor,
    lr: FloatLike,
    l1: FloatLike = 0.0,
    l2: FloatLike = 0.0,
    lr_power: FloatLike = -0.5,
    l2_shrinkage: Optional[FloatLike] = None,
    multiply_linear_by_lr: bool = False,
    name: Optional[str] = None,
    *,
    log: Optional[tf.Tensor] = None,
    sid: Optional[IntLike] = None,
    target: Optional[IntLike] = None,
    bypass_fence: bool = False,
) -> tf.Tensor:
    """FTRL-Proximal on the rows ``indices``; returns the bitwise delta.

    The same bits as ``ResourceSparseApplyFtrl``, or ``ResourceSparseApplyFtrlV2``
    when ``l2_shrinkage`` is a tensor or a positive number; this is the choice
    ``tf.compat.v1.train.FtrlOptimizer`` makes for
    ``l2_shrinkage_regularization_strength``.

    Args:
        var: float32 resource variable ``[rows, ...]``, e.g. a table ``[rows, dim]``.
        accum: Accumulator slot, shaped like ``var``.
        linear: Linear slot, shaped like ``var``.
        grad: float32 ``[n, ...]``, one row (shaped like ``var``'s) per id.
        indices: int32 or int64 ``[n]`` row ids in ``[0, rows)``; may repeat.
        lr: Positive learning rate.
        l1: Non-negative L1 regularization strength.
        l2: Non-negative L2 regularization strength.
        lr_power: Non-positive learning rate power.
        l2_shrinkage: Non-negative L2 shrinkage strength, or ``None``.
        multiply_linear_by_lr: The stock kernels' attribute of that name.
        name: Op name.
        log: A :func:`delta_log` handle on ``var``'s device: run the logged
            variant, which also appends the delta of each distinct row to it.
        sid: int64 step id of the logged update (with ``log``).
        target: int32 id (>= 0) of ``var`` and its slots (with ``log``).
        bypass_fence: Apply even if ``sid`` is fenced or committed in the
            log (recovery finishing a step); otherwise such an update fails
            with ``tf.errors.AbortedError`` and changes nothing.

    Returns:
        int32 ``[n, 3 * dim]``: ``[var | accum | linear]`` old ^ new bits at
        the first occurrence of each id, zeros at later occurrences.
    """
    logged = _log_inputs(log, sid, target, bypass_fence)
    common = dict(
        **(logged or {}),
        var=_handle(var, "var"),
        accum=_handle(accum, "accum"),
        linear=_handle(linear, "linear"),
        grad=tf.convert_to_tensor(grad, dtype=tf.float32, name="grad"),
        indices=_indices(indices, "indices"),
        lr=_float(lr, "lr"),
        l1=_float(l1, "l1"),
        l2=_float(l2, "l2"),
        lr_power=_float(lr_power, "lr_power"),
        multiply_linear_by_lr=multiply_linear_by_lr,
        name=name,
    )
    if l2_shrinkage is None or (isinstance(l2_shrinkage, numbers.Real) and l2_shrinkage <= 0):
        op = _ops.ec_rec_sparse_apply_ftrl_with_delta if logged is None else _ops.ec_rec_sparse_apply_ftrl_with_delta_logged
        return op(**common)
    op = _ops.ec_rec_sparse_apply_ftrl_v2_with_delta if logged is None else _ops.ec_rec_sparse_apply_ftrl_v2_with_delta_logged
    return op(l2_shrinkage=_float(l2_shrinkage, "l2_shrinkage"), **common)


def parity_update(
    parity: VariableLike,
    rows: tf.Tensor,
    delta: tf.Tensor,
    coef: IntLike = 1,
    field_bits: int = 16,
    name: Optional[str] = None,
    *,
    log: Optional[tf.Tensor] = None,
    sid: Optional[IntLike] = None,
    target: Optional[IntLike] = None,
    source: IntLike = -1,
    source_seq: IntLike = -1,
    bypass_fence: bool = False,
    dedupe: bool = False,
) -> Optional[tf.Operation]:
    """Folds deltas into parity: ``parity[rows[i]] ^= coef * delta[i]``.

    Products are taken in GF(2^16) (polynomial 0x1100B, pyeclib's
    ``liberasurecode_rs_vand`` and :mod:`tf_ecrec.codec`) on the two
    little-endian 16-bit symbols of each int32 word, or with
    ``field_bits=8`` in GF(2^8) (polynomial 0x11D, ``isa_l_rs_vand``) on its
    four bytes. ``coef=1`` is a plain XOR in either field. The parity
    variable is locked for the whole update, so concurrent folds into the
    same rows do not lose updates.

    Args:
        parity: int32 resource variable ``[parity_rows, width]``.
        rows: int32 or int64 ``[n]`` parity row ids; may repeat.
        delta: int32 ``[n, width]``, e.g. from a ``sparse_apply_*_with_delta``.
        coef: Non-zero field element, ``1 <= coef < 2**field_bits``.
        field_bits: 16 or 8.
        name: Op name.
        log: A :func:`delta_log` handle on ``parity``'s device: run
            ``ParityUpdateLogged``, which also appends, per distinct parity
            row (ascending), the XOR of every ``coef * delta`` folded into it.
        sid: int64 step id of the logged fold (with ``log``).
        target: int32 id (>= 0) of ``parity`` (with ``log``).
        source: int32 id of the variable the delta came from, -1 for none
            (with ``log``).
        source_seq: int64 seq of the source's apply entry in its own log
            (:func:`delta_log_seq_of`), -1 for none (with ``log``).
        bypass_fence: Fold even if ``sid`` is fenced or committed in the log
            (recovery finishing a step); otherwise such a fold fails with
            ``tf.errors.AbortedError`` and changes nothing.
        dedupe: Fold only the rows the log does not hold yet for
            ``(sid, target, source)``, and nothing of a committed ``sid``
            (recovery finishing a step: running it twice folds once).

    Returns:
        The op in graph mode; ``None`` when executing eagerly.
    """
    if field_bits not in (8, 16):
        raise ValueError(f"field_bits must be 8 or 16, got {field_bits!r}")
    logged = _log_inputs(log, sid, target, bypass_fence, source=source, source_seq=source_seq)
    if logged is not None:
        logged["dedupe"] = bool(dedupe)
    elif dedupe:
        raise ValueError("`dedupe` is only meaningful with `log`")
    op = _ops.ec_rec_parity_update if logged is None else _ops.ec_rec_parity_update_logged
    return op(
        **(logged or {}),
        parity=_handle(parity, "parity"),
        rows=_indices(rows, "rows"),
        delta=tf.convert_to_tensor(delta, dtype=tf.int32, name="delta"),
        coef=tf.convert_to_tensor(coef, dtype=tf.int32, name="coef"),
        field_bits=field_bits,
        name=name,
    )


# --- the delta log ------------------------------------------------------------------------


def delta_log(
    shared_name: str = DEFAULT_DELTA_LOG_NAME, container: str = "", name: Optional[str] = None
) -> tf.Tensor:
    """A handle to the delta log ``shared_name`` of the current device.

    Place it like a variable (``with tf.device(ps_device(p))``): the log is a
    resource of that device's ResourceMgr, created empty by the first op that
    uses it, and every handle with the same ``container`` and
    ``shared_name`` on that device, in any graph or session of the process,
    names the same log. Logged ops consuming it are colocated with it, so it
    must live on the device of the variables they update.

    Args:
        shared_name: Name of the log; non-empty.
        container: ResourceMgr container ("" is the device's default one, which
            outlives sessions on a ``tf.distribute.Server``).
        name: Op name.

    Returns:
        A scalar ``tf.resource`` tensor.
    """
    if not shared_name:
        raise ValueError("the delta log needs a non-empty shared_name")
    return _ops.ec_rec_delta_log_handle(container=container, shared_name=shared_name, name=name)


def assign_add_logged(
    var: VariableLike,
    value: Union[tf.Tensor, object],
    log: tf.Tensor,
    sid: IntLike,
    target: IntLike,
    source: IntLike = -1,
    name: Optional[str] = None,
    bypass_fence: bool = False,
    dedupe: bool = False,
) -> Optional[tf.Operation]:
    """``var += value`` (integers wrap), logging ``bits(old) ^ bits(new)``.

    The variable is seen as a matrix of int32 words (see :func:`as_words`; an
    int64 scalar such as the global step is one row of two words); the entry
    covers all its rows. Works on float32, float64, int32 and int64 variables.

    Args:
        var: Resource variable, on the log's device.
        value: Tensor of ``var``'s shape (converted to its dtype).
        log: A :func:`delta_log` handle.
        sid: int64 step id.
        target: int32 id (>= 0) of ``var``.
        source: int32 id of the variable this one replicates, or -1.
        name: Op name.
        bypass_fence: Add even if ``sid`` is fenced or committed in the log;
            otherwise that fails with ``tf.errors.AbortedError``.
        dedupe: Add nothing if the log holds an entry of ``(sid, target)``
            or ``sid`` was committed here (recovery finishing a step).

    Returns:
        The op in graph mode; ``None`` when executing eagerly.
    """
    handle = _handle(var, "var")
    dtype = getattr(var, "dtype", None)
    if dtype is None:
        raise TypeError("`var` must be a resource variable (its dtype is needed)")
    dtype = tf.as_dtype(dtype).base_dtype
    return _ops.ec_rec_assign_add_logged(
        var=handle,
        value=tf.convert_to_tensor(value, dtype=dtype, name="value"),
        **_log_inputs(log, sid, target, bypass_fence, source=source),
        dedupe=bool(dedupe),
        name=name,
    )


def delta_log_commit(
    log: tf.Tensor, sid: Union[IntLike, Sequence[int]], name: Optional[str] = None, bypass_fence: bool = False
) -> Optional[tf.Operation]:
    """Marks step(s) complete (round 2): drops their entries, remembers them as committed.

    Run it on every log a step touched, after round 1
    (:func:`delta_log_commit_in_order` on the data PS tasks). The log
    remembers the last :data:`DELTA_LOG_COMMITTED_CAPACITY` committed ids.
    A fenced step, or one of an older generation than the log admits, is
    refused with ``tf.errors.AbortedError`` (nothing changes) unless
    ``bypass_fence`` (recovery's own commits).

    Args:
        log: A :func:`delta_log` handle.
        sid: int64 step id, or a vector of them.
        name: Op name.
        bypass_fence: Commit even fenced steps.
    """
    return _ops.ec_rec_delta_log_commit(
        log=_handle(log, "log"), sid=tf.convert_to_tensor(sid, dtype=tf.int64, name="sid"), bypass_fence=bypass_fence, name=name
    )


def delta_log_commit_in_order(
    log: tf.Tensor,
    sid: Union[IntLike, Sequence[int]],
    timeout_ms: int = 60000,
    bypass_fence: bool = False,
    name: Optional[str] = None,
) -> Optional[tf.Operation]:
    """Round 1 of a step's commit, on a data PS: waits for earlier steps, then commits the applies.

    Waits (asynchronously, holding no thread) until no apply entry of
    another step precedes one of ``sid`` on the same variable, then drops
    ``sid``'s apply entries and remembers ``sid`` as data-committed. Fails
    with ``tf.errors.AbortedError`` if ``sid`` is or gets fenced, or is of
    an older generation (unless ``bypass_fence``), or after ``timeout_ms``
    (0: at once, instead of waiting).
    """
    return _ops.ec_rec_delta_log_commit_in_order(
        log=_handle(log, "log"),
        sid=tf.convert_to_tensor(sid, dtype=tf.int64, name="sid"),
        timeout_ms=int(timeout_ms),
        bypass_fence=bypass_fence,
        name=name,
    )


def delta_log_set_generation(log: tf.Tensor, generation: IntLike, name: Optional[str] = None) -> Optional[tf.Operation]:
    """Raises the log's minimum generation: older steps' writes and commits then fail (Aborted)."""
    return _ops.ec_rec_delta_log_set_generation(
        log=_handle(log, "log"), generation=tf.convert_to_tensor(generation, dtype=tf.int64, name="generation"), name=name
    )


def delta_log_seq_of(log: tf.Tensor, sid: IntLike, target: IntLike, name: Optional[str] = None) -> tf.Tensor:
    """The seq of the log's entry of ``(sid, target)``, -1 if none (int64 scalar)."""
    return _ops.ec_rec_delta_log_seq_of(
        log=_handle(log, "log"),
        sid=tf.convert_to_tensor(sid, dtype=tf.int64, name="sid"),
        target=tf.convert_to_tensor(target, dtype=tf.int32, name="target"),
        name=name,
    )


def delta_log_pending(log: tf.Tensor, name: Optional[str] = None):
    """The steps with entries in the log: ``sids`` (int64), ``age_secs`` (float32, of the
    first entry) and ``waiting`` (bool: a round-1 commit of it is waiting)."""
    return _ops.ec_rec_delta_log_pending(log=_handle(log, "log"), name=name)


def delta_log_fence(log: tf.Tensor, sids: Union[IntLike, Sequence[int]], name: Optional[str] = None) -> Optional[tf.Operation]:
    """Fences step(s): later logged updates of ``sids`` on this log fail.

    They raise ``tf.errors.AbortedError`` and change nothing (unless run with
    ``bypass_fence=True``). The op returns once no logged update of ``sids``
    is still being written, so the log's entries of ``sids`` are then final:
    recovery fences the steps it is about to undo or finish, on every
    surviving log, before it reads the logs it acts on. Committing a step id
    lifts its fence (a committed id is refused anyway).
    """
    return _ops.ec_rec_delta_log_fence(log=_handle(log, "log"), sids=tf.convert_to_tensor(sids, dtype=tf.int64, name="sids"), name=name)


def delta_log_drop(log: tf.Tensor, sids: Union[IntLike, Sequence[int]], name: Optional[str] = None) -> Optional[tf.Operation]:
    """Drops the entries of ``sids`` without marking them committed.

    Their updates stay in effect. Prefer :func:`delta_log_commit` to close a
    step after recovery: a committed mark on any log tells a recovery that
    is itself cut and rerun that the step is settled everywhere.
    """
    return _ops.ec_rec_delta_log_drop(log=_handle(log, "log"), sids=tf.convert_to_tensor(sids, dtype=tf.int64, name="sids"), name=name)


def delta_log_read(log: tf.Tensor, name: Optional[str] = None):
    """A consistent snapshot of the log, as tensors; see :func:`parse_delta_log`.

    Returns:
        A namedtuple of 18 outputs: ``seq``, ``sid`` (int64 [m]), ``target``,
        ``source`` (int32 [m]), ``row_splits`` (int64 [m + 1]), ``rows``
        (int64), ``widths`` (int64 [m], words per row), ``deltas`` (int32,
        every entry's [n_i, widths[i]] delta flattened row-major, one after
        another), ``committed`` (int64, oldest first), ``settled_targets``
        (int32) and ``settled_seq`` (int64): per target, the highest seq of an
        entry removed by commit or drop while its update stayed in effect;
        ``fenced`` (int64): fenced step ids not committed since, ascending;
        ``source_seq`` (int64 [m]), ``kinds`` (int32 [m]),
        ``settled_sources``/``settled_source_seq`` (per source, the highest
        source_seq of its folds committed or dropped here),
        ``data_committed`` (int64, round-1 commits) and ``generation``
        (int64 scalar).
    """
    return _ops.ec_rec_delta_log_read(log=_handle(log, "log"), name=name)


def delta_log_undo(
    log: tf.Tensor,
    variables: Union[VariableLike, Sequence[VariableLike]],
    seq: IntLike,
    target: IntLike,
    ordered: bool = True,
    name: Optional[str] = None,
) -> tf.Tensor:
    """Undoes log entry ``seq`` (XORs its delta back) and removes it, atomically.

    Under the variables' exclusive locks and the log's mutex. If the log no
    longer holds the entry (already undone, committed or dropped) nothing
    happens and the result is ``False``, so undoing twice is harmless.

    Args:
        log: A :func:`delta_log` handle on the variables' device.
        variables: The variables of the entry's target, in the order of its
            delta: ``[var, *slots]`` for an apply entry, ``[parity]``,
            ``[replica]`` or ``[counter]`` for the others. A row of the delta
            is split across them as in :func:`xor_rows`.
        seq: The entry's seq.
        target: Its target id; a mismatch is an InvalidArgumentError.
        ordered: Refuse (FailedPreconditionError, nothing changes) while the
            log holds a later entry of ``target`` or a later one was
            committed or dropped. Keep it for an optimizer's var and slots
            (undo in reverse seq order); pass ``False`` for parity and
            replicas, whose XOR folds commute.
        name: Op name.

    Returns:
        bool scalar: whether the entry was there and has been undone.
    """
    if not isinstance(variables, (list, tuple)):
        variables = [variables]
    return _ops.ec_rec_delta_log_undo(
        log=_handle(log, "log"),
        vars=[_handle(v, "variables") for v in variables],
        seq=tf.convert_to_tensor(seq, dtype=tf.int64, name="seq"),
        target=tf.convert_to_tensor(target, dtype=tf.int32, name="target"),
        ordered=ordered,
        name=name,
    )


def route_deltas(
    indices: tf.Tensor,
    delta: tf.Tensor,
    bases: Union[np.ndarray, tf.Tensor],
    chunk_rows: int,
    name: Optional[str] = None,
) -> list[tuple[tf.Tensor, tf.Tensor]]:
    """One apply's deltas split by the parity route each row folds into (one op for all routes).

    Local chunk ``c`` of the data variable holds rows ``[c * chunk_rows, (c + 1) * chunk_rows)``;
    ``bases[j, c]`` is the first row of chunk ``c``'s parity on route ``j``, or -1 when the chunk does
    not fold there.

    Args:
        indices: int32 or int64 ``[n]`` local rows of the data variable.
        delta: int32 ``[n, W]``, from a ``sparse_apply_*_with_delta``.
        bases: int64 ``[routes, chunks]``.
        chunk_rows: Rows per local chunk.
        name: Op name.

    Returns:
        For each route ``j``: (parity rows ``bases[j, c] + row % chunk_rows``, the delta rows), in input order.
    """
    bases = tf.convert_to_tensor(bases, dtype=tf.int64, name="bases")
    num_routes = int(bases.shape[0])
    rows, deltas = _ops.ec_rec_route_deltas(
        indices=_indices(indices, "indices"),
        delta=tf.convert_to_tensor(delta, dtype=tf.int32, name="delta"),
        bases=bases,
        chunk_rows=int(chunk_rows),
        num_routes=num_routes,
        name=name,
    )
    return list(zip(rows, deltas))


def xor_rows(
    variables: Union[VariableLike, Sequence[VariableLike]],
    rows: tf.Tensor,
    delta: tf.Tensor,
    name: Optional[str] = None,
) -> Optional[tf.Operation]:
    """``variables[*][rows[i]] ^= delta[i]`` on the variables' 32-bit words.

    Each variable (float32, int32, float64 or int64) is seen as a matrix of
    int32 words ``[rows, W_v]`` (see :func:`as_words`); the variables must
    have equal row counts and a row of ``delta`` is split across them in
    order: ``[W_0 words of variables[0] | W_1 of variables[1] | ...]``. All of
    them are locked exclusively for the whole op; everything is checked
    before the first write.

    Args:
        variables: One resource variable or a list of distinct ones.
        rows: int32 or int64 ``[n]`` row ids; may repeat.
        delta: int32 ``[n, sum W_v]``.
        name: Op name.
    """
    if not isinstance(variables, (list, tuple)):
        variables = [variables]
    return _ops.ec_rec_xor_rows(
        vars=[_handle(v, "variables") for v in variables],
        rows=_indices(rows, "rows"),
        delta=tf.convert_to_tensor(delta, dtype=tf.int32, name="delta"),
        name=name,
    )


def read_row_words(
    variables: Union[VariableLike, Sequence[VariableLike]],
    start: IntLike,
    count: IntLike,
    name: Optional[str] = None,
) -> tf.Tensor:
    """Rows ``[start, start + count)`` of the variables as int32 words, side by side.

    The variables are seen as in :func:`xor_rows`. ``count == 0`` returns a
    ``[0, 0]`` tensor without looking the variables up, so the read of a
    chunk that is not wanted (lost, uninitialised) costs nothing and fails
    nothing.

    Args:
        variables: One resource variable or a list of distinct ones, of equal row counts.
        start: int64 scalar, first row.
        count: int64 scalar, number of rows.
        name: Op name.
    """
    if not isinstance(variables, (list, tuple)):
        variables = [variables]
    return _ops.ec_rec_read_row_words(
        vars=[_handle(v, "variables") for v in variables],
        start=tf.convert_to_tensor(start, dtype=tf.int64, name="start"),
        count=tf.convert_to_tensor(count, dtype=tf.int64, name="count"),
        name=name,
    )


def combine_rows(coefs: tf.Tensor, parts: Sequence[tf.Tensor], bits: int = 16, name: Optional[str] = None) -> tf.Tensor:
    """``XOR_j coefs[j] * parts[j]`` in GF(2^bits), symbol by symbol (the codec's linear combination).

    Parts whose coefficient is 0 are ignored whatever their shape; the
    others must share one shape ``[n, W]``.

    Args:
        coefs: int32 ``[len(parts)]``.
        parts: int32 matrices.
        bits: 16 (`tf_ecrec.codec`'s field) or 8.
        name: Op name.
    """
    return _ops.ec_rec_combine_rows(
        coefs=tf.convert_to_tensor(coefs, dtype=tf.int32, name="coefs"),
        parts=[tf.convert_to_tensor(p, dtype=tf.int32) for p in parts],
        bits=bits,
        name=name,
    )


def write_row_words(
    variables: Union[VariableLike, Sequence[VariableLike]],
    start: IntLike,
    words: tf.Tensor,
    name: Optional[str] = None,
) -> Optional[tf.Operation]:
    """Writes rows ``[start, start + n)`` of the variables from int32 words (split as in :func:`xor_rows`).

    Args:
        variables: One initialised resource variable or a list of distinct ones, of equal row counts.
        start: int64 scalar, first row.
        words: int32 ``[n, sum W_v]``; empty writes nothing.
        name: Op name.
    """
    if not isinstance(variables, (list, tuple)):
        variables = [variables]
    return _ops.ec_rec_write_row_words(
        vars=[_handle(v, "variables") for v in variables],
        start=tf.convert_to_tensor(start, dtype=tf.int64, name="start"),
        words=tf.convert_to_tensor(words, dtype=tf.int32, name="words"),
        name=name,
    )


# ---- rebuilding while training goes on (ops/cc/kernels/recovery_view.h) ----------------------------


def _vars(variables: Union[VariableLike, Sequence[VariableLike]]) -> list:
    if not isinstance(variables, (list, tuple)):
        variables = [variables]
    return [_handle(v, "variables") for v in variables]


def rebuild_begin_pending(log: tf.Tensor, variable: VariableLike, rows: IntLike, name: Optional[str] = None) -> Optional[tf.Operation]:
    """Marks rows ``[0, rows)`` of ``variable``'s group pending on its PS: lookups wait, updates are refused."""
    return _ops.ec_rec_rebuild_begin_pending(
        log=_handle(log, "log"), var=_handle(variable, "variable"),
        rows=tf.convert_to_tensor(rows, dtype=tf.int64, name="rows"), name=name,
    )


def recovery_view_stats(log: tf.Tensor, name: Optional[str] = None) -> tf.Tensor:
    """int64 [2]: rows pending on the log's PS, rows preserved (saved T0 words) there."""
    return _ops.ec_rec_recovery_view_stats(log=_handle(log, "log"), name=name)


def await_rebuilt_rows(log: tf.Tensor, variable: VariableLike, rows: tf.Tensor, name: Optional[str] = None) -> Optional[tf.Operation]:
    """Finishes once none of ``rows`` of ``variable``'s group is pending (asks the rebuild for them)."""
    rows = tf.convert_to_tensor(rows)
    if rows.dtype not in (tf.int32, tf.int64):
        rows = tf.cast(rows, tf.int64)
    return _ops.ec_rec_await_rebuilt_rows(log=_handle(log, "log"), var=_handle(variable, "variable"), rows=rows, name=name)


def wanted_rows(log: tf.Tensor, variable: VariableLike, lo: IntLike, hi: IntLike, name: Optional[str] = None) -> tf.Tensor:
    """The pending rows of ``variable``'s group in ``[lo, hi)`` that waiting lookups ask for (int64, ascending)."""
    return _ops.ec_rec_wanted_rows(
        log=_handle(log, "log"), var=_handle(variable, "variable"),
        lo=tf.convert_to_tensor(lo, dtype=tf.int64, name="lo"),
        hi=tf.convert_to_tensor(hi, dtype=tf.int64, name="hi"), name=name,
    )


def wait_wanted(log: tf.Tensor, timeout_ms: IntLike, name: Optional[str] = None) -> Optional[tf.Operation]:
    """Finishes once a lookup waits for a pending row on the log's PS, or after ``timeout_ms``."""
    return _ops.ec_rec_wait_wanted(
        log=_handle(log, "log"), timeout_ms=tf.convert_to_tensor(timeout_ms, dtype=tf.int64, name="timeout_ms"), name=name
    )


def install_row_words(
    variables: Union[VariableLike, Sequence[VariableLike]], log: tf.Tensor, rows: tf.Tensor, words: tf.Tensor,
    add: bool = False, name: Optional[str] = None,
) -> tf.Tensor:
    """Writes (``add``: XORs) ``words`` into each of ``rows`` still pending and marks it installed; int64 count."""
    return _ops.ec_rec_install_row_words(
        vars=_vars(variables), log=_handle(log, "log"),
        rows=tf.convert_to_tensor(rows, dtype=tf.int64, name="rows"),
        words=tf.convert_to_tensor(words, dtype=tf.int32, name="words"), add=bool(add), name=name,
    )


def preserve_ranges(log: tf.Tensor, variable: VariableLike, ranges: Any, name: Optional[str] = None) -> Optional[tf.Operation]:
    """From now on the first logged write of a row in ``ranges`` ([m, 2] of [lo, hi)) saves its words first."""
    return _ops.ec_rec_preserve_ranges(
        log=_handle(log, "log"), var=_handle(variable, "variable"),
        ranges=tf.reshape(tf.convert_to_tensor(ranges, dtype=tf.int64, name="ranges"), [-1, 2]), name=name,
    )


def preserve_end(log: tf.Tensor, name: Optional[str] = None) -> Optional[tf.Operation]:
    """Forgets every preserved range and saved row of the log's PS."""
    return _ops.ec_rec_preserve_end(log=_handle(log, "log"), name=name)


def read_preserved_row_words(
    variables: Union[VariableLike, Sequence[VariableLike]], log: tf.Tensor, rows: tf.Tensor, name: Optional[str] = None
) -> tf.Tensor:
    """Rows of the variables as words side by side, each as it was when its range was preserved."""
    return _ops.ec_rec_read_preserved_row_words(
        vars=_vars(variables), log=_handle(log, "log"), rows=tf.convert_to_tensor(rows, dtype=tf.int64, name="rows"), name=name
    )


def as_words(array: np.ndarray) -> np.ndarray:
    """A NumPy array as the int32 word matrix the log ops see: ``[rows, W]``.

    Rows are the first dimension (one row for a scalar); a 64-bit element is
    two words, low word first (little-endian hosts).
    """
    array = np.ascontiguousarray(array)
    if array.dtype.itemsize % 4:
        raise TypeError(f"{array.dtype} elements are not whole 32-bit words")
    rows = 1 if array.ndim == 0 else array.shape[0]
    width = int(np.prod(array.shape[1:], dtype=np.int64)) * array.dtype.itemsize // 4
    return array.reshape(-1).view(np.int32).reshape(rows, width)


APPLY, FOLD, COUNTER = 0, 1, 2
"""Kinds of log entries: an optimizer's apply, a fold into parity or a replica, a counter add."""


@dataclasses.dataclass(frozen=True)
class DeltaLogEntry:
    """One update recorded in a delta log.

    Attributes:
        seq: Append sequence number, increasing within the log.
        sid: Step id.
        target: Id of the updated variable (group).
        source: Id of the variable a folded delta came from, or -1.
        rows: int64 ``[n]``, distinct rows written, ascending.
        delta: int32 ``[n, width]``, the words XORed into each row.
        source_seq: For a fold, the seq of its source apply entry; -1 else.
        kind: :data:`APPLY`, :data:`FOLD` or :data:`COUNTER`.
    """

    seq: int
    sid: int
    target: int
    source: int
    rows: np.ndarray
    delta: np.ndarray
    source_seq: int = -1
    kind: int = 0

    @property
    def width(self) -> int:
        return int(self.delta.shape[1])


@dataclasses.dataclass(frozen=True)
class DeltaLogSnapshot:
    """A parsed :func:`delta_log_read`.

    Attributes:
        entries: In seq order.
        committed: The remembered committed step ids, oldest first.
        settled: target -> highest seq of its entries that left the log by
            commit or drop with their update still in effect.
        fenced: Fenced step ids not committed since, ascending.
        settled_source: source target -> highest source_seq of its folds
            that left this log by commit or drop.
        data_committed: Step ids committed by round 1 here, oldest first.
        generation: The minimum generation the log admits.
    """

    entries: list[DeltaLogEntry]
    committed: np.ndarray
    settled: dict[int, int]
    fenced: np.ndarray
    settled_source: dict[int, int] = dataclasses.field(default_factory=dict)
    data_committed: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros([0], np.int64))
    generation: int = 0

    def sids(self) -> list[int]:
        """Step ids with entries, in the order of their first entry."""
        return list(dict.fromkeys(e.sid for e in self.entries))

    def of_sid(self, sid: int) -> list[DeltaLogEntry]:
        return [e for e in self.entries if e.sid == sid]

    def is_committed(self, sid: int) -> bool:
        """Committed by round 2 here."""
        return bool(np.any(self.committed == sid))

    def is_data_committed(self, sid: int) -> bool:
        """Committed by round 1 here."""
        return bool(np.any(self.data_committed == sid))

    def undoable(self, entry: DeltaLogEntry) -> bool:
        """Whether ``entry`` can be undone with ``ordered=True`` after every
        later entry of its target in this snapshot has been undone."""
        return entry.seq > self.settled.get(entry.target, -1)


def parse_delta_log(values: Sequence[np.ndarray]) -> DeltaLogSnapshot:
    """Parses the fetched outputs of :func:`delta_log_read` (in their order)."""
    if len(values) != 18:
        raise ValueError(f"expected the 18 outputs of delta_log_read, got {len(values)}")
    (
        seq, sid, target, source, splits, rows, widths, deltas, committed, settled_targets, settled_seq, fenced,
        source_seq, kinds, settled_sources, settled_source_seq, data_committed, generation,
    ) = (np.asarray(v) for v in values)
    entries = []
    offset = 0
    for i in range(seq.size):
        entry_rows = rows[splits[i] : splits[i + 1]].astype(np.int64)
        width = int(widths[i])
        size = entry_rows.size * width
        delta = deltas[offset : offset + size].astype(np.int32).reshape(entry_rows.size, width)
        offset += size
        entries.append(
            DeltaLogEntry(
                int(seq[i]), int(sid[i]), int(target[i]), int(source[i]), entry_rows, delta, int(source_seq[i]), int(kinds[i])
            )
        )
    if offset != deltas.size:
        raise ValueError(f"delta_log_read outputs are inconsistent: {deltas.size} delta words, entries use {offset}")
    settled = {int(t): int(s) for t, s in zip(settled_targets, settled_seq)}
    settled_source = {int(t): int(s) for t, s in zip(settled_sources, settled_source_seq)}
    return DeltaLogSnapshot(
        entries, committed.astype(np.int64), settled, fenced.astype(np.int64),
        settled_source, data_committed.astype(np.int64), int(generation),
    )
