"""A real PS server starts with the thread pools `tf_ecrec.cluster.threads` sizes (its server def's session config)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tf_ecrec.cluster.threads import ENV_PS_THREADS, ENV_TASKS_PER_HOST

_SERVER = """
import json, socket, sys
from tf_ecrec.cluster.tf_config import ClusterConfig
from tf_ecrec.cluster.ps_session import cluster_server, own_server
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
if sys.argv[1] == "ps":
    server = cluster_server(ClusterConfig({"ps": (f"127.0.0.1:{port}",)}, "ps", 0))
else:
    server = own_server(f"127.0.0.1:{port}", ps=sys.argv[1] == "spare")
c = server.server_def.default_session_config
print(json.dumps([c.intra_op_parallelism_threads, c.inter_op_parallelism_threads]))
"""


@pytest.mark.parametrize("role, env, want", [
    ("ps", {ENV_TASKS_PER_HOST: "7"}, [1, 2]),
    ("ps", {ENV_PS_THREADS: "3,5"}, [3, 5]),
    ("ps", {ENV_PS_THREADS: "default", ENV_TASKS_PER_HOST: "7"}, [0, 0]),  # 0: TensorFlow sizes them
    ("spare", {ENV_TASKS_PER_HOST: "7"}, [1, 2]),
    ("trainer", {ENV_TASKS_PER_HOST: "7"}, [0, 0]),  # a trainer's pools are TensorFlow's
])
def test_a_real_server_starts_with_the_sized_pools(role, env, want) -> None:
    base = {k: v for k, v in os.environ.items() if k not in (ENV_PS_THREADS, ENV_TASKS_PER_HOST)}
    done = subprocess.run([sys.executable, "-c", _SERVER, role], capture_output=True, text=True, timeout=120,
                          env={**base, "TF_CPP_MIN_LOG_LEVEL": "3", **env}, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == want
