"""Compile tf_ecrec's TensorFlow ops into ``tf_ecrec/ops/_ec_ops.so``.

Usage::

    python ops/build.py [--force] [--output-dir DIR]

or, from setup.py, ``build(output_dir)``. The library is compiled with the
installed TensorFlow's own compile and link flags (``tf.sysconfig``) and is
rebuilt only when it is missing, older than a source, built from other
sources, or built for another TensorFlow. Beside it the build writes
``_build_info.py`` (TensorFlow version and a hash of the sources and flags),
which the loader (``tf_ecrec.ops.loader``) checks when it loads the library.

Two flags go beyond TensorFlow's: ``-mavx`` gives Eigen the 8-float packets
the TensorFlow 2.15 binary itself uses (the stock training kernels vectorize
rows with them, and the packet/scalar split changes rounding in Adagrad's
``rsqrt``), and ``-ffp-contract=off`` keeps the compiler from fusing
multiply-adds the stock kernels do not fuse.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIR = REPO_ROOT / "ops" / "cc"
DEFAULT_OUTPUT_DIR = REPO_ROOT / "tf_ecrec" / "ops"
LIBRARY_NAME = "_ec_ops.so"
BUILD_INFO_NAME = "_build_info.py"
BASE_FLAGS = ("-std=c++17", "-shared", "-fPIC", "-O2")
EXTRA_FLAGS = ("-mavx", "-ffp-contract=off", "-DNDEBUG")


def _sources(source_dir: Path = SOURCE_DIR) -> list[Path]:
    return sorted(p for p in source_dir.rglob("*.cc"))


def _inputs() -> list[Path]:
    """Every file whose change must trigger a rebuild."""
    files = [p for p in SOURCE_DIR.rglob("*") if p.suffix in (".cc", ".h")]
    return sorted(files) + [Path(__file__).resolve()]


def source_hash(flags: Sequence[str]) -> str:
    """SHA-256 over the sources' relative paths and bytes, and the flags."""
    digest = hashlib.sha256()
    for path in _inputs():
        if path == Path(__file__).resolve():
            continue
        digest.update(str(path.relative_to(REPO_ROOT)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    digest.update(" ".join(flags).encode())
    return digest.hexdigest()


def _parse_assignments(text: str) -> dict[str, object]:
    # The format lives in the package; load that one module by path (setup.py
    # runs this before tf_ecrec is importable).
    spec = importlib.util.spec_from_file_location("_tf_ecrec_build_info", REPO_ROOT / "tf_ecrec" / "ops" / "build_info.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parse_assignments(text)


def read_build_info(path: Path) -> dict[str, object]:
    """Parses a ``_build_info.py`` without importing it ({} if unreadable)."""
    try:
        return _parse_assignments(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return {}


def _required_tensorflow() -> str | None:
    text = (REPO_ROOT / "tf_ecrec" / "version.py").read_text(encoding="utf-8")
    match = re.search(r'^REQUIRED_TENSORFLOW\s*=\s*"([^"]+)"', text, re.MULTILINE)
    return match.group(1) if match else None


def _stale_reason(output_dir: Path, tf_version: str, digest: str) -> str | None:
    library = output_dir / LIBRARY_NAME
    info_path = output_dir / BUILD_INFO_NAME
    if not library.exists() or not info_path.exists():
        return "no library built yet"
    built = library.stat().st_mtime
    newer = [p for p in _inputs() if p.stat().st_mtime > built]
    if newer:
        return f"{newer[0].relative_to(REPO_ROOT)} is newer than {LIBRARY_NAME}"
    info = read_build_info(info_path)
    if info.get("TF_VERSION") != tf_version:
        return f"built for TensorFlow {info.get('TF_VERSION')}, installed is {tf_version}"
    if info.get("SOURCE_HASH") != digest:
        return "sources or flags changed since the last build"
    return None


def _write_build_info(path: Path, tf_version: str, digest: str, compiler: str) -> None:
    text = (
        '"""What _ec_ops.so was built against; written by ops/build.py, do not edit."""\n'
        "\n"
        f"TF_VERSION = {tf_version!r}\n"
        f"SOURCE_HASH = {digest!r}\n"
        f"COMPILER = {compiler!r}\n"
    )
    path.write_text(text, encoding="utf-8")


def build(
    output_dir: str | os.PathLike[str] | None = None,
    *,
    force: bool = False,
    verbose: bool = True,
) -> Path:
    """Builds the op library into ``output_dir`` if it is stale.

    Args:
      output_dir: Directory that receives ``_ec_ops.so`` and
        ``_build_info.py``; defaults to ``tf_ecrec/ops`` of this checkout.
      force: Rebuild even if the library is up to date.
      verbose: Print the reason and the compiler command.

    Returns:
      The path of the library.

    Raises:
      RuntimeError: The compiler failed (its output is in the message).
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    out = Path(output_dir) if output_dir is not None else DEFAULT_OUTPUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    cxx = os.environ.get("CXX", "g++")
    flags = [*BASE_FLAGS, *EXTRA_FLAGS, *tf.sysconfig.get_compile_flags()]
    link_flags = list(tf.sysconfig.get_link_flags())
    tf_version = tf.__version__
    digest = source_hash([cxx, *flags, *link_flags])

    required = _required_tensorflow()
    if required and required != tf_version:
        print(f"warning: tf_ecrec requires TensorFlow {required}, building against "
              f"the installed {tf_version}", file=sys.stderr)

    library = out / LIBRARY_NAME
    reason = "forced" if force else _stale_reason(out, tf_version, digest)
    if reason is None:
        if verbose:
            print(f"{library} is up to date")
        return library

    fd, tmp_name = tempfile.mkstemp(prefix=".ec_ops.", suffix=".so", dir=out)
    os.close(fd)
    jobs = _jobs()
    if verbose:
        print(f"building {library} ({reason}): {len(_sources())} sources on {jobs} jobs")
    start = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix=".ec_ops_objects.", dir=out) as objects:
            _compile_and_link(cxx, flags, link_flags, objects, tmp_name, jobs, verbose)
        os.replace(tmp_name, library)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                             check=False).stdout.splitlines()
    _write_build_info(out / BUILD_INFO_NAME, tf_version, digest,
                      version[0] if version else cxx)
    if verbose:
        print(f"built in {time.monotonic() - start:.1f} s")
    return library


def _jobs() -> int:
    """Compilers run at once: ``TF_ECREC_BUILD_JOBS``, else the CPUs this process may use."""
    configured = os.environ.get("TF_ECREC_BUILD_JOBS", "")
    if configured:
        if not configured.isdigit() or int(configured) < 1:
            raise RuntimeError(f"TF_ECREC_BUILD_JOBS={configured!r}: must be a positive integer; source: the environment")
        return int(configured)
    return max(1, len(os.sched_getaffinity(0)))


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def _compile_and_link(cxx: str, flags: Sequence[str], link_flags: Sequence[str], objects: str,
                      library: str, jobs: int, verbose: bool, source_dir: Path = SOURCE_DIR) -> None:
    """Each source to an object in `objects`, `jobs` compilers at a time (each a separate translation unit,
    as one ``g++ a.cc b.cc`` command compiles them too), then one link into `library`.

    Raises:
      RuntimeError: a compiler or the linker failed (its output is in the message).
    """
    from concurrent.futures import ThreadPoolExecutor

    compile_flags = [f for f in flags if f != "-shared"] + [f"-I{REPO_ROOT}"]
    sources = _sources(source_dir)
    outputs = {src: os.path.join(objects, f"{i:03d}_{src.stem}.o") for i, src in enumerate(sources)}
    plain = _header(objects, "ec_plain.h")  # the same text, never precompiled: for the sources compiled beside it
    # While one compiler precompiles the header, the other job slots compile the slowest sources with
    # the header's text included as it is (the same definitions, parsed once more): on 2 cores the
    # precompilation alone would leave one core idle for a fifth of the build.
    early = sorted((src for src in sources if _slow_rank(src) < len(SLOW_SOURCES)), key=_slow_rank)[:max(0, jobs - 1)]

    def compile_one(src: Path, include: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([cxx, *compile_flags, *include, "-c", str(src), "-o", outputs[src]],
                              capture_output=True, text=True, check=False)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        header_flags = pool.submit(_precompiled_header, cxx, compile_flags, objects, verbose)
        early_results = {src: pool.submit(compile_one, src, ["-include", plain]) for src in early}
        include = header_flags.result()
        if verbose:
            print(" ".join(shlex.quote(c) for c in [cxx, *compile_flags, *include]), "-c SOURCE -o OBJECT")
        rest = {src: pool.submit(compile_one, src, include) for src in sources if src not in early_results}
        results = [(early_results.get(src) or rest[src]).result() for src in sources]
    failed = [(src, r) for src, r in zip(sources, results) if r.returncode != 0]
    if failed:
        src, result = failed[0]
        raise RuntimeError(f"compiling the tf_ecrec ops failed ({len(failed)} of {len(sources)} sources; "
                           f"{_shown(src)}: exit {result.returncode}):\n{result.stderr[-20000:]}")
    link = [cxx, "-shared", *outputs.values(), "-o", library, *link_flags]
    result = subprocess.run(link, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"linking the tf_ecrec ops failed (exit {result.returncode}):\n{result.stderr[-20000:]}")


PRECOMPILED = (  # the TensorFlow headers most sources include: parsed once, not once per source
    "#define EIGEN_USE_THREADS",  # as the kernels that use Eigen's thread pool define it, first
    '#include "tensorflow/core/framework/op_kernel.h"',
    '#include "tensorflow/core/framework/resource_mgr.h"',
    '#include "tensorflow/core/framework/op.h"',
    '#include "tensorflow/core/framework/shape_inference.h"',
    '#include "tensorflow/core/framework/common_shape_fns.h"',
    '#include "unsupported/Eigen/CXX11/Tensor"',
)


# The sources that take longest to compile (the optimizer kernels' templates: about a third of the
# build's compiler time), slowest first, relative to ops/cc; a name that is gone is ignored.
SLOW_SOURCES = ("kernels/sparse_apply_with_delta_op.cc",)


def _slow_rank(src: Path) -> int:
    """`src`'s place in `SLOW_SOURCES` (compiled first), or past its end."""
    return next((i for i, slow in enumerate(SLOW_SOURCES) if src.as_posix().endswith("/" + slow)), len(SLOW_SOURCES))


def _header(objects: str, name: str) -> str:
    """Writes `PRECOMPILED` as the header `name` in `objects` and returns its path."""
    header = os.path.join(objects, name)
    with open(header, "w", encoding="utf-8") as fh:
        fh.write("\n".join(PRECOMPILED) + "\n")
    return header


def _precompiled_header(cxx: str, compile_flags: Sequence[str], objects: str, verbose: bool) -> list[str]:
    """Precompiles `PRECOMPILED` (GCC: ``ec_pch.h.gch`` beside ``ec_pch.h`` in `objects`) with the sources'
    own flags, and returns the flags that make every source include it first: each source then skips
    several seconds of header parsing (the whole build takes about half as long on 2 cores).  A compiler
    that cannot precompile it gets no flags: the sources compile as they are."""
    header = _header(objects, "ec_pch.h")
    result = subprocess.run([cxx, *compile_flags, "-x", "c++-header", header, "-o", header + ".gch"],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        if verbose:
            print(f"no precompiled header ({cxx} exit {result.returncode}); compiling without one")
        return []
    return ["-include", header, "-Winvalid-pch"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    parser.add_argument("--output-dir", default=None,
                        help=f"where to write {LIBRARY_NAME} (default: tf_ecrec/ops)")
    args = parser.parse_args(argv)
    try:
        build(args.output_dir, force=args.force)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
