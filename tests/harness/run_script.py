"""``python SCRIPT ARGS`` or ``python -c CODE``, for a process forked from the test session's fork server.

A forked task runs a module (``python -m``); this module runs what a test would have given the
interpreter instead: ``python -m harness.run_script SCRIPT ARGS`` runs the file as ``__main__`` with
its directory first on ``sys.path``, as ``python SCRIPT ARGS`` does, and ``python -m
harness.run_script -c CODE`` runs the code as ``python -c CODE`` does.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["-c"]:
        sys.argv = ["-c", *argv[2:]]
        sys.path.insert(0, "")
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})  # pylint: disable=exec-used
        return
    script = os.path.abspath(argv[0])
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
