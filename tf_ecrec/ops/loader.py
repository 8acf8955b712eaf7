"""Loads ``_ec_ops.so``, refusing one built for another TensorFlow.

The compiled library sits beside this module (built by ``python ops/build.py``,
or by ``pip install``). A process with TensorFlow loads it when it imports
``tf_ecrec`` (:func:`load_if_tensorflow`, called by the package), or when it
imports this module: a parameter server that only *runs* the kernels of a
graph built elsewhere serves them once its script imported ``tf_ecrec`` after
TensorFlow, with no further call. A process without TensorFlow (the command
line, NumPy-only tools reading log snapshots) loads nothing, and the op
wrappers of :mod:`tf_ecrec.ops` call :func:`load_library` when they build
their first op.

Call order and state: the first ``load_library()`` reads ``_build_info.py``,
checks it against the installed TensorFlow (:func:`check_build_info`), loads
the library, registers its ops as having no gradient and caches the module
for the process; later calls return the cached module. If any check fails
it raises :class:`tf_ecrec.errors.OpLibraryError`, which says how to
rebuild, and caches nothing (the next call tries again).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
from types import ModuleType
from typing import Any

import tensorflow as tf

from tf_ecrec.errors import OpLibraryError
from tf_ecrec.ops.build_info import parse_assignments

_LOG = logging.getLogger(__name__)

__all__ = [
    "BUILD_INFO_NAME",
    "LIBRARY_DIR",
    "LIBRARY_NAME",
    "OP_NAMES",
    "REBUILD_HINT",
    "BuildInfo",
    "check_build_info",
    "load_if_tensorflow",
    "load_library",
    "read_build_info",
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
    "EcRec>SparseApplyMomentumWithDelta",
    "EcRec>SparseApplyRMSPropWithDelta",
    "EcRec>SparseApplyCenteredRMSPropWithDelta",
    "EcRec>ParityUpdate",
    "EcRec>SparseApplySgdWithDeltaLogged",
    "EcRec>SparseApplyAdagradWithDeltaLogged",
    "EcRec>SparseApplyLazyAdamWithDeltaLogged",
    "EcRec>SparseApplyFtrlWithDeltaLogged",
    "EcRec>SparseApplyFtrlV2WithDeltaLogged",
    "EcRec>SparseApplyMomentumWithDeltaLogged",
    "EcRec>SparseApplyRMSPropWithDeltaLogged",
    "EcRec>SparseApplyCenteredRMSPropWithDeltaLogged",
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
    "EcRec>DeltaLogTake",
    "EcRec>ParityFoldBatch",
    "EcRec>DeltaLogMarkFolded",
    "EcRec>DeltaLogReady",
    "EcRec>DeltaLogCommitEach",
    "EcRec>DeltaLogCounted",
    "EcRec>DeltaLogIsCommitted",
    "EcRec>XorRows",
    "EcRec>ReadRowWords",
    "EcRec>CombineRows",
    "EcRec>WriteRowWords",
    "EcRec>RebuildBeginPending",
    "EcRec>RebuildForgetPending",
    "EcRec>RecoveryViewStats",
    "EcRec>AwaitRebuiltRows",
    "EcRec>WantedRows",
    "EcRec>WaitWanted",
    "EcRec>InstallRowWords",
    "EcRec>PreserveRanges",
    "EcRec>PreserveEnd",
    "EcRec>ReadPreservedRowWords",
)
"""Registered names of the ops in ``_ec_ops.so`` (those :mod:`tf_ecrec.ops` wraps)."""


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


def check_build_info(info: BuildInfo, installed_tf_version: str | None = None) -> None:
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
_library: ModuleType | None = None
_import_load_tried = False


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


def load_library(directory: str | None = None) -> ModuleType:
    """Loads the op library, checking it against the installed TensorFlow.

    Args:
        directory: ``None`` (the default) loads the library beside this module,
            once per process, and caches it; the wrappers' first op does
            this. An explicit directory is checked and loaded on every call,
            uncached (for tools and tests).

    Returns:
        The module of generated op functions.

    Raises:
        OpLibraryError: If the library or its build info is missing, it was
            built for another TensorFlow, or TensorFlow cannot load it.
    """
    global _library
    if directory is not None:
        return _load(directory)
    if _library is not None:
        return _library
    with _lock:
        if _library is None:
            module = _load(LIBRARY_DIR)
            for op_name in OP_NAMES:
                try:
                    tf.no_gradient(op_name)
                except KeyError:  # already registered by an earlier load (module reload)
                    pass
            _library = module
        return _library


def load_if_tensorflow() -> None:
    """Loads the library if this process has imported TensorFlow; a library that fails to load is
    logged, not raised (the first op built raises `OpLibraryError`, and a chief names a PS without the
    kernels with `tf_ecrec.errors.PSKernelsMissing`): importing ``tf_ecrec`` never fails for it."""
    global _import_load_tried
    if "tensorflow" not in sys.modules or _import_load_tried:
        return
    _import_load_tried = True  # once per process (the package and this module both ask)
    try:
        load_library()
    except OpLibraryError as exc:
        _LOG.warning("tf_ecrec's op library is not loaded; this process cannot run or serve its ops: %s", exc)


def call_op(op: str, logged: dict[str, Any] | None = None, **inputs: Any) -> Any:
    """Builds (eagerly, runs) the library's op function ``op``, loading the library.

    Args:
        op: The generated function's name, e.g. ``"ec_rec_parity_update"``.
        logged: The logged variant's inputs and attrs
            (:func:`tf_ecrec.ops._inputs.log_inputs`): call ``op + "_logged"``
            with them; ``None`` calls ``op``.
        **inputs: The op's inputs and attrs.

    Returns:
        What the generated function returns.
    """
    function = getattr(load_library(), op if logged is None else f"{op}_logged")
    return function(**(logged or {}), **inputs)


load_if_tensorflow()  # importing this module imported TensorFlow: serve the kernels from now on
