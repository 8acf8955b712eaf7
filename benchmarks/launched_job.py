"""A `tf-ecrec run` job started by a benchmark: run it, fail loudly, return its report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any


def run(flags: Sequence[str], model_dir: str, what: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Runs ``tf-ecrec run --model-dir MODEL_DIR --quiet FLAGS``; the report, with ``wall_seconds`` added.

    Raises:
      SystemExit: the job failed; the message names `what`, the command and the end of its stderr.
    """
    cmd = [sys.executable, "-m", "tf_ecrec.cli", "run", "--model-dir", model_dir, "--quiet", *flags]
    started = time.time()
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, **(env or {})})
    if result.returncode != 0:
        raise SystemExit(f"{what} failed ({' '.join(cmd)}):\n{result.stderr[-4000:]}")
    with open(os.path.join(model_dir, "report.json"), encoding="utf-8") as fh:
        report: dict[str, Any] = json.load(fh)
    report["wall_seconds"] = time.time() - started
    if not os.environ.get("TF_ECREC_BENCH_KEEP_CHECKPOINTS"):
        # A run's checkpoints (its report keeps what they showed): at 1.3 GB of tables a sweep of checkpointed
        # configurations leaves tens of GB otherwise, enough to fill a disk and fail the next job's final save.
        for name in os.listdir(model_dir):
            if name.startswith("model.ckpt-"):
                os.remove(os.path.join(model_dir, name))
    return report
