"""Arithmetic in GF(2^16) and the 16-bit symbol view of arrays: what `tf_ecrec.erasure.codec` computes with.

The field is the one of pyeclib's ``liberasurecode_rs_vand`` backend:
GF(2^16) with the primitive polynomial ``x^16 + x^12 + x^3 + x + 1``
(0x1100B).  Addition is XOR; products go through log/exp tables.  An
array's bytes (C order) are read as little-endian 16-bit symbols
``b[2i] | b[2i+1] << 8`` whatever the host's byte order (:func:`words`), so
an array must hold an even number of bytes.

This module knows nothing of codes, stripes or chunks: `tf_ecrec.erasure.codec`
builds the code's matrix and encodes and decodes with these functions.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from tf_ecrec.errors import CodecError

__all__ = [
    "FIELD_BITS",
    "FIELD_POLYNOMIAL",
    "SYMBOL_BYTES",
    "check_element",
    "check_same",
    "gf_inv",
    "gf_mul",
    "invert",
    "like",
    "matmul",
    "mul_arrays",
    "mul_tables",
    "mul_words",
    "words",
]

FIELD_BITS = 16
"""Bits per symbol: the code works in GF(2^16)."""

FIELD_POLYNOMIAL = 0x1100B
"""Primitive polynomial of the field, x^16 + x^12 + x^3 + x + 1 (liberasurecode's)."""

SYMBOL_BYTES = FIELD_BITS // 8
"""Bytes per symbol; every chunk must hold a multiple of this many bytes."""

_ORDER = 1 << FIELD_BITS  # elements in the field
_GROUP = _ORDER - 1  # elements in its multiplicative group

# --- the field ------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _tables() -> tuple[np.ndarray, np.ndarray]:
    """Return ``(exp, log)``: ``exp[i] = 2^i`` (doubled so sums of logs index it)."""
    exp = np.zeros(2 * _GROUP, dtype=np.int64)
    log = np.zeros(_ORDER, dtype=np.int64)
    x = 1
    for i in range(_GROUP):
        exp[i] = x
        log[x] = i
        x <<= 1
        if x & _ORDER:
            x ^= FIELD_POLYNOMIAL
    exp[_GROUP:] = exp[:_GROUP]
    exp.flags.writeable = False
    log.flags.writeable = False
    return exp, log


def check_element(value: int, what: str) -> int:
    """Return ``value`` as an ``int`` if it is a field element; else raise `CodecError` naming ``what``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise CodecError(f"{what} must be an integer field element, got {value!r}")
    value = int(value)
    if not 0 <= value < _ORDER:
        raise CodecError(f"{what} = {value} is outside GF(2^{FIELD_BITS}), which holds 0..{_ORDER - 1}")
    return value


def gf_mul(a: int, b: int) -> int:
    """Multiply two elements of GF(2^16).

    Args:
        a: A field element, ``0 <= a < 65536``.
        b: A field element, ``0 <= b < 65536``.

    Returns:
        The product ``a * b`` in the field.

    Raises:
        CodecError: If an argument is not a field element.
    """
    a = check_element(a, "a")
    b = check_element(b, "b")
    if a == 0 or b == 0:
        return 0
    exp, log = _tables()
    return int(exp[log[a] + log[b]])


def gf_inv(a: int) -> int:
    """Return the multiplicative inverse of a non-zero element of GF(2^16).

    Raises:
        CodecError: If ``a`` is zero or not a field element.
    """
    a = check_element(a, "a")
    if a == 0:
        raise CodecError("0 has no inverse in GF(2^16)")
    exp, log = _tables()
    return int(exp[(_GROUP - log[a]) % _GROUP])


def mul_arrays(a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
    """Elementwise product of two broadcastable integer arrays of field elements."""
    exp, log = _tables()
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    product = exp[log[a] + log[b]]
    return np.where((a == 0) | (b == 0), 0, product)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Matrix product over the field of ``(m, t)`` and ``(t, n)`` element arrays."""
    out = np.zeros((a.shape[0], b.shape[1]), dtype=np.int64)
    for t in range(a.shape[1]):
        out ^= mul_arrays(a[:, t : t + 1], b[t : t + 1, :])
    return out


def invert(matrix: np.ndarray) -> np.ndarray:
    """Invert a square matrix over the field by Gauss-Jordan elimination.

    Raises:
        CodecError: If the matrix is singular.
    """
    n = matrix.shape[0]
    work = np.concatenate([np.asarray(matrix, dtype=np.int64), np.eye(n, dtype=np.int64)], axis=1)
    for col in range(n):
        nonzero = np.nonzero(work[col:, col])[0]
        if nonzero.size == 0:
            raise CodecError(f"the {n}x{n} matrix is singular over GF(2^16) (column {col} has no pivot)")
        pivot = col + int(nonzero[0])
        if pivot != col:
            work[[col, pivot]] = work[[pivot, col]]
        work[col] = mul_arrays(work[col], gf_inv(int(work[col, col])))
        factors = work[:, col : col + 1].copy()
        factors[col] = 0
        work ^= mul_arrays(factors, work[col : col + 1, :])
    return work[:, n:]


@functools.lru_cache(maxsize=64)
def _full_table(coef: int) -> np.ndarray:
    """``table[w] = coef * w`` for every 16-bit symbol ``w``."""
    table = mul_arrays(np.arange(_ORDER, dtype=np.int64), coef).astype("<u2")
    table.flags.writeable = False
    return table


def mul_tables(coef: int) -> np.ndarray:
    """Return the two 256-entry tables that multiply a symbol by ``coef``.

    For a symbol ``w = lo | hi << 8``, ``coef * w == t[0, lo] ^ t[1, hi]``
    (multiplication distributes over XOR).  A kernel that holds these 1 KB
    per coefficient needs no other field arithmetic.

    Args:
        coef: A field element.

    Returns:
        A read-only ``uint16`` array of shape ``(2, 256)``.

    Raises:
        CodecError: If ``coef`` is not a field element.
    """
    coef = check_element(coef, "coef")
    low = np.arange(256, dtype=np.int64)
    tables = np.stack([mul_arrays(low, coef), mul_arrays(low << 8, coef)]).astype(np.uint16)
    tables.flags.writeable = False
    return tables


def mul_words(coef: int, symbols: np.ndarray) -> np.ndarray:
    """Multiply every ``<u2`` symbol by ``coef``; returns a new ``<u2`` array."""
    if coef == 0:
        return np.zeros_like(symbols)
    if coef == 1:
        return symbols.copy()
    return _full_table(coef)[symbols]


# --- byte views -------------------------------------------------------------------


def words(chunk: np.ndarray, what: str) -> np.ndarray:
    """View a chunk's bytes (C order) as 1-D little-endian 16-bit symbols."""
    array = np.ascontiguousarray(chunk)
    if array.dtype.hasobject:
        raise CodecError(f"{what} has dtype {array.dtype}, which holds pointers, not values")
    raw = array.reshape(-1).view(np.uint8)
    if raw.size % SYMBOL_BYTES:
        raise CodecError(
            f"{what} holds {raw.size} bytes (shape {array.shape}, dtype {array.dtype}); the code works "
            f"on {SYMBOL_BYTES}-byte symbols, so a chunk must hold an even number of bytes"
        )
    return raw.view("<u2")


def like(symbols: np.ndarray, template: np.ndarray) -> np.ndarray:
    """Reinterpret ``<u2`` symbols as an array with ``template``'s dtype and shape."""
    return symbols.view(np.uint8).view(template.dtype).reshape(template.shape)


def check_same(chunks: Sequence[np.ndarray], names: Sequence[str]) -> None:
    """Raise `CodecError` unless every chunk has the shape and dtype of the first."""
    first = chunks[0]
    for chunk, name in zip(chunks[1:], names[1:]):
        if chunk.shape != first.shape or chunk.dtype != first.dtype:
            raise CodecError(
                f"{name} has shape {chunk.shape} and dtype {chunk.dtype}, but {names[0]} has shape "
                f"{first.shape} and dtype {first.dtype}; all chunks of a stripe must match"
            )
