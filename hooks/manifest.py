"""A hook that writes the manifest of the model's variables when the graph is built.

The manifest (name, dtype, shape, device of every global variable, slots and
global step included) is what `tf_ecrec.check.live_cluster` needs to read the variables
back from the PS tasks without the model's code; with erasure-coded
protection it also describes which variables are parity and replicas of
which (``"ec"``), for `tf_ecrec.check.verify`.  Run it on the chief.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_ecrec.check.live_cluster import variable_records, write_manifest
from tf_ecrec.step.optimizer import protectors


class VariableManifestHook(tf.compat.v1.train.SessionRunHook):
    """Writes the manifest to `path` in `begin` (the graph is complete, not yet finalized).

    Args:
      path: the JSON file to write (atomically).
      **extra: more top-level fields for the manifest (e.g. ``ps=[...]``).
    """

    def __init__(self, path: str, **extra: Any) -> None:
        self._path = path
        self._extra = extra

    def begin(self) -> None:
        extra = dict(self._extra)
        # An ECOptimizer registers itself here; its description says which variables
        # are parity and replicas of which (tf_ecrec.check.verify reads it).
        built = protectors()
        if built:
            extra["ec"] = built[-1].describe()
        write_manifest(self._path, variable_records(tf.compat.v1.global_variables()), **extra)
