"""The CPU seconds of a process and of everything it started, read from /proc.

`tests/conftest.py` records each test's share with ``TF_ECREC_TEST_CPU=PREFIX`` (one JSON line per
test in ``PREFIX.<xdist worker>.jsonl``): the suite is bound by CPU on two cores, and a test's wall
time says little about what it takes from the other worker's tests.

A process's figure is its own user and system time plus what its children that it has waited for
took (the kernel's ``cutime`` and ``cstime``), summed over the live processes under it.  So a task
of a launched job counts while it runs and, once its launcher has reaped it, inside the launcher's
figure; what a process reaped by init took (its parent died first) is not counted.
"""

from __future__ import annotations

import os

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(ppid, CPU seconds of the process and its reaped children), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "; fields[0] is the state
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return int(fields[1]), (utime + stime + cutime + cstime) / TICK


def tree_cpu(root: int) -> float:
    """CPU seconds of `root` and every live process under it, each with its reaped children."""
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            found = _stat(int(name))
            if found is not None:
                children.setdefault(found[0], []).append(int(name))
                cpu[int(name)] = found[1]
    total, stack, seen = 0.0, [root], set()
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.add(pid)
            total += cpu.get(pid, 0.0)
            stack.extend(children.get(pid, []))
    return total
