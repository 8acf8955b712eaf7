"""``python -m harness.in_netns NETNS ARGV...``: what ``ip netns exec NETNS python ARGV...`` runs, forked.

A process forked from the test session's server (`harness.zygote`) joins the network namespace
``NETNS`` (``setns``, as ``ip netns exec`` does; the fork is single-threaded when it does, so every
thread it starts after is on that host) and then runs ``ARGV`` as the interpreter would: ``-m
MODULE ARGS``, ``-c CODE ARGS`` or ``SCRIPT ARGS``.  A multi-host test's tasks and probes so start
with TensorFlow's import done instead of each importing it on a machine that also runs their job.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import sys

CLONE_NEWNET = 0x40000000


def join(netns: str) -> None:
    """Moves this thread (and the threads it starts from now on) into the named network namespace."""
    fd = os.open(os.path.join("/var/run/netns", netns), os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {netns}: {os.strerror(err)}")
    finally:
        os.close(fd)


def main() -> None:
    netns, argv = sys.argv[1], sys.argv[2:]
    join(netns)
    if argv[:1] == ["-m"]:
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    from harness import run_script  # pylint: disable=import-outside-toplevel

    sys.argv = ["harness.run_script", *argv]
    run_script.main()


if __name__ == "__main__":
    main()
