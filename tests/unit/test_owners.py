"""One owner per idea, checked where it can be read from the source (docs/architecture.md, "Owners").

- No file reaches into another file's private names: a ``x._name`` whose ``_name`` is defined only in
  other files of the package is a missing public interface (``self``/``cls`` and names of other
  libraries are not ours to judge).
- A device string is parsed in one place: `tf_ecrec.layout.device` (`ps_index`, the inverse of
  `ps_device`).
- The ops facade's typed names (what mypy reads) are exactly its lazy table, each from its owning module,
  so every op call is type-checked.
"""

from __future__ import annotations

import ast
import collections
import pathlib

from test_layering import REPO, sources

# Generated code and the example models are not the package's own design.
SKIP = ("tf_ecrec.master.proto", "tf_ecrec.examples")


def _files() -> dict[pathlib.Path, str]:
    return {s.path: s.path.read_text() for s in sources() if not s.module.startswith(SKIP)}


def private_reaches(texts: dict[pathlib.Path, str]) -> list[str]:
    """``file:line: expr`` for each ``x._name`` (x not self/cls) whose ``_name`` is defined only in other files."""
    trees = {path: ast.parse(text) for path, text in texts.items()}
    defined: dict[str, set[pathlib.Path]] = collections.defaultdict(set)
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined[node.name].add(path)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                defined[node.attr].add(path)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):  # fields, module names
                defined[node.id].add(path)
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            owners = defined.get(node.attr, set())
            if owners and path not in owners:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_file_uses_another_files_private_names() -> None:
    found = private_reaches(_files())
    assert not found, "private names used across files (give them a public name):\n" + "\n".join(found)


def test_the_private_check_catches_a_reach_into_the_optimizer() -> None:
    texts = _files()
    fold_round = REPO / "tf_ecrec/step/fold_round.py"
    texts[fold_round] += "\n\ndef _reach(opt):\n    return opt._tid\n"
    assert any("fold_round.py" in f and "opt._tid" in f for f in private_reaches(texts))


def device_parsers(texts: dict[pathlib.Path, str]) -> list[str]:
    return [str(path.relative_to(REPO)) for path, text in texts.items()
            if "DeviceSpec.from_string" in text and path != REPO / "tf_ecrec/layout/device.py"]


def test_device_strings_are_parsed_only_by_the_device_module() -> None:
    assert not device_parsers(_files())
    texts = _files()
    texts[REPO / "tf_ecrec/flash/snapshots.py"] += "\nimport tensorflow as tf\nX = tf.DeviceSpec.from_string('')\n"
    assert device_parsers(texts) == ["tf_ecrec/flash/snapshots.py"]


def test_the_ops_facade_types_exactly_its_lazy_names_from_their_modules() -> None:
    tree = ast.parse((REPO / "tf_ecrec/ops/__init__.py").read_text())
    lazy = next(n.value for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "_LAZY")
    table = {k.value: v.value for k, v in zip(lazy.keys, lazy.values)}  # type: ignore[union-attr]
    typed = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module is not None
                for alias in imp.names:
                    typed[alias.asname or alias.name] = imp.module.rpartition(".")[2]
    assert typed == table
    for name, module in table.items():
        source = (REPO / "tf_ecrec/ops" / f"{module}.py").read_text()
        assert f"def {name}(" in source or f"class {name}" in source or f"\n{name} =" in source or \
            f"\n{name}:" in source, (name, module)


def private_aliases(texts: dict[pathlib.Path, str]) -> list[str]:
    """``from tf_ecrec... import name as _name``: a public helper made to look private where it is used."""
    found = []
    for path, text in texts.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tf_ecrec"):
                found += [f"{path.relative_to(REPO)}:{node.lineno}: {a.name} as {a.asname}" for a in node.names
                          if a.asname and a.asname.startswith("_") and not a.name.startswith("_")]
    return found


def test_public_helpers_keep_their_names_where_they_are_imported() -> None:
    assert not private_aliases(_files())
    texts = _files()
    texts[REPO / "tf_ecrec/step/optimizer.py"] += "\nfrom tf_ecrec.step.step_program import dedup as _dedup\n"
    assert len(private_aliases(texts)) == 1
