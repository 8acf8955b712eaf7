"""Unit tests of tf_ecrec.erasure.codec, with pyeclib's liberasurecode_rs_vand as oracle."""

from __future__ import annotations

import doctest
import itertools

import numpy as np
import pytest
from pyeclib import ec_iface as pyeclib_iface

from tf_ecrec.erasure import codec, gf16
from tf_ecrec.erasure.codec import Code, decode, encode
from tf_ecrec.errors import CodecError, ConfigError, ReconstructionError

HEADER = codec.PYECLIB_HEADER_BYTES
DECODE_CODES = [(2, 1), (3, 1), (4, 1), (2, 2), (4, 2), (3, 3)]


def _driver(k: int, r: int) -> pyeclib_iface.ECDriver:
    return pyeclib_iface.ECDriver(k=k, m=r, ec_type=codec.PYECLIB_EC_TYPE)


def _payload(fragment: bytes, size: int) -> bytes:
    # Chunks of an even byte count are never padded by pyeclib (it aligns the
    # whole buffer to k 16-bit words), so the payload is exactly the chunk.
    assert len(fragment) == HEADER + size
    return fragment[HEADER:]


def _bits(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).tobytes()


def _random_stripe(rng: np.random.Generator, k: int, shape: tuple[int, ...] = (5, 3)) -> list[np.ndarray]:
    return [rng.integers(0, 2**32, size=shape, dtype=np.uint32).view(np.float32) for _ in range(k)]


# --- the field ---------------------------------------------------------------------


def test_field_axioms_on_random_elements() -> None:
    rng = np.random.default_rng(1)
    for a, b, c in rng.integers(0, 1 << 16, size=(300, 3)).tolist():
        assert gf16.gf_mul(a, b) == gf16.gf_mul(b, a)
        assert gf16.gf_mul(a, gf16.gf_mul(b, c)) == gf16.gf_mul(gf16.gf_mul(a, b), c)
        assert gf16.gf_mul(a, b ^ c) == gf16.gf_mul(a, b) ^ gf16.gf_mul(a, c)
        assert gf16.gf_mul(a, 1) == a and gf16.gf_mul(a, 0) == 0
        if a:
            assert gf16.gf_mul(a, gf16.gf_inv(a)) == 1


def test_gf_mul_matches_carryless_multiplication_mod_polynomial() -> None:
    def slow(a: int, b: int) -> int:
        product = 0
        for bit in range(16):
            if b >> bit & 1:
                product ^= a << bit
        for bit in range(31, 15, -1):
            if product >> bit & 1:
                product ^= gf16.FIELD_POLYNOMIAL << (bit - 16)
        return product

    rng = np.random.default_rng(2)
    for a, b in rng.integers(0, 1 << 16, size=(200, 2)).tolist():
        assert gf16.gf_mul(a, b) == slow(a, b)
    assert gf16.gf_mul(0x8000, 2) == 0x100B  # x^15 * x = x^16 = x^12 + x^3 + x + 1


def test_gf_mul_bytes_is_symbolwise_little_endian() -> None:
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, size=64, dtype=np.uint8)
    for coef in (0, 1, 2, 0x5003, 0xFFFF):
        out = codec.gf_mul_bytes(coef, data)
        assert out.dtype == np.uint8 and out.shape == data.shape
        words = data.view("<u2").tolist()
        assert out.view("<u2").tolist() == [gf16.gf_mul(coef, w) for w in words]


def test_mul_tables_split_a_symbol_into_bytes() -> None:
    rng = np.random.default_rng(4)
    for coef in (1, 3, 0x6B6F, 0xFFFF):
        tables = gf16.mul_tables(coef)
        assert tables.shape == (2, 256) and tables.dtype == np.uint16
        for w in rng.integers(0, 1 << 16, size=50).tolist():
            assert int(tables[0, w & 0xFF] ^ tables[1, w >> 8]) == gf16.gf_mul(coef, w)


def test_field_arguments_are_checked() -> None:
    with pytest.raises(CodecError, match=r"65536 is outside GF\(2\^16\)"):
        gf16.gf_mul(65536, 1)
    with pytest.raises(CodecError, match=r"0 has no inverse"):
        gf16.gf_inv(0)
    with pytest.raises(CodecError, match=r"coef = -1 is outside"):
        codec.gf_mul_bytes(-1, np.zeros(4, np.uint8))
    with pytest.raises(CodecError, match=r"holds 3 bytes .*even number of bytes"):
        codec.gf_mul_bytes(2, np.zeros(3, np.uint8))


# --- the generator -----------------------------------------------------------------


def test_design_brief_matrix_k4_r2() -> None:
    matrix = Code(4, 2).matrix
    assert matrix.dtype == np.uint16
    assert matrix.tolist() == [[1, 1, 1, 1], [0x5003, 0xCC06, 0x6B6F, 0x7802]]
    # The brief read the low byte of each 16-bit coefficient.
    assert (matrix & 0xFF).tolist() == [[1, 1, 1, 1], [3, 6, 111, 2]]


@pytest.mark.parametrize("k", range(2, 11))
def test_matrix_equals_pyeclib_unit_vector_encoding(k: int) -> None:
    for r in range(1, 5):
        driver = _driver(k, r)
        oracle = np.zeros((r, k), dtype=np.int64)
        for j in range(k):
            unit = np.zeros(k, dtype="<u2")
            unit[j] = 1
            fragments = driver.encode(unit.tobytes())
            for p in range(r):
                oracle[p, j] = np.frombuffer(_payload(fragments[k + p], 2), "<u2")[0]
        assert Code(k, r).matrix.tolist() == oracle.tolist(), (k, r)
        assert (Code(k, r).matrix[0] == 1).all()


def test_matrix_is_read_only_and_cached() -> None:
    matrix = Code(3, 2).matrix
    with pytest.raises(ValueError):
        matrix[0, 0] = 7
    assert codec.parity_matrix(3, 2) is matrix
    assert Code(3, 2).generator.tolist()[:3] == np.eye(3, dtype=int).tolist()


def test_every_k_rows_of_the_generator_are_invertible() -> None:
    for k, r in [(3, 3), (5, 4), (8, 3)]:
        generator = Code(k, r).generator.astype(np.int64)
        for rows in itertools.combinations(range(k + r), k):
            gf16.invert(generator[list(rows)])  # raises CodecError if singular


# --- encode --------------------------------------------------------------------------


@pytest.mark.parametrize("k,r", [(2, 1), (3, 2), (4, 2), (6, 3), (10, 4)])
def test_parity_bytes_equal_pyeclib_payload(k: int, r: int) -> None:
    rng = np.random.default_rng(k * 10 + r)
    driver = _driver(k, r)
    for shape in [(1,), (7, 4), (3, 16)]:
        data = _random_stripe(rng, k, shape)
        parities = encode(Code(k, r), data)
        fragments = driver.encode(b"".join(_bits(d) for d in data))
        size = data[0].nbytes
        for j in range(k):
            assert _payload(fragments[j], size) == _bits(data[j])
        for p in range(r):
            assert parities[p].shape == shape and parities[p].dtype == np.float32
            assert _bits(parities[p]) == _payload(fragments[k + p], size), (k, r, shape, p)


def test_r1_is_plain_xor_and_agrees_with_parity_0_of_larger_codes() -> None:
    rng = np.random.default_rng(5)
    data = [rng.integers(0, 256, size=(4, 8), dtype=np.uint8) for _ in range(4)]
    (xor_parity,) = encode(Code(4, 1), data)
    assert np.array_equal(xor_parity, data[0] ^ data[1] ^ data[2] ^ data[3])
    for r in (2, 3, 4):
        assert np.array_equal(encode(Code(4, r), data)[0], xor_parity)


def test_encode_works_on_non_contiguous_and_other_dtypes() -> None:
    rng = np.random.default_rng(6)
    base = rng.standard_normal((4, 6, 8))
    data = [base[j, :, ::2] for j in range(3)]  # float64, strided views
    parities = encode(Code(3, 2), data)
    again = encode(Code(3, 2), [np.ascontiguousarray(d) for d in data])
    for a, b in zip(parities, again):
        assert a.shape == (6, 4) and a.dtype == np.float64 and _bits(a) == _bits(b)


def test_encode_rejects_bad_stripes() -> None:
    code = Code(3, 1)
    with pytest.raises(CodecError, match=r"encodes 3 data chunks, got 2"):
        encode(code, [np.zeros(2, np.float32)] * 2)
    with pytest.raises(CodecError, match=r"data chunk 2 has shape \(3,\).*data chunk 0 has shape \(2,\)"):
        encode(code, [np.zeros(2, np.float32), np.zeros(2, np.float32), np.zeros(3, np.float32)])
    with pytest.raises(CodecError, match=r"dtype float64.*dtype float32"):
        encode(code, [np.zeros(2, np.float32), np.zeros(2, np.float64), np.zeros(2, np.float32)])
    with pytest.raises(CodecError, match=r"holds 3 bytes"):
        encode(code, [np.zeros(3, np.uint8)] * 3)


# --- decode --------------------------------------------------------------------------


def _erasure_patterns(n: int, r: int) -> list[tuple[int, ...]]:
    return [lost for size in range(1, r + 1) for lost in itertools.combinations(range(n), size)]


@pytest.mark.parametrize("k,r", DECODE_CODES)
def test_decode_every_erasure_pattern_matches_original_and_pyeclib(k: int, r: int) -> None:
    rng = np.random.default_rng(100 + k * 10 + r)
    code = Code(k, r)
    driver = _driver(k, r)
    data = _random_stripe(rng, k, (6, 5))
    stripe = data + encode(code, data)
    size = data[0].nbytes
    original = b"".join(_bits(d) for d in data)
    fragments = driver.encode(original)
    patterns = _erasure_patterns(code.n, r)
    assert len(patterns) == sum(len(list(itertools.combinations(range(code.n), s))) for s in range(1, r + 1))
    for lost in patterns:
        survivors = {i: stripe[i] for i in range(code.n) if i not in lost}
        rebuilt = decode(code, survivors, want=lost)
        assert sorted(rebuilt) == sorted(lost)
        for i in lost:
            assert rebuilt[i].shape == stripe[i].shape and rebuilt[i].dtype == stripe[i].dtype
            assert _bits(rebuilt[i]) == _bits(stripe[i]), (k, r, lost, i)
        surviving_fragments = [fragments[i] for i in range(code.n) if i not in lost]
        assert driver.decode(surviving_fragments) == original
        oracle = driver.reconstruct(surviving_fragments, list(lost))
        assert len(oracle) == len(lost)
        for i, fragment in zip(lost, oracle):
            assert _payload(fragment, size) == _bits(rebuilt[i]), (k, r, lost, i)


@pytest.mark.parametrize("k,r", DECODE_CODES)
def test_special_float_bit_patterns_are_rebuilt_bit_exactly(k: int, r: int) -> None:
    specials = np.array(
        [0x7FC00000, 0x7FC00001, 0xFFFFFFFF, 0x7F800001, 0x7F800000, 0xFF800000,
         0x80000000, 0x00000000, 0x00000001, 0x807FFFFF, 0x3F800000, 0xBF800000],
        dtype=np.uint32,
    ).view(np.float32)
    rng = np.random.default_rng(7)
    data = [rng.permutation(specials).reshape(3, 4) for _ in range(k)]
    code = Code(k, r)
    stripe = data + encode(code, data)
    for lost in _erasure_patterns(code.n, r):
        survivors = {i: stripe[i] for i in range(code.n) if i not in lost}
        rebuilt = decode(code, survivors, want=range(k))
        for j in range(k):
            assert rebuilt[j].view(np.uint32).tolist() == data[j].view(np.uint32).tolist()


def test_decode_returns_present_chunks_as_given_and_ignores_duplicates() -> None:
    rng = np.random.default_rng(8)
    code = Code(3, 2)
    data = _random_stripe(rng, 3)
    stripe = data + encode(code, data)
    survivors = {i: stripe[i] for i in (0, 2, 3, 4)}
    out = decode(code, survivors, want=[0, 1, 1, 4])
    assert sorted(out) == [0, 1, 4]
    assert out[0] is stripe[0] and out[4] is stripe[4]
    assert _bits(out[1]) == _bits(stripe[1])
    assert decode(code, {}, want=[]) == {}


def test_too_many_erasures_raise_reconstruction_error() -> None:
    code = Code(4, 2)
    rng = np.random.default_rng(9)
    data = _random_stripe(rng, 4)
    stripe = data + encode(code, data)
    survivors = {i: stripe[i] for i in (0, 4, 5)}
    with pytest.raises(ReconstructionError, match=r"chunks \[1, 2, 3\] are lost .*tolerates only 2 lost"):
        decode(code, survivors, want=[1])
    # Nothing lost is wanted: no reconstruction, no error.
    assert decode(code, survivors, want=[0])[0] is stripe[0]


def test_decode_rejects_bad_indices_and_mismatched_chunks() -> None:
    code = Code(2, 1)
    a = np.zeros(4, np.float32)
    with pytest.raises(CodecError, match=r"chunk index 3 is out of range 0\.\.2"):
        decode(code, {0: a, 3: a}, want=[1])
    with pytest.raises(CodecError, match=r"chunk index -1 is out of range"):
        decode(code, {0: a, 1: a}, want=[-1])
    with pytest.raises(CodecError, match=r"chunk 2 has shape \(5,\)"):
        decode(code, {0: a, 2: np.zeros(5, np.float32)}, want=[1])


# --- incremental parity updates -------------------------------------------------------


@pytest.mark.parametrize("k,r", [(2, 1), (4, 2), (3, 3), (5, 4)])
def test_folding_deltas_keeps_parity_equal_to_fresh_encode(k: int, r: int) -> None:
    rng = np.random.default_rng(200 + k * 10 + r)
    code = Code(k, r)
    rows, dim = 8, 4
    data = [rng.standard_normal((rows, dim)).astype(np.float32) for _ in range(k)]
    parity = encode(code, data)
    for _ in range(60):
        j = int(rng.integers(k))
        touched = rng.choice(rows, size=int(rng.integers(1, 4)), replace=False)
        old = data[j][touched].copy()
        new = old - np.float32(0.1) * rng.standard_normal(old.shape).astype(np.float32)
        if rng.random() < 0.2:
            new[0, 0] = np.float32("nan")
        data[j][touched] = new
        delta = codec.bitwise_delta(old, new)
        for p in range(r):
            contribution = codec.parity_delta(code, p, j, delta)
            parity[p][touched] = codec.xor_bytes(parity[p][touched], contribution)
    fresh = encode(code, data)
    for p in range(r):
        assert _bits(parity[p]) == _bits(fresh[p])


def test_parity_delta_of_parity_0_is_the_delta_itself() -> None:
    delta = np.arange(8, dtype=np.float32)
    assert _bits(codec.parity_delta(Code(3, 2), 0, 2, delta)) == _bits(delta)
    with pytest.raises(CodecError, match=r"parity index 2 is out of range 0\.\.1"):
        codec.parity_delta(Code(3, 2), 2, 0, delta)
    with pytest.raises(CodecError, match=r"data index 3 is out of range 0\.\.2"):
        codec.parity_delta(Code(3, 2), 0, 3, delta)


# --- parameters ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "k,r,message",
    [
        (0, 1, r"k = 0 must be at least 1"),
        (3, 0, r"r = 0 must be at least 1"),
        (-2, 1, r"k = -2 must be at least 1"),
        (250, 7, r"k \+ r = 257 chunks per stripe, more than the 256"),
        (2.0, 1, r"k must be an integer, got 2\.0"),
        (2, True, r"r must be an integer, got True"),
    ],
)
def test_bad_code_parameters_raise_config_error(k: object, r: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Code(k, r)  # type: ignore[arg-type]


def test_code_is_a_frozen_value() -> None:
    code = Code(np.int64(4), 2)
    assert code == Code(4, 2) and hash(code) == hash(Code(4, 2)) and type(code.k) is int
    assert code.n == 6 and not code.is_xor and Code(4, 1).is_xor
    with pytest.raises(AttributeError):
        code.k = 5  # type: ignore[misc]


def test_module_docstring_example() -> None:
    result = doctest.testmod(codec, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
