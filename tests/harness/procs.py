"""The processes of a launched job, found from /proc for tests that signal or count them.

A task of the local launcher is a child of the launcher, forked from its fork server (process
name: the task's name, such as ``worker:0``) or, with ``TF_ECREC_FORKSERVER=0``, a process of its
own (its environment's TF_CONFIG names it).
"""

from __future__ import annotations

import json
import os


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()


def descendants(root: int) -> list[int]:
    """Every process under `root`."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            children.setdefault(int(_stat(int(name))[1]), []).append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its reaper does not)."""
    try:
        return _stat(pid)[0] != "Z"
    except (OSError, IndexError):
        return False


def task_name(pid: int) -> str | None:
    """The task `pid` runs ("ps:0"), from its process name or its TF_CONFIG; None for another process."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            comm = fh.read().strip()
        if ":" in comm:
            return comm
        with open(f"/proc/{pid}/environ", "rb") as fh:
            for item in fh.read().split(b"\0"):
                if item.startswith(b"TF_CONFIG="):
                    task = json.loads(item[len(b"TF_CONFIG="):])["task"]
                    return f"{task['type']}:{task['index']}"
    except (OSError, ValueError, KeyError):
        pass
    return None


def task_pid(launcher: int, name: str) -> int | None:
    """The pid of the launcher's running task `name`, or None."""
    for pid in descendants(launcher):
        if running(pid) and task_name(pid) == name:
            return pid
    return None
