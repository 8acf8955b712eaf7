"""Shared test helpers.

Tiers: ``tests/unit`` (pure functions, ops and hooks on in-process sessions),
``tests/integration`` (real gRPC master, real ZooKeeper), ``tests/e2e``
(whole clusters as processes, killed with SIGKILL).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from harness.ports import LAUNCHER_RANGE  # noqa: E402  (pyproject: pythonpath = tests)

from tf_ecrec.cluster.tf_config import with_tf_environment  # noqa: E402  (imports no TensorFlow)

# Jobs launched by this xdist worker draw their ports from its own block (tf_ecrec.launcher.ports).
os.environ["TF_ECREC_PORT_RANGE"] = LAUNCHER_RANGE
# Every process the tests start (and this one, when nothing imported TensorFlow before) with the product's
# TensorFlow settings, as the launcher gives its tasks (tf_ecrec.cluster.tf_config.TF_ENVIRONMENT).
os.environ.update(with_tf_environment(os.environ))

# Per-test time limits by tier, in seconds: generous (a loaded 2-core machine runs the slowest e2e
# test in about three minutes); a test that needs more says so with @pytest.mark.timeout.
TIER_TIMEOUTS = {"unit": 300, "integration": 900, "e2e": 1200}


@pytest.hookimpl(tryfirst=True)  # before xdist's hook reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks every test with its tier (the directory it is in), gives it the tier's time limit and its xdist group.

    The suite runs on two pytest-xdist workers (``-n 2 --dist loadgroup``, pyproject.toml), a module
    at a time (its module-scoped clusters start once), except an e2e test that shares no module-scoped
    fixture: each is a unit of its own (a launched job of a minute or two), so that the e2e tier
    spreads over both workers instead of leaving one with a whole module at the end (seen: 211 s
    more on one worker than on the other).  xdist hands out groups largest first (by their number of
    tests), so the unit and integration modules run first and the e2e tests, one per group, last; a
    clean run of 2026-11-30 ended with the two workers' test times 27 s apart (1,461 and 1,434 s), so
    the order is left as it is.  Two launched jobs may run at once, as jobs run beside anything on a
    shared machine: no test may depend on having the machine to itself.
    """
    for item in items:
        parts = item.path.relative_to(REPO).parts
        tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else None
        if tier not in TIER_TIMEOUTS:
            continue
        item.add_marker(getattr(pytest.mark, tier))
        scopes = {d.scope for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs}
        alone = tier == "e2e" and "module" not in scopes and "package" not in scopes and "class" not in scopes
        item.add_marker(pytest.mark.xdist_group(item.nodeid if alone else "/".join(parts[1:])))
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIER_TIMEOUTS[tier]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """With ``TF_ECREC_TEST_CPU=PREFIX``, one JSON line per test in ``PREFIX.<xdist worker>.jsonl``: its
    CPU seconds (this process and everything under it, `harness.tree_cpu`), its wall seconds, its node id."""
    prefix = os.environ.get("TF_ECREC_TEST_CPU")
    if not prefix:
        yield
        return
    import json  # pylint: disable=import-outside-toplevel
    import time  # pylint: disable=import-outside-toplevel

    from harness.tree_cpu import tree_cpu  # pylint: disable=import-outside-toplevel

    cpu, wall = tree_cpu(os.getpid()), time.monotonic()
    yield
    record = {"test": item.nodeid, "cpu": round(tree_cpu(os.getpid()) - cpu, 2),
              "wall": round(time.monotonic() - wall, 2)}
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"{prefix}.{worker}.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def run_in_fresh_process(target: str, timeout: float = 600) -> None:
    """Calls ``target`` ("module:function", importable from tests/) in a process of its own (forked from
    the session's fork server, `harness.zygote`: TensorFlow imported, no session or thread yet).

    For tests of what TensorFlow fixes at a process's first session, such as
    the size of the intra-op thread pool. The child imports the same
    ``tf_ecrec`` as this process and runs with ``TF_OVERRIDE_GLOBAL_THREADPOOL``
    set, so that every session gets the intra-op threads its config asks for.
    """
    import tf_ecrec  # pylint: disable=import-outside-toplevel

    module, function = target.split(":")
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(tf_ecrec.__file__)))
    path = os.pathsep.join(p for p in (os.path.join(REPO, "tests"), package_root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_OVERRIDE_GLOBAL_THREADPOOL": "1"}
    from harness import zygote  # pylint: disable=import-outside-toplevel

    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        proc = zygote.popen([sys.executable, "-c", f"import {module}; {module}.{function}()"], env=env,
                            stdout=out_file, stderr=err_file)

        def output() -> tuple[str, str]:
            texts = []
            for stream in (out_file, err_file):
                stream.seek(0)
                texts.append(stream.read().decode("utf-8", errors="replace"))
            return texts[0], texts[1]

        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # Where it waits: SIGABRT makes faulthandler (enabled by the cases, `harness.pss_cluster.exit_with`)
            # print every thread's Python stack before the process dies.
            proc.send_signal(signal.SIGABRT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            out, err = output()
            raise AssertionError(f"{target} did not end within {timeout} s; its threads' stacks:\n{out[-12000:]}\n"
                                 f"{err[-3000:]}") from None
        out, err = output()
    assert code == 0, f"{target} failed:\n{out[-5000:]}\n{err[-5000:]}"


@pytest.fixture
def fresh_process():
    """`run_in_fresh_process`, as a fixture: test modules of every directory see this conftest's fixtures."""
    return run_in_fresh_process


@pytest.fixture
def criteo_sample() -> str:
    return os.path.join(REPO, "estimator_examples", "data", "criteo_sample.tsv")


@pytest.fixture
def criteo_corrupt_sample() -> str:
    return os.path.join(REPO, "estimator_examples", "data", "criteo_corrupt_sample.tsv")
