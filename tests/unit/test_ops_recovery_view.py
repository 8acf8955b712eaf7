"""Unit tests of the ops a rebuild uses while training goes on (ops/cc/kernels/recovery_view.h).

In graph mode, in process, with the logged writers the optimizer uses. The
properties the background rebuild relies on: on a survivor, the first logged
write (apply, fold, undo) of a preserved row saves its words, so a preserved
read returns the T0 words however often the row changed since, and current
words outside the ranges; on the rebuilt PS, a lookup of pending rows waits
without a thread and names them as wanted, an install writes each pending
row once (a later install, racing or not, leaves it alone), the add mode
XORs, an update of a pending row is refused and changes nothing, and a wait
cut by its step's deadline is withdrawn.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from tf_ecrec import ops as ec_ops

V1 = tf.compat.v1


def _log_graph(rows: int = 8, dim: int = 2):
    graph = tf.Graph()
    with graph.as_default():
        var = V1.Variable(np.arange(rows * dim, dtype=np.float32).reshape(rows, dim), use_resource=True, name="var")
        log = ec_ops.delta_log(shared_name=f"log_{id(graph)}")
    return graph, var, log


def test_preserved_rows_read_their_words_from_before_the_first_write_after_preserving():
    graph, var, log = _log_graph()
    with graph.as_default():
        idx = V1.placeholder(tf.int64, [None])
        sid = V1.placeholder(tf.int64, [])
        apply = ec_ops.sparse_apply_sgd_with_delta(
            var, tf.ones([tf.size(idx), 2]), idx, 1.0, log=log, sid=sid, target=0
        )
        commit = ec_ops.delta_log_commit(log, sid)
        rows = V1.placeholder(tf.int64, [None])
        read = ec_ops.read_preserved_row_words(var, log, rows)
        preserve = ec_ops.preserve_ranges(log, var, [[2, 5]])
        end = ec_ops.preserve_end(log)
        stats = ec_ops.recovery_view_stats(log)
        value = var.read_value()
    with V1.Session(graph=graph) as sess:
        sess.run(var.initializer)
        t0 = sess.run(value)
        sess.run(preserve)
        for s, ids in enumerate([[3, 6], [3, 4], [6]], start=1):
            sess.run(apply, {idx: ids, sid: s})
            sess.run(commit, {sid: s})
        now = sess.run(value)
        assert not np.array_equal(now[3], t0[3]) and not np.array_equal(now[6], t0[6])
        got = sess.run(read, {rows: [3, 4, 6, 2]})
        # Rows 3 and 4 (in [2, 5)) read as at T0 however often written; row 6 is outside: current.
        np.testing.assert_array_equal(got, ec_ops.as_words(np.stack([t0[3], t0[4], now[6], t0[2]])))
        assert sess.run(stats).tolist() == [0, 2, 1]
        sess.run(end)
        np.testing.assert_array_equal(sess.run(read, {rows: [3]}), ec_ops.as_words(now[3:4]))
        assert sess.run(stats).tolist() == [0, 0, 0]


def test_folds_and_undos_preserve_parity_rows_too():
    graph = tf.Graph()
    with graph.as_default():
        parity = V1.Variable(np.arange(12, dtype=np.int32).reshape(6, 2), use_resource=True, name="parity")
        log = ec_ops.delta_log(shared_name="fold_log")
        fold = ec_ops.parity_update(
            parity, tf.constant([1, 4], tf.int64), tf.constant([[1, 1], [2, 2]], tf.int32), coef=1,
            log=log, sid=7, target=3, source=0, source_seq=1,
        )
        read = ec_ops.read_preserved_row_words(parity, log, tf.constant([1, 4], tf.int64))
        preserve = ec_ops.preserve_ranges(log, parity, [[0, 2]])
        value = parity.read_value()
    with V1.Session(graph=graph) as sess:
        sess.run(parity.initializer)
        t0 = sess.run(value)
        sess.run(preserve)
        sess.run(fold)
        now = sess.run(value)
        assert now[1].tolist() == (t0[1] ^ 1).tolist()
        np.testing.assert_array_equal(sess.run(read), np.stack([t0[1], now[4]]))


def test_a_rebuilt_ps_keeps_each_rows_t0_words_from_its_install():
    # A PS being rebuilt preserves too: a data row keeps the words its install gave it; a parity row that
    # took a fold while pending (its zeros were saved) keeps the installed code, not the folds since T0.
    graph = tf.Graph()
    with graph.as_default():
        data = V1.Variable(np.zeros([4, 2], np.float32), use_resource=True, name="data")
        parity = V1.Variable(np.zeros([4, 2], np.int32), use_resource=True, name="parity")
        log = ec_ops.delta_log(shared_name="rebuilt_log")
        begin = [ec_ops.rebuild_begin_pending(log, v, 4) for v in (data, parity)]
        preserve = [ec_ops.preserve_ranges(log, v, [[0, 4]]) for v in (data, parity)]
        fold = ec_ops.parity_update(parity, tf.constant([1], tf.int64), tf.constant([[3, 5]], tf.int32), coef=1,
                                    log=log, sid=7, target=3, source=0, source_seq=1)
        t0_words = ec_ops.as_words(np.array([[1.5, 2.5]], np.float32))
        install_data = ec_ops.install_row_words(data, log, [1], tf.constant(t0_words))
        install_parity = ec_ops.install_row_words(parity, log, [1], tf.constant([[9, 12]], tf.int32), add=True)
        apply = ec_ops.sparse_apply_sgd_with_delta(data, tf.ones([1, 2]), [1], 1.0, log=log, sid=8, target=0)
        read_data = ec_ops.read_preserved_row_words(data, log, tf.constant([1], tf.int64))
        read_parity = ec_ops.read_preserved_row_words(parity, log, tf.constant([1], tf.int64))
        stats = ec_ops.recovery_view_stats(log)
    with V1.Session(graph=graph) as sess:
        sess.run([data.initializer, parity.initializer])
        sess.run(begin + preserve)
        sess.run(fold)  # a fold reaches the pending parity row: its T0 zeros are saved
        sess.run([install_data, install_parity])
        sess.run(apply)  # training changes the installed data row
        sess.run(fold)
        assert sess.run(parity.read_value())[1].tolist() == [9, 12]  # 0 ^ f ^ code ^ f
        np.testing.assert_array_equal(sess.run(read_data), t0_words)
        np.testing.assert_array_equal(sess.run(read_parity), [[9, 12]])  # the code of the T0 data alone
        assert sess.run(stats).tolist() == [6, 2, 2]


def test_a_lookup_of_pending_rows_waits_until_they_are_installed_and_each_row_is_installed_once():
    graph, var, log = _log_graph(rows=6, dim=2)
    with graph.as_default():
        rows = V1.placeholder(tf.int64, [None])
        words = V1.placeholder(tf.int32, [None, 2])
        begin = ec_ops.rebuild_begin_pending(log, var, 6)
        with tf.control_dependencies([ec_ops.await_rebuilt_rows(log, var, rows)]):
            looked_up = tf.gather(var, rows)
        wanted = ec_ops.wanted_rows(log, var, 0, 6)
        install = ec_ops.install_row_words(var, log, rows, words)
        add = ec_ops.install_row_words(var, log, rows, words, add=True)
        stats = ec_ops.recovery_view_stats(log)
        wait = ec_ops.wait_wanted(log, 5000)
    with V1.Session(graph=graph) as sess:
        sess.run(var.initializer)
        sess.run(begin)
        assert sess.run(stats).tolist() == [6, 0, 0]
        np.testing.assert_array_equal(sess.run(wanted), [])
        out: dict[str, object] = {}

        def lookup():
            out["value"] = sess.run(looked_up, {rows: [4, 1, 4]})

        waiter = threading.Thread(target=lookup)
        waiter.start()
        started = time.monotonic()
        sess.run(wait)  # returns once the lookup asks, well before its 5 s timeout
        assert time.monotonic() - started < 4.0
        assert sorted(sess.run(wanted).tolist()) == [1, 4]
        assert waiter.is_alive()
        row1 = np.array([[10.0, 11.0]], np.float32)
        assert sess.run(install, {rows: [1], words: ec_ops.as_words(row1)}) == 1
        time.sleep(0.2)
        assert waiter.is_alive(), "row 4 is still pending"
        row4 = np.array([[40.0, 41.0]], np.float32)
        assert sess.run(install, {rows: [4], words: ec_ops.as_words(row4)}) == 1
        waiter.join(10)
        assert not waiter.is_alive()
        np.testing.assert_array_equal(out["value"], [[40, 41], [10, 11], [40, 41]])
        # A second install (e.g. the range walk after the wanted rows) leaves an installed row alone.
        assert sess.run(install, {rows: [1, 2], words: np.zeros([2, 2], np.int32)}) == 1
        np.testing.assert_array_equal(sess.run(var.read_value())[1], [10, 11])
        # The add mode XORs into the row.
        base = sess.run(var.read_value())[3]
        assert sess.run(add, {rows: [3], words: np.array([[5, 6]], np.int32)}) == 1
        np.testing.assert_array_equal(ec_ops.as_words(sess.run(var.read_value())[3:4])[0], ec_ops.as_words(base[None])[0] ^ [5, 6])
        assert sess.run(stats).tolist() == [2, 0, 0]
        sess.run(install, {rows: [0, 5], words: np.zeros([2, 2], np.int32)})
        assert sess.run(stats).tolist() == [0, 0, 0]


def test_an_update_of_a_pending_row_is_refused_and_changes_nothing():
    graph, var, log = _log_graph(rows=4, dim=2)
    with graph.as_default():
        idx = V1.placeholder(tf.int64, [None])
        apply = ec_ops.sparse_apply_sgd_with_delta(var, tf.ones([tf.size(idx), 2]), idx, 1.0, log=log, sid=1, target=0)
        begin = ec_ops.rebuild_begin_pending(log, var, 4)
        install = ec_ops.install_row_words(var, log, [0], tf.zeros([1, 2], tf.int32))
        value = var.read_value()
        pending = ec_ops.delta_log_pending(log)
    with V1.Session(graph=graph) as sess:
        sess.run(var.initializer)
        sess.run(begin)
        sess.run(install)
        before = sess.run(value)
        with pytest.raises(tf.errors.FailedPreconditionError, match=r"row 2 of .*var.* is not rebuilt yet"):
            sess.run(apply, {idx: [0, 2]})
        np.testing.assert_array_equal(sess.run(value), before)
        assert sess.run(pending)[0].size == 0, "a refused update logs nothing"
        sess.run(apply, {idx: [0]})
        assert sess.run(value)[0].tolist() == [-1.0, -1.0]


def test_a_wait_cut_by_its_deadline_is_withdrawn():
    graph, var, log = _log_graph(rows=3, dim=2)
    with graph.as_default():
        begin = ec_ops.rebuild_begin_pending(log, var, 3)
        with tf.control_dependencies([ec_ops.await_rebuilt_rows(log, var, tf.constant([2], tf.int64))]):
            looked_up = tf.gather(var, [2])
        wanted = ec_ops.wanted_rows(log, var, 0, 3)
        wait = ec_ops.wait_wanted(log, 300)
    with V1.Session(graph=graph) as sess:
        sess.run(var.initializer)
        sess.run(begin)
        with pytest.raises(tf.errors.DeadlineExceededError):
            sess.run(looked_up, options=V1.RunOptions(timeout_in_ms=500))
        assert sess.run(wanted).tolist() == [], "the cancelled lookup no longer asks"
        started = time.monotonic()
        sess.run(wait)  # nobody waits: returns at its timeout
        assert 0.2 < time.monotonic() - started < 5.0


def test_a_new_t0_forgets_what_an_unfinished_rebuild_left_pending_and_its_waiters_fail():
    """A rebuild started over re-creates the lost variables (under TF2, under new keys): the rows the first T0
    marked pending under the old key are forgotten by the next T0, else the PS would count them pending for
    ever and the rebuild would never finish; a lookup still waiting on them fails instead of hanging."""
    graph, old, log = _log_graph(rows=4, dim=2)
    with graph.as_default():
        new = V1.Variable(np.zeros([3, 2], np.float32), use_resource=True, name="recreated")
        begin_old = ec_ops.rebuild_begin_pending(log, old, 4)
        forget = ec_ops.rebuild_forget_pending(log)
        with tf.control_dependencies([forget]):
            begin_new = ec_ops.rebuild_begin_pending(log, new, 3)
        with tf.control_dependencies([ec_ops.await_rebuilt_rows(log, old, tf.constant([1], tf.int64))]):
            looked_up = tf.gather(old, [1])
        stats = ec_ops.recovery_view_stats(log)
        wanted = ec_ops.wanted_rows(log, old, 0, 4)
    with V1.Session(graph=graph) as sess:
        sess.run([old.initializer, new.initializer])
        sess.run(begin_old)
        assert sess.run(stats)[0] == 4
        failed: list[BaseException] = []

        def lookup() -> None:
            try:
                sess.run(looked_up)
            except tf.errors.OpError as exc:
                failed.append(exc)

        waiter = threading.Thread(target=lookup)
        waiter.start()
        deadline = time.monotonic() + 30
        while sess.run(wanted).tolist() != [1]:  # the lookup waits (it asks for its row)
            assert time.monotonic() < deadline and waiter.is_alive(), "the lookup never waited"
            time.sleep(0.01)
        sess.run(begin_new)  # the next T0: forgets first, then marks its own rows
        waiter.join(timeout=30)
        assert not waiter.is_alive() and len(failed) == 1 and isinstance(failed[0], tf.errors.AbortedError), failed
        assert sess.run(stats)[0] == 3, "the old key's rows are still counted pending"


def test_bad_input_is_named():
    graph, var, log = _log_graph(rows=3, dim=2)
    with graph.as_default():
        bad_rows = ec_ops.install_row_words(var, log, [5], tf.zeros([1, 2], tf.int32))
        bad_width = ec_ops.install_row_words(var, log, [0], tf.zeros([1, 3], tf.int32))
        bad_range = ec_ops.preserve_ranges(log, var, [[4, 2]])
        begin = ec_ops.rebuild_begin_pending(log, var, 3)
    with V1.Session(graph=graph) as sess:
        sess.run(var.initializer)
        sess.run(begin)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"rows\[0\] = 5 is out of range \[0, 3\)"):
            sess.run(bad_rows)
        with pytest.raises(tf.errors.InvalidArgumentError, match="3 words but the variables' rows have 2"):
            sess.run(bad_width)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"ranges\[0\] = \[4, 2\) is not a range"):
            sess.run(bad_range)
