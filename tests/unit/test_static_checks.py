"""The linter and the type checker pass on the tree (configured in pyproject.toml).

They run here, in the test command, so that CI fails on a lint or type error like on any other
failure. Both are pinned in requirements.txt: a new release's new rules arrive by a deliberate bump.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing() -> None:
    done = _run("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_checks_import_order() -> None:
    # Import order is part of `ruff check` (rule I); this asserts the rule is on, so that turning
    # it off in pyproject.toml is a visible change.
    done = _run("ruff", "check", "--no-cache", "--show-settings", "tf_ecrec/__init__.py")
    assert done.returncode == 0, done.stderr
    assert "I001" in done.stdout


def test_mypy_finds_nothing() -> None:
    done = _run("mypy", "--no-incremental")
    assert done.returncode == 0, done.stdout + done.stderr


SKIPS = ("pytest.skip(", "importorskip(", "mark.skip", "skipif(", "pytest.xfail(", "mark.xfail")


def skips_in(text: str) -> list[str]:
    """The lines of a test module that could skip or expect a failure."""
    return [line.strip() for line in text.splitlines() if any(s in line for s in SKIPS)]


def test_no_test_can_skip_itself() -> None:
    # The test command runs every test with none skipped: a test that cannot find what it needs
    # (ZooKeeper, network namespaces, pyeclib) fails and names it.
    found = {str(p.relative_to(REPO)): skips_in(p.read_text(encoding="utf-8"))
             for p in (REPO / "tests").rglob("*.py") if p.name != "test_static_checks.py"}
    assert {path: lines for path, lines in found.items() if lines} == {}
    assert skips_in("    pytest.skip(reason)\n    ok = 1\n") == ["pytest.skip(reason)"]  # the check itself catches one
