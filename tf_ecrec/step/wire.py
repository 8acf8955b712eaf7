"""Several tensors sent between tasks as one: a fold round's transfers packed per (source PS, target PS).

Every tensor a graph sends from one task to another is one gRPC ``RecvTensor``
call, and on these machines that call, not the bytes, is what a small
transfer costs: a fold round that sent each of its take's five tensors to
each fold target spent about 30 ms of CPU on some 110 calls with nothing to
fold (docs/benchmarks.md, "A fold round's cost was its transfers").  `pack`
(``EcRec>Pack``, on the sending task) puts int32, int64 and bool tensors into
one int32 vector with their shapes; `unpack` (``EcRec>Unpack``, on the
receiving task) gives them back, so that one call carries them all.  The bytes
are the same; the copies are local.
"""

from __future__ import annotations

import tensorflow as tf

from tf_ecrec.ops.loader import load_library

CARRIED = (tf.int32, tf.int64, tf.bool)


def pack(tensors: list[tf.Tensor], name: str = "packed") -> tuple[tf.Tensor, list[tuple[tf.DType, int]]]:
    """(one int32 vector holding `tensors`, their (dtype, rank) for `unpack`)."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    for t in tensors:
        if t.dtype not in CARRIED:
            raise TypeError(f"wire.pack: a {t.dtype.name} tensor of shape {t.shape}; rule: int32, int64 or bool; "
                            "source: the tensors to pack")
        if t.shape.rank is None:
            raise TypeError(f"wire.pack: a {t.dtype.name} tensor of unknown rank; rule: a known rank; "
                            "source: the tensors to pack")
    blob = load_library().ec_rec_pack(tensors=tensors, name=name)
    return blob, [(t.dtype, int(t.shape.rank)) for t in tensors]


def unpack(blob: tf.Tensor, specs: list[tuple[tf.DType, int]], name: str = "unpacked") -> list[tf.Tensor]:
    """The tensors `pack` put into `blob`, with their dtypes and shapes."""
    return list(load_library().ec_rec_unpack(blob=blob, T=[d for d, _ in specs], ranks=[r for _, r in specs],
                                             name=name))
