"""Reading a job's variables from its PS tasks (`tf_ecrec.check.live_cluster.read_variables`), on an in-process cluster."""

from __future__ import annotations

import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from integration.tf_cluster import tf_cluster

from tf_ecrec.check import live_cluster

cluster = tf_cluster(num_ps=2, chief=True)


def test_variables_larger_than_one_read_come_back_whole_in_row_slices(cluster, monkeypatch):
    """A variable bigger than a read (gRPC cannot carry a message over 2 GB, tables of a few GB have such
    variables) is read in row slices and put back together; small ones are read whole, several per call."""
    cluster.reset()
    rng = np.random.default_rng(0)
    values = {
        "big": rng.standard_normal([1001, 7]).astype(np.float32),  # 28 KB: 28 reads of 1 KB
        "small": rng.standard_normal([3, 2]).astype(np.float32),
        "step": np.int64(42),
        "ints": rng.integers(0, 1 << 30, [50, 4]).astype(np.int32),
    }
    graph = tf.Graph()
    records = []
    with graph.as_default():
        inits = []
        for i, (name, value) in enumerate(values.items()):
            device = f"/job:ps/task:{i % 2}"
            with tf.device(device):
                var = tf.compat.v1.Variable(value, name=name, use_resource=True)
            inits.append(var.initializer)
            records.append({"name": var.op.name, "device": device, "dtype": var.dtype.base_dtype.name,
                            "shape": list(value.shape)})
    with tf.compat.v1.Session(cluster.target("chief"), graph=graph) as sess:
        sess.run(inits)
    monkeypatch.setattr(live_cluster, "READ_BYTES", 1024)
    got = live_cluster.read_variables(records, cluster.ps_addresses, timeout_secs=30)
    assert sorted(got) == sorted(values)
    for name, value in values.items():
        np.testing.assert_array_equal(got[name], value)
        assert got[name].dtype == value.dtype
