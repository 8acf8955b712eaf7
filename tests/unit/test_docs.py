"""The README and docs/ point at what exists: relative links, anchors, repository paths, and `tf-ecrec` flags.

Every Markdown link in ``README.md`` and ``docs/*.md`` that is not a URL must name an existing file
(and, with ``#anchor``, a heading of it, by GitHub's rule for heading ids); every repository path
written as code (`tf_ecrec/...`, `tests/...`) must exist; ``docs/index.md`` must link every page of
docs/; and every command line that runs ``tf-ecrec SUBCOMMAND`` (or ``python -m tf_ecrec.cli``), in a
code block (backslash-continued lines and a synopsis's indented lines joined) or in inline code
(across line breaks), may name only that subcommand's flags, and for a flag with choices only those
choices (``none|checkpoint`` alternatives each checked). The parsers are the CLI's own
(`tf_ecrec.cli.build_parser`, `tf_ecrec.master.server.build_parser`).
"""

from __future__ import annotations

import argparse
import pathlib
import re

import pytest

from tf_ecrec import cli
from tf_ecrec.master import server

REPO = pathlib.Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[^\n]*$", re.S | re.M)
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)
_INVOCATION = re.compile(r"(?:(?<![\w/.-])tf-ecrec|python -m tf_ecrec\.cli)[ \t]+([a-z][a-z-]*)")
_SEPARATORS = {"&&", "||", ";", "|", "&", ">", ">>", "2>&1"}
_REPO_PATH = re.compile(r"^(?:docs|tf_ecrec|tests|benchmarks|estimator_examples|deploy|hooks|ops|\.ci)/[\w./-]*$")


def _rel(page: pathlib.Path) -> str:
    return str(page.relative_to(REPO))


def fences(text: str) -> list[str]:
    """The bodies of the fenced code blocks of a Markdown text."""
    return [m.group(1) for m in _FENCE.finditer(text)]


def prose(text: str) -> str:
    """A Markdown text without its fenced code blocks."""
    return _FENCE.sub("", text)


def slug(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped (not ``-`` or ``_``), spaces as ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The ids of a page's headings, a repeated heading's with ``-1``, ``-2``... as GitHub numbers them."""
    seen: dict[str, int] = {}
    ids = set()
    for m in _HEADING.finditer(prose(text)):
        base = slug(m.group(2))
        ids.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return ids


def links(text: str) -> list[str]:
    """The targets of a page's Markdown links and images, outside code."""
    return _LINK.findall(_CODE_SPAN.sub("code", prose(text)))


def command_lines(text: str) -> list[str]:
    """The command lines of a page: code-block lines (continuations joined) and inline code spans."""
    commands = []
    for block in fences(text):
        lines: list[str] = []
        for raw in block.splitlines():
            stripped = raw.strip()
            continues = lines and (
                lines[-1].endswith("\\")
                or (_INVOCATION.search(lines[-1]) and raw[:1].isspace() and stripped[:1] in ("[", "-"))
            )
            if continues:
                lines[-1] = lines[-1].rstrip("\\").rstrip() + " " + stripped
            else:
                lines.append(stripped)
        commands.extend(lines)
    commands.extend(" ".join(m.group(2).split()) for m in _CODE_SPAN.finditer(prose(text)))
    return commands


def invocations(command: str) -> list[tuple[str, list[str]]]:
    """Each ``tf-ecrec SUBCOMMAND`` in a command line with the tokens after it, up to a shell separator."""
    found = []
    for m in _INVOCATION.finditer(command):
        tokens: list[str] = []
        depth = 0  # inside a synopsis's [...], `|` separates alternatives, not commands
        for token in command[m.end():].split():
            if (token in _SEPARATORS and depth == 0) or token.startswith(">") or token.startswith("#"):
                break
            depth += token.count("[") - token.count("]")
            tokens.append(token)
        found.append((m.group(1), tokens))
    return found


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Each ``tf-ecrec`` subcommand's parser, ``master``'s from the master itself."""
    (subparsers,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {**subparsers.choices, "master": server.build_parser()}


def flag_errors(command: str, known: dict[str, argparse.ArgumentParser]) -> list[str]:
    """What in a command line's ``tf-ecrec`` invocations the CLI would not accept."""
    errors = []
    for name, tokens in invocations(command):
        parser = known.get(name)
        if parser is None:
            errors.append(f"no subcommand {name!r} (tf-ecrec has {sorted(known)})")
            continue
        options = {s: a for a in parser._actions for s in a.option_strings}
        for i, token in enumerate(tokens):
            word = token.strip("[](),.;:'\"")
            if not word.startswith("--"):
                continue
            flag, _, inline = word.partition("=")
            action = options.get(flag)
            if action is None:
                errors.append(f"tf-ecrec {name} has no flag {flag}")
                continue
            value = inline or (tokens[i + 1].strip("[](),;:'\"") if i + 1 < len(tokens) else "")
            if action.choices is not None and value and not value.startswith("-"):
                wrong = [v for v in value.split("|") if v not in action.choices]
                if wrong:
                    errors.append(f"tf-ecrec {name} {flag} takes {sorted(action.choices)}, not {wrong}")
    return errors


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_names_an_existing_file_and_heading(page: pathlib.Path):
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading with id {anchor!r} in {_rel(file)}")
    assert not broken, f"{_rel(page)}: broken links:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_repository_path_written_as_code_exists(page: pathlib.Path):
    text = page.read_text(encoding="utf-8")
    paths = {m.group(2).rstrip(".,:;") for m in _CODE_SPAN.finditer(text) if _REPO_PATH.match(m.group(2).strip())}
    for block in fences(text):  # paths run as commands: python benchmarks/x.py, bash tests/x.sh
        paths.update(w for w in block.split() if _REPO_PATH.match(w) and "." in w.rsplit("/", 1)[-1])
    # `tests/harness/pss_cluster.fit_started`: a module's attribute, the module must exist.
    missing = sorted(p for p in paths if not (REPO / p).exists() and not (REPO / (p.rsplit(".", 1)[0] + ".py")).exists())
    assert not missing, f"{_rel(page)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_tf_ecrec_command_line_names_only_flags_the_cli_accepts(page: pathlib.Path):
    known = parsers()
    errors = [f"{e}\n    in: {c[:200]}" for c in command_lines(page.read_text(encoding="utf-8")) for e in flag_errors(c, known)]
    assert not errors, f"{_rel(page)}:\n" + "\n".join(errors)


def test_the_docs_index_links_every_page_and_the_readme_links_the_index():
    index = REPO / "docs" / "index.md"
    linked = {(index.parent / t.partition("#")[0]).resolve() for t in links(index.read_text(encoding="utf-8"))}
    unlisted = [_rel(p) for p in PAGES if p.parent.name == "docs" and p != index and p.resolve() not in linked]
    assert not unlisted, f"docs/index.md does not link {unlisted}"
    assert "docs/index.md" in links((REPO / "README.md").read_text(encoding="utf-8"))


def test_the_checks_catch_what_they_are_for():
    known = parsers()
    # A bad flag, a bad choice and an unknown subcommand, in a backslash-continued block and in inline code.
    page = """Run `tf-ecrec run --model dlrm
--fault-tolerance ecrec|raid5 --model-dir D` and then:

```bash
tf-ecrec run --ps 3 \\
  --no-such-flag 1 && tf-ecrec verify --model-dir D
tf-ecrec run --model dlrm --ps 3
             [--strategy estimator|pss] [--restart-at same|new-port] [--retries 2]
python -m tf_ecrec.cli master --port 0 --zk H:P/job && tf-ecrec frobnicate
```
"""
    errors = [e for c in command_lines(page) for e in flag_errors(c, known)]
    assert errors == [
        "tf-ecrec run has no flag --no-such-flag",
        "tf-ecrec run has no flag --retries",
        "no subcommand 'frobnicate' (tf-ecrec has ['export', 'gen-criteo', 'master', 'run', 'verify'])",
        "tf-ecrec run --fault-tolerance takes ['checkpoint', 'ecrec', 'flash', 'none'], not ['raid5']",
    ]
    assert links("[a](x.md#b) `[c](not-a-link.md)`\n```\n[d](e.md)\n```\n") == ["x.md#b"]
    assert slug("Erasure-coded protection (`--fault-tolerance ecrec --ec K+R`)") == (
        "erasure-coded-protection---fault-tolerance-ecrec---ec-kr")
    assert anchors("# A\n## A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1", "a-2"}
