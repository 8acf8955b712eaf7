"""`harness.tree_cpu`: the CPU of a process and everything under it, live or reaped."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys

from harness.tree_cpu import summary, tree_cpu

SPIN = ("import sys, time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"
        "print('spun', flush=True)\nsys.stdin.read()\n")


def test_a_grandchild_counts_while_it_runs_and_once_reaped():
    before = tree_cpu(os.getpid())
    # A child that starts a grandchild which spins 0.6 CPU-s, says so (on the pipe both share), and then
    # waits on its input; the child waits for a line, then for the grandchild.
    child = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys\n"
        f"g = subprocess.Popen([sys.executable, '-c', {SPIN!r}], stdin=subprocess.PIPE)\n"
        "sys.stdin.readline()\n"
        "g.stdin.close(); g.wait()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdin is not None
    try:
        with selectors.DefaultSelector() as waiting:  # epoll: a worker process may hold descriptors past select's 1024
            waiting.register(child.stdout, selectors.EVENT_READ)
            ready = waiting.select(60)
        assert ready and child.stdout.readline() == "spun\n"
        live = tree_cpu(os.getpid()) - before  # the grandchild is alive, two levels down
        child.stdin.write("\n")
        child.stdin.close()
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    reaped = tree_cpu(os.getpid()) - before  # in this process's own children figures now
    assert live >= 0.55 and reaped >= live - 0.05, (live, reaped)


def test_the_summary_sums_by_tier_and_module_and_lists_the_heaviest(tmp_path):
    rows = [{"test": "tests/e2e/test_a.py::t1", "cpu": 30.0, "wall": 40.0},
            {"test": "tests/e2e/test_a.py::t2", "cpu": 10.0, "wall": 12.0},
            {"test": "tests/unit/test_b.py::t3", "cpu": 1.5, "wall": 1.0}]
    for worker, part in (("gw0", rows[:2]), ("gw1", rows[2:])):
        (tmp_path / f"cpu.{worker}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    text = summary(str(tmp_path / "cpu"), top=2).splitlines()
    assert text[0] == "3 tests, 42 CPU-s: e2e 40, unit 2"
    assert text[1].split() == ["40.0", "tests/e2e/test_a.py"]
    assert text[3].split()[:2] == ["30.0", "40.0"] and text[3].endswith("test_a.py::t1")
