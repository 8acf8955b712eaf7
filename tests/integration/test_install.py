"""requirements.txt installs in one resolution, with one TensorFlow distribution.

pip's own resolver is run on ``requirements.txt`` as a fresh environment would see it
(``pip install --dry-run --ignore-installed --report``, against the package index): a requirement
naming a TensorFlow distribution the pins do not provide (``tensorflow-recommenders`` requires
``tensorflow``, not ``tensorflow-cpu``) made pip download ten ``tensorflow`` wheels of 570-645 MB
while it backtracked, then install one beside ``tensorflow-cpu``: two distributions writing the same
``tensorflow/`` package.

Backtracking is read from pip's log, two ways: its ``INFO: pip is looking at multiple versions``
line, and any project whose files were fetched (or read from the cache, or a local mirror) at more
than one version. The dry run fetches each file once, TensorFlow's 475 MB wheel included (from pip's
cache when the install filled it); it takes about 30 s of CPU (37-43 s at a load average of 4 on 2
cores, six minutes at 20), most of it pip 23.2 matching the tags of the index's ~90,000 file links
(profiled). The old pins' dry run downloaded eleven `tensorflow` wheels (569 s, loaded).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Distributions that install the `tensorflow` package itself: any two of them overwrite each other.
TENSORFLOW_DISTRIBUTIONS = frozenset({
    "tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-cpu-aws",
    "tensorflow-macos", "tensorflow-rocm", "intel-tensorflow", "intel-tensorflow-avx512",
    "tf-nightly", "tf-nightly-cpu", "tf-nightly-gpu", "tf-nightly-intel",
})

# A file pip fetched or read to learn a candidate's metadata, as its log names it.
_FETCHED = re.compile(
    r"^\s*(?:Downloading|Using cached|Processing|File was already downloaded)\s+(?P<file>\S+)"
    r"|^\s*Obtaining dependency information from (?P<name>\S+) (?P<version>\S+)"
)
_ARCHIVE = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+?)-(?P<version>\d[^-]*?)(?:-.*\.whl|\.tar\.gz|\.zip)$")


def canonical(name: str) -> str:
    """The PEP 503 form of a project name: ``Foo_Bar.baz`` -> ``foo-bar-baz``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def fetched_versions(log: str) -> dict[str, set[str]]:
    """Maps each project pip fetched a file of (in ``log``, its output) to the versions fetched."""
    versions: dict[str, set[str]] = {}
    for line in log.splitlines():
        match = _FETCHED.match(line)
        if match is None:
            continue
        if match.group("name"):
            name, version = match.group("name"), match.group("version")
        else:
            archive = _ARCHIVE.match(os.path.basename(match.group("file").split("#")[0]))
            if archive is None:
                continue
            name, version = archive.group("name"), archive.group("version")
        versions.setdefault(canonical(name), set()).add(version)
    return versions


def test_fetched_versions_reads_pips_log_lines():
    # Lines as pip 23.2 writes them, from the resolution this test guards against.
    log = """Collecting tensorflow>=2.9.0 (from tensorflow-recommenders==0.7.3->-r requirements.txt (line 4))
  Downloading tensorflow-2.21.0-cp311-cp311-manylinux_2_27_x86_64.whl (572.4 MB)
INFO: pip is looking at multiple versions of tensorflow to determine which version is compatible
  Downloading tensorflow-2.20.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl (620.6 MB)
Processing /opt/pypi/files/numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
  Using cached tensorflow_cpu-2.15.1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl (207.2 MB)
  Obtaining dependency information from grpcio 1.85.3
  Downloading PyYAML-6.0.4.tar.gz (125 kB)
"""
    assert fetched_versions(log) == {
        "tensorflow": {"2.21.0", "2.20.0"},
        "numpy": {"1.26.4"},
        "tensorflow-cpu": {"2.15.1"},
        "grpcio": {"1.85.3"},
        "pyyaml": {"6.0.4"},
    }


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """pip's resolution of requirements.txt for an empty environment: its log and its report."""
    report = tmp_path_factory.mktemp("pip") / "report.json"
    command = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--progress-bar", "off",
        "--report", str(report), "-r", os.path.join(REPO, "requirements.txt"),
    ]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=500, cwd=REPO, env=env)
    log = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{log[-5000:]}"
    return log, json.loads(report.read_text())


@pytest.mark.timeout(600)
def test_requirements_resolve_to_one_tensorflow_distribution(dry_run: tuple[str, dict]):
    _, report = dry_run
    installed = {canonical(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}
    tensorflows = {name: version for name, version in installed.items() if name in TENSORFLOW_DISTRIBUTIONS}
    assert tensorflows == {"tensorflow": "2.15.1"}, (
        f"requirements.txt installs {tensorflows}: exactly one TensorFlow distribution, tensorflow 2.15.1 "
        "(the one tensorflow-recommenders requires), must be installed"
    )
    assert installed["tensorflow-estimator"] == "2.15.0"
    assert installed["tensorflow-recommenders"] == "0.7.3"


@pytest.mark.timeout(600)
def test_requirements_resolve_without_backtracking(dry_run: tuple[str, dict]):
    log, _ = dry_run
    looking = [line for line in log.splitlines() if "pip is looking at multiple versions" in line]
    assert not looking, "pip backtracked while resolving requirements.txt:\n" + "\n".join(looking)
    several = {name: sorted(v) for name, v in fetched_versions(log).items() if len(v) > 1}
    assert not several, f"pip fetched several versions of a project (it backtracked): {several}"
    assert "tensorflow" in fetched_versions(log), "the log no longer names the files pip fetched: update _FETCHED"


def test_the_installed_environment_has_no_broken_requirements():
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"pip check:\n{result.stdout}{result.stderr}"
