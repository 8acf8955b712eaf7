"""At session creation, before anything trains: does every PS task serve the op library's kernels?

A PS process is a plain TensorFlow server; it runs the ``EcRec>...`` kernels of the chief's graph
only if it loaded the op library (``import tf_ecrec`` after TensorFlow, or
``tf_ecrec.ops.load_library()``).  One that did not fails the chief's first call on it with
TensorFlow's "Op type not registered ... in binary running on <host>", which names a host (every
local task shares it) and not what to do.  `PSKernelsCheck` runs one small op of the library on
every PS in one call first; when that fails so, it asks each PS alone and raises
`PSKernelsMissing` naming those without the kernels.

Lifecycle: build it with the graph (its ops must exist before the graph is finalized); `run` it on
the chief's new session before the first call that touches the PS (`tf_ecrec.recovery.scaffold`
does, before `RecoveryPlan.prepare`).
"""

from __future__ import annotations

import re

import tensorflow as tf

from tf_ecrec import ops as ec_ops
from tf_ecrec.errors import PSKernelsMissing

_UNREGISTERED = "Op type not registered"


class PSKernelsCheck:
    """One probe per PS: the pending steps of its delta log (an op of the library, on that PS).

    Args:
      devices: PS task -> a device string on it (where its protected variables are).
    """

    def __init__(self, devices: dict[int, str]) -> None:
        self._probes: dict[int, tf.Tensor] = {}
        with tf.name_scope("ec_kernels_check"):
            for p, device in sorted(devices.items()):
                with tf.device(device):
                    self._probes[p] = ec_ops.delta_log_pending(ec_ops.delta_log(), name=f"ps{p}")[0]
        self._devices = dict(devices)

    def run(self, sess: tf.compat.v1.Session) -> None:
        """Returns when every PS serves the kernels (one call); raises `PSKernelsMissing` otherwise.

        Raises:
          PSKernelsMissing: names each PS task whose server lacks the kernels, and what to do.
        """
        try:
            sess.run(list(self._probes.values()))
            return
        except tf.errors.NotFoundError as exc:
            if _UNREGISTERED not in str(exc):
                raise
            first = exc
        missing = [p for p, probe in sorted(self._probes.items()) if not self._serves(sess, probe)]
        tasks = ", ".join(f"/job:ps/task:{p}" for p in missing) or "a PS task (it answered the second time)"
        op = found.group(1) if (found := re.search(r"Op type not registered '([^']+)'", str(first))) else "EcRec>..."
        raise PSKernelsMissing(
            f"{tasks} serve(s) without tf_ecrec's kernels (TensorFlow: op type {op!r} not registered there); rule: "
            "every PS process loads tf_ecrec's op library before it serves: `import tf_ecrec` after `import "
            "tensorflow` in the PS's script (or call tf_ecrec.ops.load_library()), with the tf_ecrec this chief "
            "runs; restart those PS tasks; source: the chief's session creation, before any step"
        ) from first

    @staticmethod
    def _serves(sess: tf.compat.v1.Session, probe: tf.Tensor) -> bool:
        try:
            sess.run(probe)
        except tf.errors.NotFoundError as exc:
            if _UNREGISTERED in str(exc):
                return False
            raise
        return True
