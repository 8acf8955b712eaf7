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
    assert steps == ["bash tests/setup_machine.sh", "python -m pytest -q tests"]
    setup = (REPO / "tests" / "setup_machine.sh").read_text()
    for line in ("apt-get update -qq", "apt-get install -y -qq zookeeper", "pip install -r requirements.txt",
                 "pip install --no-build-isolation -e ."):
        assert line in setup, line
    required = (REPO / "requirements.txt").read_text()
    for package in ("pytest-timeout", "ruff", "mypy", "kazoo", "pyeclib"):
        assert package in required


# Distributions that install the `tensorflow` package itself (tests/integration/test_install.py resolves the pins).
_TENSORFLOW_PIN = re.compile(r"^(tensorflow|tensorflow-(?:cpu|gpu|intel|cpu-aws|macos|rocm)|intel-tensorflow|tf-nightly[\w-]*)==(\S+)$")


def _tensorflow_pins(requirements: list[str]) -> set[tuple[str, str]]:
    return {m.groups() for m in map(_TENSORFLOW_PIN.match, requirements) if m}


def test_requirements_setup_and_the_image_pin_the_same_one_tensorflow_distribution():
    requirements = [line.split("#")[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines()]
    quoted = re.compile(r'"([A-Za-z0-9_.-]+==[^"\s]+)"')
    setup = quoted.findall((REPO / "setup.py").read_text())
    image = quoted.findall((REPO / "deploy" / "Dockerfile").read_text())
    # tensorflow-recommenders requires the distribution `tensorflow`: any other one makes pip install a second.
    for source, pins in (("requirements.txt", requirements), ("setup.py", setup), ("deploy/Dockerfile", image)):
        assert _tensorflow_pins(pins) == {("tensorflow", "2.15.1")}, f"{source} pins {_tensorflow_pins(pins)}"
    assert _tensorflow_pins(["tensorflow-cpu==2.15.1", "tensorflow-estimator==2.15.0"]) == {("tensorflow-cpu", "2.15.1")}
