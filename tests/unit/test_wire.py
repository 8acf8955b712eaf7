"""`tf_ecrec.step.wire`: tensors packed into one transfer and given back whole, on one task and across two."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.harness.ports import free_ports
from tf_ecrec.step import wire

CASES = [
    np.array([[1, -2], [3, 2**31 - 1], [5, -(2**31)]], np.int32),
    np.array([2**40 + 3, -7, 0], np.int64),
    np.array([True, False, True]),
    np.int64(-(2**62) + 5),
    np.zeros([0, 4], np.int32),
    np.zeros([0], np.int64),
    np.arange(24, dtype=np.int64).reshape(2, 3, 4),
]


def test_every_dtype_and_shape_comes_back_bit_for_bit() -> None:
    blob, specs = wire.pack([tf.constant(c) for c in CASES])
    out = wire.unpack(blob, specs)
    for want, got in zip(CASES, out):
        assert got.dtype.as_numpy_dtype == np.asarray(want).dtype
        assert got.shape == np.asarray(want).shape
        np.testing.assert_array_equal(got.numpy(), want)


def test_a_blob_unpacked_as_other_tensors_is_refused() -> None:
    blob, specs = wire.pack([tf.constant(CASES[0]), tf.constant(CASES[1])])
    with pytest.raises(tf.errors.InvalidArgumentError, match="holds 2 tensors, the op unpacks 1"):
        wire.unpack(blob, specs[:1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="words left after the last tensor"):
        wire.unpack(tf.concat([blob, [0]], 0), specs)
    with pytest.raises(tf.errors.InvalidArgumentError, match="are left"):
        wire.unpack(blob[:-1], specs)


def test_a_dtype_it_does_not_carry_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="a float32 tensor of shape \\(1,\\); rule: int32, int64 or bool"):
        wire.pack([tf.constant([1.0])])


def test_packed_between_two_tasks_in_one_transfer() -> None:
    """Packed on one task, unpacked on another: the values arrive whole, and the receiving task's partition
    of the step has one receive from the packing task (one RecvTensor call a step) where the unpacked
    tensors would have one each.  Read from the partition graphs the master registered, not from a
    trace: a trace's remote node stats went missing once in a run beside two other test processes."""
    ports = free_ports(3)
    spec = {"ps": [f"127.0.0.1:{p}" for p in ports[:2]], "worker": [f"127.0.0.1:{ports[2]}"]}
    servers = [tf.distribute.Server(spec, job_name="ps", task_index=i) for i in range(2)]
    servers.append(tf.distribute.Server(spec, job_name="worker", task_index=0))
    graph = tf.Graph()
    with graph.as_default():
        fed = [tf.compat.v1.placeholder(tf.as_dtype(np.asarray(c).dtype), np.shape(c)) for c in CASES]
        with tf.device("/job:ps/task:0"):
            blob, specs = wire.pack([tf.identity(f) for f in fed])
        with tf.device("/job:ps/task:1"):
            got = [tf.identity(t) for t in wire.unpack(blob, specs)]
    with tf.compat.v1.Session(servers[-1].target, graph=graph) as sess:
        meta = tf.compat.v1.RunMetadata()
        out = sess.run(got, dict(zip(fed, CASES)), options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                       run_metadata=meta)
    for want, value in zip(CASES, out):
        np.testing.assert_array_equal(value, want)
    recvs = [n.name for g in meta.partition_graphs for n in g.node
             if n.op == "_Recv" and "/job:ps/replica:0/task:1" in n.device
             and "/job:ps/replica:0/task:0" in n.attr["send_device"].s.decode()]
    assert len(recvs) == 1, recvs
