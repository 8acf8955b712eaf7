"""No import cycles between files: a file that needs another is never needed by it, even through others.

Counted are the imports that run (at the top of a module or inside a function: a lazy import is
still a dependency); imports under ``if TYPE_CHECKING:`` are annotations only and are not counted.
A cycle usually means one idea split across two files, or a lower file reaching up: the fix is to
move the shared part down, or to pass a callback up (docs/architecture.md).
"""

from __future__ import annotations

import ast

from test_layering import REPO, Source, _is_module, imported_modules, sources


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
