"""Unit tests of the parity-update op: field arithmetic, pyeclib, concurrency, errors."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf

from tf_ecrec import ops as ec_ops
from tf_ecrec.erasure import codec
from tf_ecrec.layout.table_layout import route_rows

V1 = tf.compat.v1
F32 = np.float32


def _gf_mul(a: int, b: int, bits: int, polynomial: int) -> int:
    """Shift-and-add product in GF(2^bits): the test's own oracle."""
    product = 0
    while b:
        if b & 1:
            product ^= a
        b >>= 1
        a <<= 1
        if a >> bits:
            a ^= polynomial
    return product


def _scale_words(coef: int, words: np.ndarray, bits: int) -> np.ndarray:
    """coef * every little-endian `bits`-bit symbol of int32 words."""
    polynomial = {8: 0x11D, 16: 0x1100B}[bits]
    table = np.array([_gf_mul(coef, s, bits, polynomial) for s in range(1 << bits)], dtype=np.uint32)
    symbols = words.astype("<i4").view("<u1" if bits == 8 else "<u2")
    return table[symbols].astype(symbols.dtype).view("<i4").reshape(words.shape)


def _random_words(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(-(2**31), 2**31, size=shape, dtype=np.int64).astype(np.int32)


def _fold(parity: np.ndarray, rows: np.ndarray, delta: np.ndarray, coef: int, bits: int) -> np.ndarray:
    expected = parity.copy()
    np.bitwise_xor.at(expected, rows, _scale_words(coef, delta, bits))
    return expected


def test_oracle_agrees_with_the_codec() -> None:
    words = _random_words(np.random.default_rng(0), (3, 5))
    for coef in (1, 2, 0x5003, 65535):
        np.testing.assert_array_equal(_scale_words(coef, words, 16), codec.gf_mul_bytes(coef, words))
    assert _gf_mul(2, 0x80, 8, 0x11D) == 0x1D


@pytest.mark.parametrize("bits", [8, 16])
def test_parity_update_matches_numpy_oracle_in_graph_mode(bits: int) -> None:
    rng = np.random.default_rng(bits)
    parity0 = _random_words(rng, (6, 9))
    graph = tf.Graph()
    with graph.as_default():
        parity = tf.Variable(parity0)
        rows = V1.placeholder(tf.int64, [None])
        delta = V1.placeholder(tf.int32, [None, 9])
        coef = V1.placeholder(tf.int32, [])
        update = ec_ops.parity_update(parity, rows, delta, coef, field_bits=bits)
        read = parity.read_value()
        init = V1.global_variables_initializer()
    max_coef = (1 << bits) - 1
    with V1.Session(graph=graph) as sess:
        sess.run(init)
        expected = parity0
        for coef_value in [1, 2, 3, max_coef] + [int(c) for c in rng.integers(1, max_coef + 1, 6)]:
            step_rows = np.concatenate([[0, 5, 0], rng.integers(0, 6, 7)])  # edges and repeats
            step_delta = _random_words(rng, (step_rows.size, 9))
            sess.run(update, {rows: step_rows, delta: step_delta, coef: coef_value})
            expected = _fold(expected, step_rows, step_delta, coef_value, bits)
            np.testing.assert_array_equal(sess.run(read), expected)


def test_int32_rows_and_eager_mode() -> None:
    parity = tf.Variable(np.zeros((3, 2), np.int32))
    delta = np.array([[1, -1], [7, 8]], np.int32)
    assert ec_ops.parity_update(parity, np.array([2, 2], np.int32), delta) is None
    np.testing.assert_array_equal(parity.numpy(), [[0, 0], [0, 0], [1 ^ 7, -1 ^ 8]])


# --- pyeclib as the oracle of whole stripes ---------------------------------------------------


@pytest.mark.parametrize(
    "ec_type,bits,matrix",
    [
        ("liberasurecode_rs_vand", 16, codec.Code(4, 2).matrix.tolist()),
        ("isa_l_rs_vand", 8, [[1, 1, 1, 1], [1, 2, 4, 8]]),
    ],
)
def test_folding_every_chunk_into_zero_parity_encodes_like_pyeclib(ec_type: str, bits: int, matrix) -> None:
    from pyeclib import ec_iface  # requirements.txt: its absence fails the test, never skips it
    driver = ec_iface.ECDriver(k=4, m=2, ec_type=ec_type)
    rng = np.random.default_rng(bits)
    chunks = [_random_words(rng, (4, 8)) for _ in range(4)]
    fragments = driver.encode(b"".join(chunk.astype("<i4").tobytes() for chunk in chunks))
    parities = [tf.Variable(np.zeros((4, 8), np.int32)) for _ in range(2)]
    rows = np.arange(4)
    for p, parity in enumerate(parities):
        for j, chunk in enumerate(chunks):
            ec_ops.parity_update(parity, rows, chunk, matrix[p][j], field_bits=bits)
        payload = fragments[4 + p][codec.PYECLIB_HEADER_BYTES:]
        assert parity.numpy().astype("<i4").tobytes() == payload


# --- concurrency -------------------------------------------------------------------------------


def test_concurrent_steps_on_hot_rows_keep_parity_exact() -> None:
    """Threads update both chunks of a (k=2) stripe on the same rows at once.

    Parity 0 is the r=1 XOR code, parity 1 the second parity of the k=2, r=2
    code; after the last step both equal the code of the data and Adagrad
    slot bits, exactly. Steps are long (a thousand-odd ids on three rows) so
    that they overlap: built without the variable locks, the ops failed this
    test in 18 runs out of 18.
    """
    rows, dim, threads, steps = 8, 256, 8, 10
    code = codec.Code(2, 2)
    rng = np.random.default_rng(11)
    init_vars = [rng.normal(size=(rows, dim)).astype(F32) for _ in range(2)]
    init_accums = [rng.uniform(0.1, 1.0, size=(rows, dim)).astype(F32) for _ in range(2)]

    def stripe_bits(variables, accums) -> list[np.ndarray]:
        return [np.concatenate([v.view(np.int32), a.view(np.int32)], axis=1) for v, a in zip(variables, accums)]

    init_parity = codec.encode(code, stripe_bits(init_vars, init_accums))
    graph = tf.Graph()
    with graph.as_default():
        variables = [tf.Variable(v) for v in init_vars]
        accums = [tf.Variable(a) for a in init_accums]
        parities = [tf.Variable(p) for p in init_parity]
        grad = V1.placeholder(tf.float32, [None, dim])
        ids = V1.placeholder(tf.int64, [None])
        step_ops = []
        for j in range(2):
            delta = ec_ops.sparse_apply_adagrad_with_delta(variables[j], accums[j], grad, ids, 0.05)
            step_ops.append(
                tf.group(*[ec_ops.parity_update(parities[p], ids, delta, code.coef(p, j)) for p in range(2)])
            )
        init = V1.global_variables_initializer()
    config = V1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=4)
    errors: list[BaseException] = []
    with V1.Session(graph=graph, config=config) as sess:
        sess.run(init)

        def worker(seed: int) -> None:
            worker_rng = np.random.default_rng(seed)
            try:
                for _ in range(steps):
                    n = int(worker_rng.integers(1000, 2000))
                    feed = {
                        ids: worker_rng.integers(0, 3, size=n),  # three hot rows, repeated
                        grad: worker_rng.normal(size=(n, dim)).astype(F32),
                    }
                    sess.run(step_ops[int(worker_rng.integers(0, 2))], feed)
            except BaseException as exc:  # surfaced by the assertion below
                errors.append(exc)

        pool = [threading.Thread(target=worker, args=(seed,)) for seed in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join(timeout=60)
        assert not errors and not any(thread.is_alive() for thread in pool)
        final_vars, final_accums, final_parities = sess.run([variables, accums, parities])

    assert not np.array_equal(final_vars[0][:3], init_vars[0][:3])
    np.testing.assert_array_equal(final_vars[0][3:], init_vars[0][3:])
    expected = codec.encode(code, stripe_bits(final_vars, final_accums))
    for p in range(2):
        np.testing.assert_array_equal(final_parities[p], expected[p])


def check_large_folds() -> None:
    """Folds worth splitting into shards of rows, with hot rows, on two intra-op threads.

    Run by the fresh_process fixture, where this session sets the pool's size.
    """
    rng = np.random.default_rng(5)
    width, n = 13, 20_000  # 13 words: a 32-byte block of the vector path and a tail
    parity0 = _random_words(rng, (1000, width))
    graph = tf.Graph()
    with graph.as_default():
        parity = tf.Variable(parity0)
        rows = V1.placeholder(tf.int64, [None])
        delta = V1.placeholder(tf.int32, [None, width])
        coef = V1.placeholder(tf.int32, [])
        updates = {bits: ec_ops.parity_update(parity, rows, delta, coef, field_bits=bits) for bits in (8, 16)}
        read = parity.read_value()
        init = V1.global_variables_initializer()
    config = V1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=1)
    with V1.Session(graph=graph, config=config) as sess:
        sess.run(init)
        expected = parity0
        for bits, coef_value in [(16, 1), (16, 0x5003), (8, 0x8E)]:
            step_rows = rng.choice(rng.choice(1000, size=200, replace=False), size=n)
            step_delta = _random_words(rng, (n, width))
            sess.run(updates[bits], {rows: step_rows, delta: step_delta, coef: coef_value})
            expected = _fold(expected, step_rows, step_delta, coef_value, bits)
            np.testing.assert_array_equal(sess.run(read), expected)


def test_large_folds_with_repeats_on_two_threads_match_the_oracle(fresh_process) -> None:
    fresh_process("unit.test_ops_parity:check_large_folds")


# --- errors ------------------------------------------------------------------------------------


def test_parity_update_errors_leave_parity_untouched() -> None:
    graph = tf.Graph()
    with graph.as_default():
        parity = tf.Variable(np.arange(12, dtype=np.int32).reshape(4, 3))
        floats = tf.Variable(np.zeros((4, 3), F32))
        rows = V1.placeholder(tf.int64, None)
        delta = V1.placeholder(tf.int32, None)
        coef = V1.placeholder(tf.int32, None)
        update = ec_ops.parity_update(parity, rows, delta, coef)
        update8 = ec_ops.parity_update(parity, rows, delta, coef, field_bits=8)
        on_floats = ec_ops.parity_update(floats, rows, delta, coef)
        init = V1.global_variables_initializer()
        with pytest.raises(ValueError):  # delta width 2 against a [4, 3] parity
            ec_ops.parity_update(parity, [0], np.zeros((1, 2), np.int32))
        with pytest.raises(ValueError):
            ec_ops.parity_update(parity, [0], np.zeros((1, 3), np.int32), field_bits=12)
    good = {rows: [0, 3], delta: np.ones((2, 3), np.int32), coef: 3}
    with V1.Session(graph=graph) as sess:
        sess.run(init)
        for fetch, override, message in [
            (update, {rows: [0, 4]}, "out of range"),
            (update, {rows: [-1, 0]}, "out of range"),
            (update, {delta: np.ones((2, 2), np.int32)}, "words"),
            (update, {delta: np.ones((3, 3), np.int32)}, "rows"),
            (update, {delta: np.ones(3, np.int32)}, "matrix"),
            (update, {coef: 0}, "non-zero"),
            (update, {coef: 65536}, "65535"),
            (update8, {coef: 256}, "255"),
            (update, {coef: [1, 2]}, "scalar"),
            (on_floats, {}, "int32"),
        ]:
            with pytest.raises(tf.errors.InvalidArgumentError, match=message):
                sess.run(fetch, {**good, **override})
        np.testing.assert_array_equal(sess.run(parity), np.arange(12).reshape(4, 3))
        sess.run(update, good)
        assert sess.run(parity)[3, 0] == 9 ^ 3


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_route_deltas_splits_an_apply_by_route_like_masks_do(index_dtype) -> None:
    # The op replaces, per route, a mask of the rows whose chunk folds there, a gather of the chunk's
    # parity base and index arithmetic; the oracle is that computation in NumPy, written once in
    # tf_ecrec.layout.table_layout.route_rows (settlement's expected folds use it too).
    rng = np.random.default_rng(5)
    chunk_rows, chunks, width = 7, 6, 3
    bases = np.full([3, chunks], -1, np.int64)
    bases[0, [0, 2, 5]] = [0, 7, 14]
    bases[1, [1, 2]] = [21, 0]
    bases[2, [3]] = [35]  # chunk 4 folds nowhere (a chunk of a stripe whose parity is elsewhere)
    indices = rng.integers(0, chunks * chunk_rows, 40).astype(index_dtype)
    delta = _random_words(rng, (40, width))
    got = [(np.asarray(r), np.asarray(d)) for r, d in ec_ops.route_deltas(indices, delta, bases, chunk_rows)]
    want = route_rows(indices.astype(np.int64), bases, chunk_rows)
    assert len(want) == 3
    for j, (at, prow) in enumerate(want):
        np.testing.assert_array_equal(got[j][0], prow)
        np.testing.assert_array_equal(got[j][1], delta[at])
    assert set(np.concatenate([at for at, _ in want])) == set(np.flatnonzero(indices // chunk_rows != 4))
    empty = ec_ops.route_deltas(np.zeros([0], index_dtype), np.zeros([0, width], np.int32), bases, chunk_rows)
    assert all(np.asarray(r).shape == (0,) and np.asarray(d).shape == (0, width) for r, d in empty)
    with pytest.raises(tf.errors.InvalidArgumentError, match="index 42 at position 1 is outside the 6 local chunks of 7 rows"):
        ec_ops.route_deltas(np.array([3, 42], index_dtype), delta[:2], bases, chunk_rows)
