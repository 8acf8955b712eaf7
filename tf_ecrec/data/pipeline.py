"""From a record source and a stream of record ranges to a `tf.data.Dataset`.

Sharding is by contiguous record ranges ("shards") of a few batches.  With
static sharding (`StaticShards`) worker ``w`` of ``W`` takes shards
``w, w + W, w + 2W, ...`` of every epoch, epoch after epoch; with the job
master's dynamic sharding the ranges come from the master instead
(`make_leased_dataset`, fed `LeasedRange` values).  Within a shard, batches
are consecutive records, so one worker reading a fixed shard stream sees a
fixed data order (what ``--deterministic`` relies on).

The dataset yields ``(features, label)`` with
``features = {"dense": float32[B, 13], "cat": int64[B, 26]}`` and
``label = float32[B]``; ``B`` is the batch size except for the last batch of a
shard, which may be shorter (and for Criteo files, batches from which corrupt
lines were skipped).  Models must use the actual batch size
(``tf.shape(label)[0]``), never the configured one.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_ecrec.data.criteo import CriteoFiles
from tf_ecrec.data.schema import NUM_CAT, NUM_DENSE
from tf_ecrec.data.stream import PartitionSource, StreamDirectory
from tf_ecrec.data.synthetic import SyntheticCriteo
from tf_ecrec.errors import ConfigError

Source = SyntheticCriteo | CriteoFiles

# Graph collections holding, for the batch of the current step, the number of
# records trained and of corrupt records skipped (scalar int tensors); progress
# hooks fetch them.  `with_data_accounting` fills both.
BATCH_RECORDS_COLLECTION = "tf_ecrec_batch_records"
CORRUPT_RECORDS_COLLECTION = "tf_ecrec_corrupt_records"
# The feature carrying a batch's count of skipped corrupt records.
CORRUPT_KEY = "__tf_ecrec_corrupt_records"


@dataclasses.dataclass(frozen=True)
class StaticShards:
    """Round-robin assignment of fixed-size record ranges to one worker, forever.

    Attributes:
      num_records: records in one epoch.
      shard_records: records per shard (a multiple of the batch size).
      num_workers: workers sharing the data.
      worker_index: this worker's position in 0..num_workers-1.
    """

    num_records: int
    shard_records: int
    num_workers: int = 1
    worker_index: int = 0

    def __post_init__(self) -> None:
        if self.shard_records < 1 or self.num_records < 1:
            raise ConfigError(
                f"shards need num_records >= 1 and shard_records >= 1, got {self.num_records} and "
                f"{self.shard_records}; source: StaticShards"
            )
        if not 0 <= self.worker_index < self.num_workers:
            raise ConfigError(
                f"worker_index {self.worker_index} is outside 0..{self.num_workers - 1}; source: StaticShards"
            )

    def __iter__(self) -> Iterator[tuple[int, int]]:
        per_epoch = math.ceil(self.num_records / self.shard_records)
        epoch = 0
        while True:
            base = epoch * self.num_records
            for j in range(self.worker_index, per_epoch, self.num_workers):
                start = j * self.shard_records
                yield base + start, base + min(start + self.shard_records, self.num_records)
            epoch += 1
            if per_epoch <= self.worker_index:  # more workers than shards: nothing for us
                return


def _batches(ranges: Iterable[tuple[int, int]], batch_size: int) -> Iterator[tuple[int, int]]:
    for start, end in ranges:
        for s in range(start, end, batch_size):
            yield s, min(s + batch_size, end)


def make_dataset(
    source: Source,
    ranges: Iterable[tuple[int, int]],
    batch_size: int,
    table_sizes: Sequence[int],
) -> tf.data.Dataset:
    """A dataset of parsed batches of `source` over `ranges`.

    Args:
      source: a `SyntheticCriteo` or `CriteoFiles`.
      ranges: record ranges [start, end), consumed lazily in order.
      batch_size: records per batch (a shard's last batch may be shorter).
      table_sizes: rows of each categorical table; Criteo categoricals are
        hashed into these.
    """
    sizes = _table_sizes(table_sizes, batch_size)

    if isinstance(source, CriteoFiles):

        def gen_lines() -> Iterator[tuple[np.ndarray, int]]:
            for s, e in _batches(ranges, batch_size):
                lines = source.read_lines(s, e)
                if lines:
                    yield np.array(lines, dtype=object), (e - s) - len(lines)

        return _lines_dataset(gen_lines, sizes)

    def gen_arrays() -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        for s, e in _batches(ranges, batch_size):
            b = source.read(s, e)
            yield b.dense, b.cat, b.label

    return _arrays_dataset(gen_arrays)


def _table_sizes(table_sizes: Sequence[int], batch_size: int) -> tf.Tensor:
    if len(table_sizes) != NUM_CAT:
        raise ConfigError(f"expected {NUM_CAT} table sizes, got {len(table_sizes)}; source: table_sizes")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}; source: --batch-size")
    return tf.constant(np.asarray(table_sizes, dtype=np.int64))


def _lines_dataset(gen: Callable[[], Iterator[tuple[np.ndarray, int]]], sizes: tf.Tensor) -> tf.data.Dataset:
    """Batches of Criteo lines (with their corrupt count) parsed in the graph."""
    ds = tf.data.Dataset.from_generator(gen, output_signature=(tf.TensorSpec([None], tf.string), tf.TensorSpec([], tf.int64)))
    ds = ds.map(lambda lines, bad: _parse_lines(lines, bad, sizes), num_parallel_calls=1, deterministic=True)
    return without_autotune(ds.prefetch(2))


def _arrays_dataset(gen: Callable[[], Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]]) -> tf.data.Dataset:
    """Batches of synthetic records (already parsed arrays)."""
    ds = tf.data.Dataset.from_generator(
        gen,
        output_signature=(
            tf.TensorSpec([None, NUM_DENSE], tf.int64),
            tf.TensorSpec([None, NUM_CAT], tf.int64),
            tf.TensorSpec([None], tf.float32),
        ),
    )
    zero = tf.constant(0, tf.int64)
    ds = ds.map(lambda d, c, y: ({"dense": dense_transform(d), "cat": c, CORRUPT_KEY: zero}, y))
    return without_autotune(ds.prefetch(2))


def without_autotune(ds: tf.data.Dataset) -> tf.data.Dataset:
    """`ds` with tf.data's autotuning off, so that its iterator starts no model thread.

    Destroying an iterator joins that thread, which sleeps between its optimizations for a period that
    doubles up to a minute; a trainer's session close (MonitoredSession's, on a PS failure, and at the end
    of training) destroys the iterator on the trainer's own TensorFlow server, inside the close's
    DeleteWorkerSession, so the close waited out the sleep: 6 s to about a minute before the next session
    (seen in the chief's native stacks: ``~LogicalThreadWrapper`` under ``IteratorResource::~State``, the
    model thread in ``Model::OptimizeLoop``).  These pipelines fix their own parallelism (one parse call
    at a time, two batches prefetched), so autotuning had nothing to tune.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


def input_fn_without_autotune(input_fn: Callable[..., Any]) -> Callable[..., Any]:
    """An Estimator `input_fn` whose dataset runs without tf.data's autotuning thread (`without_autotune`),
    unless the dataset's own options set autotuning on or off.  The wrapper has `input_fn`'s signature: the
    Estimator passes ``params``, ``config``, ``mode`` or ``input_context`` by the names it finds there.  A
    ``num_parallel_calls=tf.data.AUTOTUNE`` then runs on as many threads as the CPUs TensorFlow schedules
    on, and a ``prefetch(AUTOTUNE)`` keeps its own buffer tuning (which needs no thread)."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = input_fn(*args, **kwargs)
        if isinstance(result, tf.data.Dataset) and result.options().autotune.enabled is None:
            return without_autotune(result)
        return result

    wrapped.__signature__ = inspect.signature(input_fn)  # type: ignore[attr-defined]
    wrapped.__name__ = getattr(input_fn, "__name__", "input_fn")
    return wrapped


def dense_transform(raw: tf.Tensor) -> tf.Tensor:
    """The model's dense features from the raw counts: ``log1p`` of the count, negatives as 0."""
    return tf.math.log1p(tf.cast(tf.maximum(raw, 0), tf.float32))


def _parse_lines(lines: tf.Tensor, bad: tf.Tensor, sizes: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    lines = tf.strings.regex_replace(lines, "\r$", "")
    defaults = (
        [tf.constant(0, tf.int64)]
        + [tf.constant(0, tf.int64)] * NUM_DENSE
        + [tf.constant("", tf.string)] * NUM_CAT
    )
    cols = tf.io.decode_csv(lines, record_defaults=defaults, field_delim="\t", na_value="")
    label = tf.cast(cols[0], tf.float32)
    dense = dense_transform(tf.stack(cols[1 : 1 + NUM_DENSE], axis=1))
    hashed = tf.strings.to_hash_bucket_fast(tf.stack(cols[1 + NUM_DENSE :], axis=1), (1 << 62))
    return {"dense": dense, "cat": tf.math.floormod(hashed, sizes), CORRUPT_KEY: bad}, label


ModelFn = Callable[..., Any]


def with_data_accounting(model_fn: ModelFn) -> ModelFn:
    """Wraps a model_fn so progress hooks can count what each step trained.

    The wrapper removes the corrupt-record count from the features (the
    model never sees it) and puts it, with the batch's record count
    (``tf.size(labels)``), into the graph collections the hooks fetch.  The
    model_fn's signature is preserved for the Estimator (it inspects which of
    ``params``/``config`` it takes).
    """

    def wrapped(features, labels, mode, params, config):
        features = dict(features)
        corrupt = features.pop(CORRUPT_KEY, None)
        if mode == tf.estimator.ModeKeys.TRAIN and labels is not None:
            tf.compat.v1.add_to_collection(BATCH_RECORDS_COLLECTION, tf.size(labels))
            if corrupt is not None:
                tf.compat.v1.add_to_collection(CORRUPT_RECORDS_COLLECTION, corrupt)
        return model_fn(features=features, labels=labels, mode=mode, params=params, config=config)

    return wrapped


def with_step_keyed_data(model_fn: ModelFn, source: Source, batch_size: int, table_sizes: Sequence[int]) -> ModelFn:
    """Wraps a model_fn so that the batch of a step is a function of the global step.

    For deterministic single-worker runs: the features of the step that
    starts at global step ``s`` are records ``[s * B, (s + 1) * B)`` of
    `source` (modulo its size), read in the graph from the global step's
    value.  The data order is then part of the model state: a step that a
    failure undid is retried with the same batch, and a run that recovered
    from a failure trains on exactly the records of a run that had none.
    Pair it with `step_keyed_input_fn` (the Estimator still wants an
    input_fn; its output is ignored).
    """
    sizes = np.asarray(table_sizes, dtype=np.int64)

    def read(step: np.ndarray) -> tuple[np.ndarray | np.int64, ...]:
        start = int(step) * batch_size
        if isinstance(source, CriteoFiles):
            lines = source.read_lines(start, start + batch_size)
            return (np.array(lines, dtype=object), np.int64(batch_size - len(lines)))
        b = source.read(start, start + batch_size)
        return b.dense, b.cat, b.label

    def wrapped(features, labels, mode, params, config):
        if mode != tf.estimator.ModeKeys.TRAIN:
            return model_fn(features=features, labels=labels, mode=mode, params=params, config=config)
        step = tf.compat.v1.train.get_global_step()
        value = step.read_value() if hasattr(step, "read_value") else tf.identity(step)
        if isinstance(source, CriteoFiles):
            lines, bad = tf.numpy_function(read, [value], [tf.string, tf.int64], stateful=False)
            lines.set_shape([None])
            features, labels = _parse_lines(lines, bad, tf.constant(sizes))
        else:
            dense, cat, label = tf.numpy_function(read, [value], [tf.int64, tf.int64, tf.float32], stateful=False)
            dense.set_shape([None, NUM_DENSE])
            cat.set_shape([None, NUM_CAT])
            label.set_shape([None])
            features = {"dense": dense_transform(dense), "cat": cat, CORRUPT_KEY: tf.constant(0, tf.int64)}
            labels = label
        return model_fn(features=features, labels=labels, mode=mode, params=params, config=config)

    return wrapped


def step_keyed_input_fn() -> tf.data.Dataset:
    """The placeholder input of `with_step_keyed_data`: an endless dataset of nothing useful."""
    return without_autotune(tf.data.Dataset.from_tensors(({"unused": tf.constant(0.0)}, tf.constant(0.0))).repeat())


@dataclasses.dataclass(frozen=True)
class LeasedRange:
    """Records ``[start, end)`` of a source leased from the job master, with the reader's callbacks.

    Attributes:
      start: first record (a global index: epoch * records per epoch + offset).
      end: one past the last record.
      on_start: called once, right before the range's first batch is
        yielded; the caller registers the lease for progress accounting here,
        in reading order.
      on_empty: called instead when no record of the range is readable (every
        line corrupt): no batch of it will ever be trained, so the caller
        acknowledges it itself.
    """

    start: int
    end: int
    on_start: Callable[[], None]
    on_empty: Callable[[], None]


def make_leased_dataset(
    source: Source,
    open_ranges: Callable[[], Iterable[LeasedRange]],
    batch_size: int,
    table_sizes: Sequence[int],
) -> tf.data.Dataset:
    """A dataset of parsed batches of `source` over ranges leased from the job master.

    Same elements as `make_dataset`, with one difference in accounting: the
    records of a range are trained exactly once per lease, and every record of
    the range is counted in exactly one batch as either a label or a corrupt
    record (the ``CORRUPT_KEY`` feature).  A batch whose lines are all corrupt
    is never yielded; its count goes to the nearest batch of the same range
    (the previous one, or the next for leading batches), so that
    ``tf.size(labels) + corrupt`` of each step is what the step consumed of
    its range, in reading order.  A range with no readable line at all gets
    ``on_empty`` instead of batches.

    Args:
      source: a `SyntheticCriteo`, `CriteoFiles`, `StreamDirectory` or `PartitionSource`.
      open_ranges: called each time the pipeline starts (the Estimator
        re-initializes its iterator with every new session, dropping what
        was prefetched); returns the ranges to read from then on.
      batch_size: records per batch (a range's last batch may be shorter).
      table_sizes: rows of each categorical table.
    """
    sizes = _table_sizes(table_sizes, batch_size)

    if isinstance(source, (CriteoFiles, StreamDirectory, PartitionSource)):  # TSV lines by record index

        def gen_lines() -> Iterator[tuple[np.ndarray, int]]:
            for leased in open_ranges():
                batches = [(source.read_lines(s, e), e - s) for s, e in _batches([(leased.start, leased.end)], batch_size)]
                counted = _attribute_corrupt(batches)
                if not counted:
                    leased.on_empty()
                    continue
                leased.on_start()
                for lines, corrupt in counted:
                    yield np.array(lines, dtype=object), corrupt

        return _lines_dataset(gen_lines, sizes)

    def gen_arrays() -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        for leased in open_ranges():
            leased.on_start()
            for s, e in _batches([(leased.start, leased.end)], batch_size):
                b = source.read(s, e)
                yield b.dense, b.cat, b.label

    return _arrays_dataset(gen_arrays)


def _attribute_corrupt(batches: Sequence[tuple[list[bytes], int]]) -> list[tuple[list[bytes], int]]:
    """``[(lines, records read)]`` of one range -> ``[(lines, corrupt records counted with them)]``.

    Batches with no readable line are dropped; their records are counted as
    corrupt with the previous kept batch (or, before the first, the first).
    The counts of the result add up to the records of the range; the result
    is empty when no line was readable.
    """
    out: list[tuple[list[bytes], int]] = []
    leading = 0
    for lines, records in batches:
        corrupt = records - len(lines)
        if not lines:
            if out:
                out[-1] = (out[-1][0], out[-1][1] + corrupt)
            else:
                leading += corrupt
            continue
        out.append((lines, corrupt + leading))
        leading = 0
    return out
