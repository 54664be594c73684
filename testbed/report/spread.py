"""Run-to-run spread of a scenario's bounded figures: does a verdict flip by chance?

Owns ``spread`` (one scenario's runs -> per expectation the values each run
measured, their min / median / max, how many passed, and whether the bound
lies inside the spread) and ``spread_markdown``. Input is each run's
summary.json (``expectations``: name, value, bound, passed; ``fidelity``)
with a label saying which seed it used. Pure: the caller reads the files
(``load_summaries``, a ReportError naming the file it cannot read) and
writes spread.json / spread.md.

An expectation is *stable* when every run gave it the same verdict; it
*flips* otherwise. Its bound is *inside* the spread when it lies between
the smallest and the largest value measured (min <= bound <= max): a bound
there passes or fails by chance, whether or not these runs happened to
flip. Runs whose fidelity read degraded are listed and counted apart
(``degraded``): their figures measure the host as much as PDD.

Example::

    s = spread([("seed 41 #1", summary1), ("seed 41 #2", summary2), ("seed 42", summary3)])
    s["expectations"][0]["inside"], s["expectations"][0]["values"]
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from statistics import median
from typing import Mapping, Sequence

from testbed.report.rundir import ReportError

_BOUND = re.compile(r"([<>]=?|==)\s*([-+0-9.eE]+)")


def bound_value(bound: object) -> float | None:
    """The number of an expectation's bound text ("<= 0.8", "ratio <= 1.1"); None if
    none."""
    m = _BOUND.search(str(bound))
    try:
        return float(m.group(2)) if m else None
    except ValueError:
        return None


def spread(runs: Sequence[tuple[str, Mapping]]) -> dict:
    """{"runs": [{label, passed, fidelity}], "expectations": [{name, bound, values,
    min, median, max, passed, runs, flips, inside}], "degraded": n}."""
    names: list[str] = []
    by_name: dict[str, dict] = {}
    for label, s in runs:
        for e in s.get("expectations") or ():
            name = e.get("name")
            if name not in by_name:
                names.append(name)
                by_name[name] = {"name": name, "bound": e.get("bound"), "values": [],
                                 "verdicts": []}
            by_name[name]["values"].append(e.get("value"))
            by_name[name]["verdicts"].append(bool(e.get("passed")))
    out = []
    for name in names:
        e = by_name[name]
        nums = [v for v in e["values"] if isinstance(v, (int, float))]
        lo, hi = (min(nums), max(nums)) if nums else (None, None)
        b = bound_value(e["bound"])
        out.append({"name": name, "bound": e["bound"], "values": e["values"],
                    "min": lo, "median": median(nums) if nums else None, "max": hi,
                    "passed": sum(e["verdicts"]), "runs": len(e["verdicts"]),
                    "flips": len(set(e["verdicts"])) > 1,
                    "inside": b is not None and lo is not None and lo <= b <= hi
                    and lo != hi})
    run_rows = [{"label": label, "passed": bool(s.get("passed")),
                 "fidelity": (s.get("fidelity") or {}).get("verdict")} for label, s in runs]
    return {"runs": run_rows, "expectations": out,
            "degraded": sum(r["fidelity"] == "degraded" for r in run_rows)}


def _n(v: object) -> str:
    return "-" if not isinstance(v, (int, float)) else f"{v:.3g}"


def spread_markdown(scenario: str, s: Mapping) -> str:
    """spread.md: the runs, then one row per expectation."""
    lines = [f"# Spread: {scenario}", "",
             "| run | verdict | fidelity |", "|---|---|---|"]
    lines += [f"| {r['label']} | {'passed' if r['passed'] else 'FAILED'} | {r['fidelity']} |"
              for r in s["runs"]]
    lines += ["", "| expectation | bound | values | min / median / max | passed | bound inside "
                  "the spread |", "|---|---|---|---|---:|---|"]
    for e in s["expectations"]:
        inside = "**yes**" if e["inside"] else "no"
        if e["flips"]:
            inside += " (verdict flips)"
        lines.append(f"| {e['name']} | {e['bound']} | {', '.join(_n(v) for v in e['values'])} | "
                     f"{_n(e['min'])} / {_n(e['median'])} / {_n(e['max'])} | "
                     f"{e['passed']}/{e['runs']} | {inside} |")
    if s["degraded"]:
        lines += ["", f"{s['degraded']} of {len(s['runs'])} runs read degraded: their figures "
                      "measure the host as much as PDD."]
    return "\n".join(lines) + "\n"


def load_summaries(dirs: Sequence[Path]) -> list[tuple[str, dict]]:
    """(label, summary.json) of each run directory; the label is the directory's name
    and the seed its metadata.json records."""
    out = []
    for d in dirs:
        path = Path(d) / "summary.json"
        try:
            summary = json.loads(path.read_text())
        except OSError as err:
            raise ReportError(f"{path}: not readable ({err.strerror}): a run directory "
                              "has a summary.json (testbed report DIR writes one)") from None
        except ValueError as err:
            raise ReportError(f"{path}: not valid JSON ({err})") from None
        if not isinstance(summary, dict):
            raise ReportError(f"{path}: expected a JSON object, got {type(summary).__name__}")
        try:
            seed = json.loads((Path(d) / "metadata.json").read_text()).get("seed")
        except (OSError, ValueError):
            seed = None
        out.append((f"{Path(d).name} (seed {seed})", summary))
    return out
