"""`serve_without_tf_ecrec`: SavedModels loaded and called in a process that cannot import tf_ecrec.

The process has TensorFlow alone: an import of tf_ecrec fails in it, and so would loading a graph with
one of tf_ecrec's ops (their library is never loaded), so a SavedModel that serves there serves under any
stock loader (TF Serving's takes the same graphs).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

import numpy as np

SERVE = """
import hashlib, json, sys
import numpy as np

class NoTfEcrec:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tf_ecrec":
            raise ImportError(f"{name}: this process serves without tf_ecrec")
        return None

sys.meta_path.insert(0, NoTfEcrec())
import tensorflow as tf

inputs = dict(np.load(sys.argv[1], allow_pickle=True))  # object arrays: serialized tf.Examples
out = {}
for path in sys.argv[2:]:
    loaded = tf.saved_model.load(path)
    serve = loaded.signatures["serving_default"]
    specs = serve.structured_input_signature[1]
    if len(specs) == 1 and len(inputs) == 1:  # one input: fed whatever the signature names it
        (name, spec), = specs.items()
        feed = {name: tf.constant(next(iter(inputs.values())), spec.dtype)}
    else:
        feed = {name: tf.constant(inputs[name], spec.dtype) for name, spec in specs.items()}
    result = serve(**feed)
    variables = {v.name: hashlib.sha256(v.numpy().tobytes()).hexdigest() for v in loaded.variables}
    outputs = {k: (v.numpy().astype(str) if v.dtype == tf.string else v.numpy()).tolist() for k, v in result.items()}
    out[path] = {"outputs": outputs, "variables": variables,
                 "trainable": sorted(hashlib.sha256(v.numpy().tobytes()).hexdigest() for v in getattr(loaded, "trainable_variables", []))}
assert not [m for m in sys.modules if m.split(".")[0] == "tf_ecrec"]
print(json.dumps(out))
"""


def serve_without_tf_ecrec(paths: Sequence[str], inputs: Mapping[str, np.ndarray], scratch: str,
                           timeout: float = 180) -> dict[str, dict]:
    """Each SavedModel in `paths` called once with `inputs` (by signature input name; one input whatever its
    name) in a process without
    tf_ecrec: path -> {"outputs": {name: list}, "variables": {name: sha256}, "trainable": [sha256, ...]}."""
    inputs_path = os.path.join(scratch, "serving_inputs.npz")
    np.savez(inputs_path, **inputs)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", SERVE, inputs_path, *paths], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    served = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(served) == sorted(paths)
    return served


def sha256(value: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()
