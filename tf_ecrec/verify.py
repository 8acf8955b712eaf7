"""Check, from the live PS tasks, that every parity and replica equals the code of what it protects.

This is invariant 1 made observable: read data, slots, parity and replicas
(`tf_ecrec.inspect`), re-encode every stripe with `tf_ecrec.codec`, compare
bit for bit.  Run it when no step is in flight (after training, or with the
job paused): a step in flight has applied its data update and not yet its
parity update, which is not a mismatch but looks like one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from tf_ecrec import codec, placement

_LOG = logging.getLogger(__name__)


def redundancy_names(ec_meta: Mapping[str, Any]) -> set[str]:
    """Names of the parity and replica variables (what a model digest leaves out)."""
    names = {name for c in ec_meta.get("collections", []) for name in c["parity"].values()}
    names |= {name for reps in ec_meta.get("replicas", {}).values() for name in reps}
    return names


def check_parity(ec_meta: Mapping[str, Any], values: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Compares every stripe's parity and every replica with the code of its data.

    Returns:
      {"stripes_checked", "rows_checked", "mismatches", "replicas_checked",
       "replica_mismatches", "mismatched": [first few descriptions]}.
    """
    k, r = ec_meta["code"]
    code = codec.Code(k, r)
    stripes = rows_checked = mismatches = 0
    mismatched: list[str] = []
    for coll in ec_meta.get("collections", []):
        layout = placement.Layout.from_json(coll["layout"]).table(coll["name"])
        c = layout.chunk_rows
        bits = {}
        for p, name in coll["data"].items():
            parts = [values[name]] + [values[s] for s in coll["slots"][p]]
            bits[int(p)] = np.ascontiguousarray(np.concatenate(parts, axis=1)).view(np.int32)
        for stripe in layout.stripes:
            data = [bits[dc.ps][slice(*layout.local_rows(dc))] for dc in stripe.data]
            expected = codec.encode(code, data)
            for pc in stripe.parity:
                actual = values[coll["parity"][str(pc.ps)]][slice(*layout.local_rows(pc))]
                bad = np.any(actual != expected[pc.position], axis=1)
                if bad.any():
                    mismatches += int(bad.sum())
                    if len(mismatched) < 5:
                        mismatched.append(
                            f"{coll['name']} stripe {stripe.index} parity {pc.position} on ps:{pc.ps}: "
                            f"{int(bad.sum())} rows differ (first: row {int(np.flatnonzero(bad)[0])})"
                        )
            stripes += 1
            rows_checked += c
    replicas = replica_mismatches = 0
    for name, reps in ec_meta.get("replicas", {}).items():
        slots = ec_meta.get("replica_slots", {}).get(name, [])
        primary = values[name]
        if primary.ndim == 0:
            expected = primary
        else:
            rows = primary.shape[0]
            expected = np.concatenate([values[v].reshape(rows, -1) for v in [name, *slots]], axis=1).view(np.int32)
        for rep in reps:
            replicas += 1
            if not np.array_equal(np.asarray(values[rep]), expected):
                replica_mismatches += 1
                if len(mismatched) < 5:
                    mismatched.append(f"replica {rep} differs from {name}")
    return {
        "stripes_checked": stripes,
        "rows_checked": rows_checked,
        "mismatches": mismatches,
        "replicas_checked": replicas,
        "replica_mismatches": replica_mismatches,
        "mismatched": mismatched,
    }
