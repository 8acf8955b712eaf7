"""The repository's contract: the README's test command is what CI runs, and it installs what it needs."""

from __future__ import annotations

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert block is not None, "the README opens with a bash block of its two commands"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_ci_runs_exactly_the_readmes_test_command():
    commands = _readme_commands()
    assert len(commands) == 2
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci[-1] == commands[1]


def test_the_test_command_installs_zookeeper_and_the_packages_before_running_every_test():
    command = _readme_commands()[1]
    steps = [s.strip() for s in command.split("&&")]
    assert steps[0] == "bash tests/setup_machine.sh"
    assert "apt-get install -y -qq zookeeper" in (REPO / "tests" / "setup_machine.sh").read_text()
    assert steps[1] == "pip install -r requirements.txt"
    assert steps[-1] == "python -m pytest -q tests"
    required = (REPO / "requirements.txt").read_text()
    for package in ("pytest-timeout", "ruff", "mypy", "kazoo", "pyeclib"):
        assert package in required
