"""`tf_ecrec.data.saved_shares`: each worker's share written once, loaded as the records the source holds."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from tf_ecrec.data.pipeline import dense_transform
from tf_ecrec.data.saved_shares import SavedShares
from tf_ecrec.data.synthetic import SyntheticCriteo
from tf_ecrec.errors import ConfigError

SIZES = [50 + i for i in range(26)]


def _records(dataset: tf.data.Dataset, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dense, cat, label = [], [], []
    for features, y in dataset.unbatch().take(n):
        dense.append(features["dense"].numpy())
        cat.append(features["cat"].numpy())
        label.append(y.numpy())
    return np.stack(dense), np.stack(cat), np.array(label)


def test_each_share_is_its_records_of_the_source_repeated_in_batches(tmp_path):
    source = SyntheticCriteo(SIZES, 10_001, seed=7)
    shares = SavedShares(source, 3, str(tmp_path), batch_size=64, max_records=3_000)
    assert len(shares.write()) == 3
    for share in range(3):
        start, end = shares.bounds(share)
        assert (start, end) == (share * 3_334, min(10_001, share * 3_334 + 3_000))
        expected = source.read(start, end)
        n = end - start
        dense, cat, label = _records(shares.dataset(share), 2 * n)  # twice: the share repeats
        want_dense = dense_transform(expected.dense).numpy()
        for lap in (0, 1):
            got = slice(lap * n, (lap + 1) * n)
            np.testing.assert_array_equal(cat[got], expected.cat)
            np.testing.assert_array_equal(label[got], expected.label)
            np.testing.assert_array_equal(dense[got], want_dense)
        first = next(iter(shares.dataset(share)))
        assert first[1].shape == (64,)  # batches of the batch size, across the wrap too


def test_a_second_coordinator_reuses_whole_shares_and_rewrites_a_partial_one(tmp_path):
    source = SyntheticCriteo(SIZES, 2_000, seed=1)
    shares = SavedShares(source, 2, str(tmp_path), batch_size=32, max_records=10_000)
    shares.write()
    again = SavedShares(source, 2, str(tmp_path), batch_size=32, max_records=10_000)
    assert again.directory == shares.directory and again.write() == []
    # A coordinator killed while writing share 1 left a partial directory and no share.
    os.rename(shares.path(1), shares.path(1) + ".partial")
    assert again.write() == [shares.path(1)]
    assert _records(again.dataset(1), 1_000)[1].tolist() == source.read(1_000, 2_000).cat.tolist()
    # Another source (another seed) does not read these files.
    other = SavedShares(SyntheticCriteo(SIZES, 2_000, seed=2), 2, str(tmp_path), batch_size=32, max_records=10_000)
    assert other.directory != shares.directory


def test_bad_shares_are_refused_naming_the_value_and_the_rule(tmp_path):
    shares = SavedShares(SyntheticCriteo(SIZES, 100), 2, str(tmp_path), batch_size=8, max_records=100)
    with pytest.raises(ConfigError, match=r"share 2; rule: 0 <= share < 2"):
        shares.dataset(2)
    with pytest.raises(ConfigError, match=r"share 0 not written at .*; rule: SavedShares.write\(\) before"):
        shares.dataset(0)
    with pytest.raises(ConfigError, match=r"num_shares=0, batch_size=8, max_records=1; rule: each >= 1"):
        SavedShares(SyntheticCriteo(SIZES, 100), 0, str(tmp_path), batch_size=8, max_records=1)
