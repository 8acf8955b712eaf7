"""Unit tests of the delta log: logged updates, commit, read, undo, XOR of rows.

All in graph mode, in process. The properties checked are those recovery of
a cut training step relies on: a logged op changes the variables exactly as
its unlogged twin does and appends one entry recording exactly the words it
XORed into each distinct row, atomically with the update (concurrent steps
on shared variables log in the order they applied); undoing entries restores
variables, slots, parity, replicas and int64 counters bit for bit; a failing
op changes neither variables nor log; the log lives in the device's
ResourceMgr, across sessions of a server.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence

import numpy as np
import pytest
import tensorflow as tf

from tf_ecrec import ops as ec_ops
from tf_ecrec.erasure import codec

V1 = tf.compat.v1
F32 = np.float32
ROWS, DIM = 9, 5

_names = itertools.count()


def _log_name() -> str:
    """A fresh shared_name: logs of a server outlive the test that made them."""
    return f"test_log_{next(_names)}"


def _session(graph: tf.Graph, target: str = "", threads: int = 1) -> V1.Session:
    config = V1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=threads)
    return V1.Session(target, graph=graph, config=config)


def _words(array: np.ndarray) -> np.ndarray:
    return ec_ops.as_words(array)


def _read(sess: V1.Session, read) -> ec_ops.DeltaLogSnapshot:
    return ec_ops.parse_delta_log(sess.run(read))


def _random_words(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(-(2**31), 2**31, size=shape, dtype=np.int64).astype(np.int32)


# --- logged apply ops: same update as unlogged, entry = exactly the XORed words ----------


def _positive(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0.1, 2.0, size=(ROWS, DIM)).astype(F32)


APPLY = {
    # name: (number of slots, slot initializer, op(variables, grad, ids, **log kwargs))
    "sgd": (0, lambda rng: [], lambda v, g, i, **kw: ec_ops.sparse_apply_sgd_with_delta(v[0], g, i, 0.1, **kw)),
    "adagrad": (1, lambda rng: [_positive(rng)],
                lambda v, g, i, **kw: ec_ops.sparse_apply_adagrad_with_delta(v[0], v[1], g, i, 0.05, **kw)),
    "adam": (2, lambda rng: [rng.normal(size=(ROWS, DIM)).astype(F32) * F32(0.1), _positive(rng)],
             lambda v, g, i, **kw: ec_ops.sparse_apply_adam_with_delta(v[0], v[1], v[2], g, i, 0.01, **kw)),
    "ftrl": (2, lambda rng: [_positive(rng), rng.normal(size=(ROWS, DIM)).astype(F32)],
             lambda v, g, i, **kw: ec_ops.sparse_apply_ftrl_with_delta(v[0], v[1], v[2], g, i, 0.05, 0.01, 0.02, **kw)),
    "ftrl_v2": (2, lambda rng: [_positive(rng), rng.normal(size=(ROWS, DIM)).astype(F32)],
                lambda v, g, i, **kw: ec_ops.sparse_apply_ftrl_with_delta(
                    v[0], v[1], v[2], g, i, 0.05, 0.01, 0.02, l2_shrinkage=0.03, **kw)),
    "momentum": (1, lambda rng: [rng.normal(size=(ROWS, DIM)).astype(F32)],
                 lambda v, g, i, **kw: ec_ops.sparse_apply_momentum_with_delta(
                     v[0], v[1], g, i, 0.05, 0.9, use_nesterov=True, **kw)),
    "rmsprop": (2, lambda rng: [_positive(rng), rng.normal(size=(ROWS, DIM)).astype(F32)],
                lambda v, g, i, **kw: ec_ops.sparse_apply_rms_prop_with_delta(
                    v[0], v[1], v[2], g, i, 0.01, momentum=0.5, **kw)),
    "centered_rmsprop": (3, lambda rng: [rng.normal(size=(ROWS, DIM)).astype(F32) * F32(0.1), _positive(rng),
                                         rng.normal(size=(ROWS, DIM)).astype(F32)],
                         lambda v, g, i, **kw: ec_ops.sparse_apply_centered_rms_prop_with_delta(
                             v[0], v[1], v[2], v[3], g, i, 0.01, momentum=0.5, **kw)),
}


def _row_words(tables: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([_words(t) for t in tables], axis=1)


@pytest.mark.parametrize("name", sorted(APPLY))
@pytest.mark.parametrize("index_dtype", [tf.int64, tf.int32])
def test_logged_apply_updates_like_unlogged_and_logs_exactly_the_xored_words(name: str, index_dtype) -> None:
    num_slots, slot_init, apply = APPLY[name]
    rng = np.random.default_rng(len(name))
    init = [rng.normal(size=(ROWS, DIM)).astype(F32)] + slot_init(rng)
    graph = tf.Graph()
    with graph.as_default():
        plain = [tf.Variable(v) for v in init]
        logged = [tf.Variable(v) for v in init]
        grad = V1.placeholder(tf.float32, [None, DIM])
        ids = V1.placeholder(index_dtype, [None])
        sid = V1.placeholder(tf.int64, [])
        log = ec_ops.delta_log(_log_name())
        plain_delta = apply(plain, grad, ids)
        logged_delta = apply(logged, grad, ids, log=log, sid=sid, target=7)
        assert logged_delta.shape.as_list() == [None, (1 + num_slots) * DIM]
        assert logged_delta.op.type.endswith("Logged")
        read = ec_ops.delta_log_read(log)
        init_op = V1.global_variables_initializer()
    with _session(graph) as sess:
        sess.run(init_op)
        assert _read(sess, read).entries == []
        for step in range(4):
            step_ids = np.concatenate([[0, ROWS - 1, 0], rng.integers(0, ROWS, size=6)]).astype(index_dtype.as_numpy_dtype)
            step_grad = rng.normal(size=(step_ids.size, DIM)).astype(F32)
            feed = {grad: step_grad, ids: step_ids, sid: 1000 + step}
            old = sess.run(logged)
            d_plain = sess.run(plain_delta, feed)
            d_logged = sess.run(logged_delta, feed)
            new, expected = sess.run([logged, plain])
            np.testing.assert_array_equal(d_logged, d_plain)
            for ours, theirs in zip(new, expected):
                np.testing.assert_array_equal(_words(ours), _words(theirs))
            entries = _read(sess, read).entries
            entry = entries[-1]
            assert (entry.seq - entries[0].seq, entry.sid, entry.target, entry.source) == (step, 1000 + step, 7, -1)
            unique = np.unique(step_ids).astype(np.int64)
            np.testing.assert_array_equal(entry.rows, unique)
            np.testing.assert_array_equal(entry.delta, _row_words(old)[unique] ^ _row_words(new)[unique])
        assert len(_read(sess, read).entries) == 4


def test_logged_apply_with_no_ids_logs_an_empty_entry() -> None:
    graph = tf.Graph()
    with graph.as_default():
        var, accum = tf.Variable(tf.ones([3, 2])), tf.Variable(tf.ones([3, 2]))
        log = ec_ops.delta_log(_log_name())
        delta = ec_ops.sparse_apply_adagrad_with_delta(
            var, accum, tf.zeros([0, 2]), tf.zeros([0], tf.int64), 0.1, log=log, sid=5, target=1
        )
        read = ec_ops.delta_log_read(log)
        init = V1.global_variables_initializer()
    with _session(graph) as sess:
        sess.run(init)
        assert sess.run(delta).shape == (0, 4)
        (entry,) = _read(sess, read).entries
        assert entry.sid == 5 and entry.rows.size == 0 and entry.delta.shape == (0, 4)


# --- logged parity fold ------------------------------------------------------------------


@pytest.mark.parametrize("bits", [16, 8])
def test_logged_parity_update_logs_the_sum_folded_into_each_row(bits: int) -> None:
    rng = np.random.default_rng(bits)
    parity0 = _random_words(rng, (6, 4))
    graph = tf.Graph()
    with graph.as_default():
        plain, logged = tf.Variable(parity0), tf.Variable(parity0)
        rows = V1.placeholder(tf.int64, [None])
        delta = V1.placeholder(tf.int32, [None, 4])
        coef = V1.placeholder(tf.int32, [])
        log = ec_ops.delta_log(_log_name())
        fold_plain = ec_ops.parity_update(plain, rows, delta, coef, field_bits=bits)
        fold_logged = ec_ops.parity_update(logged, rows, delta, coef, field_bits=bits, log=log, sid=3, target=2, source=11)
        read = ec_ops.delta_log_read(log)
        init = V1.global_variables_initializer()
    with _session(graph) as sess:
        sess.run(init)
        for coef_value in (1, 2, (1 << bits) - 1):
            step_rows = np.array([5, 0, 5, 2, 5, 0], np.int64)
            step_delta = _random_words(rng, (6, 4))
            old = sess.run(logged)
            feed = {rows: step_rows, delta: step_delta, coef: coef_value}
            sess.run([fold_plain], feed)
            sess.run([fold_logged], feed)
            new, expected = sess.run([logged, plain])
            np.testing.assert_array_equal(new, expected)
            entry = _read(sess, read).entries[-1]
            assert (entry.sid, entry.target, entry.source) == (3, 2, 11)
            np.testing.assert_array_equal(entry.rows, [0, 2, 5])
            np.testing.assert_array_equal(entry.delta, (old ^ new)[[0, 2, 5]])


def test_logged_fold_keeps_its_own_copy_of_a_fed_delta() -> None:
    """A graph-mode feed may borrow the caller's NumPy buffer; overwriting the
    array after the step must not change what the log recorded."""
    graph = tf.Graph()
    with graph.as_default():
        parity = tf.Variable(np.zeros((4, 1024), np.int32))
        delta = V1.placeholder(tf.int32, [None, 1024])
        log = ec_ops.delta_log(_log_name())
        fold = ec_ops.parity_update(parity, [0, 3], delta, 1, log=log, sid=1, target=0)
        read = ec_ops.delta_log_read(log)
    with _session(graph) as sess:
        sess.run(parity.initializer)
        fed = np.ones((2, 1024), np.int32)
        sess.run(fold, {delta: fed})
        fed[:] = 7
        (entry,) = _read(sess, read).entries
        np.testing.assert_array_equal(entry.delta, np.ones((2, 1024), np.int32))


# --- logged AssignAdd ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "initial,value",
    [
        (np.int64(2**32 - 1), np.int64(1)),  # carries into the high word
        (np.int64(2**63 - 1), np.int64(1)),  # wraps
        (np.array([3, -7, 2**31 - 1], np.int32), np.array([1, 7, 1], np.int32)),
        (np.arange(6, dtype=F32).reshape(3, 2) / F32(3), np.full((3, 2), 0.1, F32)),
        (np.float64(0.1), np.float64(0.2)),
    ],
)
def test_assign_add_logged_adds_and_logs_old_xor_new_words(initial: np.ndarray, value: np.ndarray) -> None:
    graph = tf.Graph()
    with graph.as_default():
        var = tf.Variable(initial)
        log = ec_ops.delta_log(_log_name())
        add = ec_ops.assign_add_logged(var, value, log, sid=9, target=4, source=3)
        read = ec_ops.delta_log_read(log)
        init = V1.global_variables_initializer()
    with _session(graph) as sess:
        sess.run(init)
        sess.run(add)
        new = sess.run(var)
        with np.errstate(over="ignore"):
            expected = np.asarray(initial + value, dtype=np.asarray(initial).dtype)
        np.testing.assert_array_equal(_words(new), _words(expected))
        (entry,) = _read(sess, read).entries
        assert (entry.sid, entry.target, entry.source) == (9, 4, 3)
        old_words = _words(np.asarray(initial))
        np.testing.assert_array_equal(entry.rows, np.arange(old_words.shape[0]))
        np.testing.assert_array_equal(entry.delta, old_words ^ _words(new))


# --- a sequence of protected steps, undone exactly ------------------------------------------

# Target ids of the simulated cluster (all on one device, one log).
DATA, PARITY, DENSE, DENSE_REPLICA, STEP, STEP_REPLICA = range(6)
PARITY_COEF = 0x5003


def _protected_step_graph(log_name: str):
    """An Adagrad table with its parity, a dense variable with its replica, a
    global step with its replica, all updated through logged ops, one step
    per run of `step` (sid fed)."""
    rng = np.random.default_rng(0)
    table0, accum0 = rng.normal(size=(ROWS, DIM)).astype(F32), _positive(rng)
    dense0, dense_accum0 = rng.normal(size=(4, 3)).astype(F32), rng.uniform(0.1, 1, (4, 3)).astype(F32)
    table_words = _row_words([table0, accum0])
    parity0 = codec.gf_mul_bytes(PARITY_COEF, table_words)
    dense_words = _row_words([dense0, dense_accum0])
    v = {
        "table": tf.Variable(table0), "accum": tf.Variable(accum0), "parity": tf.Variable(parity0),
        "dense": tf.Variable(dense0), "dense_accum": tf.Variable(dense_accum0), "replica": tf.Variable(dense_words),
        "step": tf.Variable(np.int64(2**32 - 2)), "step_replica": tf.Variable(np.int64(2**32 - 2)),
    }
    ids = V1.placeholder(tf.int64, [None])
    grad = V1.placeholder(tf.float32, [None, DIM])
    dense_grad = V1.placeholder(tf.float32, [4, 3])
    sid = V1.placeholder(tf.int64, [])
    log = ec_ops.delta_log(log_name)
    delta = ec_ops.sparse_apply_adagrad_with_delta(v["table"], v["accum"], grad, ids, 0.05, log=log, sid=sid, target=DATA)
    fold = ec_ops.parity_update(v["parity"], ids, delta, PARITY_COEF, log=log, sid=sid, target=PARITY, source=DATA)
    all_rows = tf.range(4, dtype=tf.int64)
    dense_delta = ec_ops.sparse_apply_adagrad_with_delta(
        v["dense"], v["dense_accum"], dense_grad, all_rows, 0.05, log=log, sid=sid, target=DENSE
    )
    replica_fold = ec_ops.parity_update(v["replica"], all_rows, dense_delta, 1, log=log, sid=sid, target=DENSE_REPLICA, source=DENSE)
    with tf.control_dependencies([fold, replica_fold]):
        one = tf.constant(1, tf.int64)
        increment = tf.group(
            ec_ops.assign_add_logged(v["step"], one, log, sid, STEP),
            ec_ops.assign_add_logged(v["step_replica"], one, log, sid, STEP_REPLICA, source=STEP),
        )
    groups = {
        DATA: [v["table"], v["accum"]], PARITY: [v["parity"]], DENSE: [v["dense"], v["dense_accum"]],
        DENSE_REPLICA: [v["replica"]], STEP: [v["step"]], STEP_REPLICA: [v["step_replica"]],
    }
    return v, groups, (ids, grad, dense_grad, sid), increment, log


def _assert_state_equal(state: dict, expected: dict) -> None:
    for key in expected:
        np.testing.assert_array_equal(_words(state[key]), _words(expected[key]), err_msg=key)


def _assert_consistent(state: dict) -> None:
    """Parity and replicas equal the code of what they protect."""
    np.testing.assert_array_equal(
        state["parity"], codec.gf_mul_bytes(PARITY_COEF, _row_words([state["table"], state["accum"]]))
    )
    np.testing.assert_array_equal(state["replica"], _row_words([state["dense"], state["dense_accum"]]))
    assert state["step"] == state["step_replica"]


def test_undo_in_reverse_log_order_restores_every_variable_bit_for_bit() -> None:
    graph = tf.Graph()
    with graph.as_default():
        v, groups, (ids, grad, dense_grad, sid), step, log = _protected_step_graph(_log_name())
        seq_in, target_in = V1.placeholder(tf.int64, []), V1.placeholder(tf.int32, [])
        undo = {
            # Only XOR folds commute; optimizer steps and additions must be undone in order.
            t: ec_ops.delta_log_undo(log, groups[t], seq_in, target_in, ordered=t not in (PARITY, DENSE_REPLICA))
            for t in groups
        }
        read = ec_ops.delta_log_read(log)
        commit = ec_ops.delta_log_commit(log, sid)
        init = V1.global_variables_initializer()
    rng = np.random.default_rng(1)
    with _session(graph) as sess:
        sess.run(init)
        states = {}
        for s in range(100, 106):
            states[s] = sess.run(v)
            step_ids = rng.integers(0, ROWS, size=7)
            step_ids[:3] = [2, 2, ROWS - 1]  # duplicates
            sess.run(step, {
                ids: step_ids, grad: rng.normal(size=(7, DIM)).astype(F32),
                dense_grad: rng.normal(size=(4, 3)).astype(F32), sid: s,
            })
        final = sess.run(v)
        _assert_consistent(final)
        assert final["step"] == 2**32 - 2 + 6
        snapshot = _read(sess, read)
        assert len(snapshot.entries) == 6 * 6 and snapshot.sids() == list(range(100, 106))
        for entry in snapshot.entries:
            assert entry.source == {PARITY: DATA, DENSE_REPLICA: DENSE, STEP_REPLICA: STEP}.get(entry.target, -1)

        # Steps 100 and 101 complete; 102..105 are undone, newest first.
        sess.run(commit, {sid: 100})
        sess.run(commit, {sid: 101})
        snapshot = _read(sess, read)
        assert list(snapshot.committed) == [100, 101]
        assert {e.sid for e in snapshot.entries} == {102, 103, 104, 105}
        for entry in reversed(snapshot.entries):
            assert snapshot.undoable(entry)
            assert sess.run(undo[entry.target], {seq_in: entry.seq, target_in: entry.target})
            if entry is snapshot.of_sid(entry.sid)[0]:
                restored = sess.run(v)
                _assert_state_equal(restored, states[entry.sid])
                _assert_consistent(restored)
        assert _read(sess, read).entries == []
        # Undoing again finds nothing and changes nothing.
        entry = snapshot.entries[-1]
        assert not sess.run(undo[entry.target], {seq_in: entry.seq, target_in: entry.target})
        _assert_state_equal(sess.run(v), states[102])


def test_xor_rows_undoes_entries_across_var_and_slots() -> None:
    graph = tf.Graph()
    with graph.as_default():
        v, groups, (ids, grad, dense_grad, sid), step, log = _protected_step_graph(_log_name())
        rows_in = V1.placeholder(tf.int64, [None])
        delta_in = V1.placeholder(tf.int32, [None, None])
        xor = {t: ec_ops.xor_rows(groups[t], rows_in, delta_in) for t in groups}
        read = ec_ops.delta_log_read(log)
        init = V1.global_variables_initializer()
    rng = np.random.default_rng(2)
    with _session(graph) as sess:
        sess.run(init)
        initial = sess.run(v)
        for s in range(3):
            sess.run(step, {ids: rng.integers(0, 3, size=6), grad: rng.normal(size=(6, DIM)).astype(F32),
                            dense_grad: rng.normal(size=(4, 3)).astype(F32), sid: s})
        for entry in reversed(_read(sess, read).entries):
            sess.run(xor[entry.target], {rows_in: entry.rows, delta_in: entry.delta})
        _assert_state_equal(sess.run(v), initial)


# --- commit, drop, ordered undo ---------------------------------------------------------------


def _counter_graph(log_name: str):
    counter = tf.Variable(np.int64(0))
    other = tf.Variable(np.int64(0))
    log = ec_ops.delta_log(log_name)
    sid = V1.placeholder(tf.int64, [])
    value = V1.placeholder(tf.int64, [])
    add = ec_ops.assign_add_logged(counter, value, log, sid, 0)
    add_other = ec_ops.assign_add_logged(other, value, log, sid, 1)
    return counter, other, log, sid, value, add, add_other


def test_a_cancelled_step_stops_waiting_for_its_in_order_commit() -> None:
    """Round 1 of step 2 waits behind step 1's uncommitted update of the same variable; the step's deadline
    cancels it at once (not at the commit's own 60 s timeout), and the wait is withdrawn: once step 1
    commits, step 2 commits."""
    import time

    graph = tf.Graph()
    with graph.as_default():
        var = tf.Variable(np.zeros([ROWS, DIM], F32))
        log = ec_ops.delta_log(_log_name())
        sid = V1.placeholder(tf.int64, [])
        apply = ec_ops.sparse_apply_sgd_with_delta(var, tf.ones([1, DIM]), tf.constant([0], tf.int64), 0.1,
                                                   log=log, sid=sid, target=0)
        sids = V1.placeholder(tf.int64, None)
        in_order = ec_ops.delta_log_commit_in_order(log, sids, timeout_ms=60_000)
        read = ec_ops.delta_log_read(log)
        init = V1.global_variables_initializer()
    with _session(graph) as sess:
        sess.run(init)
        sess.run(apply, {sid: 1})
        sess.run(apply, {sid: 2})
        started = time.monotonic()
        with pytest.raises(tf.errors.DeadlineExceededError):
            sess.run(in_order, {sids: 2}, options=V1.RunOptions(timeout_in_ms=300))
        assert time.monotonic() - started < 10.0
        sess.run(in_order, {sids: 1})
        sess.run(in_order, {sids: 2})  # would wait behind nothing now
        snap = _read(sess, read)
        # Round 1 marked both steps committed here and left their applies in the log for round 2.
        assert [e.sid for e in snap.entries] == [1, 2]
        assert snap.is_data_committed(1) and snap.is_data_committed(2)


def test_round_1_of_several_steps_does_not_pass_another_steps_apply_between_them() -> None:
    """Settlement commits several steps with one round 1: steps 1 and 3 of a variable that step 2 (live,
    not settled) applied between them.  Step 1 commits; step 3 must wait for step 2, else the committed
    applies of the variable are no longer a prefix and a lost PS's rollback keeps 3 without 2 (F1).  The
    batched settlement soak found this (a decoded row held a value no sequence of its updates produced)."""
    graph = tf.Graph()
    with graph.as_default():
        var = tf.Variable(np.zeros([ROWS, DIM], F32))
        log = ec_ops.delta_log(_log_name())
        sid = V1.placeholder(tf.int64, [])
        apply = ec_ops.sparse_apply_sgd_with_delta(var, tf.ones([1, DIM]), tf.constant([0], tf.int64), 0.1,
                                                   log=log, sid=sid, target=0)
        sids = V1.placeholder(tf.int64, None)
        in_order = ec_ops.delta_log_commit_in_order(log, sids, timeout_ms=0, bypass_fence=True)
        init = V1.global_variables_initializer()
    with _session(graph) as sess:
        sess.run(init)
        for s in (1, 2, 3):
            sess.run(apply, {sid: s})
        with pytest.raises(tf.errors.AbortedError):
            sess.run(in_order, {sids: [1, 3]})
        sess.run(in_order, {sids: 2})
        sess.run(in_order, {sids: [1, 3]})  # nothing between them now


def test_commit_drops_the_entries_and_remembers_the_sid() -> None:
    graph = tf.Graph()
    with graph.as_default():
        counter, other, log, sid, value, add, add_other = _counter_graph(_log_name())
        sids = V1.placeholder(tf.int64, None)
        commit = ec_ops.delta_log_commit(log, sids)
        drop = ec_ops.delta_log_drop(log, sids)
        read = ec_ops.delta_log_read(log)
        init = V1.global_variables_initializer()
    with _session(graph) as sess:
        sess.run(init)
        for s in (1, 2, 3, 4):
            sess.run([add, add_other], {sid: s, value: 10 * s})
        of_two = {e.target: e.seq for e in _read(sess, read).of_sid(2)}  # the two adds ran in either order
        sess.run(commit, {sids: 2})
        snap = _read(sess, read)
        assert [e.sid for e in snap.entries] == [1, 1, 3, 3, 4, 4]
        assert list(snap.committed) == [2] and snap.is_committed(2) and not snap.is_committed(1)
        base = min(e.seq for e in snap.entries)  # sid 1's adds, seqs base and base + 1
        assert snap.settled == of_two and sorted(v - base for v in of_two.values()) == [2, 3]
        sess.run(drop, {sids: [1, 3]})
        snap = _read(sess, read)
        assert [e.sid for e in snap.entries] == [4, 4] and list(snap.committed) == [2]
        sess.run(commit, {sids: [4, 2, 7]})  # a vector; 2 again is a no-op; 7 has no entries
        snap = _read(sess, read)
        assert snap.entries == [] and list(snap.committed) == [2, 4, 7]
        assert sess.run([counter, other]) == [100, 100]  # commit and drop leave variables alone
        # The ring keeps the newest DELTA_LOG_COMMITTED_CAPACITY sids.
        many = np.arange(1000, 1000 + ec_ops.DELTA_LOG_COMMITTED_CAPACITY + 10, dtype=np.int64)
        sess.run(commit, {sids: many})
        committed = _read(sess, read).committed
        np.testing.assert_array_equal(committed, many[-ec_ops.DELTA_LOG_COMMITTED_CAPACITY:])


def test_ordered_undo_refuses_to_jump_a_later_update_and_changes_nothing() -> None:
    graph = tf.Graph()
    with graph.as_default():
        counter, _other, log, sid, value, add, add_other = _counter_graph(_log_name())
        seq = V1.placeholder(tf.int64, [])
        target = V1.placeholder(tf.int32, [])
        undo = ec_ops.delta_log_undo(log, counter, seq, target)
        undo_unordered = ec_ops.delta_log_undo(log, counter, seq, target, ordered=False)
        commit = ec_ops.delta_log_commit(log, sid)
        read = ec_ops.delta_log_read(log)
        init = V1.global_variables_initializer()
    with _session(graph) as sess:
        sess.run(init)
        sess.run(add, {sid: 1, value: 5})  # seq s0
        sess.run(add_other, {sid: 1, value: 5})  # seq s0 + 1, another target
        sess.run(add, {sid: 2, value: 6})  # seq s0 + 2
        s0 = _read(sess, read).entries[0].seq
        with pytest.raises(tf.errors.FailedPreconditionError, match=f"later entry {s0 + 2}"):
            sess.run(undo, {seq: s0, target: 0})
        with pytest.raises(tf.errors.InvalidArgumentError, match="target 1, not 0"):
            sess.run(undo, {seq: s0 + 1, target: 0})
        assert sess.run(counter) == 11 and len(_read(sess, read).entries) == 3
        sess.run(commit, {sid: 2})  # seq s0 + 2 settles: its update stays
        snap = _read(sess, read)
        assert not snap.undoable(snap.entries[0])
        with pytest.raises(tf.errors.FailedPreconditionError, match="committed or dropped"):
            sess.run(undo, {seq: s0, target: 0})
        assert sess.run(counter) == 11
        # XOR-folded targets may be undone out of order: here that means the
        # caller takes responsibility (counter bits = 11 ^ (0 ^ 5)).
        assert sess.run(undo_unordered, {seq: s0, target: 0})
        assert sess.run(counter) == 11 ^ 5


def test_an_undo_of_a_list_undoes_its_entries_in_its_order_and_stops_at_the_first_it_cannot() -> None:
    """A vector `seq`: one op undoes a target's entries one after the other (settlement's one call for many steps);
    in the wrong order it fails on the first it cannot undo, the ones before it done, the rest untouched."""
    graph = tf.Graph()
    with graph.as_default():
        counter, _other, log, sid, value, add, _add_other = _counter_graph(_log_name())
        seqs = V1.placeholder(tf.int64, [None])
        undo = ec_ops.delta_log_undo(log, counter, seqs, 0)
        read = ec_ops.delta_log_read(log)
        init = V1.global_variables_initializer()
    with _session(graph) as sess:
        sess.run(init)
        for step, v in enumerate((5, 6, 7, 9), start=1):
            sess.run(add, {sid: step, value: v})
        s = [e.seq for e in _read(sess, read).entries]
        assert sess.run(counter) == 27
        with pytest.raises(tf.errors.FailedPreconditionError, match=f"later entry {s[2]}"):
            sess.run(undo, {seqs: [s[3], s[1], s[2]]})  # the newest undone, then s[1] jumps s[2]: refused
        assert sess.run(counter) == 27 - 9 and [e.seq for e in _read(sess, read).entries] == s[:3]
        assert sess.run(undo, {seqs: [s[2], s[1], s[3]]}).tolist() == [True, True, False]  # s[3]: already undone
        assert sess.run(counter) == 5 and [e.seq for e in _read(sess, read).entries] == s[:1]
        assert sess.run(undo, {seqs: []}).tolist() == [] and sess.run(counter) == 5


# --- fences: stragglers of a cut step cannot write after recovery read the logs ----------------


def test_fence_and_commit_refuse_later_updates_of_the_step_unless_bypassed() -> None:
    graph = tf.Graph()
    with graph.as_default():
        table = tf.Variable(np.zeros((ROWS, DIM), F32))
        parity = tf.Variable(np.zeros((ROWS, DIM), np.int32))
        counter = tf.Variable(np.int64(0))
        sid = V1.placeholder(tf.int64, [])
        sids = V1.placeholder(tf.int64, None)
        log = ec_ops.delta_log(_log_name())
        ids = tf.constant([1, 3], tf.int64)
        apply = ec_ops.sparse_apply_sgd_with_delta(table, tf.ones([2, DIM]), ids, 0.5, log=log, sid=sid, target=0)
        fold = ec_ops.parity_update(parity, ids, tf.ones([2, DIM], tf.int32), 3, log=log, sid=sid, target=1, source=0)
        finish = ec_ops.parity_update(
            parity, ids, tf.ones([2, DIM], tf.int32), 3, log=log, sid=sid, target=1, source=0, bypass_fence=True
        )
        add = ec_ops.assign_add_logged(counter, 1, log, sid, 2)
        fence = ec_ops.delta_log_fence(log, sids)
        commit = ec_ops.delta_log_commit(log, sids, bypass_fence=True)
        worker_commit = ec_ops.delta_log_commit(log, sids)
        read = ec_ops.delta_log_read(log)
        init = V1.global_variables_initializer()
        with pytest.raises(ValueError, match="only meaningful"):
            ec_ops.parity_update(parity, ids, tf.ones([2, DIM], tf.int32), bypass_fence=True)
    with _session(graph) as sess:
        sess.run(init)
        sess.run(apply, {sid: 1})
        sess.run(fence, {sids: [1, 5]})
        snapshot = _read(sess, read)
        assert list(snapshot.fenced) == [1, 5] and len(snapshot.entries) == 1
        before = sess.run([table, parity, counter])
        for fetch in (apply, fold, add):
            with pytest.raises(tf.errors.AbortedError, match="step 1 is fenced"):
                sess.run(fetch, {sid: 1})
        for a, b in zip(sess.run([table, parity, counter]), before):
            np.testing.assert_array_equal(a, b)
        assert len(_read(sess, read).entries) == 1
        sess.run([apply, fold, add], {sid: 2})  # other steps go on
        with pytest.raises(tf.errors.AbortedError, match="step 1 was fenced"):
            sess.run(worker_commit, {sids: [1, 2]})  # a fenced step cannot commit; nothing changes
        assert [e.sid for e in _read(sess, read).entries] == [1, 2, 2, 2]
        sess.run(finish, {sid: 1})  # recovery finishes step 1
        assert [e.sid for e in _read(sess, read).entries] == [1, 2, 2, 2, 1]
        sess.run(commit, {sids: [1, 2]})
        snapshot = _read(sess, read)
        assert list(snapshot.fenced) == [1, 5] and list(snapshot.committed) == [1, 2] and snapshot.entries == []
        with pytest.raises(tf.errors.AbortedError, match="step 2 is already committed"):
            sess.run(add, {sid: 2})
        assert sess.run(counter) == 1


def test_a_refusal_fails_its_step_without_a_warning_that_later_errors_would_carry() -> None:
    # A refusal (Aborted) is the protocol's answer, not a fault: no "OP_REQUIRES failed" warning, which
    # TensorFlow forwards into the messages of later errors (kilobytes the client parses at each error).
    # An invalid argument still warns: it is the control that shows the forwarding is on.
    server = tf.distribute.Server.create_local_server()
    graph = tf.Graph()
    with graph.as_default():
        table = tf.Variable(np.zeros((ROWS, DIM), F32))
        sid, sids = V1.placeholder(tf.int64, []), V1.placeholder(tf.int64, None)
        log = ec_ops.delta_log(_log_name())
        apply = ec_ops.sparse_apply_sgd_with_delta(table, tf.ones([2, DIM]), tf.constant([1, 3], tf.int64), 0.5,
                                                   log=log, sid=sid, target=0)
        bad = ec_ops.sparse_apply_sgd_with_delta(table, tf.ones([2, DIM]), tf.constant([1, ROWS], tf.int64), 0.5,
                                                 log=log, sid=sid, target=0)
        fence = ec_ops.delta_log_fence(log, sids)
        init = V1.global_variables_initializer()
    with _session(graph, server.target) as sess:
        sess.run([init, fence], {sids: [1]})
        messages = []
        for fetch, step in ((bad, 2), (apply, 1), (apply, 1), (apply, 1)):
            with pytest.raises(tf.errors.OpError) as caught:
                sess.run(fetch, {sid: step})
            messages.append(caught.value.message)
    assert "step 1 is fenced" in messages[-1]
    forwarded = [line for m in messages[1:] for line in m.splitlines() if "OP_REQUIRES failed" in line]
    assert forwarded and all("INVALID_ARGUMENT" in line for line in forwarded), forwarded


def test_fence_waits_for_writes_in_flight_and_every_applied_update_is_logged() -> None:
    """Threads keep running logged steps of a few step ids while the main
    thread fences half of them. After the fence returns, the fenced ids'
    entries never change; every update that was applied is in the log (undoing
    all entries restores the initial values), and no fenced update was
    applied without being logged."""
    rng = np.random.default_rng(9)
    table0 = rng.normal(size=(ROWS, DIM)).astype(F32)
    graph = tf.Graph()
    with graph.as_default():
        table, counter = tf.Variable(table0), tf.Variable(np.int64(0))
        ids = V1.placeholder(tf.int64, [None])
        grad = V1.placeholder(tf.float32, [None, DIM])
        sid = V1.placeholder(tf.int64, [])
        log = ec_ops.delta_log(_log_name())
        apply = ec_ops.sparse_apply_sgd_with_delta(table, grad, ids, 0.01, log=log, sid=sid, target=0)
        add = ec_ops.assign_add_logged(counter, 1, log, sid, 1)
        step = tf.group(apply, add)
        fence = ec_ops.delta_log_fence(log, [0, 1, 2, 3])
        seq_in = V1.placeholder(tf.int64, [])
        undo = {0: ec_ops.delta_log_undo(log, table, seq_in, 0), 1: ec_ops.delta_log_undo(log, counter, seq_in, 1)}
        read = ec_ops.delta_log_read(log)
        init = V1.global_variables_initializer()
    aborted = []
    failures: list[BaseException] = []
    with _session(graph, threads=4) as sess:
        sess.run(init)
        started = threading.Barrier(4)

        def worker(w: int) -> None:
            worker_rng = np.random.default_rng(w)
            started.wait()
            try:
                for _ in range(40):
                    n = int(worker_rng.integers(100, 300))
                    feed = {ids: worker_rng.integers(0, ROWS, size=n), sid: int(worker_rng.integers(0, 8)),
                            grad: worker_rng.normal(size=(n, DIM)).astype(F32)}
                    try:
                        sess.run(step, feed)
                    except tf.errors.AbortedError:
                        aborted.append(feed[sid])
            except BaseException as exc:
                failures.append(exc)

        pool = [threading.Thread(target=worker, args=(w,)) for w in range(3)]
        for thread in pool:
            thread.start()
        started.wait()
        sess.run(fence)
        fenced_entries = [(e.seq, e.sid) for e in _read(sess, read).entries if e.sid < 4]
        for thread in pool:
            thread.join(timeout=120)
        assert not failures and not any(thread.is_alive() for thread in pool)
        assert aborted and all(s < 4 for s in aborted)
        snapshot = _read(sess, read)
        assert [(e.seq, e.sid) for e in snapshot.entries if e.sid < 4] == fenced_entries
        # An aborted step may have applied one of its two updates (logged) but
        # the counter equals the number of its logged increments exactly.
        assert sess.run(counter) == sum(1 for e in snapshot.entries if e.target == 1)
        for entry in reversed(snapshot.entries):
            assert sess.run(undo[entry.target], {seq_in: entry.seq})
        np.testing.assert_array_equal(_words(sess.run(table)), _words(table0))
        assert sess.run(counter) == 0


# --- concurrency ------------------------------------------------------------------------------


def test_concurrent_logged_steps_append_atomically_in_application_order() -> None:
    """Threads run logged steps on the same hot rows, parity and counter.

    Replaying each target's entries in seq order from the initial state
    must reproduce every step's own update (SGD of the step's gradients,
    the step's parity fold, +sid on the counter): so each entry is the exact
    old ^ new of its own update, and seq order is application order. Undoing
    everything in reverse seq order then restores the initial state.
    """
    threads, steps, lr = 4, 12, F32(0.1)
    rng = np.random.default_rng(5)
    table0 = rng.normal(size=(ROWS, DIM)).astype(F32)
    parity0 = _random_words(rng, (ROWS, DIM))
    graph = tf.Graph()
    with graph.as_default():
        table, parity, counter = tf.Variable(table0), tf.Variable(parity0), tf.Variable(np.int64(0))
        ids = V1.placeholder(tf.int64, [None])
        grad = V1.placeholder(tf.float32, [None, DIM])
        coef = V1.placeholder(tf.int32, [])
        sid = V1.placeholder(tf.int64, [])
        log = ec_ops.delta_log(_log_name())
        delta = ec_ops.sparse_apply_sgd_with_delta(table, grad, ids, lr, log=log, sid=sid, target=0)
        fold = ec_ops.parity_update(parity, ids, delta, coef, log=log, sid=sid, target=1, source=0)
        add = ec_ops.assign_add_logged(counter, sid, log, sid, 2)
        step = tf.group(fold, add)
        seq_in = V1.placeholder(tf.int64, [])
        undo = {
            0: ec_ops.delta_log_undo(log, table, seq_in, 0),
            1: ec_ops.delta_log_undo(log, parity, seq_in, 1, ordered=False),
            2: ec_ops.delta_log_undo(log, counter, seq_in, 2),
        }
        read = ec_ops.delta_log_read(log)
        init = V1.global_variables_initializer()
    feeds: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}
    failures: list[BaseException] = []
    with _session(graph, threads=4) as sess:
        sess.run(init)

        def worker(w: int) -> None:
            worker_rng = np.random.default_rng(100 + w)
            try:
                for i in range(steps):
                    s = (w << 32) | i
                    n = int(worker_rng.integers(200, 400))
                    step_ids = worker_rng.integers(0, 3, size=n)  # three hot rows, repeated
                    step_grad = worker_rng.normal(size=(n, DIM)).astype(F32)
                    step_coef = int(worker_rng.integers(1, 1 << 16))
                    feeds[s] = (step_ids, step_grad, step_coef)
                    sess.run(step, {ids: step_ids, grad: step_grad, coef: step_coef, sid: s})
            except BaseException as exc:  # surfaced below
                failures.append(exc)

        pool = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join(timeout=120)
        assert not failures and not any(thread.is_alive() for thread in pool)
        final_table, final_parity, final_counter = sess.run([table, parity, counter])
        snapshot = _read(sess, read)
        assert len(snapshot.entries) == 3 * threads * steps
        assert len(snapshot.sids()) == threads * steps
        first = snapshot.entries[0].seq
        assert [e.seq - first for e in snapshot.entries] == list(range(3 * threads * steps))

        state_table, state_parity, state_counter = table0.copy(), parity0.copy(), np.int64(0)
        for entry in snapshot.entries:
            step_ids, step_grad, step_coef = feeds[entry.sid]
            if entry.target == 0:
                before = _words(state_table)[entry.rows].copy()
                expected = state_table.copy()
                for position, row in enumerate(step_ids):
                    expected[row] = expected[row] + (-step_grad[position]) * lr
                after = before ^ entry.delta
                np.testing.assert_array_equal(after, _words(expected)[entry.rows])
                state_table = expected
            elif entry.target == 1:
                folded = state_parity.copy()
                np.bitwise_xor.at(folded, step_ids, _scaled_sgd_delta(entry, snapshot, feeds, step_coef))
                np.testing.assert_array_equal(state_parity[entry.rows] ^ entry.delta, folded[entry.rows])
                state_parity = folded
            else:
                after = _words(state_counter) ^ entry.delta
                state_counter = state_counter + np.int64(entry.sid)
                np.testing.assert_array_equal(after, _words(state_counter))
        np.testing.assert_array_equal(_words(state_table), _words(final_table))
        np.testing.assert_array_equal(state_parity, final_parity)
        assert state_counter == final_counter

        for entry in reversed(snapshot.entries):
            assert sess.run(undo[entry.target], {seq_in: entry.seq})
        restored = sess.run([table, parity, counter])
    np.testing.assert_array_equal(_words(restored[0]), _words(table0))
    np.testing.assert_array_equal(restored[1], parity0)
    assert restored[2] == 0


def _scaled_sgd_delta(parity_entry, snapshot, feeds, coef: int) -> np.ndarray:
    """The [n, DIM] words the step's ParityUpdate folded: coef * its apply delta,
    which is the data entry's delta at each id's first occurrence, zeros after."""
    (data_entry,) = [e for e in snapshot.of_sid(parity_entry.sid) if e.target == 0]
    step_ids = feeds[parity_entry.sid][0]
    delta = np.zeros((step_ids.size, DIM), np.int32)
    seen: set[int] = set()
    for position, row in enumerate(step_ids):
        if int(row) not in seen:
            seen.add(int(row))
            delta[position] = data_entry.delta[np.searchsorted(data_entry.rows, row)]
    return codec.gf_mul_bytes(coef, delta)


# --- errors ----------------------------------------------------------------------------------


def test_errors_are_invalid_argument_and_leave_variables_and_log_unchanged() -> None:
    graph = tf.Graph()
    with graph.as_default():
        table0 = np.arange(ROWS * DIM, dtype=F32).reshape(ROWS, DIM)
        table, accum = tf.Variable(table0), tf.Variable(np.ones((ROWS, DIM), F32))
        parity = tf.Variable(np.zeros((ROWS, 2 * DIM), np.int32))
        short = tf.Variable(np.zeros((ROWS - 1, DIM), F32))
        halves = tf.Variable(np.zeros((ROWS, DIM), np.float16))
        counter = tf.Variable(np.int64(5))
        log = ec_ops.delta_log(_log_name())
        ids = V1.placeholder(tf.int64, None)
        grad = V1.placeholder(tf.float32, None)
        sid = V1.placeholder(tf.int64, None)
        target = V1.placeholder(tf.int32, None)
        source = V1.placeholder(tf.int32, None)
        delta = V1.placeholder(tf.int32, None)
        value = V1.placeholder(tf.int64, None)
        apply = ec_ops.sparse_apply_adagrad_with_delta(table, accum, grad, ids, 0.1, log=log, sid=sid, target=target)
        fold = ec_ops.parity_update(parity, ids, delta, 3, log=log, sid=sid, target=target, source=source)
        add = ec_ops.assign_add_logged(counter, value, log, sid, target, source)
        xor = ec_ops.xor_rows([table, accum], ids, delta)
        xor_short = ec_ops.xor_rows([table, short], ids, delta)
        xor_halves = ec_ops.xor_rows(halves, ids, delta)
        xor_alias = ec_ops.xor_rows([table, table], ids, delta)
        var_as_log = ec_ops.parity_update(parity, ids, delta, 3, log=table.handle, sid=sid, target=target)
        read = ec_ops.delta_log_read(log)
        init = V1.global_variables_initializer()
        with pytest.raises(ValueError):  # static shapes: sid must be a scalar
            ec_ops.sparse_apply_sgd_with_delta(table, tf.zeros([1, DIM]), [0], 0.1, log=log, sid=[1, 2], target=0)
        with pytest.raises(ValueError):
            ec_ops.xor_rows(table, [0, 1], tf.zeros([3, DIM], tf.int32))
        with pytest.raises(ValueError, match="sid"):
            ec_ops.parity_update(parity, [0], tf.zeros([1, 2 * DIM], tf.int32), log=log)
        with pytest.raises(ValueError, match="only meaningful"):
            ec_ops.parity_update(parity, [0], tf.zeros([1, 2 * DIM], tf.int32), sid=1, target=1)
    good = {
        ids: [0, ROWS - 1], grad: np.ones((2, DIM), F32), sid: 1, target: 0, source: -1,
        delta: np.ones((2, 2 * DIM), np.int32), value: 1,
    }
    cases = [
        (apply, {ids: [0, ROWS]}, "out of range"),
        (apply, {grad: np.ones((2, DIM + 1), F32)}, "rows have shape"),
        (apply, {sid: [1, 2]}, "scalar"),
        (apply, {target: -1}, "target"),
        (fold, {ids: [-1, 0]}, "out of range"),
        (fold, {delta: np.ones((2, DIM), np.int32)}, "words"),
        (fold, {source: -2}, "source"),
        (fold, {target: [0]}, "scalar"),
        (add, {value: [1, 2]}, "shape"),
        (xor, {ids: [0, ROWS]}, "out of range"),
        (xor, {delta: np.ones((2, DIM), np.int32)}, "words"),
        (xor, {delta: np.ones((3, 2 * DIM), np.int32)}, "entries"),
        (xor_short, {}, "rows"),
        (xor_halves, {delta: np.ones((2, DIM), np.int32)}, "got half"),
        (xor_alias, {}, "same variable"),
        (var_as_log, {}, "wrong type"),
    ]
    with _session(graph) as sess:
        sess.run(init)
        before = sess.run([table, accum, parity, counter])
        for fetch, override, message in cases:
            with pytest.raises(tf.errors.InvalidArgumentError, match=message):
                sess.run(fetch, {**good, **override})
            after = sess.run([table, accum, parity, counter])
            for a, b in zip(after, before):
                np.testing.assert_array_equal(_words(np.asarray(a)), _words(np.asarray(b)))
            assert _read(sess, read).entries == []
        sess.run([apply, fold, add], good)  # the session and the log still work
        assert len(_read(sess, read).entries) == 3


def test_handles_and_eager_mode() -> None:
    with pytest.raises(ValueError):
        ec_ops.delta_log("")
    log = ec_ops.delta_log(_log_name())
    var = tf.Variable(np.zeros((2, 3), np.int32))
    assert ec_ops.parity_update(var, [1], np.ones((1, 3), np.int32), log=log, sid=1, target=0) is None
    assert ec_ops.xor_rows(var, [1], np.ones((1, 3), np.int32)) is None
    np.testing.assert_array_equal(var.numpy(), np.zeros((2, 3)))
    snapshot = ec_ops.parse_delta_log([t.numpy() for t in ec_ops.delta_log_read(log)])
    assert [(e.sid, e.rows.tolist(), e.delta.tolist()) for e in snapshot.entries] == [(1, [1], [[1, 1, 1]])]
    # Another handle with the same name is the same log; another name, another one.
    assert len(ec_ops.parse_delta_log(ec_ops.delta_log_read(ec_ops.delta_log(_log_name()))).entries) == 0


# --- the log lives in the server's ResourceMgr ---------------------------------------------------


def test_log_survives_sessions_and_graphs_of_a_server() -> None:
    server = tf.distribute.Server.create_local_server()
    name = _log_name()

    def build(shared_name: str):
        table = V1.Variable(np.zeros((ROWS, DIM), F32), name="survivor_table", use_resource=True)
        log = ec_ops.delta_log(shared_name)
        apply = ec_ops.sparse_apply_sgd_with_delta(
            table, tf.ones([2, DIM]), tf.constant([1, 4], tf.int64), 0.5, log=log, sid=77, target=3
        )
        return table, apply, ec_ops.delta_log_read(log), ec_ops.delta_log_commit(log, 77)

    first = tf.Graph()
    with first.as_default():
        table, apply, read, _ = build(name)
        init = V1.global_variables_initializer()
    with _session(first, server.target) as sess:
        sess.run(init)
        sess.run(apply)
        assert len(_read(sess, read).entries) == 1

    second = tf.Graph()
    with second.as_default():
        table, _, read, commit = build(name)
        _, _, other_read, _ = build(_log_name())
    with _session(second, server.target) as sess:
        snapshot = _read(sess, read)
        (entry,) = snapshot.entries
        assert (entry.sid, entry.target, entry.rows.tolist()) == (77, 3, [1, 4])
        np.testing.assert_array_equal(entry.delta, _words(np.zeros((2, DIM), F32)) ^ _words(sess.run(table)[[1, 4]]))
        assert _read(sess, other_read).entries == []
        sess.run(commit)

    with _session(second, server.target) as sess:
        snapshot = _read(sess, read)
        assert snapshot.entries == [] and list(snapshot.committed) == [77]
