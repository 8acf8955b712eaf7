"""Memory limits on this machine's kernel (`tf_ecrec.launcher.memory_limit`): a real process in a
real memory cgroup, killed at its limit, counted as an OOM kill, and not killed under a larger one."""

from __future__ import annotations

import os
import subprocess
import sys

from tf_ecrec.launcher.child import command
from tf_ecrec.launcher.job.diagnosis import ExitKind, classify
from tf_ecrec.launcher.memory_limit import CgroupMemoryLimits

# Allocates `mb` MB in 16 MB touched blocks, then exits 0.
HOG = "import sys\nhog = [bytearray(16 << 20) for _ in range(int(sys.argv[1]) // 16)]\n"


def _run(limits, name, limit_mb, alloc_mb, tmp_path):
    script = tmp_path / "hog.py"
    script.write_text(HOG)
    env = dict(os.environ, **limits.environment(name, limit_mb))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    # through the launcher's child entry, which joins the cgroup before running the module
    cmd = command("hog", str(alloc_mb))
    return subprocess.run(cmd, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=120, check=False)


def test_a_process_over_its_limit_is_oom_killed_and_counted_and_a_larger_limit_lets_it_live(tmp_path):
    limits = CgroupMemoryLimits()
    try:
        over = _run(limits, "ps:9", 128, 400, tmp_path)
        assert over.returncode == -9, (over.returncode, over.stderr[-2000:])
        assert limits.oom_kills("ps:9") >= 1
        d = classify(over.returncode, oom_kills=limits.oom_kills("ps:9"), limit_mb=limits.limit_mb("ps:9"))
        assert d.kind is ExitKind.OOM and "128 MB" in d.detail
        under = _run(limits, "ps:9", 800, 400, tmp_path)  # the same task, its limit raised
        assert under.returncode == 0, under.stderr[-2000:]
        assert limits.oom_kills("ps:9") == 0  # counted since the limit was last set
    finally:
        limits.close()
    assert not any(d.startswith(f"tf_ecrec-{os.getpid()}") for d in os.listdir("/sys/fs/cgroup/memory"))


def test_the_child_entry_runs_a_module_without_a_cgroup_too(tmp_path):
    (tmp_path / "hello.py").write_text("print('hi')\n")
    env = {k: v for k, v in os.environ.items() if k != "TF_ECREC_CGROUP"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    out = subprocess.run(command("hello"), env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "hi", out.stderr
    assert sys.executable
