"""`cli`: ``tf-ecrec ARGS`` as a test runs it (forked from the session's fork server).

In a module of its own, not in ``tests/conftest.py``: an e2e module that imported it ``from conftest``
got ``tests/integration/conftest.py`` whenever an integration module was collected first in the same
command (both are modules named ``conftest``).
"""

from __future__ import annotations

import os
import subprocess
import sys


def cli(*args: str, timeout: float = 600, cwd: str | None = None, env: dict | None = None,
        plot: bool = False, tables: int | None = 4) -> subprocess.CompletedProcess:
    """Runs ``tf-ecrec ARGS`` (as ``python -m tf_ecrec.cli``, forked from the session's fork server,
    `harness.zygote`) and returns the finished process.

    ``tf-ecrec run`` gets ``--no-plot`` unless `plot`: matplotlib's import and the render are about
    1.5 CPU-s per job, on a suite bound by CPU; the plot is checked by one e2e job of its own
    (test_adoption's model module, run without this helper) and by the unit tests of the report.
    It also gets ``--tables 4`` (the model reads 4 of the 26 categoricals) unless ARGS name
    ``--tables`` or `tables` is None: the protocol, the recoveries and the checks are the same for any
    number of tables, and a job of 4 took a fifth less CPU than one of 26 (50.7 -> 40.5 CPU-s for
    500 steps with a PS killed); the jobs that run all 26 say so with ``tables=None``.
    """
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    if args[:1] == ("run",) and not plot:
        args = (*args, "--no-plot")
    if args[:1] == ("run",) and tables is not None and "--tables" not in args:
        args = (*args, "--tables", str(tables))
    from harness import zygote  # pylint: disable=import-outside-toplevel

    return zygote.run([sys.executable, "-m", "tf_ecrec.cli", *args], env=env, cwd=cwd, timeout=timeout)
