"""The examples' plain Estimator scripts, run as a user runs them: ``python estimator_examples/X.py``.

The DLRM script runs in an interpreter of its own, exactly as a user starts it; the others are forked
from the session's server (`harness.zygote`: the same file run as ``__main__`` with the same
arguments and environment, TensorFlow's import already done).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import tensorflow as tf
from harness import zygote

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _script(name: str, *args: str, forked: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    argv = [sys.executable, os.path.join(REPO, "estimator_examples", f"{name}.py"), *args]
    if forked:
        return zygote.run(argv, env=env, timeout=600)
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, check=False)


@pytest.mark.parametrize(
    ("name", "extra"), [("dlrm", []), ("dcn", ["--table-rows", "1000"])]
)
def test_a_script_alone_trains_to_its_step_count_and_checkpoints(tmp_path, name, extra):
    model_dir = str(tmp_path / name)
    done = _script(name, "--steps", "12", "--batch-size", "32", "--model-dir", model_dir, "--checkpoint-steps", "6", *extra,
                   forked=name != "dlrm")
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint = tf.train.latest_checkpoint(model_dir)
    assert checkpoint is not None and checkpoint.endswith("-12")
    assert int(tf.train.load_variable(checkpoint, "global_step")) == 12


def test_a_script_names_a_bad_data_flag_and_fails(tmp_path):
    done = _script("dlrm", "--steps", "2", "--model-dir", str(tmp_path / "m"), "--data", "parquet:/x")
    assert done.returncode != 0
    assert "--data must be synthetic or criteo:PATH, got 'parquet:/x'" in done.stderr
