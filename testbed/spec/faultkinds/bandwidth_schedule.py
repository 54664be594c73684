"""``bandwidth_schedule``: the link's rate follows a schedule from ``at_s`` on:
explicit ``steps``, a linear ``ramp`` or a ``trace`` CSV file (t_s,rate_gbit).
It has no end: the last rate holds."""

from __future__ import annotations

import csv
from pathlib import Path

from testbed.errors import SpecError
from testbed.reader import finite, is_file, read_text
from testbed.spec.faultkinds.base import Export, WanChange, at, start
from testbed.spec.faultkinds.bandwidth import RATE

NAME = "bandwidth_schedule"
DOC = ("steps: [{at_s, rate_gbit}] | ramp: {from_gbit, to_gbit, over_s, steps}\n"
       "                 | trace: FILE (CSV t_s,rate_gbit)          a schedule from at_s on")


def parse(f, base, duration_s):
    return {"schedule": _schedule(f, base)}, duration_s


def actions(fault, ops):
    out = [start(fault, lambda: None)]
    for off, rate in fault.params["schedule"]:
        out.append(at(fault.at_s + off, f"bandwidth {rate:g} Gbit/s",
                      lambda r=rate: ops.set_link(fault.link, rate_gbit=r)))
    return out


def export(fault, nominal, instances, horizon_s, notes):
    return Export(wan=tuple(WanChange(fault.at_s + off, fault.index, i, {"rate_gbit": rate})
                            for i, (off, rate) in enumerate(fault.params["schedule"])))


def _schedule(f, base: Path) -> list[tuple[float, float]]:
    """(offset_s, rate_gbit) pairs from steps, a ramp or a trace file."""
    given = [k for k in ("steps", "ramp", "trace") if f.has(k)]
    if len(given) != 1:
        raise f.error("steps", "exactly one of steps, ramp, trace", given or None)
    if given[0] == "steps":
        out = []
        for s in f.items("steps", min_len=1):
            out.append((s.num("at_s", lo=0, unit="s"), s.num("rate_gbit", **RATE)))
            s.done()
    elif given[0] == "ramp":
        r = f.sub("ramp")
        first, to = r.num("from_gbit", **RATE), r.num("to_gbit", **RATE)
        over, n = r.num("over_s", lo=0, lo_open=True, unit="s"), r.int("steps", 10, lo=1)
        r.done()
        out = [(over * i / n, first + (to - first) * i / n) for i in range(n + 1)]
    else:
        out = _read_trace(f, base)
    if [t for t, _ in out] != sorted(t for t, _ in out):
        raise f.error(given[0], "times in increasing order", [t for t, _ in out])
    return out


def _read_trace(f, base: Path) -> list[tuple[float, float]]:
    rel = f.str("trace")
    path = (base / rel) if not Path(rel).is_absolute() else Path(rel)
    if not is_file(path):
        raise f.error("trace", "a readable CSV file of t_s,rate_gbit", str(path))
    out = load_rate_trace(path)
    if not out:
        raise f.error("trace", "a CSV with at least one t_s,rate_gbit row", str(path))
    return out


def load_rate_trace(path: str | Path) -> list[tuple[float, float]]:
    """(t_s, rate_gbit) rows of a bandwidth trace CSV (an optional ``t_s,rate_gbit``
    header, ``#`` comments); SpecError naming the file and the row."""
    file = str(path)
    try:
        rows = list(csv.reader(read_text(path, "CSV file of t_s,rate_gbit").splitlines()))
    except csv.Error as e:
        raise SpecError(file, "", "CSV rows of t_s,rate_gbit", str(e)) from None
    out = []
    for i, row in enumerate(r for r in rows if r and not r[0].startswith("#")):
        if i == 0 and row[0].strip() == "t_s":
            continue
        out.append(_trace_row(file, f"row {i + 1}", row))
    return out


def _trace_row(file: str, where: str, row: list[str]) -> tuple[float, float]:
    try:
        t, rate = float(row[0]), float(row[1])
    except (ValueError, IndexError):
        raise SpecError(file, where, "t_s,rate_gbit numbers", row) from None
    if not finite(t) or t < 0:
        raise SpecError(file, f"{where}: t_s", "a finite time >= 0", row[0])
    if not finite(rate) or not 0 < rate <= RATE["hi"]:
        raise SpecError(file, f"{where}: rate_gbit", f"a rate in (0, {RATE['hi']:g}] Gbit/s",
                        row[1])
    return t, rate
