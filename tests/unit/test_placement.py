"""Unit tests of tf_ecrec.layout.placement: a hand-checked example and property loops."""

from __future__ import annotations

import itertools
import json
from fractions import Fraction

import numpy as np
import pytest

from tf_ecrec.errors import ConfigError
from tf_ecrec.layout.placement import Layout, plan
from tf_ecrec.layout.table_layout import ChunkKind, TableLayout, TableSpec


def _random_cases(count: int, seed: int) -> list[tuple[int, int, int, list[TableSpec]]]:
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        num_ps = int(rng.integers(2, 13))
        k = int(rng.integers(1, num_ps))
        r = int(rng.integers(1, num_ps - k + 1))
        edge = [k, k + 1, num_ps * k - 1, num_ps * k, num_ps * k + 1, 3 * num_ps * k + 5]
        tables = []
        for t in range(int(rng.integers(1, 5))):
            rows = int(rng.choice(edge)) if rng.random() < 0.5 else int(rng.integers(k, 3000))
            tables.append(TableSpec(f"t{t}", max(rows, k), int(rng.integers(1, 9))))
        cases.append((num_ps, k, r, tables))
    return cases


CASES = _random_cases(250, seed=11)


def _counts(table: TableLayout, num_ps: int, data: bool) -> np.ndarray:
    chunks = table.data_chunks if data else table.parity_chunks
    return np.bincount([c.ps for c in chunks], minlength=num_ps)


# --- the worked example of the module docstring -----------------------------------------


def test_worked_example_three_ps_two_plus_one_ten_rows() -> None:
    layout = plan(3, 2, 1, [TableSpec("emb", rows=10, dim=4)])
    table = layout.table("emb")
    shape = (table.num_stripes, table.chunk_rows, table.padded_rows, table.padding_rows)
    assert shape == (3, 2, 12, 2)
    assert [s.ps for s in table.stripes] == [(0, 1, 2), (1, 2, 0), (2, 0, 1)]
    assert [(c.chunk, c.row_start, c.ps, c.real_rows) for c in table.data_chunks] == [
        (0, 0, 0, 2), (1, 2, 1, 2), (2, 4, 1, 2), (3, 6, 2, 2), (4, 8, 2, 2), (5, 10, 0, 0),
    ]
    parity = [(c.stripe, c.ps, c.index_in_stripe) for c in table.parity_chunks]
    assert parity == [(0, 2, 2), (1, 0, 2), (2, 1, 2)]
    where = layout.locate("emb", 7)
    assert (where.chunk, where.stripe, where.position, where.ps, where.offset) == (3, 1, 1, 2, 1)
    assert [c.name for c in layout.chunks_on(0)] == ["emb/data_0", "emb/parity_1_0", "emb/data_5"]
    summary = layout.summary(itemsize=4)
    totals = (summary.table_bytes, summary.padding_bytes, summary.data_bytes, summary.parity_bytes)
    assert totals == (160, 32, 192, 96)
    assert summary.overhead_ratio == Fraction(1, 2)
    assert [(p.data, p.parity, p.padding) for p in summary.per_ps] == [(64, 32, 32), (64, 32, 0), (64, 32, 0)]


def test_ecrec_degenerate_case_five_ps_four_plus_one_rotates_parity() -> None:
    # ECRec's layout put every parity of this configuration on server 4.
    layout = plan(5, 4, 1, [TableSpec("emb", rows=1000, dim=8)])
    table = layout.table("emb")
    assert _counts(table, 5, data=False).tolist() == [1, 1, 1, 1, 1]
    assert _counts(table, 5, data=True).tolist() == [4, 4, 4, 4, 4]


def test_small_table_gets_few_stripes_and_little_padding() -> None:
    layout = plan(8, 4, 2, [("small", 9, 3)])
    table = layout.table("small")
    assert (table.num_stripes, table.chunk_rows, table.padding_rows) == (3, 1, 3)
    assert sorted(_counts(table, 8, data=True).tolist()) == [1, 1, 1, 1, 2, 2, 2, 2]
    assert sorted(_counts(table, 8, data=False).tolist()) == [0, 0, 1, 1, 1, 1, 1, 1]


# --- properties over many random plans ---------------------------------------------------


@pytest.mark.parametrize("case", range(0, len(CASES), 25))
def test_properties_of_random_plans(case: int) -> None:
    for num_ps, k, r, specs in CASES[case : case + 25]:
        layout = plan(num_ps, k, r, specs)
        context = (num_ps, k, r, specs)
        assert [t.spec for t in layout.tables] == specs
        for table in layout.tables:
            _check_table(layout, table, context)
        _check_summary(layout, context)
        text = layout.to_json()
        again = Layout.from_json(text)
        assert again == layout and again.to_json() == text, context


def _check_table(layout: Layout, table: TableLayout, context: object) -> None:
    num_ps, k, r, n = layout.num_ps, layout.k, layout.r, layout.k + layout.r
    rows = table.spec.rows
    stripes = table.num_stripes
    # Stripe count and padding.
    assert stripes == (num_ps if rows >= num_ps * k else -(-rows // k)), context
    assert table.padded_rows == stripes * k * table.chunk_rows >= rows, context
    assert table.padding_rows < (num_ps * k if stripes == num_ps else k), context
    assert sum(c.real_rows for c in table.data_chunks) == rows, context
    # Distinct PS per stripe, parity off its stripe's data PS, codec order.
    for s in table.stripes:
        assert len(s.chunks) == n and len(set(s.ps)) == n, context
        assert [c.index_in_stripe for c in s.chunks] == list(range(n))
        assert not {c.ps for c in s.parity} & {c.ps for c in s.data}, context
        assert all(0 <= p < num_ps for p in s.ps)
        assert all(c.rows == table.chunk_rows and c.dim == table.spec.dim for c in s.chunks)
        assert all(p.real_rows == s.data[0].real_rows for p in s.parity)
    # Balance: per PS, data and parity counts differ by at most one chunk.
    data = _counts(table, num_ps, data=True)
    parity = _counts(table, num_ps, data=False)
    assert data.max() - data.min() <= 1 and parity.max() - parity.min() <= 1, (context, data, parity)
    if stripes == num_ps:
        assert data.tolist() == [k] * num_ps and parity.tolist() == [r] * num_ps, context
    if parity.sum() > 1:
        assert parity.max() < parity.sum(), context  # no PS holds all parity
    # Every original row maps to exactly one (chunk, offset), inside the chunk's real rows.
    where = table.locate_many(np.arange(rows))
    flat = where.chunk * table.chunk_rows + where.offset
    assert np.array_equal(flat, np.arange(rows)), context
    assert len(set(zip(where.chunk.tolist(), where.offset.tolist()))) == rows
    assert np.array_equal(where.stripe * k + where.position, where.chunk)
    chunks = table.data_chunks
    starts = np.array([c.row_start for c in chunks])
    real = np.array([c.real_rows for c in chunks])
    assert np.array_equal(where.ps, np.array([c.ps for c in chunks])[where.chunk])
    assert (where.row - starts[where.chunk] < real[where.chunk]).all()
    # Padding rows are trailing rows of the trailing chunks, never addressed.
    message = rf"row id {rows} is outside table '{table.name}', whose rows are 0\.\.{rows - 1}"
    with pytest.raises(ConfigError, match=message):
        table.locate_many([0, rows])


def _check_summary(layout: Layout, context: object) -> None:
    summary = layout.summary(itemsize=4)
    assert summary.overhead_ratio == Fraction(layout.r, layout.k), context
    assert summary.data_bytes == summary.table_bytes + summary.padding_bytes
    assert summary.table_bytes == sum(t.spec.rows * t.spec.dim * 4 for t in layout.tables)
    assert sum(p.data for p in summary.per_ps) == summary.data_bytes
    assert sum(p.parity for p in summary.per_ps) == summary.parity_bytes
    assert sum(p.padding for p in summary.per_ps) == summary.padding_bytes
    if all(t.num_stripes == layout.num_ps for t in layout.tables):
        assert len({(p.data, p.parity) for p in summary.per_ps}) == 1, context


def test_losing_up_to_r_ps_leaves_every_stripe_recoverable() -> None:
    for num_ps, k, r, specs in CASES[:60]:
        layout = plan(num_ps, k, r, specs)
        for failed in itertools.combinations(range(num_ps), r):
            assert layout.unrecoverable_stripes(failed) == ()
            for ps in failed:
                for chunk in layout.chunks_on(ps):
                    assert all(p.ps != chunk.ps or p is chunk for p in layout.parity_of(chunk))
        lost = layout.unrecoverable_stripes(range(r + 1))
        assert lost and all(sum(p <= r for p in s.ps) == r + 1 for s in lost)


def test_every_ps_holds_the_same_bytes_when_all_tables_are_big() -> None:
    layout = plan(6, 3, 2, [("a", 100_000, 16), ("b", 777, 8), ("c", 18, 1)])
    per_ps = layout.summary(itemsize=4).per_ps
    assert len({(p.data, p.parity) for p in per_ps}) == 1
    assert all(p.data > 0 and p.parity > 0 for p in per_ps)


def test_locate_and_locate_many_agree_and_keep_shape() -> None:
    layout = plan(4, 2, 1, [("emb", 1001, 4)])
    table = layout.table("emb")
    ids = np.array([[0, 1000], [500, 37]])
    many = table.locate_many(ids)
    assert many.ps.shape == (2, 2)
    for row, ps, offset in zip(ids.ravel(), many.ps.ravel(), many.offset.ravel()):
        one = layout.locate("emb", int(row))
        assert (one.ps, one.offset) == (ps, offset)
    with pytest.raises(ConfigError, match=r"row id -1 is outside table 'emb'"):
        table.locate(-1)
    with pytest.raises(ConfigError, match=r"must be integers, got dtype float64"):
        table.locate_many(np.array([1.0]))


# --- infeasible requests -----------------------------------------------------------------


@pytest.mark.parametrize(
    "num_ps,k,r,tables,message",
    [
        (5, 4, 2, [("t", 100, 4)], r"k \+ r = 6 chunks of each stripe on distinct PS, but .* num_ps = 5"),
        (5, 4, 0, [("t", 100, 4)], r"r = 0: a stripe needs at least 1 parity chunk"),
        (5, 0, 1, [("t", 100, 4)], r"k = 0: a stripe needs at least 1 data chunk"),
        (0, 1, 1, [("t", 100, 4)], r"num_ps = 0: there must be at least 1 PS"),
        (5, 4, 1, [("t", 3, 4)], r"table 't' has 3 rows, fewer than k = 4"),
        (5, 2, 1, [("a", 10, 4), ("b", 10, 4), ("a", 20, 1)], r"duplicate table name\(s\) \['a'\]"),
        (5, 2, 1, [("t", 10, 0)], r"table 't' has dim = 0; dim must be at least 1"),
        (5, 2, 1, [("t", 0, 3)], r"table 't' has rows = 0; rows must be at least 1"),
        (5, 2, 1, [("", 10, 3)], r"table name must be a non-empty string"),
        (5, 2.0, 1, [("t", 10, 3)], r"k must be an integer, got 2\.0"),
        (5, 2, 1, [("t", "10", 3)], r"table 't': rows must be an integer, got '10'"),
    ],
)
def test_infeasible_requests_raise_config_error(
    num_ps: object, k: object, r: object, tables: list[tuple[object, object, object]], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        plan(num_ps, k, r, tables)  # type: ignore[arg-type]


def _doc(**changes: object) -> str:
    doc = json.loads(plan(3, 2, 1, [("emb", 10, 4)]).to_json())
    table_changes = changes.pop("table", {})
    doc.update(changes)
    doc["tables"][0].update(table_changes)  # type: ignore[arg-type]
    return json.dumps(doc)


@pytest.mark.parametrize(
    "text,message",
    [
        ("{not json", r"layout is not valid JSON .*source: manifest\.json"),
        (_doc(version=2), r"format 'tf_ecrec.layout' version 2, expected .*source: manifest\.json"),
        (_doc(table={"stripes": [[0, 1, 1], [1, 2, 0], [2, 0, 1]]}),
         r"stripe 0: PS list \[0, 1, 1\] puts two chunks"),
        (_doc(table={"stripes": [[0, 1, 3], [1, 2, 0], [2, 0, 1]]}),
         r"stripe 0: PS list \[0, 1, 3\] must name k \+ r = 3 PS in 0\.\.2"),
        (_doc(table={"stripes": [[0, 1, 2]]}), r"1 stripes of 2 chunks of 2 rows do not cover its 10 rows"),
        (_doc(table={"chunk_rows": 0}), r"chunk_rows = 0 must be a positive integer"),
        (_doc(num_ps=2), r"k \+ r = 3 chunks .* only num_ps = 2"),
        (json.dumps({"format": "tf_ecrec.layout", "version": 1, "num_ps": 3, "k": 2, "r": 1}),
         r"layout is malformed \(KeyError: 'tables'\); source: manifest\.json"),
        ("[]", r"layout is malformed \(AttributeError"),
    ],
)
def test_from_json_rejects_bad_layouts(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Layout.from_json(text, source="manifest.json")


def test_json_is_stable_and_records_the_placement() -> None:
    layout = plan(4, 2, 2, [("b", 50, 2), ("a", 7, 3)])
    text = layout.to_json()
    assert text == plan(4, 2, 2, [("b", 50, 2), ("a", 7, 3)]).to_json()
    doc = json.loads(text)
    assert list(doc) == sorted(doc)
    assert [t["name"] for t in doc["tables"]] == ["b", "a"]
    assert doc["tables"][0]["stripes"] == [list(s.ps) for s in layout.table("b").stripes]


def test_unknown_table_is_named() -> None:
    with pytest.raises(ConfigError, match=r"no table 'x' in the layout; tables: \['emb'\]"):
        plan(3, 2, 1, [("emb", 10, 4)]).table("x")


@pytest.mark.parametrize("num_ps,k,r,rows", [(3, 2, 1, 10), (4, 2, 2, 1000), (5, 3, 2, 7), (6, 4, 2, 123457)])
def test_each_ps_stacks_its_chunks_of_a_kind_in_chunk_order_and_local_rows_tile_its_variable(num_ps, k, r, rows):
    table = plan(num_ps, k, r, [TableSpec("t", rows, 3)]).table("t")
    seen = set()
    for ps in range(num_ps):
        for kind, all_of_kind in ((ChunkKind.DATA, table.data_chunks), (ChunkKind.PARITY, table.parity_chunks)):
            mine = table.chunks_on(ps, kind)
            assert list(mine) == [c for c in all_of_kind if c.ps == ps]
            spans = [table.local_rows(c) for c in mine]
            assert spans == [(i * table.chunk_rows, (i + 1) * table.chunk_rows) for i in range(len(mine))]
            assert [table.local_index(c) for c in mine] == list(range(len(mine)))
            seen.update(mine)
    assert seen == set(table.data_chunks) | set(table.parity_chunks)
