"""A PS server's thread pools sized to the CPUs it may use (`tf_ecrec.cluster.threads`)."""

from __future__ import annotations

import pytest

from tf_ecrec.cluster.tf_config import ClusterConfig
from tf_ecrec.cluster.threads import (
    ENV_PS_THREADS,
    ENV_TASKS_PER_HOST,
    ThreadPools,
    cgroup_cpu_quota,
    parse_cpu_quota,
    ps_thread_pools,
)
from tf_ecrec.errors import ConfigError
from tf_ecrec.launcher.job.spec import JobSpec
from tf_ecrec.launcher.process_table import ProcessTable


@pytest.mark.parametrize("cpu_max, v1, want", [
    ("max 100000\n", None, None),
    ("150000 100000\n", None, 1.5),
    ("200000\n", None, 2.0),  # the period defaults to 100 ms
    ("banana 1\n", None, None),
    (None, ("-1\n", "100000\n"), None),
    (None, ("300000\n", "100000\n"), 3.0),
    (None, ("x", "100000"), None),
    (None, None, None),
])
def test_cpu_quota_parsed_from_cgroup_v2_and_v1(cpu_max, v1, want) -> None:
    assert parse_cpu_quota(cpu_max, *(v1 or (None, None))) == want


def test_cpu_quota_read_from_a_cgroup_tree(tmp_path) -> None:
    assert cgroup_cpu_quota(str(tmp_path)) is None  # no file: no quota known
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(str(tmp_path)) == 0.5
    (tmp_path / "cpu.max").write_text("400000 100000\n")  # v2 wins where both exist
    assert cgroup_cpu_quota(str(tmp_path)) == 4.0


@pytest.mark.parametrize("env, cpus, want", [
    ({}, (2, None), None),  # alone on its host, no quota: TensorFlow's sizing
    ({ENV_PS_THREADS: "default", ENV_TASKS_PER_HOST: "7"}, (2, None), None),
    ({ENV_TASKS_PER_HOST: "7"}, (2, None), ThreadPools(1, 2)),  # the launcher's 5 PS + 2 trainers on 2 cores
    ({ENV_PS_THREADS: "auto", ENV_TASKS_PER_HOST: "2"}, (16, None), ThreadPools(8, 8)),
    ({}, (64, 2.0), ThreadPools(2, 2)),  # a pod limited to 2 CPUs on a 64-core node
    ({}, (64, 0.5), ThreadPools(1, 2)),
    ({ENV_TASKS_PER_HOST: "3"}, (64, 6.0), ThreadPools(2, 2)),
    ({}, (4, 8.0), None),  # a quota above the cores changes nothing
    ({ENV_PS_THREADS: " 3,5 "}, (2, None), ThreadPools(3, 5)),
])
def test_pools_follow_the_setting_the_share_and_the_quota(env, cpus, want) -> None:
    assert ps_thread_pools(env, cpus) == want


def test_the_launcher_counts_the_tasks_sharing_its_host() -> None:
    # Counted from the job, not from the tasks added so far: the first PS is launched before the trainers are added.
    table = ProcessTable(JobSpec(ps=3, workers=2, min_workers=2, max_workers=4, spare_ps=1))
    assert table.tasks_on_host() == 3 + 2 + 1  # the PS, the chief and one worker, the spare; not the later slots
    table.add(ClusterConfig({"ps": ("a:1", "a:2", "a:3")}, "ps", 0))
    assert table.tasks_on_host() == 6


@pytest.mark.parametrize("env, named", [
    ({ENV_PS_THREADS: "two"}, ENV_PS_THREADS),
    ({ENV_PS_THREADS: "0,2"}, ENV_PS_THREADS),
    ({ENV_PS_THREADS: "1"}, ENV_PS_THREADS),
    ({ENV_PS_THREADS: "1,2,3"}, ENV_PS_THREADS),
    ({ENV_TASKS_PER_HOST: "0"}, ENV_TASKS_PER_HOST),
    ({ENV_TASKS_PER_HOST: "seven"}, ENV_TASKS_PER_HOST),
])
def test_bad_settings_are_refused_by_name(env, named) -> None:
    with pytest.raises(ConfigError, match=named) as info:
        ps_thread_pools(env, (2, None))
    assert "rule:" in str(info.value) and "source: the environment" in str(info.value)
