"""Runs a module as a child process that dies with the launcher.

``python -m tf_ecrec.launcher.child PARENT_PID MODULE [ARGS...]`` asks the
kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``), checks that
the parent is still ``PARENT_PID`` (it may have died before the request),
then runs ``MODULE`` as ``__main__`` with ``ARGS``, as ``python -m MODULE
ARGS`` would.

Why not ``subprocess.Popen(preexec_fn=...)``: a ``preexec_fn`` makes Python
``fork()`` and run code in the child before ``exec``, and the launcher has
gRPC threads (its link to the job master); gRPC's fork handlers then
restart a poller thread in the child, which aborts when ``close_fds``
closes its epoll descriptor (grpc/grpc#43055).  Without ``preexec_fn`` the
child is started with ``vfork`` and no handler runs.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys
from collections.abc import Sequence

_PR_SET_PDEATHSIG = 1


def command(module: str, *args: str) -> list[str]:
    """The argv that runs ``python -m module args`` as a child of this process."""
    return [sys.executable, "-m", "tf_ecrec.launcher.child", str(os.getpid()), module, *args]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m tf_ecrec.launcher.child PARENT_PID MODULE [ARGS...]", file=sys.stderr)
        return 2
    parent, module, args = int(argv[0]), argv[1], argv[2:]
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the launcher still stops its children on every normal exit
    if os.getppid() != parent:
        print(f"tf_ecrec.launcher.child: the launcher (pid {parent}) is gone; not starting {module}", file=sys.stderr)
        return 1
    from tf_ecrec.launcher.memory_limit import join_cgroup_from_environment

    join_cgroup_from_environment()  # everything it allocates is charged to its limit (--ps-memory-mb)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
