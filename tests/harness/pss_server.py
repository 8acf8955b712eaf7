"""One task of `harness.pss_cluster.PSSCluster`: ``python -m harness.pss_server CLUSTER_JSON JOB INDEX``.

A TF server with the op library loaded (as the launcher's tasks); prints ``up`` once it serves.
"""

import json
import sys

from tf_ecrec.config import ClusterConfig
from tf_ecrec.launcher.task import start_server
from tf_ecrec.ops import load_library

if __name__ == "__main__":
    load_library()
    cluster, job, index = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    server = start_server(ClusterConfig(cluster, job, index))
    print("up", flush=True)
    server.join()
