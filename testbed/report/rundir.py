"""Reading a run directory: the only input of the report.

Owns RunData, ModeData, LinkSample, ReportError and ``load_run``. Reads
``metadata.json`` and, per mode, ``MODE/requests.jsonl``, ``MODE/events.jsonl``
and ``MODE/links.csv`` as docs/run-directory.md lays them out; nothing else
(never the scenario file, never the network, no testbed runtime import).

A missing metadata.json is an error (there is no run). A missing or empty
per-mode file is not: the mode gets no data and a note, so the report can
say what is missing instead of crashing. A run killed mid-write may leave a
truncated last line in a .jsonl file; that line is dropped with a note. Any
other malformed line is an error naming the file and line.

Example::

    run = load_run(Path("runs/wan-fault"))
    run.scale, [m.name for m in run.modes]      # 10.0, ['pdd', 'cross-dc-pd']
    len(run.mode("pdd").requests)               # 200
"""

from __future__ import annotations

import csv
import json
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from testbed.errors import TestbedError

LINKS_HEADER = ("t_mono", "link", "direction", "bytes", "packets", "drops",
                "nominal_rate_gbit", "emulated_rate_gbit")


class Tokens(Sequence):
    """A record's ``tokens`` ([position, token_id, t_rel_s, producer] rows) held as
    columns: 25 bytes a token instead of ~220 as parsed JSON lists, which is what lets a
    report read a paper-scale run (20,000 records of ~1,000 tokens each) in a few GB. A
    row reads back as the tuple (position, token_id, t_rel_s, producer); ``of(rows)``
    keeps rows that do not fit the columns (another shape, a non-integer id) as they are.
    """

    __slots__ = ("_pos", "_ids", "_t", "_who", "_names")

    def __init__(self, pos: array, ids: array, t: array, who: bytes, names: tuple):
        self._pos, self._ids, self._t, self._who, self._names = pos, ids, t, who, names

    @classmethod
    def of(cls, rows):
        if not isinstance(rows, list) or not rows:
            return rows
        names: list = []
        who = bytearray()
        try:
            for r in rows:
                if type(r) is not list or len(r) != 4 or type(r[0]) is not int \
                        or type(r[1]) is not int or type(r[2]) not in (int, float):
                    return rows
                if r[3] not in names:
                    if len(names) == 255 or not (r[3] is None or type(r[3]) is str):
                        return rows
                    names.append(r[3])
                who.append(names.index(r[3]))
            return cls(array("q", [r[0] for r in rows]), array("q", [r[1] for r in rows]),
                       array("d", [r[2] for r in rows]), bytes(who), tuple(names))
        except OverflowError:  # an integer beyond 64 bits
            return rows

    def __len__(self) -> int:
        return len(self._pos)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return (self._pos[i], self._ids[i], self._t[i], self._names[self._who[i]])

    def __iter__(self):
        names = self._names
        return zip(self._pos, self._ids, self._t, (names[w] for w in self._who))

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) \
            and all(tuple(a) == tuple(b) for a, b in zip(self, other))

    __hash__ = None

    def __repr__(self) -> str:
        return f"Tokens({list(self)!r})"


def _compact(record: dict) -> dict:
    """``record`` with its long integer lists and token rows held as arrays (Tokens)."""
    toks = record.get("tokens")
    if toks:
        record["tokens"] = Tokens.of(toks)
    prompt = record.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(x) is int for x in prompt):
        try:
            record["prompt"] = array("q", prompt)
        except OverflowError:
            pass
    return record


class ReportError(TestbedError):
    """The run directory cannot be reported on (missing metadata, malformed file)."""


class LinkSample(NamedTuple):
    """One row of links.csv: cumulative counters of one shaped channel at t_mono."""

    t_mono: float
    link: str
    direction: str
    bytes: int  # emulated bytes (what crossed the emulated link)
    packets: int
    drops: int
    nominal_rate_gbit: float | None
    emulated_rate_gbit: float | None
    backlog_bytes: int | None = None  # queued in the leaf at the read (absent in older runs)


@dataclass(frozen=True)
class ModeData:
    name: str
    requests: tuple[dict, ...] = ()
    events: tuple[dict, ...] = ()
    links: tuple[LinkSample, ...] = ()
    notes: tuple[str, ...] = ()  # what was missing or dropped while reading


@dataclass(frozen=True)
class RunData:
    path: Path
    metadata: dict
    modes: tuple[ModeData, ...] = field(default=())

    @property
    def resolved(self) -> dict:
        """The validated scenario as plain data ({} if the runner recorded none)."""
        return self.metadata.get("resolved") or {}

    @property
    def scale(self) -> float:
        """Bandwidth scale k: nominal bytes = emulated bytes x k."""
        return float(self.metadata.get("scale") or 1.0)

    def pdd_settings(self, mode: str | None = None) -> dict:
        """The PDD settings the runner resolved for ``mode`` (a mode folder's name), else
        the scenario's; {} when the run recorded none."""
        for m in self.resolved.get("modes") or ():
            if mode and isinstance(m, dict) and m.get("name") == mode and m.get("pdd"):
                return m["pdd"]
        return self.resolved.get("pdd") or {}

    @property
    def mode_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.modes)

    def mode(self, name: str) -> ModeData:
        for m in self.modes:
            if m.name == name:
                return m
        raise KeyError(name)


def load_run(run_dir: Path | str) -> RunData:
    """Read every file of the run the report needs."""
    path = Path(run_dir)
    meta_path = path / "metadata.json"
    if not meta_path.is_file():
        raise ReportError(f"{path}: not a run directory (no metadata.json)")
    try:
        metadata = json.loads(meta_path.read_text())
    except json.JSONDecodeError as e:
        raise ReportError(f"{meta_path}: not valid JSON ({e})") from e
    if not isinstance(metadata, dict):
        raise ReportError(f"{meta_path}: expected a JSON object, got {type(metadata).__name__}")
    modes = tuple(_load_mode(path, name) for name in _mode_names(path, metadata))
    return RunData(path, metadata, modes)


def _mode_names(path: Path, metadata: dict) -> list[str]:
    """Modes in the order the runner ran them; subdirectories if metadata lists none."""
    listed = metadata.get("modes") or []
    names = [m["name"] if isinstance(m, dict) else str(m) for m in listed]
    if names:
        return names
    return sorted(d.name for d in path.iterdir() if (d / "requests.jsonl").is_file())


def _load_mode(run_path: Path, name: str) -> ModeData:
    d = run_path / name
    notes: list[str] = []
    requests = _read_jsonl(d / "requests.jsonl", notes, _compact)
    events = _read_jsonl(d / "events.jsonl", notes)
    links = read_links(d / "links.csv", notes)
    return ModeData(name, tuple(requests), tuple(events), tuple(links), tuple(notes))


def _read_jsonl(path: Path, notes: list[str], keep=lambda obj: obj) -> list[dict]:
    """The file's objects, each passed through ``keep``; read a line at a time (a
    paper-scale requests.jsonl is hundreds of MB)."""
    if not path.is_file():
        notes.append(f"{path.parent.name}/{path.name} is missing")
        return []
    out: list[dict] = []
    bad = None  # (line number, error) of an unparsable line, fatal unless it is the last
    with path.open() as f:
        for lineno, text in enumerate(f, 1):
            if not text.strip():
                continue
            if bad is not None:
                raise ReportError(f"{path}:{bad[0]}: not valid JSON ({bad[1]})")
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                bad = (lineno, e)
                continue
            if not isinstance(obj, dict):
                raise ReportError(f"{path}:{lineno}: expected a JSON object")
            out.append(keep(obj))
    if bad is not None:  # a run killed mid-write; keep what is complete
        notes.append(f"{path.parent.name}/{path.name}: dropped a truncated last line")
    return out


def read_links(path: Path, notes: list[str]) -> list[LinkSample]:
    """One links.csv's rows (a missing file or a truncated last line: a note)."""
    if not path.is_file():
        notes.append(f"{path.parent.name}/{path.name} is missing")
        return []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = set(LINKS_HEADER) - set(reader.fieldnames or ())
        if missing:
            raise ReportError(f"{path}: header lacks {sorted(missing)}")
        rows = list(reader)
    out = []
    for lineno, row in enumerate(rows, 2):
        try:
            out.append(_link_sample(row))
        except (TypeError, ValueError) as e:
            if lineno == len(rows) + 1:
                notes.append(f"{path.parent.name}/{path.name}: dropped a truncated last line")
                break
            raise ReportError(f"{path}:{lineno}: bad row ({e})") from e
    return out


def _link_sample(row: dict) -> LinkSample:
    def opt(key: str) -> float | None:
        return float(row[key]) if row.get(key) not in (None, "") else None

    return LinkSample(float(row["t_mono"]), row["link"], row["direction"], int(row["bytes"]),
                      int(row["packets"]), int(row["drops"]),
                      opt("nominal_rate_gbit"), opt("emulated_rate_gbit"),
                      int(row["backlog_bytes"]) if row.get("backlog_bytes") else None)
