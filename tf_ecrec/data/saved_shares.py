"""Each TF2 worker's share of a synthetic source, written once as files that its input pipeline reads.

A worker of TF2's ParameterServerStrategy runs no Python: its input pipeline is made on the
coordinator (a ``dataset_fn``) and shipped to it as a function.  Records read in the coordinator
and put into that function as constants (what the launcher did before) were copied into the
function at every ``model.fit`` call: a recovery's ``model.fit`` spent 3.4 s of its 7.5 s start
on it for two workers of 192,000 records (docs/benchmarks.md, "A TF2 recovery's fit").  Written
once with ``tf.data.Dataset.save``, a share is a path the worker's pipeline loads; the function is
small and each call of ``model.fit`` makes it again in milliseconds.

    shares = SavedShares(source, num_shares=2, directory=os.path.join(model_dir, "input"), batch_size=256)
    shares.write()                         # eagerly, on the coordinator, before model.fit
    dataset = shares.dataset(context.input_pipeline_id)   # inside the dataset_fn

Share ``i`` of ``n`` is records ``[i * s, min(N, (i + 1) * s, i * s + max_records))`` with
``s = ceil(N / n)``, repeated, in batches of ``batch_size`` (a batch may span the share's wrap).
The files are named by the source, the share count and the bound, so a coordinator restarted on the
same model directory reuses them (the records are a function of the source's seed), and a share is
renamed into place only once written whole.  Every task must read the directory: the launcher runs
its tasks on one machine.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil

import tensorflow as tf

from tf_ecrec.data.pipeline import dense_transform
from tf_ecrec.data.schema import NUM_CAT, NUM_DENSE
from tf_ecrec.data.synthetic import SyntheticCriteo
from tf_ecrec.errors import ConfigError

CHUNK_RECORDS = 4096
"""Records per saved element: the load yields chunks, unbatched and batched again in the pipeline."""

ELEMENT_SPEC = (
    {"dense": tf.TensorSpec([None, NUM_DENSE], tf.float32), "cat": tf.TensorSpec([None, NUM_CAT], tf.int64)},
    tf.TensorSpec([None], tf.float32),
)


class SavedShares:
    """The shares of `source` for `num_shares` input pipelines, under `directory` (see the module doc)."""

    def __init__(self, source: SyntheticCriteo, num_shares: int, directory: str, batch_size: int,
                 max_records: int) -> None:
        if num_shares < 1 or batch_size < 1 or max_records < 1:
            raise ConfigError(f"num_shares={num_shares}, batch_size={batch_size}, max_records={max_records}; rule: "
                              "each >= 1; source: SavedShares")
        self.source = source
        self.num_shares = int(num_shares)
        self.batch_size = int(batch_size)
        self.max_records = int(max_records)
        key = f"{source!r} sizes={list(source.table_sizes)} shares={num_shares} max={max_records}"
        self.directory = os.path.join(directory, hashlib.sha256(key.encode()).hexdigest()[:16])

    def bounds(self, share: int) -> tuple[int, int]:
        """Records ``[start, end)`` of `share`."""
        if not 0 <= share < self.num_shares:
            raise ConfigError(f"share {share}; rule: 0 <= share < {self.num_shares} (the input pipelines the shares "
                              "were written for); source: SavedShares")
        size = math.ceil(self.source.num_records / self.num_shares)
        start = share * size
        return start, min(self.source.num_records, start + size, start + self.max_records)

    def path(self, share: int) -> str:
        return os.path.join(self.directory, f"share-{share}-of-{self.num_shares}")

    def write(self) -> list[str]:
        """Writes every share not written whole yet (eagerly); returns the paths written now."""
        written = []
        for share in range(self.num_shares):
            final = self.path(share)
            if os.path.isdir(final):
                continue
            partial = final + ".partial"
            shutil.rmtree(partial, ignore_errors=True)  # what a coordinator killed while writing left
            start, end = self.bounds(share)
            batch = self.source.read(start, end)
            features = {"dense": dense_transform(batch.dense), "cat": batch.cat}
            records = tf.data.Dataset.from_tensor_slices((features, batch.label))
            records.batch(CHUNK_RECORDS).save(partial)
            os.replace(partial, final)
            written.append(final)
        return written

    def dataset(self, share: int) -> tf.data.Dataset:
        """`share`'s records, repeated, in batches (a load of its files: call `write` first)."""
        path = self.path(share)
        self.bounds(share)  # checks the share
        if not os.path.isdir(path):
            raise ConfigError(f"share {share} not written at {path}; rule: SavedShares.write() before the dataset; "
                              "source: SavedShares")
        return tf.data.Dataset.load(path, element_spec=ELEMENT_SPEC).unbatch().repeat().batch(self.batch_size)
