"""Strict YAML reading: every field checked, every error located.

Owns the one YAML loader of the project. ``load_yaml`` returns plain dicts
that remember the line of each key; ``Fields`` walks one mapping, hands out
typed values (number, string, enum, list...) and, in ``done()``, rejects any
key nobody asked for. Every error is a SpecError naming the file, the YAML
path (``wan.loss.pct``), the line when known, what was expected and what
was found. No I/O beyond reading the file.

Hostile input is an error too, never a traceback: ``read_text`` rejects
bytes that are not UTF-8, the loader rejects documents nested deeper than
MAX_DEPTH, duplicate keys (PyYAML would keep the last one silently, which
hides typos), unhashable keys, and scalars Python cannot build (an integer
of thousands of digits, a date like 2020-13-45), each with its line.

Example::

    data = load_yaml("topologies/two-dc.yaml")
    f = Fields(data, "topologies/two-dc.yaml", "")
    name = f.str("name")
    f.done()
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml

from testbed.errors import SpecError
from testbed.strict import MAX_DEPTH, MAX_INT, finite, read_text  # noqa: F401 (re-exported)

T = TypeVar("T")


class LineDict(dict):
    """A mapping that remembers the source line of each key (1-based)."""

    lines: dict[str, int]


class _Loader(yaml.SafeLoader):
    """SafeLoader with a nesting limit and located errors for unbuildable scalars."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"more than {MAX_DEPTH} levels of nesting",
                self.peek_event().start_mark)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as e:
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot build {node.value!s:.40}: {e}", node.start_mark) from None


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    out = LineDict()
    out.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key that is a list or mapping",
                key_node.start_mark) from None
        if key in out:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def is_file(path: Path) -> bool:
    """Path.is_file, False also for names the OS refuses (too long, NUL)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file; syntax errors become SpecError with the line."""
    path = str(path)
    text = read_text(path, "YAML file")
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        raise SpecError(path, _yaml_line(e, text), "valid YAML", _yaml_problem(e)) from None


def _yaml_line(e: yaml.YAMLError, text: str) -> str:
    """``line N`` of a YAML error: its mark, or a reader error's character position."""
    mark = getattr(e, "problem_mark", None)
    if mark:
        return f"line {mark.line + 1}"
    if isinstance(e, yaml.reader.ReaderError):
        return f"line {text.count(chr(10), 0, e.position) + 1}"
    return ""


def _yaml_problem(e: yaml.YAMLError) -> str:
    """The error without PyYAML's quoted source lines (the line is in the path)."""
    parts = [getattr(e, "context", None), getattr(e, "problem", None)]
    text = ", ".join(str(p) for p in parts if p) or str(e)
    return " ".join(text.split())


def join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


class Fields:
    """Typed, strict access to one YAML mapping at ``path`` in ``file``."""

    def __init__(self, data: Any, file: str, path: str):
        if not isinstance(data, dict):
            raise SpecError(file, path, "a mapping", data)
        self.data, self.file, self.path = data, file, path
        self.used: set[str] = set()

    # -- errors --------------------------------------------------------
    def where(self, key: str) -> str:
        line = getattr(self.data, "lines", {}).get(key)
        p = join(self.path, key)
        return f"{p} (line {line})" if line else p

    def error(self, key: str, expected: str, got: object) -> SpecError:
        return SpecError(self.file, self.where(key), expected, got)

    # -- access --------------------------------------------------------
    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = ...) -> Any:
        self.used.add(key)
        if key not in self.data:
            if default is ...:
                raise SpecError(self.file, join(self.path, key), "this field to be set", "nothing")
            return default
        return self.data[key]

    def num(self, key: str, default: Any = ..., *, lo: float | None = None,
            hi: float | None = None, lo_open: bool = False, unit: str = "") -> float:
        """A finite number within [lo, hi] (or (lo, hi] with lo_open)."""
        v = self.raw(key, default)
        if key not in self.data:
            return default  # defaults are the caller's, not checked
        what = f"a number{' of ' + unit if unit else ''}"
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not finite(v):
            raise self.error(key, what + " (units are in the field name)", v)
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise self.error(key, f"{what} {'>' if lo_open else '>='} {lo:g}", v)
        if hi is not None and v > hi:
            raise self.error(key, f"{what} <= {hi:g}", v)
        return float(v)

    def int(self, key: str, default: Any = ..., *, lo: int | None = None,
            hi: int | None = None) -> int:
        v = self.raw(key, default)
        if key not in self.data:
            return default  # defaults are the caller's, not checked
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(key, "an integer", v)
        if abs(v) > MAX_INT:
            raise self.error(key, f"an integer of at most {MAX_INT}", v)
        if lo is not None and v < lo:
            raise self.error(key, f"an integer >= {lo}", v)
        if hi is not None and v > hi:
            raise self.error(key, f"an integer <= {hi}", v)
        return v

    def str(self, key: str, default: Any = ..., *, check: Callable[[str], str | None] | None = None) -> str:
        v = self.raw(key, default)
        if key not in self.data:
            return default  # defaults are the caller's, not checked
        if not isinstance(v, str) or not v:
            raise self.error(key, "a non-empty string", v)
        if check and (problem := check(v)):
            raise self.error(key, problem, v)
        return v

    def bool(self, key: str, default: Any = ...) -> bool:
        v = self.raw(key, default)
        if not isinstance(v, bool):
            raise self.error(key, "true or false", v)
        return v

    def choice(self, key: str, choices: tuple[str, ...], default: Any = ...) -> str:
        v = self.raw(key, default)
        if v not in choices:
            raise self.error(key, "one of " + ", ".join(choices), v)
        return v

    def list(self, key: str, default: Any = ..., *, min_len: int = 0) -> list:
        v = self.raw(key, default)
        if not isinstance(v, list):
            raise self.error(key, "a list", v)
        if len(v) < min_len:
            raise self.error(key, f"a list of at least {min_len} item(s)", v)
        return v

    def sub(self, key: str, default: Any = ...) -> "Fields | None":
        v = self.raw(key, default)
        if v is None and default is not ...:
            return None  # an optional section left empty
        return Fields(v, self.file, join(self.path, key))

    def items(self, key: str, *, min_len: int = 0) -> list["Fields"]:
        """A list of mappings, each as Fields."""
        lst = self.list(key, min_len=min_len)
        base = join(self.path, key)
        return [Fields(item, self.file, join(base, i)) for i, item in enumerate(lst)]

    def done(self) -> None:
        """Reject keys that were never asked for (typos, unsupported options)."""
        extra = [k for k in self.data if k not in self.used]
        if extra:
            k = extra[0]
            raise SpecError(self.file, self.where(k), "a known field (one of "
                            + ", ".join(sorted(self.used)) + ")", k)
