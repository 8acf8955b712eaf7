"""The CPU seconds of a process and of everything it started, read from /proc.

`tests/conftest.py` records each test's share with ``TF_ECREC_TEST_CPU=PREFIX`` (one JSON line per
test in ``PREFIX.<xdist worker>.jsonl``): the suite is bound by CPU on two cores, and a test's wall
time says little about what it takes from the other worker's tests.

A process's figure is its own user and system time plus what its children that it has waited for
took (the kernel's ``cutime`` and ``cstime``), summed over the live processes under it.  So a task
of a launched job counts while it runs and, once its launcher has reaped it, inside the launcher's
figure; what a process reaped by init took (its parent died first) is not counted.

    TF_ECREC_TEST_CPU=/tmp/cpu python -m pytest -q tests
    python tests/harness/tree_cpu.py /tmp/cpu       # by tier, by module, the heaviest tests
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


def summary(prefix: str, top: int = 25) -> str:
    """The records ``PREFIX.*.jsonl`` summed by tier and by module, and the `top` tests, by CPU seconds."""
    import collections
    import glob
    import json

    records: list[dict] = []
    for path in sorted(glob.glob(f"{prefix}.*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            records.extend(json.loads(line) for line in fh if line.strip())
    tiers: collections.Counter[str] = collections.Counter()
    modules: collections.Counter[str] = collections.Counter()
    for r in records:
        module = r["test"].split("::")[0]
        tiers[module.split("/")[1] if module.count("/") > 1 else module] += r["cpu"]
        modules[module] += r["cpu"]
    lines = [f"{len(records)} tests, {sum(tiers.values()):,.0f} CPU-s: "
             + ", ".join(f"{t} {s:,.0f}" for t, s in tiers.most_common())]
    lines += [f"{s:8.1f}  {m}" for m, s in modules.most_common(top)]
    lines += [f"{r['cpu']:8.1f}  {r['wall']:7.1f} s  {r['test']}"
              for r in sorted(records, key=lambda r: -r["cpu"])[:top]]
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(summary(sys.argv[1]))
