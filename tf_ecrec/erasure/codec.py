"""Exact erasure codes over the raw bits of embedding rows.

Why bitwise codes
-----------------
ECRec kept parity as the float sum of its data rows, updated with ``parity -=
delta``: float addition rounds, so parity drifts and decoding cancels digits
(rebuilt rows are close to the lost ones, never equal).  Here parity is a
function of the data's *bits* in a Galois field where addition is XOR and
nothing rounds: a parity equals the code of its data bit for bit however many
updates were folded into it (:func:`parity_delta`), and a rebuilt row has the
lost one's bytes (NaN payloads, infinities and ``-0.0`` included).

The code
--------
``Code(k, r)`` is a systematic linear code of ``k`` data chunks and ``r``
parity chunks.  Parity ``p`` (``0 <= p < r``) is::

    parity[p] = XOR over j of  matrix[p, j] * data[j]      (products in GF(2^16))

The coefficient matrix is the one of pyeclib's ``liberasurecode_rs_vand``
backend (GF(2^16), see `tf_ecrec.erasure.gf16`), so pyeclib can check us: unit
vectors encoded with k=4, r=2 give the parity symbols
``[[1, 1, 1, 1], [0x5003, 0xCC06, 0x6B6F, 0x7802]]``.  :func:`parity_matrix`
builds it in closed form: ``V[i, j] = i^j`` (``(k + r) x k`` Vandermonde,
``0^0 = 1``); ``P = V[k:] @ inverse(V[:k])`` (systematic and MDS: any ``k``
chunks rebuild the rest); column ``j`` of ``P`` divided by ``P[0, j]``, so
the first parity is the plain XOR of the data and ``Code(k, 1)`` *is* the
XOR code.

A chunk is any NumPy array (rows of a table or slot); the code sees its bytes
as 16-bit little-endian symbols (`tf_ecrec.erasure.gf16.words`), so a chunk holds an
even number of bytes and row ``i`` of a parity depends only on row ``i`` of
each data chunk.  Parity chunks have the data's shape and dtype.

Which "config" is which: `tf_ecrec.ECConfig` is the user's choice of ``(k,
r)`` for a job (a value in the model_fn and on the command line); `Code` is
the code's coefficient matrix object built from it (what encodes and
decodes); `tf_ecrec.cluster.tf_config.ClusterConfig` is the cluster (TF_CONFIG), not a
code at all.

Worked example (k=2, r=2, two symbols per chunk)::

    >>> import numpy as np
    >>> code = Code(k=2, r=2)
    >>> code.matrix.tolist()
    [[1, 1], [61447, 34820]]
    >>> d0 = np.array([1, 2], dtype="<u2")
    >>> d1 = np.array([3, 4], dtype="<u2")
    >>> p0, p1 = encode(code, [d0, d1])
    >>> p0.tolist()                        # 1^3, 2^4
    [2, 6]
    >>> p1.tolist()                        # 61447*1 ^ 34820*3, 61447*2 ^ 34820*4
    [30720, 61443]
    >>> rebuilt = decode(code, {2: p0, 3: p1}, want=[0, 1])   # both data chunks lost
    >>> rebuilt[0].tolist(), rebuilt[1].tolist()
    ([1, 2], [3, 4])

Incremental updates: when data chunk ``j`` changes from ``old`` to ``new``,
``parity[p] ^= matrix[p, j] * (old ^ new)`` keeps every parity exact
(:func:`bitwise_delta`, :func:`parity_delta`); this is what the parity op does
on the parameter servers.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tf_ecrec.erasure import gf16
from tf_ecrec.errors import CodecError, ConfigError, ReconstructionError

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_STRIPE_WIDTH", "PYECLIB_EC_TYPE", "PYECLIB_HEADER_BYTES", "Code", "bitwise_delta", "decode",
    "decoding_coefficients", "encode", "gf_mul_bytes", "parity_delta", "parity_matrix", "xor_bytes",
]

MAX_STRIPE_WIDTH = 256
"""Largest ``k + r`` accepted.  The field would allow 65536 chunks per stripe;
this is a practical cap (matrix inversion here is cubic in ``k``)."""

PYECLIB_EC_TYPE = "liberasurecode_rs_vand"
"""The pyeclib ``ec_type`` whose fragments carry exactly our parity bytes."""

PYECLIB_HEADER_BYTES = 80
"""Bytes of pyeclib fragment header in front of the payload."""


# --- byte operations on chunks ---------------------------------------------------------

def xor_bytes(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """XOR the raw bytes of two arrays of the same shape and dtype.

    Returns:
        A new array with ``a``'s shape and dtype.

    Raises:
        CodecError: If shapes or dtypes differ or the byte count is odd.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    gf16.check_same([a, b], ["a", "b"])
    return gf16.like(gf16.words(a, "a") ^ gf16.words(b, "b"), a)


def bitwise_delta(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Return ``old ^ new`` on raw bytes: the delta a data update feeds to parity.

    Raises:
        CodecError: If shapes or dtypes differ or the byte count is odd.
    """
    return xor_bytes(old, new)


def gf_mul_bytes(coef: int, data: np.ndarray) -> np.ndarray:
    """Multiply every 16-bit symbol of ``data``'s raw bytes by ``coef``.

    Args:
        coef: A field element.
        data: Any array holding an even number of bytes.

    Returns:
        A new array with ``data``'s shape and dtype holding the products.

    Raises:
        CodecError: If ``coef`` is not a field element or the byte count is odd.
    """
    coef = gf16.check_element(coef, "coef")
    data = np.asarray(data)
    return gf16.like(gf16.mul_words(coef, gf16.words(data, "data")), data)


# --- the code ------------------------------------------------------------------------


@functools.lru_cache(maxsize=128)
def _parity_matrix(k: int, r: int) -> np.ndarray:
    n = k + r
    points = np.arange(n, dtype=np.int64)
    vand = np.ones((n, k), dtype=np.int64)
    for j in range(1, k):
        vand[:, j] = gf16.mul_arrays(vand[:, j - 1], points)
    parity = gf16.matmul(vand[k:], gf16.invert(vand[:k]))
    scale = np.array([gf16.gf_inv(int(v)) for v in parity[0]], dtype=np.int64)
    matrix = gf16.mul_arrays(parity, scale[None, :]).astype(np.uint16)
    matrix.flags.writeable = False
    logger.debug("built the (%d, %d) rs_vand parity matrix", k, r)
    return matrix


def parity_matrix(k: int, r: int) -> np.ndarray:
    """Return the ``r x k`` parity coefficients of ``liberasurecode_rs_vand``.

    See the module docstring for the construction.

    Returns:
        A read-only ``uint16`` array; row ``p`` gives parity ``p``'s coefficient
        for each data chunk.  Row 0 is all ones.

    Raises:
        ConfigError: If ``(k, r)`` is not a valid code.
    """
    return Code(k, r).matrix


@dataclass(frozen=True)
class Code:
    """A systematic ``(k data, r parity)`` MDS code over GF(2^16).

    Chunk indices ``0 .. k-1`` are data, ``k .. k+r-1`` are parity; any ``k``
    chunks of a stripe rebuild the others.

    Attributes:
        k: Data chunks per stripe, ``k >= 1``.
        r: Parity chunks per stripe (failures tolerated), ``r >= 1``.
    """

    k: int
    r: int

    def __post_init__(self) -> None:
        for name in ("k", "r"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ConfigError(f"code parameter {name} must be an integer, got {value!r}")
        if self.k < 1:
            raise ConfigError(f"code parameter k = {self.k} must be at least 1 (data chunks per stripe)")
        if self.r < 1:
            raise ConfigError(
                f"code parameter r = {self.r} must be at least 1 (parity chunks per stripe); "
                "r = 0 would protect nothing"
            )
        if self.k + self.r > MAX_STRIPE_WIDTH:
            raise ConfigError(
                f"code ({self.k}, {self.r}) has k + r = {self.k + self.r} chunks per stripe, more than "
                f"the {MAX_STRIPE_WIDTH} this codec supports"
            )
        object.__setattr__(self, "k", int(self.k))
        object.__setattr__(self, "r", int(self.r))

    @property
    def n(self) -> int:
        """Chunks per stripe, ``k + r``."""
        return self.k + self.r

    @property
    def is_xor(self) -> bool:
        """True for ``r == 1``, where the single parity is the XOR of the data."""
        return self.r == 1

    @property
    def matrix(self) -> np.ndarray:
        """The read-only ``(r, k)`` ``uint16`` parity coefficient matrix."""
        return _parity_matrix(self.k, self.r)

    @property
    def generator(self) -> np.ndarray:
        """The ``(k + r, k)`` generator: identity on top of :attr:`matrix`."""
        return np.concatenate([np.eye(self.k, dtype=np.uint16), self.matrix])

    def coef(self, parity_index: int, data_index: int) -> int:
        """Coefficient of data chunk ``data_index`` in parity ``parity_index``.

        Raises:
            CodecError: If an index is out of range.
        """
        self._check_parity_index(parity_index)
        self._check_data_index(data_index)
        return int(self.matrix[parity_index, data_index])

    def _check_parity_index(self, parity_index: int) -> None:
        self._check_index("parity", parity_index, self.r)

    def _check_data_index(self, data_index: int) -> None:
        self._check_index("data", data_index, self.k)

    def _check_index(self, what: str, index: int, count: int) -> None:
        if not 0 <= index < count:
            raise CodecError(f"{what} index {index} is out of range 0..{count - 1} for code ({self.k}, {self.r})")


def encode(code: Code, data_chunks: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Compute the ``r`` parity chunks of a stripe.

    Args:
        code: The code.
        data_chunks: ``k`` arrays of one shape and dtype, in stripe order.

    Returns:
        ``r`` new arrays with the data's shape and dtype, parity 0 first.

    Raises:
        CodecError: If there are not ``k`` chunks, they differ in shape or
            dtype, or they hold an odd number of bytes.
    """
    if len(data_chunks) != code.k:
        raise CodecError(f"code ({code.k}, {code.r}) encodes {code.k} data chunks, got {len(data_chunks)}")
    arrays = [np.asarray(chunk) for chunk in data_chunks]
    gf16.check_same(arrays, [f"data chunk {j}" for j in range(code.k)])
    words = [gf16.words(a, f"data chunk {j}") for j, a in enumerate(arrays)]
    matrix = code.matrix
    parities = []
    for p in range(code.r):
        acc = np.zeros_like(words[0])
        for j in range(code.k):
            acc ^= gf16.mul_words(int(matrix[p, j]), words[j])
        parities.append(gf16.like(acc, arrays[0]))
    return parities


@functools.lru_cache(maxsize=256)
def _recovery_rows(k: int, r: int, survivors: tuple[int, ...]) -> np.ndarray:
    """``(k + r, k)`` rows expressing every chunk as a combination of ``survivors``."""
    generator = Code(k, r).generator.astype(np.int64)
    inverse = gf16.invert(generator[list(survivors)])
    logger.debug("inverted the decoding matrix of code (%d, %d) for survivors %s", k, r, survivors)
    return gf16.matmul(generator, inverse)


def decoding_coefficients(code: Code, present: Iterable[int], index: int) -> np.ndarray:
    """How :func:`decode` writes chunk ``index`` as a combination of the chunks ``present``.

    Returns ``coef``, ``int64 [n]``: ``chunk[index] = XOR_j coef[j] * chunk[j]``
    in GF(2^16) (symbol by symbol, see :func:`gf_mul_bytes`), nonzero only on
    the first ``k`` present indices (data before parity, as :func:`decode`
    reads them). A present ``index`` is itself (``coef[index] = 1``). With
    the ``k`` data chunks present it gives the encoding of a parity.

    Raises:
        CodecError: If an index is out of range.
        ReconstructionError: If ``index`` is not present and fewer than ``k`` chunks are.
    """
    have = sorted(dict.fromkeys(int(i) for i in present))
    for i in have + [int(index)]:
        if not 0 <= i < code.n:
            raise CodecError(f"chunk index {i} is out of range 0..{code.n - 1} for code ({code.k}, {code.r})")
    coef = np.zeros(code.n, dtype=np.int64)
    if index in have:
        coef[index] = 1
        return coef
    if len(have) < code.k:
        raise ReconstructionError(
            f"cannot rebuild chunk {index} of a code ({code.k}, {code.r}) stripe from chunks {have}: "
            f"{code.k} are needed"
        )
    survivors = tuple(have[: code.k])
    rows = _recovery_rows(code.k, code.r, survivors)
    for s, j in enumerate(survivors):
        coef[j] = int(rows[index, s])
    return coef


def decode(code: Code, chunks: Mapping[int, np.ndarray], want: Iterable[int]) -> dict[int, np.ndarray]:
    """Rebuild chunks of a stripe from any ``k`` survivors.

    The first ``k`` surviving chunks in index order are read (data before
    parity, as liberasurecode does), the rest are ignored.

    Args:
        code: The code.
        chunks: Surviving chunks by index (``0 .. k-1`` data, ``k .. k+r-1``
            parity), all of one shape and dtype.
        want: Indices of the chunks to return, lost or not.

    Returns:
        A dict from each wanted index to its chunk.  Wanted chunks that were
        given are returned as given (not copied); rebuilt ones are new arrays.

    Raises:
        CodecError: If an index is out of range or the chunks differ in shape
            or dtype or hold an odd number of bytes.
        ReconstructionError: If a wanted chunk is lost and fewer than ``k``
            chunks survive.
    """
    wanted = list(dict.fromkeys(int(i) for i in want))
    for index in list(chunks) + wanted:
        if not 0 <= index < code.n:
            raise CodecError(
                f"chunk index {index} is out of range 0..{code.n - 1} for code ({code.k}, {code.r})"
            )
    present = sorted(chunks)
    result = {i: chunks[i] for i in wanted if i in chunks}
    missing = [i for i in wanted if i not in chunks]
    if not missing:
        return result
    lost = [i for i in range(code.n) if i not in chunks]
    if len(present) < code.k:
        raise ReconstructionError(
            f"cannot rebuild chunk(s) {missing} of a code ({code.k}, {code.r}) stripe: chunks {lost} "
            f"are lost ({len(lost)} of {code.n}) but the code tolerates only {code.r} lost chunk(s); "
            f"{len(present)} survive and {code.k} are needed"
        )
    survivors = tuple(present[: code.k])
    arrays = [np.asarray(chunks[i]) for i in survivors]
    gf16.check_same(arrays, [f"chunk {i}" for i in survivors])
    words = [gf16.words(a, f"chunk {i}") for i, a in zip(survivors, arrays)]
    rows = _recovery_rows(code.k, code.r, survivors)
    for index in missing:
        acc = np.zeros_like(words[0])
        for s in range(code.k):
            coef = int(rows[index, s])
            if coef:
                acc ^= gf16.mul_words(coef, words[s])
        result[index] = gf16.like(acc, arrays[0])
    return result


def parity_delta(code: Code, parity_index: int, data_index: int, delta_bytes: np.ndarray) -> np.ndarray:
    """Return the change a data delta makes to one parity: ``coef * delta``.

    When rows of data chunk ``data_index`` change from ``old`` to ``new``,
    ``parity[parity_index] ^= parity_delta(code, parity_index, data_index,
    bitwise_delta(old, new))`` on the matching parity rows keeps the parity
    exactly equal to :func:`encode` of the new data, because the code is
    linear over XOR.  Deltas of different updates commute, so they may reach
    the parity in any order.  For ``parity_index == 0`` the coefficient is 1
    and the contribution is the delta itself.

    Args:
        code: The code.
        parity_index: Which parity, ``0 .. r-1`` (not the chunk index ``k + p``).
        data_index: Position of the updated chunk in its stripe, ``0 .. k-1``.
        delta_bytes: ``old ^ new`` as an array of any dtype (raw bytes count).

    Returns:
        A new array with ``delta_bytes``'s shape and dtype.

    Raises:
        CodecError: If an index is out of range or the byte count is odd.
    """
    return gf_mul_bytes(code.coef(parity_index, data_index), delta_bytes)
