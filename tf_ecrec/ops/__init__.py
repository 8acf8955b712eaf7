"""TensorFlow ops that keep erasure-code parity in step with embedding updates.

The ops live in the compiled library ``_ec_ops.so`` beside this package
(built by ``python ops/build.py``, or by ``pip install``). One module per idea:

    loader         loads the library on first use, refusing one built for
                   another TensorFlow (OpLibraryError says how to rebuild)
    apply          sparse optimizer updates that return their bitwise delta
    apply_momentum the same for the rules with a momentum slot (Momentum,
                   RMSProp)
    parity         folding deltas into parity; routing them to parity chunks
    delta_log_ops  the per-PS delta log: logged updates, fence, commit, undo
    batched_fold   a fold round: many steps' applies taken, folded, committed
    row_words      rows of variables as int32 words: XOR, read, combine, write
    recovery_view  rebuilding lost rows while training goes on
    log_snapshot   NumPy only: parsing a log snapshot, the word view of arrays

This package is a facade of names, and importing it loads nothing (not even
TensorFlow): ``from tf_ecrec import ops as ec_ops`` then
``ec_ops.parity_update(...)`` imports the owning module on first access
(the table below; mypy reads the same names from their modules), and the library is loaded when the first op is built
(:func:`load_library`). Callers may use either the facade or the modules;
:mod:`tf_ecrec.ops.log_snapshot` can be imported without TensorFlow.

A process that only *runs* the ops, such as a parameter server executing
the kernels of a graph built elsewhere, must register them before serving by
calling ``tf_ecrec.ops.load_library()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

_LAZY = {
    "BUILD_INFO_NAME": "loader",
    "BuildInfo": "loader",
    "LIBRARY_DIR": "loader",
    "LIBRARY_NAME": "loader",
    "OP_NAMES": "loader",
    "check_build_info": "loader",
    "load_library": "loader",
    "read_build_info": "loader",
    "lazy_adam_learning_rate": "apply",
    "sparse_apply_adagrad_with_delta": "apply",
    "sparse_apply_adam_with_delta": "apply",
    "sparse_apply_ftrl_with_delta": "apply",
    "sparse_apply_sgd_with_delta": "apply",
    "sparse_apply_centered_rms_prop_with_delta": "apply_momentum",
    "sparse_apply_momentum_with_delta": "apply_momentum",
    "sparse_apply_rms_prop_with_delta": "apply_momentum",
    "parity_update": "parity",
    "route_deltas": "parity",
    "DEFAULT_DELTA_LOG_NAME": "delta_log_ops",
    "DELTA_LOG_COMMITTED_CAPACITY": "delta_log_ops",
    "assign_add_logged": "delta_log_ops",
    "delta_log": "delta_log_ops",
    "delta_log_commit": "delta_log_ops",
    "delta_log_commit_in_order": "delta_log_ops",
    "delta_log_drop": "delta_log_ops",
    "delta_log_fence": "delta_log_ops",
    "delta_log_pending": "delta_log_ops",
    "delta_log_read": "delta_log_ops",
    "delta_log_seq_of": "delta_log_ops",
    "delta_log_set_generation": "delta_log_ops",
    "delta_log_undo": "delta_log_ops",
    "delta_log_commit_each": "batched_fold",
    "delta_log_counted": "batched_fold",
    "delta_log_is_committed": "batched_fold",
    "delta_log_mark_folded": "batched_fold",
    "delta_log_ready": "batched_fold",
    "delta_log_take": "batched_fold",
    "parity_fold_batch": "batched_fold",
    "combine_rows": "row_words",
    "read_row_words": "row_words",
    "write_row_words": "row_words",
    "xor_rows": "row_words",
    "await_rebuilt_rows": "recovery_view",
    "install_row_words": "recovery_view",
    "preserve_end": "recovery_view",
    "preserve_ranges": "recovery_view",
    "read_preserved_row_words": "recovery_view",
    "rebuild_begin_pending": "recovery_view",
    "rebuild_forget_pending": "recovery_view",
    "recovery_view_stats": "recovery_view",
    "wait_wanted": "recovery_view",
    "wanted_rows": "recovery_view",
    "DeltaLogEntry": "log_snapshot",
    "DeltaLogSnapshot": "log_snapshot",
    "EntryKind": "log_snapshot",
    "as_words": "log_snapshot",
    "parse_delta_log": "log_snapshot",
}
"""Public name -> the module of this package that owns it."""

__all__ = [*_LAZY]

if TYPE_CHECKING:  # the same names, typed for mypy (tests/unit/test_owners.py keeps the two in step)
    from tf_ecrec.ops.apply import (
        lazy_adam_learning_rate,
        sparse_apply_adagrad_with_delta,
        sparse_apply_adam_with_delta,
        sparse_apply_ftrl_with_delta,
        sparse_apply_sgd_with_delta,
    )
    from tf_ecrec.ops.apply_momentum import (
        sparse_apply_centered_rms_prop_with_delta,
        sparse_apply_momentum_with_delta,
        sparse_apply_rms_prop_with_delta,
    )
    from tf_ecrec.ops.batched_fold import (
        delta_log_commit_each,
        delta_log_counted,
        delta_log_is_committed,
        delta_log_mark_folded,
        delta_log_ready,
        delta_log_take,
        parity_fold_batch,
    )
    from tf_ecrec.ops.delta_log_ops import (
        DEFAULT_DELTA_LOG_NAME,
        DELTA_LOG_COMMITTED_CAPACITY,
        assign_add_logged,
        delta_log,
        delta_log_commit,
        delta_log_commit_in_order,
        delta_log_drop,
        delta_log_fence,
        delta_log_pending,
        delta_log_read,
        delta_log_seq_of,
        delta_log_set_generation,
        delta_log_undo,
    )
    from tf_ecrec.ops.loader import (
        BUILD_INFO_NAME,
        LIBRARY_DIR,
        LIBRARY_NAME,
        OP_NAMES,
        BuildInfo,
        check_build_info,
        load_library,
        read_build_info,
    )
    from tf_ecrec.ops.log_snapshot import DeltaLogEntry, DeltaLogSnapshot, EntryKind, as_words, parse_delta_log
    from tf_ecrec.ops.parity import parity_update, route_deltas
    from tf_ecrec.ops.recovery_view import (
        await_rebuilt_rows,
        install_row_words,
        preserve_end,
        preserve_ranges,
        read_preserved_row_words,
        rebuild_begin_pending,
        rebuild_forget_pending,
        recovery_view_stats,
        wait_wanted,
        wanted_rows,
    )
    from tf_ecrec.ops.row_words import combine_rows, read_row_words, write_row_words, xor_rows


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
