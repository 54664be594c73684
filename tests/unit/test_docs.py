"""The docs check: README.md and docs/*.md cite only what the repository has.

Three checks, no root, no network:

- every repository path cited exists. A cited path is a link target
  (``[text](target)``, relative to the citing file) or a token that starts
  with one of the repository's top-level folders (``testbed/``,
  ``scenarios/``, ``topologies/``, ``docs/``, ``tests/``, ``vagrant/``)
  or is one of its top-level files (``setup.sh``...), in backticks or not;
- every ``testbed SUBCOMMAND --flag`` in code (backtick spans, fenced and
  indented blocks) names a subcommand of ``testbed.cli.build_parser()``
  and only long flags that subcommand (or the top-level parser) accepts;
  ``python -m testbed.vm SUBCOMMAND --flag`` likewise against
  ``testbed.vm.__main__.build_parser()``;
- every dotted module cited (``testbed.pdd.run.verify``) is a module or
  package of the repository, or one attribute of one
  (``testbed.vm.run_in_guest``).

Exempt, and nothing else: web links and in-page anchors; paths under
``runs/`` (a run's output, not in the repository); absolute paths (e.g.
``/run/testbed/...``, the host's); and paths with a placeholder: a
component that is one of PLACEHOLDERS (before any extension: ``NAME.log``),
a glob (``*``) or ``...``. A new placeholder goes into PLACEHOLDERS by name;
an all-capitals file the repository has (``README.md``) is still checked.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from testbed import cli
from testbed.vm import __main__ as vm_cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP_DIRS = ("testbed", "scenarios", "topologies", "docs", "tests", "vagrant")
TOP_FILES = ("README.md", "setup.sh", "pyproject.toml")

# A path token: a top-level folder or file, not glued to a longer path or a
# word before it (so "/run/testbed/x" and "my-tests/" are not repository paths).
PATH_RE = re.compile(
    r"(?<![\w./~-])((?:%s)/[\w./*{}-]*|(?:%s)\b)" % (
        "|".join(TOP_DIRS), "|".join(re.escape(f) for f in TOP_FILES)))
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
PLACEHOLDERS = frozenset({"DIR", "FILE", "NAME", "MODE", "SCENARIO", "PATHS", "X"})
FENCE_RE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.S | re.M)
SPAN_RE = re.compile(r"`([^`]+)`")
# "testbed" as a command: at a start, after a space, "sudo", "bin/" or "(";
# or the qemu guest's "-m testbed.vm".
COMMAND_RE = re.compile(
    r"(?:(?:^|(?<=[\s(`])|(?<=bin/))(testbed)|-m[ \t]+(testbed\.vm))[ \t]+([a-z][\w-]*)(.*)")
MODULE_RE = re.compile(r"(?<![\w./-])testbed(?:\.[a-z_]\w*)+")
FLAG_RE = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")


def is_exempt(path: str) -> bool:
    """runs/..., absolute paths, and paths with a placeholder component."""
    if path.startswith(("runs/", "/")) or "*" in path or "..." in path:
        return True
    parts = [p for p in path.split("/") if p]
    return any(p.split(".")[0] in PLACEHOLDERS for p in parts)


def cited_paths(doc: Path) -> set[str]:
    """Repository paths ``doc`` cites, relative to the repository root."""
    text = doc.read_text()
    out: set[str] = set()
    for m in PATH_RE.finditer(text):
        out.add(m.group(1).rstrip(".,:;"))
    for m in LINK_RE.finditer(text):
        target = m.group(1).split("#")[0]
        if not target or re.match(r"^[a-z]+:", target):
            continue
        resolved = (doc.parent / target).resolve()
        out.add(str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else target)
    return out


def code_texts(doc: Path) -> list[str]:
    """The code of ``doc``: fenced blocks, indented lines, backtick spans (a span
    that wraps over lines made one line: one command per line)."""
    text = doc.read_text()
    chunks = [m.group(0) for m in FENCE_RE.finditer(text)]
    prose = FENCE_RE.sub("", text)
    chunks += [line for line in prose.splitlines() if line.startswith("    ")]
    chunks += [" ".join(m.group(1).split()) for m in SPAN_RE.finditer(prose)]
    return chunks


def cited_commands(doc: Path) -> list[tuple[str, str, tuple[str, ...]]]:
    """(program, subcommand, long flags) of every ``testbed SUB ...`` and
    ``python -m testbed.vm SUB ...`` in ``doc``'s code; the command ends at a
    comment, ``&&``, ``||``, ``;`` or a lone ``--``."""
    out = []
    for chunk in code_texts(doc):
        for line in chunk.splitlines():
            for m in COMMAND_RE.finditer(line):
                rest = re.split(r"\s#|&&|\|\||;|\s--(?:\s|$)", m.group(4))[0]
                out.append((m.group(1) or m.group(2), m.group(3),
                            tuple(FLAG_RE.findall(rest))))
    return out


def cited_modules(doc: Path) -> set[str]:
    return {m.group(0) for m in MODULE_RE.finditer(doc.read_text())}


def module_exists(name: str) -> bool:
    """A module or package of the repository, or one attribute of one."""
    def found(parts):
        base = ROOT.joinpath(*parts)
        return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()

    parts = name.split(".")
    if found(parts):
        return True
    module = ROOT.joinpath(*parts[:-1])
    source = module.with_suffix(".py") if module.with_suffix(".py").is_file() \
        else module / "__init__.py"
    return source.is_file() and re.search(rf"\b{parts[-1]}\b", source.read_text()) is not None


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def long_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


def _doc_id(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_cited_paths_exist(doc):
    missing = sorted(p for p in cited_paths(doc) if not is_exempt(p) and not (ROOT / p).exists())
    assert not missing, f"{_doc_id(doc)} cites paths the repository does not have: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_cited_commands_are_known_to_the_cli(doc):
    parsers = {"testbed": cli.build_parser(), "testbed.vm": vm_cli.build_parser()}
    problems = []
    for prog, sub, flags in cited_commands(doc):
        top = parsers[prog]
        subs = subparsers(top)
        if sub not in subs:
            problems.append(f"{prog} {sub}: no such subcommand")
            continue
        known = long_flags(subs[sub]) | long_flags(top)
        problems += [f"{prog} {sub} {f}: no such flag" for f in flags if f not in known]
    assert not problems, f"{_doc_id(doc)}: " + "; ".join(sorted(set(problems)))


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_cited_modules_exist(doc):
    missing = sorted(m for m in cited_modules(doc) if not module_exists(m))
    assert not missing, f"{_doc_id(doc)} cites modules the repository does not have: {missing}"


def test_the_check_sees_the_citations_it_exists_for():
    """The extractors find known citations (a check that finds nothing passes vacuously)."""
    readme = ROOT / "README.md"
    assert "docs/run-directory.md" in cited_paths(readme)
    assert "testbed/net/delayline.py" in cited_paths(readme)
    assert "testbed/pdd/wire/kvpayload.py" in cited_paths(ROOT / "docs" / "design.md")
    commands = cited_commands(readme)
    assert ("testbed", "calibrate", ("--json", "--wan-rate-gbit", "--wan-rtt-ms",
                                     "--wan-loss-pct", "--shaper-rate")) in commands
    assert any(sub == "run" and "--dry-run" in flags for _, sub, flags in commands)
    backends = cited_commands(ROOT / "docs" / "backends.md")
    assert ("testbed", "check", ("--no-measure",)) in backends  # a span over two lines
    assert ("testbed.vm", "scenario", ("--backend", "--out")) in backends
    assert ("testbed.vm", "run", ()) in backends  # "-- tc qdisc ..." is the guest's command
    assert "testbed.pdd.run.verify" in cited_modules(readme) | cited_modules(ROOT / "docs" /
                                                                          "pdd-roles.md")


@pytest.mark.parametrize("path, exempt", [
    ("runs/quickstart/report.md", True), ("/run/testbed/tb1a2b.json", True),
    ("MODE/roles/NAME.log", True), ("DIR/suite.json", True), ("topologies/*.yaml", True),
    ("scenarios/X.yaml", True), ("scenarios/loss.yaml", False),
    ("testbed/pdd/roles/router.py", False), ("docs/design.md", False), ("docs/README.md", False),
    ("scenarios/LOSS.yaml", False), ("runsx/a.md", False),
])
def test_exemptions_are_narrow(path, exempt):
    assert is_exempt(path) is exempt


def test_a_wrong_citation_is_caught(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("See `scenarios/nope.yaml` and run `testbed run SCENARIO --no-such-flag`.\n"
                   "    sudo testbed frobnicate topologies/two-dc.yaml\n"
                   "Also `python -m testbed.pdd.nope`.\n")
    assert "scenarios/nope.yaml" in cited_paths(doc)
    assert ("testbed", "run", ("--no-such-flag",)) in cited_commands(doc)
    assert ("testbed", "frobnicate", ()) in cited_commands(doc)
    assert not module_exists("testbed.pdd.nope")
    assert module_exists("testbed.pdd.run.verify") and module_exists("testbed.vm.run_in_guest")
