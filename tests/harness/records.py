"""The e2e tests' one check that every record of a finished dataset was trained into the model.

The master's counters alone cannot tell it: ``records_trained - records_retrained == records_total``
holds for any finished dataset, also when a restore's data rollback never reached the master and
acknowledged records are in no model (issue 30, case 1).  The report's model-side bound
(`tf_ecrec.launcher.data_report`: the model's global step times the batch size) must cover every
record: ``records_lost_from_model == 0``.
"""

from __future__ import annotations

from typing import Any


def assert_every_record_in_model(report: dict[str, Any]) -> dict[str, Any]:
    """Asserts the dataset finished with no record given up, acknowledged once beyond the retrained
    ones, and that the model's steps can hold every record; returns the report's data section."""
    data = report["data"]
    assert data["finished"] and data["records_failed"] == 0, data
    assert data["records_trained"] - data["records_retrained"] == data["records_total"], data  # the master's side
    # The model's side: its global step (restored with it by every recovery) bounds what it holds.
    assert data["records_in_model_max"] == report["global_step"] * report["config"]["batch_size"], (report["global_step"], data)
    assert data["records_lost_from_model"] == 0, f"acknowledged records in no model: {data}"
    return data
