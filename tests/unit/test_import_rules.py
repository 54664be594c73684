"""The import rules of docs/design.md ("Layers and import rules"), enforced.

Every ``import testbed.X`` / ``from testbed.X import ...`` in every module,
at any depth (function-level imports count), is checked against the table.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "testbed"

# package -> the testbed packages it may import (docs/design.md's table)
MAY_IMPORT = {
    "errors": set(),
    "types": set(),
    "histogram": set(),
    "linkmath": set(),
    "impairment": {"errors"},  # LinkSpec/LossSpec and their rules: pure, only SpecError
    "readyline": set(),
    "clock": set(),
    "decision": set(),
    "catalog": set(),  # the metric catalogue: names only
    "strict": {"errors"},
    "reader": {"errors", "strict"},
    "spec": {"errors", "types", "strict", "reader", "impairment", "workload", "catalog"},
    "workload": {"errors", "strict", "reader"},
    "net": {"errors", "histogram", "linkmath", "impairment", "readyline", "spec", "clock"},
    "pdd": {"errors", "types", "decision", "histogram", "impairment", "readyline", "strict",
            "clock"},
    "bench": {"errors", "types", "histogram", "impairment", "net", "spec", "workload", "pdd",
              "scenario"},
    "scenario": {"errors", "types", "strict", "readyline", "clock", "impairment", "spec", "workload",
                 "net", "pdd", "report"},
    "report": {"errors", "types", "decision", "histogram", "catalog"},
    "export": {"errors", "types", "strict", "linkmath", "impairment", "spec", "workload", "scenario",
               "pdd", "report"},
    "vm": {"errors", "impairment", "spec", "net", "scenario", "report"},  # the guest checks judge
    # as a run does: the runner's LinkSampler, the fidelity verdict
    "cli": None,  # everything, inside each subcommand
}
# single modules with a wider reach than their package, and why
EXCEPTIONS = {
    "spec/fuzz.py": {"pdd"},  # the fuzzer of every reader, the roles' config/request readers too
    "report/capacity.py": {"pdd", "reader"},  # per-chip capacities (pdd.compute.costmodel), its YAML
    "report/pcap.py": {"pdd"},  # the frame header (pdd.wire.protocol), to find PDD frames in packets
}
ONLY_THROUGH_MODULE = {("report/capacity.py", "pdd"): "pdd.compute.costmodel",
                       ("report/pcap.py", "pdd"): "pdd.wire.protocol"}


def _imports(path: Path) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "testbed":
            out += [(f"testbed.{a.name}", node.lineno) for a in node.names]  # from testbed import X
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, node.lineno))
    return [(name, line) for name, line in out if name.startswith("testbed.")]


def _package(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def violations() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        pkg = _package(path)
        rel = str(path.relative_to(PACKAGE))
        if pkg == "__init__" or MAY_IMPORT.get(pkg, set()) is None:
            continue
        assert pkg in MAY_IMPORT, f"testbed/{pkg} has no row in the import rules"
        allowed = MAY_IMPORT[pkg] | EXCEPTIONS.get(rel, set())
        for name, line in _imports(path):
            target = name.split(".")[1]
            through = ONLY_THROUGH_MODULE.get((rel, target))
            if target != pkg and (target not in allowed
                                  or through and not name.startswith("testbed." + through)):
                found.append(f"testbed/{rel}:{line} imports {name}")
    return found


def test_every_module_keeps_the_import_rules():
    assert violations() == []


def test_the_roles_import_neither_the_network_nor_spec_nor_scenario():
    for path in (PACKAGE / "pdd").rglob("*.py"):
        bad = [n for n, _ in _imports(path)
               if n.split(".")[1] in ("net", "spec", "scenario")]
        assert not bad, f"{path}: {bad}"


@pytest.mark.parametrize("source, pkg", [
    ("from testbed.net.runtime import set_link\n", "pdd"),
    ("def f():\n    import testbed.spec.topology\n", "pdd"),
    ("from testbed.pdd.run.config import parse_config\n", "report"),
    ("from testbed.spec.topology import Topology\n", "workload"),
    ("from testbed.spec.reader import Fields\n", "workload"),
    ("from testbed.reader import Fields\n", "impairment"),  # pure: the YAML side is spec/link.py
])
def test_a_forbidden_import_is_found(tmp_path, monkeypatch, source, pkg):
    fake = tmp_path / "testbed"
    (fake / pkg).mkdir(parents=True)
    (fake / pkg / "mod.py").write_text(source)
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", fake)
    assert len(violations()) == 1


def unresolved(package: Path = PACKAGE) -> list[str]:
    """Every ``from testbed.X import name`` / ``import testbed.X`` in the package, at any
    depth (function-level imports only fail when the function runs), that names no
    module or no attribute of one."""
    import importlib

    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [(node.module, a.name) for a in node.names]
            else:
                continue
            for module, name in targets:
                if not module.startswith("testbed"):
                    continue
                where = f"{path.relative_to(package.parent)}:{node.lineno}"
                try:
                    mod = importlib.import_module(module)
                except ImportError as e:
                    found.append(f"{where}: {module}: {e}")
                    continue
                if name is not None and name != "*" and not hasattr(mod, name):
                    try:
                        importlib.import_module(f"{module}.{name}")
                    except ImportError:
                        found.append(f"{where}: {module} has no {name}")
    return found


def test_every_testbed_import_resolves_function_level_ones_too():
    assert unresolved() == []


def test_an_unresolved_function_level_import_is_found(tmp_path):
    fake = tmp_path / "testbed"
    fake.mkdir()
    (fake / "mod.py").write_text("def f():\n    from testbed.pdd.bench import run\n"
                                 "def g():\n    from testbed.types import NoSuchName\n")
    assert len(unresolved(fake)) == 2
