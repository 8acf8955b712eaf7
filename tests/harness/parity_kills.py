"""What a deterministic launched job whose PS were killed must show, against the same job with no failure."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from tf_ecrec.step.batched_commit import BOUND_FACTOR, EVERY

NOT_DURABLE_BOUND = BOUND_FACTOR * EVERY
"""Returned steps of a trainer not yet durable, at most (tf_ecrec.step.batched_commit): what a failure may undo."""


def assert_rebuilt_by_parity_to_the_same_bytes(report: dict[str, Any], err: str, reference_sha256: str,
                                               killed: Sequence[int], model_dir: str, moved: bool,
                                               trainers: int = 1) -> None:
    """Each killed PS (in order) was rebuilt from parity, with no rollback and no checkpoint read, and the
    job ended with the reference's bytes in every variable; `moved`: each came back at a new address."""
    assert [rec["task"] for rec in report["recovery"]] == [f"ps:{i}" for i in killed], report["recovery"]
    for i, rec in zip(killed, report["recovery"]):
        assert rec["method"] == "parity" and rec["steps_rolled_back"] == 0, rec
        # Settlement undid only returned steps that were not durable (folds batched over steps: at most
        # the bound per trainer), which the report counts; nothing else went back.
        assert rec["steps_undone"] <= NOT_DURABLE_BOUND * trainers, rec
        assert rec["resumed_from_step"] + rec["steps_undone"] >= rec["killed_at_step"] and rec["bytes_rebuilt"] > 0, rec
        assert 0 < rec["rebuild_seconds"] < rec["seconds_to_resume"], rec
        assert f"recovered lost PS [{i}] by parity" in err
        if moved:
            assert rec["address"] != "same" and rec["failovers"] >= 1, rec
    with open(os.path.join(model_dir, "logs", "chief-0.log"), encoding="utf-8") as fh:
        assert "Restoring parameters from" not in fh.read()
    assert report["variables_sha256"] == reference_sha256, killed
