"""Verification and digests in bounded slices (`tf_ecrec.check.verify.check_parity`, `tf_ecrec.check.live_cluster.streamed_digest`).

A model of many GB cannot be held twice in the process that checks it (the
launcher's end-of-job digest of a 4 GB job was killed for memory holding the
model, its words and the re-encoded parity at once).  These tests check the
bounded paths against what they replace: the same verdicts and digest at any
read budget, and a corrupted word found where it is, in a stripe split across
calls.
"""

from __future__ import annotations

import numpy as np
import pytest

from tf_ecrec.check.live_cluster import ArrayReader, streamed_digest, variables_digest
from tf_ecrec.check.verify import check_parity
from tf_ecrec.erasure import codec
from tf_ecrec.layout import placement


class _CountingReader(ArrayReader):
    """Records the bytes of every call, to show the budget is kept."""

    def __init__(self, values):
        super().__init__(values)
        self.calls = []

    def read(self, requests):
        out = super().read(requests)
        self.calls.append(sum(v.nbytes for v in out))
        return out


def _job(num_ps=4, k=2, r=1, rows=1000, dim=3, seed=0):
    """Values and the protection's description of one table with one slot, parity exact, plus a replicated dense."""
    rng = np.random.default_rng(seed)
    layout = placement.plan(num_ps, k, r, [("emb", rows, dim)])
    table = layout.table("emb")
    c = table.chunk_rows
    values, data, slots, parity = {}, {}, {}, {}
    for p in range(num_ps):
        n = len(table.chunks_on(p, "data")) * c
        values[f"emb/p{p}"] = rng.standard_normal([n, dim]).astype(np.float32)
        values[f"emb/p{p}/slot"] = rng.random([n, dim]).astype(np.float32)
        data[str(p)], slots[str(p)] = f"emb/p{p}", [f"emb/p{p}/slot"]
        values[f"emb/parity{p}"] = np.zeros([len(table.chunks_on(p, "parity")) * c, 2 * dim], np.int32)
        parity[str(p)] = f"emb/parity{p}"
    code = codec.Code(k, r)
    for stripe in table.stripes:
        chunks = []
        for dc in stripe.data:
            lo, hi = table.local_rows(dc)
            words = np.concatenate([values[data[str(dc.ps)]][lo:hi], values[slots[str(dc.ps)][0]][lo:hi]], axis=1)
            chunks.append(np.ascontiguousarray(words).view(np.int32))
        for pc, words in zip(stripe.parity, codec.encode(code, chunks)):
            lo, hi = table.local_rows(pc)
            values[parity[str(pc.ps)]][lo:hi] = words
    values["dense"] = rng.standard_normal([40, 5]).astype(np.float32)
    values["dense/acc"] = rng.random([40, 5]).astype(np.float32)
    values["dense/ec_replica_0"] = np.concatenate([values["dense"], values["dense/acc"]], axis=1).view(np.int32).copy()
    values["step"] = np.int64(7)
    values["step/ec_replica_0"] = np.int64(7)
    meta = {
        "code": [k, r],
        "collections": [{"name": "emb", "layout": layout.to_json(), "data": data, "slots": slots, "parity": parity}],
        "replicas": {"dense": ["dense/ec_replica_0"], "step": ["step/ec_replica_0"]},
        "replica_slots": {"dense": ["dense/acc"]},
    }
    return values, meta, table


@pytest.mark.parametrize("budget", [None, 4096, 700, 1])
def test_exact_parity_checks_clean_at_any_budget_and_every_call_stays_within_it(budget):
    values, meta, table = _job()
    reader = _CountingReader(values)
    result = check_parity(meta, reader, budget=budget)
    assert result["mismatches"] == 0 and result["replica_mismatches"] == 0, result
    assert result["stripes_checked"] == table.num_stripes
    assert result["rows_checked"] == table.num_stripes * table.chunk_rows
    assert result["replicas_checked"] == 2
    if budget:
        # The smallest unit of a call: one row of each of a stripe's k + r chunks (3 x 24 bytes), or one
        # row of the dense variable, its slot and its replica (80 bytes).
        assert max(reader.calls) <= max(budget, 80)
        assert len(reader.calls) > 2


@pytest.mark.parametrize("budget", [None, 500])
def test_a_flipped_parity_word_is_found_in_its_stripe_and_row(budget):
    values, meta, table = _job(seed=1)
    stripe = table.stripes[-1]
    pc = stripe.parity[0]
    lo, _ = table.local_rows(pc)
    row = table.chunk_rows - 2  # late in the chunk: in a later slice when the budget splits it
    values[meta["collections"][0]["parity"][str(pc.ps)]][lo + row, 4] ^= 1 << 9
    result = check_parity(meta, values, budget=budget)
    assert result["mismatches"] == 1
    assert f"stripe {stripe.index} parity 0 on ps:{pc.ps}: 1 rows differ (first: row {row})" in result["mismatched"][0]


def test_a_changed_slot_value_or_replica_is_a_mismatch():
    values, meta, table = _job(seed=2)
    dc = table.stripes[0].data[1]
    lo, _ = table.local_rows(dc)
    values[f"emb/p{dc.ps}/slot"][lo, 0] += 1.0
    values["dense/ec_replica_0"][39, 9] ^= 1
    result = check_parity(meta, values, budget=300)
    assert result["mismatches"] == 1
    assert result["replica_mismatches"] == 1 and "replica dense/ec_replica_0 differs from dense" in result["mismatched"]


@pytest.mark.parametrize("budget", [None, 64, 1])
def test_the_streamed_digest_equals_the_in_memory_one(budget, monkeypatch):
    from tf_ecrec.check import live_cluster

    values, _, _ = _job(seed=3)
    if budget:
        monkeypatch.setattr(live_cluster, "READ_BYTES", budget)
    digest, nbytes = streamed_digest(ArrayReader(values), list(values))
    assert digest == variables_digest(values)
    assert nbytes == sum(np.asarray(v).nbytes for v in values.values())
    values["emb/p0"][3, 1] = np.nextafter(values["emb/p0"][3, 1], np.float32(9))
    assert streamed_digest(ArrayReader(values), list(values))[0] != digest
