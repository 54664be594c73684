"""Strict reading of input files, shared by every reader (spec/, workload/, pdd/).

Owns ``read_text`` (a file's text: SpecError when unreadable or not UTF-8),
``parse_json`` (the one way a reader turns JSON text into Python values),
``finite`` and the limits ``MAX_DEPTH`` and ``MAX_INT``. It imports nothing
of the testbed but errors.py, so the roles' package (pdd/) can use it
without importing the spec layer.

``parse_json`` goes beyond ``json.loads``: it rejects NaN and Infinity
literals (not JSON, and never a valid number here), duplicate keys in an
object (the standard library keeps the last one silently, which hides
typos), and documents nested deeper than MAX_DEPTH; integers of thousands
of digits and nesting deep enough to exhaust Python's stack are errors too.
Every problem is a SpecError naming the file and the place (``line 3`` in
a JSONL file).

Example::

    obj = parse_json('{"mode": "pdd"}', "cluster.json")
    parse_json("[NaN]", "x.json")   # SpecError: x.json: <top>: expected valid JSON, ...
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from testbed.errors import SpecError

MAX_DEPTH = 100  # nesting levels a document may have (real files use fewer than 10)
MAX_INT = 2**63 - 1  # no integer field takes more (an int64)


class _Invalid(ValueError):
    """A strictness rule json.loads itself does not apply."""


def _no_constant(name: str) -> Any:
    raise _Invalid(f"{name} is not a JSON number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _Invalid(f"duplicate key {key!r}")
        out[key] = value
    return out


def _depth(value: Any) -> int:
    """Nesting levels of lists and objects (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, level = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, level)
            stack.extend((x, level + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def parse_json(text: str, file: str, where: str = "", expected: str = "valid JSON") -> Any:
    """Parse one JSON document; SpecError(file, where, expected, why) on any problem."""
    try:
        value = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise SpecError(file, where, expected, f"{text.strip()[:60]} ({e.msg} at column "
                        f"{e.colno})") from None
    except (ValueError, RecursionError) as e:  # _Invalid, a huge int, deep nesting
        raise SpecError(file, where, expected, str(e) or type(e).__name__) from None
    if _depth(value) > MAX_DEPTH:
        raise SpecError(file, where, expected, f"more than {MAX_DEPTH} levels of nesting")
    return value


def read_text(path: str | Path, what: str) -> str:
    """The file's text; SpecError if it cannot be read or is not UTF-8.

    ``what`` names the expected content in the error ("YAML file").
    """
    try:
        data = Path(path).read_bytes()
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise SpecError(str(path), "", f"a readable {what}",
                        getattr(e, "strerror", None) or str(e)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise SpecError(str(path), f"line {line}", f"a {what} in UTF-8",
                        data[e.start:e.start + 4]) from None


def finite(v: float) -> bool:
    """True for a finite number; False for NaN, infinities and ints beyond a float."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False
