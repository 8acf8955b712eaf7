"""Check, from the live PS tasks, that every parity and replica equals the code of what it protects.

This is invariant 1 made observable: read data, slots, parity and replicas
(`tf_ecrec.check.live_cluster`), re-encode every stripe with `tf_ecrec.erasure.codec`, compare
bit for bit.  Run it when no step is in flight (after training, or with the
job paused): a step in flight has applied its data update and not yet its
parity update, which is not a mismatch but looks like one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from tf_ecrec.check import live_cluster
from tf_ecrec.check.live_cluster import ArrayReader
from tf_ecrec.erasure import codec
from tf_ecrec.layout import placement
from tf_ecrec.layout.stripe_encoding import np_row_words

_LOG = logging.getLogger(__name__)


def redundancy_names(ec_meta: Mapping[str, Any]) -> set[str]:
    """Names of the parity and replica variables (what a model digest leaves out)."""
    names = {name for c in ec_meta.get("collections", []) for name in c["parity"].values()}
    names |= {name for reps in ec_meta.get("replicas", {}).values() for name in reps}
    return names


def check_parity(ec_meta: Mapping[str, Any], source: Any, budget: int | None = None) -> dict[str, Any]:
    """Compares every stripe's parity and every replica with the code of its data.

    Args:
      ec_meta: the protection's description (`ECOptimizer.describe`, the manifest's ``"ec"``).
      source: the variables: a mapping of name to array, or a `tf_ecrec.check.live_cluster.PsReader`
        on the live PS tasks.
      budget: bytes read per call (default `tf_ecrec.check.live_cluster.READ_BYTES`): stripes are
        checked a bounded group of rows at a time, so a model of many GB is verified in
        a few hundred MB.

    Returns:
      {"stripes_checked", "rows_checked", "mismatches", "replicas_checked",
       "replica_mismatches", "mismatched": [first few descriptions]}.
    """
    reader = ArrayReader(source) if isinstance(source, Mapping) else source
    budget = budget or live_cluster.READ_BYTES
    k, r = ec_meta["code"]
    code = codec.Code(k, r)
    stripes = rows_checked = mismatches = 0
    mismatched: list[str] = []
    for coll in ec_meta.get("collections", []):
        layout = placement.Layout.from_json(coll["layout"]).table(coll["name"])
        c = layout.chunk_rows
        names = {int(p): [name, *coll["slots"][p]] for p, name in coll["data"].items()}
        data_ps = {name: int(p) for p, name in coll["data"].items()}  # data variable -> its PS
        row_bytes = sum(int(np.prod(reader.shape(n)[1:])) * reader.dtype(n).itemsize for n in next(iter(names.values())))
        # Units of work: (stripe, first row, end row) within its chunks, grouped under the budget.
        span = max(1, budget // max(1, row_bytes * (k + r)))
        groups: list[list[tuple[Any, int, int]]] = [[]]
        grouped = 0
        for stripe in layout.stripes:
            for lo in range(0, c, span):
                hi = min(lo + span, c)
                if grouped + hi - lo > span:
                    groups.append([])
                    grouped = 0
                groups[-1].append((stripe, lo, hi))
                grouped += hi - lo
        for group in groups:
            # One request per variable: the rows of every chunk of the group it holds, in group order.
            rows: dict[str, list[np.ndarray]] = {}
            where: dict[tuple[int, int], tuple[str, int, int]] = {}  # (unit, chunk index) -> (variable, offset, rows)
            for u, (stripe, lo, hi) in enumerate(group):
                for chunk in stripe.chunks:
                    first, _ = layout.local_rows(chunk)
                    var = coll["data"][str(chunk.ps)] if chunk.is_data else coll["parity"][str(chunk.ps)]
                    held = rows.setdefault(var, [])
                    where[(u, chunk.index_in_stripe)] = (var, sum(len(x) for x in held), hi - lo)
                    held.append(np.arange(first + lo, first + hi))
            requests = []
            for var, held in rows.items():
                idx = np.concatenate(held)
                requests += [(n, idx) for n in (names[data_ps[var]] if var in data_ps else [var])]
            values = dict(zip([n for n, _ in requests], reader.read(requests)))
            for u, (stripe, lo, hi) in enumerate(group):
                data = []
                for dc in stripe.data:
                    var, off, n = where[(u, dc.index_in_stripe)]
                    data.append(np_row_words([values[name][off : off + n] for name in names[dc.ps]], n))
                expected = codec.encode(code, data)
                for pc in stripe.parity:
                    var, off, n = where[(u, pc.index_in_stripe)]
                    bad = np.any(values[var][off : off + n] != expected[pc.position], axis=1)
                    if bad.any():
                        mismatches += int(bad.sum())
                        if len(mismatched) < 5:
                            mismatched.append(
                                f"{coll['name']} stripe {stripe.index} parity {pc.position} on ps:{pc.ps}: "
                                f"{int(bad.sum())} rows differ (first: row {lo + int(np.flatnonzero(bad)[0])})"
                            )
                if hi == c:
                    stripes += 1
                rows_checked += hi - lo
    replicas = replica_mismatches = 0
    for name, reps in ec_meta.get("replicas", {}).items():
        slots = ec_meta.get("replica_slots", {}).get(name, [])
        shape = reader.shape(name)
        if not shape:
            primary, *copies = reader.read([(n, None) for n in [name, *reps]])
            bad = [rep for rep, copy in zip(reps, copies) if not np.array_equal(copy, primary)]
        else:
            row_bytes = sum(int(np.prod(reader.shape(n)[1:])) * reader.dtype(n).itemsize for n in [name, *slots])
            bad = []
            for lo, hi in live_cluster.row_slices(shape[0], row_bytes * (1 + len(reps)), budget):
                idx = np.arange(lo, hi)
                got = reader.read([(n, idx) for n in [name, *slots, *reps]])
                words = np_row_words(got[: 1 + len(slots)], hi - lo)
                bad += [rep for rep, copy in zip(reps, got[1 + len(slots) :]) if not np.array_equal(copy, words)]
        replicas += len(reps)
        for rep in dict.fromkeys(bad):
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

