"""The tree's architecture, checked: imports run one way, files hold one idea, one TF_CONFIG writer.

The layers and what each may import are written in ``docs/architecture.md``; ``LAYERS`` below is
the same table. A module may import modules of its own layer or a lower one, never a higher one,
counting imports inside functions too (a lazy import is still a dependency). No file imports a file
that imports it back, even through others (a cycle), and a task process imports only the job and task
sides of the launcher (both checked at the end of this file). The analysis reads the
sources (``ast``), so it also covers modules that need the op library or a cluster to import.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# Where each importable package lives in the source tree (hooks/ and estimator_examples/ are
# installed as tf_ecrec.hooks and tf_ecrec.examples).
SOURCE_ROOTS = {
    "tf_ecrec": REPO / "tf_ecrec",
    "tf_ecrec.hooks": REPO / "hooks",
    "tf_ecrec.examples": REPO / "estimator_examples",
}

# Module name prefixes and their layers; the longest matching prefix wins.
LAYERS: dict[str, float] = {
    # 0 foundation: values, errors, the code's arithmetic, the data formats.
    "tf_ecrec.errors": 0,
    "tf_ecrec.version": 0,
    "tf_ecrec.base": 0,  # retries, process end, graph registry, unfolded constants
    "tf_ecrec.erasure": 0,  # GF(2^16), the codec, the code a job chooses
    "tf_ecrec.data": 0,
    # 1 devices: the op library and its wrappers, where things are placed, reaching PS tasks.
    "tf_ecrec": 1,  # the package's facade: loads the op library when TensorFlow is in the process
    "tf_ecrec.ops": 1,
    "tf_ecrec.cluster": 1,  # TF_CONFIG, sessions that carry their cluster
    "tf_ecrec.layout": 1,  # chunks, stripes, placement, the device function
    # 2 protection: tables, the protected step, settlement, recovery, checks of a live cluster.
    "tf_ecrec.step": 2,  # protected tables, the step, its log and settlement
    "tf_ecrec.check": 2,  # a live cluster read and verified
    "tf_ecrec.rebuild": 2,
    "tf_ecrec.recovery": 2,
    "tf_ecrec.flash": 2,
    "tf_ecrec.pss": 2,
    "tf_ecrec.feature_column": 2,
    "tf_ecrec.keras": 2,
    # 3 coordination: membership backends (3.0), then the job master (3.5), which may use them.
    "tf_ecrec.membership": 3,
    "tf_ecrec.master": 3.5,
    # 4 session: what runs inside a trainer's session loop.
    "tf_ecrec.data.leased": 4,
    "tf_ecrec.session": 4,  # where the PS are now, following a move, the failover loop
    "tf_ecrec.hooks": 4,
    # 5 launch: processes, the command line, the example models.
    "tf_ecrec.launcher": 5,
    "tf_ecrec.launcher.k8s": 5,  # the pod entry of deploy/ (docs/kubernetes.md)
    "tf_ecrec.cli": 5,
    "tf_ecrec.estimator": 5,  # a user's Estimator protected: ec_model_fn, train, offline_estimator
    "tf_ecrec.examples": 5,
}

# Generated code is exempt from the size rule.
GENERATED = ("_pb2.py", "_pb2_grpc.py", "_build_info.py")
MAX_LINES = 400


def layer_of(module: str) -> float | None:
    """The layer of `module`, by its longest prefix in LAYERS; None if no prefix matches."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYERS:
            # A top-level module of the package must be listed itself: only packages lend
            # their layer to what is inside them.
            if prefix == "tf_ecrec" and n < len(parts):
                return None
            return LAYERS[prefix]
    return None


@dataclasses.dataclass(frozen=True)
class Source:
    module: str
    path: pathlib.Path
    is_package: bool


def sources() -> list[Source]:
    """Every Python module of the package, hooks and examples, with its importable name."""
    out = []
    for package, root in SOURCE_ROOTS.items():
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = list(rel.parts)
            if (root / parts[0]).is_symlink():
                continue  # tf_ecrec/hooks -> ../hooks in a development tree: listed under its own root
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            out.append(Source(".".join([package, *parts]), path, is_package))
    return out


def imported_modules(source: Source, text: str | None = None) -> list[tuple[int, str]]:
    """(line, module) for every tf_ecrec import in `source`, relative ones resolved."""
    tree = ast.parse(text if text is not None else source.path.read_text(), str(source.path))
    package = source.module if source.is_package else source.module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # `from pkg import name` imports pkg.name when that is a module; counting it as
            # such is right for layering either way (a name from pkg is pkg's layer or pkg.name's).
            for alias in node.names:
                found.append((node.lineno, f"{stem}.{alias.name}" if _is_module(f"{stem}.{alias.name}") else stem))
    return sorted({(line, m) for line, m in found if m == "tf_ecrec" or m.startswith("tf_ecrec.")})


def _is_module(name: str) -> bool:
    for package, root in sorted(SOURCE_ROOTS.items(), key=lambda kv: -len(kv[0])):
        if name == package:
            return True
        if name.startswith(package + "."):
            rel = pathlib.Path(*name[len(package) + 1 :].split("."))
            return (root / rel).with_suffix(".py").exists() or (root / rel / "__init__.py").exists()
    return False


def violations(source: Source, text: str | None = None) -> list[str]:
    """The upward imports of `source`, as readable lines."""
    mine = layer_of(source.module)
    out = []
    for line, module in imported_modules(source, text):
        theirs = layer_of(module)
        if theirs is None:
            out.append(f"{source.path.relative_to(REPO)}:{line}: {module} has no layer in LAYERS")
        elif mine is not None and theirs > mine:
            out.append(
                f"{source.path.relative_to(REPO)}:{line}: {source.module} (layer {mine}) imports "
                f"{module} (layer {theirs})"
            )
    return out


def test_every_module_has_a_layer() -> None:
    missing = [s.module for s in sources() if layer_of(s.module) is None]
    assert not missing, f"add these to LAYERS (and docs/architecture.md): {missing}"


def test_every_layer_entry_names_a_module() -> None:
    stale = [name for name in LAYERS if not _is_module(name)]
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


def test_imports_run_from_higher_layers_to_lower_ones_only() -> None:
    found = [v for s in sources() for v in violations(s)]
    assert not found, "upward imports:\n" + "\n".join(found)


def test_the_checker_catches_an_upward_import_even_inside_a_function() -> None:
    codec = next(s for s in sources() if s.module == "tf_ecrec.erasure.codec")
    text = "def f():\n    from tf_ecrec.launcher.job import spec\n    return spec\n"
    assert violations(codec, text) == [
        "tf_ecrec/erasure/codec.py:2: tf_ecrec.erasure.codec (layer 0) imports tf_ecrec.launcher.job.spec (layer 5)"
    ]
    hook = next(s for s in sources() if s.module.startswith("tf_ecrec.hooks."))
    assert any("tf_ecrec.launcher" in v for v in violations(hook, "from ..launcher import spec\n"))


def test_membership_backends_never_import_the_master() -> None:
    found = [
        f"{s.path.relative_to(REPO)}:{line}: {m}"
        for s in sources()
        if s.module.startswith("tf_ecrec.membership")
        for line, m in imported_modules(s)
        if m.startswith("tf_ecrec.master")
    ]
    assert not found, found


def test_only_the_package_imports_the_installed_only_packages_from_above() -> None:
    # tf_ecrec.hooks and tf_ecrec.examples exist only when installed: nothing below the launch
    # layer may need them (hooks may import their siblings).
    found = [
        f"{s.path.relative_to(REPO)}:{line}: {m}"
        for s in sources()
        if (layer_of(s.module) or 0) < 5 and not s.module.startswith("tf_ecrec.hooks")
        for line, m in imported_modules(s)
        if m.startswith(("tf_ecrec.hooks", "tf_ecrec.examples"))
    ]
    assert not found, found


@pytest.mark.parametrize("root", ["tf_ecrec", "hooks"])
def test_no_file_holds_more_than_a_few_hundred_lines(root: str) -> None:
    long = {
        str(p.relative_to(REPO)): n
        for p in sorted((REPO / root).rglob("*.py"))
        if not p.name.endswith(GENERATED) and not (REPO / root / p.relative_to(REPO / root).parts[0]).is_symlink()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"files over {MAX_LINES} lines (one idea each): {long}"


def _writes_tf_config(tree: ast.AST) -> list[int]:
    """Lines that set or remove os.environ["TF_CONFIG"] (assignment, del, update, setdefault, pop)."""

    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    def is_key(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value == "TF_CONFIG"

    lines = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for t in targets:
            if isinstance(t, ast.Subscript) and is_environ(t.value) and is_key(t.slice):
                lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_environ(node.func.value):
            if node.func.attr in ("update", "setdefault", "pop", "__setitem__") and (
                any(is_key(a) for a in node.args) or any(k.arg == "TF_CONFIG" for k in node.keywords)
            ):
                lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "putenv":
            if node.args and is_key(node.args[0]):
                lines.append(node.lineno)
    return lines


def test_tf_config_has_one_writer() -> None:
    found = [
        f"{s.path.relative_to(REPO)}:{line}"
        for s in sources()
        if s.module != "tf_ecrec.cluster.tf_config"
        for line in _writes_tf_config(ast.parse(s.path.read_text()))
    ]
    assert not found, f"TF_CONFIG is written only by tf_ecrec.cluster.tf_config.tf_config_env: {found}"
    assert _writes_tf_config(ast.parse('import os\nos.environ["TF_CONFIG"] = "{}"\n')) == [2]
    assert _writes_tf_config(ast.parse('import os\nos.environ.pop("TF_CONFIG", None)\n')) == [2]


# ---- no import cycles between files -----------------------------------------------------------------
# Counted are the imports that run (at the top of a module or inside a function: a lazy import is still a
# dependency); imports under ``if TYPE_CHECKING:`` are annotations only and are not counted. A cycle usually
# means one idea split across two files, or a lower file reaching up: move the shared part down, or pass a
# callback up (docs/architecture.md).

def _without_type_checking(text: str) -> str:
    tree = ast.parse(text)

    class Strip(ast.NodeTransformer):
        def visit_If(self, node: ast.If) -> ast.AST | None:
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                return ast.Pass() if not node.orelse else ast.If(test=ast.Constant(False), body=[ast.Pass()],
                                                                  orelse=node.orelse)
            return self.generic_visit(node)

    return ast.unparse(ast.fix_missing_locations(Strip().visit(tree)))


def _target(module: str, modules: set[str]) -> str | None:
    """The file `module` names: itself, or its longest prefix that is one of `modules`."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in modules:
            return name
    return None


def import_graph(texts: dict[str, str] | None = None) -> dict[str, set[str]]:
    """File -> the files it imports at run time (`texts` replaces some files' sources: for the mutation check)."""
    found = sources()
    modules = {s.module for s in found}
    graph: dict[str, set[str]] = {}
    for s in found:
        text = (texts or {}).get(s.module, s.path.read_text())
        deps = {_target(m, modules) for _, m in imported_modules(s, _without_type_checking(text))}
        graph[s.module] = {d for d in deps if d is not None and d != s.module and not _is_parent(d, s)}
    return graph


def _is_parent(dep: str, source: Source) -> bool:
    """A package's __init__ importing from it: resolved through the package, not a dependency of the file."""
    return source.module.startswith(dep + ".") and _is_module(dep)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_file_imports_a_file_that_imports_it_back() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles (files):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_check_catches_a_cycle_through_a_lazy_import_and_ignores_annotations() -> None:
    # verify imports live_cluster; a function of live_cluster importing verify back closes a cycle.
    live = (REPO / "tf_ecrec/check/live_cluster.py").read_text()
    lazy = live + "\n\ndef _back():\n    from tf_ecrec.check import verify\n    return verify\n"
    assert ["tf_ecrec.check.live_cluster", "tf_ecrec.check.verify"] in cycles(
        import_graph({"tf_ecrec.check.live_cluster": lazy}))
    typed = live + "\n\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tf_ecrec.check import verify\n"
    assert ["tf_ecrec.check.live_cluster", "tf_ecrec.check.verify"] not in cycles(
        import_graph({"tf_ecrec.check.live_cluster": typed}))


def launcher_sides(graph: dict[str, set[str]]) -> list[str]:
    """Imports across the launcher's sides that the split forbids: `launcher.job` imports nothing else of the
    launcher, `launcher.task` (what runs in a task process) only `launcher.job`."""
    allowed = {"tf_ecrec.launcher.job": ("tf_ecrec.launcher.job",),
               "tf_ecrec.launcher.task": ("tf_ecrec.launcher.job", "tf_ecrec.launcher.task")}
    found = []
    for module, deps in sorted(graph.items()):
        side = next((s for s in allowed if module == s or module.startswith(s + ".")), None)
        if side is None:
            continue
        for dep in sorted(deps):
            if dep.startswith("tf_ecrec.launcher") and dep != "tf_ecrec.launcher" and not dep.startswith(
                    tuple(p + "." for p in allowed[side]) + allowed[side]):
                found.append(f"{module} imports {dep}")
    return found


def test_a_task_process_imports_only_the_job_and_task_sides_of_the_launcher() -> None:
    assert not launcher_sides(import_graph())
    entry = (REPO / "tf_ecrec/launcher/task/entry.py").read_text()
    back = entry + "\n\ndef _back():\n    from tf_ecrec.launcher import supervisor\n    return supervisor\n"
    assert launcher_sides(import_graph({"tf_ecrec.launcher.task.entry": back})) == [
        "tf_ecrec.launcher.task.entry imports tf_ecrec.launcher.supervisor"]
