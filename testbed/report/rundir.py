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
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from testbed.errors import TestbedError

LINKS_HEADER = ("t_mono", "link", "direction", "bytes", "packets", "drops",
                "nominal_rate_gbit", "emulated_rate_gbit")


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
    requests = _read_jsonl(d / "requests.jsonl", notes)
    events = _read_jsonl(d / "events.jsonl", notes)
    links = _read_links(d / "links.csv", notes)
    return ModeData(name, tuple(requests), tuple(events), tuple(links), tuple(notes))


def _read_jsonl(path: Path, notes: list[str]) -> list[dict]:
    if not path.is_file():
        notes.append(f"{path.parent.name}/{path.name} is missing")
        return []
    lines = [(i, s) for i, s in enumerate(path.read_text().splitlines(), 1) if s.strip()]
    out: list[dict] = []
    for n, (lineno, text) in enumerate(lines):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            if n == len(lines) - 1:  # a run killed mid-write; keep what is complete
                notes.append(f"{path.parent.name}/{path.name}: dropped a truncated last line")
                break
            raise ReportError(f"{path}:{lineno}: not valid JSON ({e})") from e
        if not isinstance(obj, dict):
            raise ReportError(f"{path}:{lineno}: expected a JSON object")
        out.append(obj)
    return out


def _read_links(path: Path, notes: list[str]) -> list[LinkSample]:
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
