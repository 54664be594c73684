"""Fault timeline specs: what happens to the network or the roles, and when.

Owns FaultSpec and the parsing of a scenario's ``faults:`` list. Each entry
has ``at_s`` (seconds from the workload start), a ``kind`` and that kind's
parameters; durations make a fault end by itself. Pure: the runner's
``testbed.scenario.faults`` turns these into timed actions.

Kinds::

    bandwidth    rate_gbit [link] [duration_s]             one step
    bandwidth_schedule  steps: [{at_s, rate_gbit}] | ramp: {to_gbit, over_s, steps}
                 | trace: FILE (CSV t_s,rate_gbit)          a schedule from at_s on
    rtt          one_way_delay_ms [jitter_ms] [link] [duration_s]  each direction's
                 one-way delay/jitter (the RTT of "wan" becomes 2 x one_way_delay_ms)
    loss         pct | loss: {model: gilbert_elliott, ...}  [link] [duration_s]
    link_flap    down_s [link]                             link down, then up
    congestion   flows [direction a>b|b>a] duration_s      N TCP cross flows
    kill         role (main_decode|relay_decode|prefill) [instance]  kill -9 a role process
    restart      role [instance] down_s                    kill -9, start it again after down_s
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import SpecError
from testbed.spec.link import LossSpec, parse_loss
from testbed.reader import Fields, finite, is_file, read_text

FAULT_KINDS = ("bandwidth", "bandwidth_schedule", "rtt", "loss", "link_flap", "congestion",
               "kill", "restart")
KILLABLE_ROLES = ("main_decode", "relay_decode", "prefill")


@dataclass(frozen=True)
class FaultSpec:
    index: int
    at_s: float
    kind: str
    link: str = "wan"
    duration_s: float | None = None
    params: dict = field(default_factory=dict)  # kind-specific, plain data

    @property
    def end_s(self) -> float | None:
        return None if self.duration_s is None else self.at_s + self.duration_s


_RATE = dict(lo=0, lo_open=True, hi=1000.0, unit="Gbit/s")


def _schedule(f: Fields, base: Path) -> list[tuple[float, float]]:
    """(offset_s, rate_gbit) pairs from steps, a ramp or a trace file."""
    given = [k for k in ("steps", "ramp", "trace") if f.has(k)]
    if len(given) != 1:
        raise f.error("steps", "exactly one of steps, ramp, trace", given or None)
    if given[0] == "steps":
        out = []
        for s in f.items("steps", min_len=1):
            out.append((s.num("at_s", lo=0, unit="s"), s.num("rate_gbit", **_RATE)))
            s.done()
    elif given[0] == "ramp":
        r = f.sub("ramp")
        start, to = r.num("from_gbit", **_RATE), r.num("to_gbit", **_RATE)
        over, n = r.num("over_s", lo=0, lo_open=True, unit="s"), r.int("steps", 10, lo=1)
        r.done()
        out = [(over * i / n, start + (to - start) * i / n) for i in range(n + 1)]
    else:
        out = _read_trace(f, base)
    if [t for t, _ in out] != sorted(t for t, _ in out):
        raise f.error(given[0], "times in increasing order", [t for t, _ in out])
    return out


def _read_trace(f: Fields, base: Path) -> list[tuple[float, float]]:
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
    if not finite(rate) or not 0 < rate <= _RATE["hi"]:
        raise SpecError(file, f"{where}: rate_gbit", f"a rate in (0, {_RATE['hi']:g}] Gbit/s",
                        row[1])
    return t, rate


def _parse_one(f: Fields, index: int, base: Path) -> FaultSpec:
    at = f.num("at_s", lo=0, unit="s")
    kind = f.choice("kind", FAULT_KINDS)
    link = f.str("link", "wan")
    dur = f.num("duration_s", None, lo=0, lo_open=True, unit="s")
    p: dict = {}
    if kind == "bandwidth":
        p["rate_gbit"] = f.num("rate_gbit", **_RATE)
    elif kind == "bandwidth_schedule":
        p["schedule"] = _schedule(f, base)
    elif kind == "rtt":
        if f.has("delay_ms"):  # the name before: it read as the RTT to some
            raise f.error("delay_ms", "one_way_delay_ms (renamed: the rtt fault sets each "
                          "direction's one-way delay; the RTT of 'wan' is twice it)",
                          f.raw("delay_ms"))
        p["one_way_delay_ms"] = f.num("one_way_delay_ms", lo=0, hi=10_000, unit="ms")
        p["jitter_ms"] = f.num("jitter_ms", 0.0, lo=0, hi=10_000, unit="ms")
    elif kind == "loss":
        if f.has("loss"):
            p["loss"] = parse_loss(f.sub("loss"))
        else:
            p["loss"] = LossSpec("random", pct=f.num("pct", lo=0, hi=100, unit="percent"))
    elif kind == "link_flap":
        dur = f.num("down_s", lo=0, lo_open=True, unit="s")
    elif kind == "congestion":
        p["flows"] = f.int("flows", lo=1, hi=64)
        p["direction"] = f.choice("direction", ("a>b", "b>a"), "a>b")
        if dur is None:
            raise f.error("duration_s", "a duration for congestion", None)
    elif kind in ("kill", "restart"):
        p["role"] = f.choice("role", KILLABLE_ROLES)
        p["instance"] = f.str("instance", None)
        if kind == "restart":
            dur = f.num("down_s", lo=0, lo_open=True, unit="s")
    f.done()
    return FaultSpec(index, at, kind, link, dur, p)


def parse_faults(f: Fields, key: str, base: Path) -> tuple[FaultSpec, ...]:
    if not f.has(key):
        f.raw(key, None)
        return ()
    return tuple(_parse_one(item, i, base) for i, item in enumerate(f.items(key)))
