"""An in-process TensorFlow PS cluster for integration tests.

`InProcessCluster` starts one `tf.distribute.Server` per task (PS tasks, a
chief, workers) on free loopback ports, in this process.  Servers cannot be
stopped in-process, so a cluster lives as long as the test module that made
it (use the `tf_cluster` fixture factory with ``scope="module"``).

    cluster = InProcessCluster(num_ps=3)
    with tf_config_env(cluster.config("chief", 0)):
        run_config = tf.estimator.RunConfig(model_dir=...)   # master: the chief's server
    ...
    cluster.reset()                                          # variables gone from every task
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import tensorflow as tf

from tf_ecrec.cluster.tf_config import ClusterConfig


def free_ports(n: int) -> list[int]:
    """n distinct loopback ports nobody listened on when asked (`harness.ports`)."""
    from harness.ports import free_ports as pick

    return pick(n)


class InProcessCluster:
    """PS tasks, optionally a chief and workers, each a started in-process server.

    Args:
      num_ps: PS tasks.
      chief: whether the cluster has a chief task.
      num_workers: non-chief workers.
    """

    def __init__(self, num_ps: int, chief: bool = True, num_workers: int = 0) -> None:
        sizes = {"ps": num_ps, "chief": int(chief), "worker": num_workers}
        ports = iter(free_ports(sum(sizes.values())))
        self.spec: dict[str, list[str]] = {
            job: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for job, n in sizes.items() if n
        }
        self.servers: dict[tuple[str, int], tf.distribute.Server] = {}
        for job, addresses in self.spec.items():
            for i in range(len(addresses)):
                self.servers[(job, i)] = tf.distribute.Server(self.spec, job_name=job, task_index=i, start=True)

    @property
    def ps_addresses(self) -> list[str]:
        return list(self.spec["ps"])

    def target(self, job: str, index: int = 0) -> str:
        """The task's session target ("grpc://host:port")."""
        return self.servers[(job, index)].target

    def config(self, job: str, index: int = 0) -> ClusterConfig:
        """The cluster as the task `job:index` sees it (what its TF_CONFIG says)."""
        return ClusterConfig({k: tuple(v) for k, v in self.spec.items()}, job, index)

    def reset(self) -> None:
        """Drops every variable and other resource on every task, as if the servers had restarted.

        Variables live in the servers, not in a session: without a reset, the
        next graph that names a variable the same finds it initialised.
        """
        tf.compat.v1.Session.reset(self.target(*next(iter(self.servers))))


def tf_cluster(
    num_ps: int, chief: bool = True, num_workers: int = 0, scope: str = "module"
) -> Callable[..., InProcessCluster]:
    """A pytest fixture giving an `InProcessCluster` (assign it to a name in the test module)."""

    @pytest.fixture(scope=scope)
    def fixture() -> InProcessCluster:
        return InProcessCluster(num_ps, chief=chief, num_workers=num_workers)

    return fixture
