"""The fault kinds, one module each, found by name.

Every module of this package but ``base`` is a fault kind (``base``'s
docstring says what one holds). Adding a kind is adding a module here: the
scenario parser (testbed/spec/faults.py), the runner
(testbed/scenario/faults.py) and the Chaos Mesh export
(testbed/export/timeline.py) find it through ``KINDS``; ``reference()``
gives every kind's line (tests/unit/test_fault_kinds.py checks that
testbed/spec/faults.py's docstring and docs/design.md name each kind).

Example::

    from testbed.spec.faultkinds import KINDS, kind
    kind("duplicate").DOC
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

_REQUIRED = ("NAME", "DOC", "parse", "actions", "export")


def _discover() -> dict[str, ModuleType]:
    found: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name == "base" or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        missing = [n for n in _REQUIRED if not hasattr(module, n)]
        if missing:
            raise ImportError(f"{module.__name__}: a fault kind module needs {missing}")
        if module.NAME in found:
            raise ImportError(f"{module.__name__}: fault kind {module.NAME!r} defined twice")
        found[module.NAME] = module
    return found


KINDS: dict[str, ModuleType] = _discover()
FAULT_KINDS: tuple[str, ...] = tuple(KINDS)


def kind(name: str) -> ModuleType:
    """The module of fault kind ``name`` (KeyError naming the known kinds)."""
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"no fault kind {name!r}; known: {', '.join(FAULT_KINDS)}") from None


def reference() -> str:
    """Every kind's line, as the scenario reference shows them."""
    return "\n".join(f"    {name:<12} {module.DOC}" for name, module in KINDS.items())
