"""ops/build.py compiles the sources in parallel and links them once; a failing source is named."""

from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _build_module():
    spec = importlib.util.spec_from_file_location("_tf_ecrec_ops_build", REPO / "ops" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(directory: Path, name: str, text: str) -> None:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_sources_compile_on_several_jobs_into_one_library(tmp_path: Path) -> None:
    build = _build_module()
    src = tmp_path / "cc"
    for i in range(5):
        _write(src, f"sub{i % 2}/part{i}.cc", f'extern "C" int part{i}() {{ return {i * 7}; }}\n')
    library = str(tmp_path / "lib.so")
    objects = tmp_path / "objects"
    objects.mkdir()
    build._compile_and_link("g++", ["-std=c++17", "-shared", "-fPIC", "-O0"], [], str(objects), library, 3, False,
                            source_dir=src)
    loaded = ctypes.CDLL(library)
    assert [getattr(loaded, f"part{i}")() for i in range(5)] == [0, 7, 14, 21, 28]


def test_every_source_includes_the_precompiled_header_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The real header is TensorFlow's (ops/build.py PRECOMPILED); here one the sources cannot compile without.
    build = _build_module()
    monkeypatch.setattr(build, "PRECOMPILED", ("#define EC_ANSWER 42",))
    src = tmp_path / "cc"
    for i in range(3):
        _write(src, f"part{i}.cc", f'extern "C" int part{i}() {{ return EC_ANSWER + {i}; }}\n')
    objects = tmp_path / "objects"
    objects.mkdir()
    library = str(tmp_path / "lib.so")
    build._compile_and_link("g++", ["-std=c++17", "-shared", "-fPIC", "-O0"], [], str(objects), library, 2, False,
                            source_dir=src)
    assert (objects / "ec_pch.h.gch").exists()
    loaded = ctypes.CDLL(library)
    assert [getattr(loaded, f"part{i}")() for i in range(3)] == [42, 43, 44]


def test_the_slowest_sources_compile_beside_the_header_with_its_text(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # A source of SLOW_SOURCES compiles while the header is precompiled, against the header's plain text;
    # it needs the header's definitions as much as any other source does.
    build = _build_module()
    monkeypatch.setattr(build, "PRECOMPILED", ("#define EC_ANSWER 42",))
    monkeypatch.setattr(build, "SLOW_SOURCES", ("sub/part2.cc", "gone.cc"))
    src = tmp_path / "cc"
    for i in range(3):
        _write(src, f"sub/part{i}.cc", f'extern "C" int part{i}() {{ return EC_ANSWER + {i}; }}\n')
    assert [build._slow_rank(p) for p in sorted(src.rglob("*.cc"))] == [2, 2, 0]
    objects = tmp_path / "objects"
    objects.mkdir()
    library = str(tmp_path / "lib.so")
    build._compile_and_link("g++", ["-std=c++17", "-shared", "-fPIC", "-O0"], [], str(objects), library, 2, False,
                            source_dir=src)
    assert (objects / "ec_plain.h").read_text() == "#define EC_ANSWER 42\n"
    loaded = ctypes.CDLL(library)
    assert [getattr(loaded, f"part{i}")() for i in range(3)] == [42, 43, 44]


def test_a_failing_source_is_named_with_the_compilers_message(tmp_path: Path) -> None:
    build = _build_module()
    src = tmp_path / "cc"
    _write(src, "good.cc", 'extern "C" int good() { return 1; }\n')
    _write(src, "broken.cc", "int broken( { return 2; }\n")
    objects = tmp_path / "objects"
    objects.mkdir()
    with pytest.raises(RuntimeError, match=r"1 of 2 sources; .*broken\.cc: exit 1\)(.|\n)*error"):
        build._compile_and_link("g++", ["-std=c++17", "-shared", "-fPIC"], [], str(objects), str(tmp_path / "x.so"), 2,
                                False, source_dir=src)
    assert not os.path.exists(tmp_path / "x.so")


def test_build_jobs_come_from_the_environment_or_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    build = _build_module()
    monkeypatch.setenv("TF_ECREC_BUILD_JOBS", "3")
    assert build._jobs() == 3
    monkeypatch.delenv("TF_ECREC_BUILD_JOBS")
    assert build._jobs() == len(os.sched_getaffinity(0))
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("TF_ECREC_BUILD_JOBS", bad)
        with pytest.raises(RuntimeError, match=f"TF_ECREC_BUILD_JOBS={bad!r}: must be a positive integer"):
            build._jobs()
