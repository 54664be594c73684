"""Strict JSON parsing for the testbed's JSON and JSONL input files.

Owns ``parse_json``: the one way a reader turns JSON text into Python
values. Beyond ``json.loads`` it rejects NaN and Infinity literals (not
JSON, and never a valid number here), duplicate keys in an object (the
standard library keeps the last one silently, which hides typos), and
documents nested deeper than the YAML reader's MAX_DEPTH; integers of
thousands of digits and nesting deep enough to exhaust Python's stack are
errors too. Every problem is a SpecError naming the file and the place
(``line 3`` in a JSONL file).

Example::

    obj = parse_json('{"mode": "pdd"}', "cluster.json")
    parse_json("[NaN]", "x.json")   # SpecError: x.json: <top>: expected valid JSON, ...
"""

from __future__ import annotations

import json
from typing import Any

from testbed.errors import SpecError
from testbed.spec.reader import MAX_DEPTH


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
