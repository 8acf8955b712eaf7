"""The report's ``data`` section: the master's counters of the run's dataset, and the model's side of them.

The master counts acknowledgements: ``records_trained - records_retrained == records_total`` holds
for any finished dataset, whether or not the model still holds what was acknowledged (a restore
whose data rollback never reached the master leaves acknowledged records in no model, and the
counters still add up).  The evidence of what the model holds is the model's own: its global step,
a variable every step counts once, saved and restored with every other (checkpoint, flash snapshot,
parity and replicas, settlement's undo of a cut step).  A step trains one batch of at most
``batch_size`` records, so

    records in the model  <=  global_step * batch_size          (``records_in_model_max``)

and every record of the dataset can be in the model only if that bound reaches ``records_total``:

    records_lost_from_model = max(0, records_total - global_step * batch_size)

is a lower bound on the acknowledged records that are in no model.  It is sound (never more than
the truth: a step with a short batch, or a step counted that settlement undid while a later one
kept its count, only makes the bound looser) and it is 0 in a correct run.  It is not exact: records
trained twice in the model (a worker's requeued records, a rollback to an older saved progress)
can hide as many missing ones; docs/flash.md, "Every record in the model".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast


def records_lost_from_model(records_total: int, global_step: int, batch_size: int) -> int:
    """At least this many of `records_total` records are in no model of `global_step` steps of
    at most `batch_size` records each (module docstring)."""
    return max(0, int(records_total) - int(global_step) * int(batch_size))


def data_section(
    done_reports: Mapping[str, Mapping[str, Any]],
    data_state: Any = None,
    failures: Sequence[Mapping[str, Any]] = (),
    global_step: int | None = None,
    batch_size: int | None = None,
) -> dict[str, Any]:
    """The report's ``data`` (see `tf_ecrec.launcher.report`); the model's side needs `global_step`
    (the model's at the end) and `batch_size` (the most records one step trains)."""
    corrupt = int(sum(int(r.get("corrupt_records", 0)) for r in done_reports.values()))
    if data_state is None:
        return {
            "records_trained": int(sum(int(r.get("records", 0)) for r in done_reports.values())),
            "corrupt_records": corrupt,
        }
    in_flight = [f.get("records_in_flight") for f in failures]
    data = {
        "records_total": int(data_state.records_total),
        "records_trained": int(data_state.records_trained),
        "records_retrained": int(data_state.records_retrained),
        "records_requeued": int(data_state.records_requeued),
        "records_failed": int(data_state.records_failed),
        "shards_failed": int(data_state.shards_failed),
        "finished": bool(data_state.finished),
        "corrupt_records": corrupt,
        "failures": [dict(f) for f in failures],
        "records_in_flight_at_failures": None if None in in_flight else int(sum(cast("list[int]", in_flight))),
    }
    if global_step is not None and batch_size:
        data["records_in_model_max"] = int(global_step) * int(batch_size)
        data["records_lost_from_model"] = records_lost_from_model(data_state.records_total, global_step, batch_size)
    return data
