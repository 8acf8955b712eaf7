"""One task of `harness.pss_cluster.PSSCluster`: ``python -m harness.pss_server CLUSTER_JSON JOB INDEX [plain]``.

A TF server with the op library loaded (as the launcher's tasks), or with ``plain`` a bare
``tf.distribute.Server`` (for facts of TensorFlow itself); prints ``up`` once it serves.
"""

import json
import sys

from tf_ecrec.cluster.ps_session import cluster_server
from tf_ecrec.cluster.tf_config import ClusterConfig
from tf_ecrec.ops import load_library

if __name__ == "__main__":
    cluster, job, index = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    if sys.argv[4:] == ["plain"]:
        import tensorflow as tf

        server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=index, protocol="grpc",
                                      start=True)
    else:
        load_library()
        server = cluster_server(ClusterConfig(cluster, job, index))
    print("up", flush=True)
    server.join()
