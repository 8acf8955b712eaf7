"""Unit tests of the rebuild ops: row slices as words, their GF combination, and writes.

In graph mode, in process. The properties the PS-side rebuild relies on: a
slice read and written back is the identity, bit for bit, across variables
of different dtypes side by side; `combine_rows` with the decoding
coefficients of `tf_ecrec.erasure.codec` gives exactly the chunk `codec.decode`
gives (and with the data's, the parity `codec.encode` gives), for XOR and
GF(2^16) codes and every pattern of survivors; a read of count 0 never
touches its (possibly uninitialised) variables; bad input fails with the
value named and writes nothing.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf

from tf_ecrec import ops as ec_ops
from tf_ecrec.erasure import codec
from tf_ecrec.errors import CodecError, ReconstructionError

V1 = tf.compat.v1


def _random_words(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(-(2**31), 2**31, size=shape, dtype=np.int64).astype(np.int32)


def test_rows_read_and_written_as_words_round_trip_across_dtypes():
    rng = np.random.default_rng(0)
    values = rng.standard_normal((10, 3)).astype(np.float32)
    slots = rng.standard_normal((10, 3)).astype(np.float32)
    counts = rng.integers(-(2**40), 2**40, size=(10, 2), dtype=np.int64)
    graph = tf.Graph()
    with graph.as_default():
        a = V1.Variable(values, use_resource=True)
        b = V1.Variable(slots, use_resource=True)
        c = V1.Variable(counts, use_resource=True)
        dst = [V1.Variable(np.zeros_like(x), use_resource=True) for x in (values, slots, counts)]
        start = V1.placeholder(tf.int64, [])
        count = V1.placeholder(tf.int64, [])
        read = ec_ops.read_row_words([a, b, c], start, count)
        copy = ec_ops.write_row_words(dst, start, read)
        out = [v.read_value() for v in dst]
    with V1.Session(graph=graph) as sess:
        sess.run(V1.global_variables_initializer())
        words = sess.run(read, {start: 3, count: 4})
        assert words.shape == (4, 3 + 3 + 4) and words.dtype == np.int32
        expected = np.concatenate([ec_ops.as_words(values)[3:7], ec_ops.as_words(slots)[3:7], ec_ops.as_words(counts)[3:7]], axis=1)
        np.testing.assert_array_equal(words, expected)
        for lo in range(0, 10, 4):  # slices that do not divide the rows
            sess.run(copy, {start: lo, count: min(4, 10 - lo)})
        got = sess.run(out)
    for x, y in zip((values, slots, counts), got):
        assert x.tobytes() == y.tobytes()


def test_a_read_of_count_zero_does_not_look_the_variable_up():
    graph = tf.Graph()
    with graph.as_default():
        never_initialised = V1.Variable(np.zeros([4, 2], np.float32), use_resource=True)
        count = V1.placeholder(tf.int64, [])
        read = ec_ops.read_row_words(never_initialised, 0, count)
    with V1.Session(graph=graph) as sess:
        assert sess.run(read, {count: 0}).shape == (0, 0)
        with pytest.raises(tf.errors.FailedPreconditionError, match="uninitialized"):
            sess.run(read, {count: 1})


@pytest.mark.parametrize("k,r", [(2, 1), (3, 2), (4, 2), (1, 1)])
def test_combining_with_the_decoding_coefficients_is_the_codecs_decode(k, r):
    rng = np.random.default_rng(k * 10 + r)
    code = codec.Code(k, r)
    data = [_random_words(rng, (6, 5)) for _ in range(k)]
    chunks = data + codec.encode(code, data)
    graph = tf.Graph()
    with graph.as_default():
        coefs = V1.placeholder(tf.int32, [code.n])
        parts = [V1.placeholder(tf.int32, [None, None]) for _ in range(code.n)]
        combined = ec_ops.combine_rows(coefs, parts)
    with V1.Session(graph=graph) as sess:
        for lost in itertools.chain.from_iterable(itertools.combinations(range(code.n), m) for m in range(1, r + 1)):
            present = [i for i in range(code.n) if i not in lost]
            for index in lost:
                coef = codec.decoding_coefficients(code, present, index)
                # Parts that are not read are empty, as the rebuild feeds them.
                feed = {p: (chunks[j] if coef[j] else np.zeros([0, 0], np.int32)) for j, p in enumerate(parts)}
                feed[coefs] = coef.astype(np.int32)
                got = sess.run(combined, feed)
                want = codec.decode(code, {i: chunks[i] for i in present}, [index])[index]
                np.testing.assert_array_equal(got, want, err_msg=f"chunk {index} with {lost} lost")
                np.testing.assert_array_equal(got, chunks[index])


def test_a_combine_that_reuses_its_first_part_changes_no_tensor_another_op_reads():
    # CombineRows starts from a part with coefficient 1 and, when nothing else holds that part's buffer, XORs
    # the others into it in place. A part read by two combines (the synchronous rebuild's slices feed every
    # chunk of their stripe) and fetched as well must come out unchanged, as must the caller's fed arrays.
    rng = np.random.default_rng(3)
    a, b, c = (_random_words(rng, (5, 4)) for _ in range(3))
    kept = [a.copy(), b.copy(), c.copy()]
    graph = tf.Graph()
    with graph.as_default():
        fed = [V1.placeholder(tf.int32, [None, None]) for _ in range(3)]
        parts = [tf.bitwise.bitwise_xor(f, 0) for f in fed]  # computed in the graph: buffers TF owns
        both = [ec_ops.combine_rows(np.array([1, 1, 0], np.int32), parts),
                ec_ops.combine_rows(np.array([1, 0, 1], np.int32), parts)]
        alone = ec_ops.combine_rows(np.array([1, 1, 1], np.int32), [tf.bitwise.bitwise_xor(f, 0) for f in fed])
    with V1.Session(graph=graph) as sess:
        got = sess.run({"both": both, "parts": parts, "alone": alone}, dict(zip(fed, (a, b, c))))
    np.testing.assert_array_equal(got["both"][0], a ^ b)
    np.testing.assert_array_equal(got["both"][1], a ^ c)
    np.testing.assert_array_equal(got["alone"], a ^ b ^ c)
    for part, want in zip(got["parts"], kept):
        np.testing.assert_array_equal(part, want)
    for array, want in zip((a, b, c), kept):
        np.testing.assert_array_equal(array, want)


def test_decoding_coefficients_of_a_parity_from_the_data_are_its_encoding():
    code = codec.Code(3, 2)
    for p in range(code.r):
        coef = codec.decoding_coefficients(code, range(code.k), code.k + p)
        assert [int(c) for c in coef[: code.k]] == [code.coef(p, j) for j in range(code.k)]
        assert not coef[code.k :].any()
    assert list(codec.decoding_coefficients(code, [0, 1, 2], 1)) == [0, 1, 0, 0, 0]
    with pytest.raises(ReconstructionError):
        codec.decoding_coefficients(code, [0, 4], 1)
    with pytest.raises(CodecError, match="out of range"):
        codec.decoding_coefficients(code, [0, 1, 2], 7)


def test_bad_input_is_named_and_writes_nothing():
    graph = tf.Graph()
    with graph.as_default():
        var = V1.Variable(np.arange(8, dtype=np.float32).reshape(4, 2), use_resource=True)
        start = V1.placeholder(tf.int64, [])
        words = V1.placeholder(tf.int32, [None, None])
        write = ec_ops.write_row_words(var, start, words)
        count = V1.placeholder(tf.int64, [])
        read = ec_ops.read_row_words(var, start, count)
        coefs = V1.placeholder(tf.int32, [2])
        parts = [V1.placeholder(tf.int32, [None, None]) for _ in range(2)]
        combined = ec_ops.combine_rows(coefs, parts)
        value = var.read_value()
    with V1.Session(graph=graph) as sess:
        sess.run(var.initializer)
        before = sess.run(value)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"rows \[3, 5\) are out of range \[0, 4\)"):
            sess.run(write, {start: 3, words: np.zeros([2, 2], np.int32)})
        with pytest.raises(tf.errors.InvalidArgumentError, match="have 3 words but the variables' rows have 2"):
            sess.run(write, {start: 0, words: np.zeros([1, 3], np.int32)})
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"rows \[2, 5\) are out of range"):
            sess.run(read, {start: 2, count: 3})
        np.testing.assert_array_equal(sess.run(value), before)
        a, b = np.ones([2, 2], np.int32), np.ones([3, 2], np.int32)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"parts\[1\] has shape \[3,2\]"):
            sess.run(combined, {coefs: [1, 1], parts[0]: a, parts[1]: b})
        with pytest.raises(tf.errors.InvalidArgumentError, match="every coefficient is 0"):
            sess.run(combined, {coefs: [0, 0], parts[0]: a, parts[1]: b})
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"coefs\[0\] = 65536 is not an element of GF\(2\^16\)"):
            sess.run(combined, {coefs: [65536, 1], parts[0]: a, parts[1]: a})
        # A coefficient of 0 ignores its part whatever its shape.
        np.testing.assert_array_equal(sess.run(combined, {coefs: [0, 1], parts[0]: a, parts[1]: b}), b)
