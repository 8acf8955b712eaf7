
import numpy as np
import pytest

from tf_ecrec.data.criteo import CriteoFiles, check_line
from tf_ecrec.data.schema import NUM_CAT, NUM_DENSE, dense_transform
from tf_ecrec.data.synthetic import SyntheticCriteo, write_criteo_tsv
from tf_ecrec.errors import ConfigError, DataError

GOOD = "\t".join(["1"] + ["3", "", "-2"] + ["0"] * (NUM_DENSE - 3) + ["68fd1e64", ""] + ["0a"] * (NUM_CAT - 2))


def _write(path, lines, trailing_newline=True):
    text = "\n".join(lines) + ("\n" if trailing_newline else "")
    path.write_bytes(text.encode())
    return str(path)


def test_a_well_formed_line_passes_and_each_rule_is_named():
    assert check_line(GOOD.encode()) is None
    assert "expected 40 tab-separated fields, found 3" in check_line(b"1\t2\t3")
    assert "label must be 0 or 1" in check_line(("2" + GOOD[1:]).encode())
    bad_int = GOOD.split("\t")
    bad_int[2] = "1.5"
    assert "integer feature I2 must be an integer" in check_line("\t".join(bad_int).encode())
    bad_hex = GOOD.split("\t")
    bad_hex[20] = "xyz"
    assert "categorical feature C7 must be hex" in check_line("\t".join(bad_hex).encode())


@pytest.mark.parametrize("value", ["-", "--1", "1" * 19, "-" + "9" * 25])
def test_an_integer_field_that_int64_cannot_hold_is_a_corrupt_line(tmp_path, value):
    bad = GOOD.split("\t")
    bad[1] = value
    line = "\t".join(bad)
    assert "integer feature I1 must be an integer of at most 18 digits" in check_line(line.encode())
    ok = GOOD.split("\t")
    ok[1] = "-" + "9" * 18
    assert check_line("\t".join(ok).encode()) is None
    files = CriteoFiles([_write(tmp_path / "c.tsv", [GOOD, line, GOOD])], on_corrupt="skip")
    assert len(files.read_lines(0, 3)) == 2 and files.corrupt_records == 1
    path = _write(tmp_path / "d.tsv", [GOOD, line])
    with pytest.raises(DataError, match=rf"corrupt record at {path}:2: integer feature I1"):
        CriteoFiles([path], on_corrupt="fail").read_lines(0, 2)


def test_ranges_span_files_and_wrap_around_the_epoch(tmp_path):
    a = _write(tmp_path / "a.tsv", [GOOD.replace("68fd1e64", f"{i:08x}") for i in range(5)])
    b = _write(tmp_path / "b.tsv", [GOOD.replace("68fd1e64", f"{i:08x}") for i in range(5, 8)], trailing_newline=False)
    files = CriteoFiles([a, b])
    assert files.num_records == 8
    ids = lambda lines: [int(l.split(b"\t")[14], 16) for l in lines]  # noqa: E731
    assert ids(files.read_lines(3, 7)) == [3, 4, 5, 6]
    assert ids(files.read_lines(6, 11)) == [6, 7, 0, 1, 2]  # record 8 is record 0 of the next epoch
    assert files.corrupt_records == 0


def test_corrupt_lines_are_counted_and_skipped(tmp_path):
    lines = [GOOD] * 6
    lines[2] = "1\t2"
    lines[4] = ""
    files = CriteoFiles([_write(tmp_path / "c.tsv", lines)], on_corrupt="skip")
    assert len(files.read_lines(0, 6)) == 4
    assert files.corrupt_records == 2


def test_corrupt_line_fails_the_run_with_file_line_and_rule(tmp_path):
    lines = [GOOD] * 6
    lines[3] = GOOD.replace("68fd1e64", "68fd1e6g")
    path = _write(tmp_path / "c.tsv", lines)
    files = CriteoFiles([path], on_corrupt="fail")
    assert len(files.read_lines(0, 3)) == 3
    with pytest.raises(DataError, match=rf"corrupt record at {path}:4: categorical feature C1 must be hex"):
        files.read_lines(0, 6)


def test_crlf_lines_are_accepted(tmp_path):
    path = tmp_path / "crlf.tsv"
    path.write_bytes((GOOD + "\r\n" + GOOD + "\r\n").encode())
    files = CriteoFiles([str(path)])
    assert len(files.read_lines(0, 2)) == 2 and files.corrupt_records == 0


def test_bad_reader_arguments(tmp_path):
    with pytest.raises(ConfigError, match=r"on_corrupt must be one of"):
        CriteoFiles([str(tmp_path / "x")], on_corrupt="ignore")
    with pytest.raises(ConfigError, match=r"cannot open Criteo file"):
        CriteoFiles([str(tmp_path / "missing.tsv")])
    (tmp_path / "empty.tsv").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"contain no records"):
        CriteoFiles([str(tmp_path / "empty.tsv")])


def test_the_shipped_samples_have_the_expected_corruption(criteo_sample, criteo_corrupt_sample):
    clean = CriteoFiles([criteo_sample])
    assert len(clean.read_lines(0, clean.num_records)) == clean.num_records == 4000
    dirty = CriteoFiles([criteo_corrupt_sample])
    assert len(dirty.read_lines(0, dirty.num_records)) == 400 - 8
    assert dirty.corrupt_records == 8


def test_generated_files_are_valid_criteo(tmp_path):
    path = str(tmp_path / "gen.tsv")
    assert write_criteo_tsv(path, 500, seed=1, corrupt_every=100) == 5
    files = CriteoFiles([path])
    assert len(files.read_lines(0, 500)) == 495


def test_synthetic_records_depend_only_on_seed_and_index():
    src = SyntheticCriteo([1000] * NUM_CAT, 100_000, seed=3)
    whole = src.read(4000, 9000)
    part = SyntheticCriteo([1000] * NUM_CAT, 100_000, seed=3).read(6000, 6100)
    np.testing.assert_array_equal(part.cat, whole.cat[2000:2100])
    np.testing.assert_array_equal(part.dense, whole.dense[2000:2100])
    np.testing.assert_array_equal(part.label, whole.label[2000:2100])
    other = SyntheticCriteo([1000] * NUM_CAT, 100_000, seed=4).read(6000, 6100)
    assert not np.array_equal(other.cat, part.cat)
    assert whole.cat.min() >= 0 and whole.cat.max() < 1000


def test_synthetic_ids_are_zipf_skewed_and_spread_over_the_table():
    src = SyntheticCriteo([10_000] * NUM_CAT, 100_000, seed=0)
    ids = src.read(0, 50_000).cat[:, 0]
    counts = np.sort(np.bincount(ids, minlength=10_000))[::-1]
    assert counts[:10].sum() > 0.2 * len(ids)  # a few hot rows carry a large share
    hot = np.argsort(np.bincount(ids, minlength=10_000))[::-1][:20]
    assert len(set(hot // 3334)) == 3  # hot rows fall in every third of the table


def test_dense_transform_clips_negatives():
    np.testing.assert_allclose(dense_transform(np.array([[-5, 0, 1, 9]])), [[0, 0, np.log(2), np.log(10)]], rtol=1e-6)


def test_tf_pipeline_parses_criteo_lines_into_table_ranges(tmp_path):
    import tensorflow as tf

    from tf_ecrec.data.pipeline import StaticShards, make_dataset

    path = _write(tmp_path / "p.tsv", [GOOD] * 10)
    files = CriteoFiles([path])
    sizes = [7] * NUM_CAT
    ds = make_dataset(files, StaticShards(10, 4), 4, sizes)
    features, label = next(iter(ds))
    assert features["dense"].shape == (4, NUM_DENSE) and features["cat"].shape == (4, NUM_CAT)
    np.testing.assert_allclose(features["dense"][0, :4].numpy(), [np.log(4), 0.0, 0.0, 0.0], rtol=1e-6)
    assert label.numpy().tolist() == [1.0] * 4
    cat = features["cat"].numpy()
    assert cat.min() >= 0 and cat.max() < 7
    # the same value hashes to the same row; the empty C2 hashes to a fixed row too
    assert (cat[:, 0] == cat[0, 0]).all() and (cat[:, 1] == cat[0, 1]).all()
    expected = tf.strings.to_hash_bucket_fast(["68fd1e64"], 1 << 62).numpy()[0] % 7
    assert cat[0, 0] == expected


def test_static_shards_round_robin_covers_every_record_once_per_epoch():
    from tf_ecrec.data.pipeline import StaticShards

    seen = []
    for w in range(3):
        it = iter(StaticShards(1000, 96, 3, w))
        seen += [next(it) for _ in range(len(range(w, 11, 3)))]
    covered = sorted(i for s, e in seen for i in range(s, e))
    assert covered == list(range(1000))
    first_of_next_epoch = next(x for x in iter(StaticShards(1000, 96, 3, 0)) if x[0] >= 1000)
    assert first_of_next_epoch == (1000, 1096)


def test_every_training_pipeline_runs_without_tf_datas_autotuning_thread(tmp_path):
    # Destroying an iterator joins tf.data's autotuning model thread, which sleeps for up to a minute between
    # optimizations: a trainer's session close (on a PS failure, at the end) waited that out inside its own
    # DeleteWorkerSession.  Each pipeline a trainer reads must turn autotuning off (tf_ecrec.data.pipeline).
    from tf_ecrec.data.pipeline import StaticShards, make_dataset, make_leased_dataset, step_keyed_input_fn

    sizes = [7] * NUM_CAT
    lines = CriteoFiles([_write(tmp_path / "p.tsv", [GOOD] * 10)])
    synthetic = SyntheticCriteo(sizes, 100, seed=1)
    pipelines = {
        "criteo lines, static shards": make_dataset(lines, StaticShards(10, 4), 4, sizes),
        "synthetic, static shards": make_dataset(synthetic, StaticShards(100, 4), 4, sizes),
        "criteo lines, leased": make_leased_dataset(lines, lambda: iter(()), 4, sizes),
        "synthetic, leased": make_leased_dataset(synthetic, lambda: iter(()), 4, sizes),
        "step-keyed placeholder": step_keyed_input_fn(),
    }
    assert {name: ds.options().autotune.enabled for name, ds in pipelines.items()} == dict.fromkeys(pipelines, False)


def test_a_users_input_fn_keeps_its_signature_and_its_own_autotune_choice():
    import tensorflow as tf
    from tensorflow.python.util import function_utils

    from tf_ecrec.data.pipeline import input_fn_without_autotune

    def input_fn(params, mode):  # what the Estimator reads to pass its arguments by name
        ds = tf.data.Dataset.range(4).map(lambda x: x * params["k"], num_parallel_calls=tf.data.AUTOTUNE)
        if mode == "explicit":
            options = tf.data.Options()
            options.autotune.enabled = True
            ds = ds.with_options(options)
        return ds.prefetch(tf.data.AUTOTUNE)

    wrapped = input_fn_without_autotune(input_fn)
    assert function_utils.fn_args(wrapped) == ("params", "mode")
    plain = wrapped(params={"k": 3}, mode="train")
    assert plain.options().autotune.enabled is False and list(plain.as_numpy_iterator()) == [0, 3, 6, 9]
    assert wrapped(params={"k": 1}, mode="explicit").options().autotune.enabled is True  # the user's choice stands
    assert input_fn_without_autotune(lambda: ({"x": tf.zeros([2])}, tf.zeros([2])))()[1].shape == (2,)  # not a dataset
