"""When the op library is loaded: at ``import tf_ecrec`` in a TensorFlow process, else on the first op built.

Each case runs in a fresh interpreter (this test process has long loaded the
library), and looks at the loader's handle and at the process's memory map.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np

from tf_ecrec import ops as ec_ops
from tf_ecrec.ops.log_snapshot import EntryKind, parse_delta_log

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MAPPED = textwrap.dedent(
    """
    def mapped():
        with open("/proc/self/maps") as fh:
            return "_ec_ops.so" in fh.read()
    """
)


def _run(code: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO_ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    result = subprocess.run(
        [sys.executable, "-c", MAPPED + textwrap.dedent(code)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def _snapshot_outputs() -> list[np.ndarray]:
    """The 18 outputs of delta_log_read for two entries, worked by hand.

    Entry seq 5 (sid 7, an apply of target 0): rows [2, 4], width 1, words
    [[3], [-1]]. Entry seq 6 (sid 7, a fold into target 1 from target 0,
    source_seq 5): row [0], width 2, words [[1, 2]].
    """
    return [
        np.array([5, 6], np.int64),  # seq
        np.array([7, 7], np.int64),  # sid
        np.array([0, 1], np.int32),  # target
        np.array([-1, 0], np.int32),  # source
        np.array([0, 2, 3], np.int64),  # row_splits
        np.array([2, 4, 0], np.int64),  # rows
        np.array([1, 2], np.int64),  # widths
        np.array([3, -1, 1, 2], np.int32),  # deltas
        np.array([4], np.int64),  # committed
        np.array([0], np.int32),  # settled_targets
        np.array([3], np.int64),  # settled_seq
        np.array([9], np.int64),  # fenced
        np.array([-1, 5], np.int64),  # source_seq
        np.array([0, 1], np.int32),  # kinds
        np.array([0], np.int32),  # settled_sources
        np.array([2], np.int64),  # settled_source_seq
        np.array([], np.int64),  # data_committed
        np.array(11, np.int64),  # generation
    ]


def test_parse_delta_log_by_hand() -> None:
    snapshot = parse_delta_log(_snapshot_outputs())
    apply_entry, fold = snapshot.entries
    assert apply_entry.kind is EntryKind.APPLY and fold.kind is EntryKind.FOLD
    np.testing.assert_array_equal(apply_entry.rows, [2, 4])
    np.testing.assert_array_equal(apply_entry.delta, [[3], [-1]])
    np.testing.assert_array_equal(fold.delta, [[1, 2]])
    assert (fold.source, fold.source_seq, fold.width) == (0, 5, 2)
    assert snapshot.sids() == [7]
    assert snapshot.is_committed(4) and not snapshot.is_committed(7)
    assert snapshot.settled == {0: 3} and snapshot.settled_source == {0: 2}
    assert snapshot.undoable(apply_entry)  # seq 5 > settled 3
    assert snapshot.generation == 11


def test_log_snapshot_works_without_tensorflow_or_the_library() -> None:
    out = _run(
        """
        import sys
        import numpy as np
        from tf_ecrec.ops.log_snapshot import EntryKind, as_words, parse_delta_log

        words = as_words(np.array([1.0, 2.0], np.float64))
        assert words.shape == (2, 2) and words.dtype == np.int32
        values = [np.array(v) for v in (
            [5], [7], [0], [-1], [0, 1], [2], [1], [3], [], [], [], [], [-1], [2], [], [], [], 0)]
        snapshot = parse_delta_log(values)
        assert snapshot.entries[0].kind is EntryKind.COUNTER
        assert "tensorflow" not in sys.modules, "log_snapshot imported TensorFlow"
        assert "tf_ecrec.ops.loader" not in sys.modules, "log_snapshot imported the loader"
        assert not mapped()
        print("ok")
        """
    )
    assert out.strip().endswith("ok")


def test_importing_tf_ecrec_after_tensorflow_loads_the_library() -> None:
    # What a user's PS process does (issue 30, the upgrade case): no further call serves the kernels.
    out = _run(
        """
        import tensorflow as tf
        assert not mapped()
        import tf_ecrec
        from tf_ecrec.ops import loader
        assert loader._library is not None and mapped()
        from tensorflow.python.framework import op_def_registry
        assert op_def_registry.get("EcRec>ReadRowWords") is not None  # registered: a server runs its kernel
        print("ok")
        """
    )
    assert out.strip().endswith("ok")


def test_importing_tf_ecrec_without_tensorflow_loads_nothing() -> None:
    out = _run(
        """
        import sys
        import tf_ecrec, tf_ecrec.ops
        assert "tensorflow" not in sys.modules, "import tf_ecrec imported TensorFlow"
        assert "tf_ecrec.ops.loader" not in sys.modules and not mapped()
        import tensorflow as tf
        from tf_ecrec import ops as ec_ops
        with tf.Graph().as_default():
            ec_ops.delta_log()  # the first op built loads it
        assert ec_ops.load_library() is sys.modules["tf_ecrec.ops.loader"]._library and mapped()
        print("ok")
        """
    )
    assert out.strip().endswith("ok")


def test_facade_names_resolve_to_their_modules() -> None:
    for name in ec_ops.__all__:
        assert getattr(ec_ops, name) is not None
    assert ec_ops.parity_update.__module__ == "tf_ecrec.ops.parity"
    assert ec_ops.EntryKind is EntryKind
    try:
        ec_ops.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("an unknown name resolved")
