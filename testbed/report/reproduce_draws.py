"""``testbed reproduce --seeds N``: the claims on N draws of every slot, each figure with
its spread and a 95% interval.

A draw is every slot's scenario run once on its own seed plus the draw's index (draw 0
is the scenario as shipped; ``with_seed``: another workload sample and other network
draws, and on the virtual clock another order of simultaneous events). Each draw is a
complete reproduction (reproduce.py's layout and table); this module runs them and
sets the claims side by side: per claim how many draws gave each verdict, and every
scalar figure of the claim (claim.figures; claim 9's per-bin benefit, claim 8's load
where p-rld broke) with its values, median and Student's t interval of the mean
(seeds.describe). The verdict over the draws is the one most draws gave, with the
count beside it: a claim reproduced in 6 of 10 draws is not settled, and says so.

Layout of DIR (``--out``; ``--from-runs`` reads the same)::

    DIR/draw-I/SLOT                   draw I's run directory of each slot
    DIR/draw-I/reproduction.md/.json  draw I's own table
    DIR/reproduction.md/.json         the claims over the draws

Example::

    doc = reproduce_draws(Path("runs/repro-v"), 10, run_fn, slots=PAPER_SCALE)
    doc["claims"][1]["verdicts"]          # {"differs": 10}
    doc["claims"][1]["figures"]["ttft_p90_s"]["ci95"]
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Mapping, Sequence

from testbed.errors import TestbedError
from testbed.report.capacity import CapacityConfig
from testbed.report.claims_load import HIT_BINS
from testbed.report.reproduce import (FULL, JSON_FILE, MD_FILE, PAPER_SCALE, QUICK, SWEEP, Slot,
                                      reproduce)
from testbed.report.seeds import describe

DRAW = "draw-{}"
# (scenario file, run directory, k or None, seed offset) -> None
DrawRunFn = Callable[[Path, Path, "float | None", int], None]


def reproduce_draws(out: Path, n: int, run_fn: DrawRunFn | None, slots: tuple[Slot, ...],
                    capacity: CapacityConfig | None = None,
                    command: str = "testbed reproduce", resume: bool = False,
                    from_runs: Path | None = None) -> dict:
    """Run draws 0..n-1 of ``slots`` into out/draw-I (unless ``from_runs``: read its
    draw-I folders, every one there), write each draw's table and the table over the
    draws into ``out``; return the latter."""
    started, t0 = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.monotonic()
    if from_runs is None:
        if run_fn is None:
            raise TestbedError("reproduce: nothing to run with and no --from-runs")
        if n < 2:
            raise TestbedError(f"reproduce --seeds: need at least 2 draws for an interval, "
                               f"got {n}")
        docs = []
        for i in range(n):
            def one(scenario: Path, run_dir: Path, scale: float | None, i=i) -> None:
                run_fn(scenario, run_dir, scale, i)
            docs.append(reproduce(out / DRAW.format(i), False, one, None, None, capacity,
                                  f"{command} (draw {i})", resume=resume, slots=slots))
    else:
        dirs = sorted((d for d in from_runs.glob("draw-*") if d.is_dir()),
                      key=lambda d: int(d.name.split("-")[1]) if d.name.split("-")[1].isdigit()
                      else math.inf)
        if len(dirs) < 2:
            raise TestbedError(f"{from_runs}: need at least 2 draw-I folders of a reproduction "
                               f"with --seeds, found {len(dirs)}")
        docs = [reproduce(out / d.name if out != from_runs else d, False, None, None, d,
                          capacity, command) for d in dirs]
        slots = slots_in(dirs[0])
    table = claims_over_draws(docs)
    meta = {"command": command, "started_wall": started, "draws": len(docs),
            "wall_s": round(time.monotonic() - t0, 1),
            "from_runs": str(from_runs) if from_runs else None,
            "slots": [{"name": s.name, "scenario": s.scenario, "claims": s.claims}
                      for s in slots],
            "draw_wall_s": [d.get("slots_wall_s") for d in docs],
            "errors": {f"draw-{i}/{slot}": e["error"] for i, d in enumerate(docs)
                       for slot, e in (d.get("runs") or {}).items() if e.get("error")}}
    doc = {**meta, **table}
    out.mkdir(parents=True, exist_ok=True)
    (out / JSON_FILE).write_text(json.dumps(doc, indent=1, allow_nan=False, default=str) + "\n")
    (out / MD_FILE).write_text(render_draws_md(doc))
    return doc


def slots_in(draw: Path) -> tuple[Slot, ...]:
    """The known slots (PAPER_SCALE, FULL, QUICK, SWEEP: the first of a name) that have a run
    directory in ``draw``."""
    seen: dict[str, Slot] = {}
    for slot in PAPER_SCALE + FULL + QUICK + SWEEP:
        if slot.name not in seen and (draw / slot.name / "metadata.json").is_file():
            seen[slot.name] = slot
    return tuple(seen.values())


def scalar_figures(claim: Mapping) -> dict[str, float]:
    """A claim's figures that are one number each: the top-level numeric ones (claim 8's
    ``breaks_at_rps`` only where p-rld broke); claim 8's e2e p99 ratio p-rld / pdd and
    requests that waited for RLD's KV memory at the highest load, and the peak share of
    that memory RLD held; claim 9's benefit per hit-rate bin (``benefit_pct[lo-hi]``)."""
    out = {}
    figs = claim.get("figures") or {}
    for k, v in figs.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[k] = float(v)
    if claim.get("key") == "8" and figs.get("points"):
        top = figs["points"][-1]  # the highest load
        for k in ("e2e_ratio", "p_rld_kv_waited"):
            if isinstance(top.get(k), (int, float)):
                out[f"top_load_{k}"] = float(top[k])
        peak = figs.get("rld_peak") or {}
        if peak.get("kv_capacity_tokens"):
            out["rld_peak_kv_share"] = peak["kv_tokens"] / peak["kv_capacity_tokens"]
    if claim.get("key") == "9":
        for point in figs.get("points") or ():
            hit, benefit, n = point
            for lo, hi in HIT_BINS:
                if lo <= hit < hi + (hi == 100):
                    out[f"benefit_pct[{lo}-{hi}]"] = float(benefit)
    return out


def claims_over_draws(docs: Sequence[Mapping]) -> dict:
    """Per claim (in the first draw's order): title, published, each draw's verdict and
    measured text, the verdict counts, the most common verdict, and every scalar
    figure described over the draws that have it."""
    rows = []
    for c0 in docs[0]["claims"]:
        per = [next((c for c in d["claims"] if c["key"] == c0["key"]), None) for d in docs]
        per = [c for c in per if c is not None]
        counts = Counter(c["verdict"] for c in per)
        top = max(counts.values())
        verdict = next(v for v in (c["verdict"] for c in per) if counts[v] == top)
        values: dict[str, list[float]] = {}
        for c in per:
            for k, v in scalar_figures(c).items():
                values.setdefault(k, []).append(v)
        rows.append({"key": c0["key"], "title": c0["title"], "published": c0["published"],
                     "verdict": verdict, "verdicts": dict(counts), "draws": len(per),
                     "measured": [c["measured"] for c in per],
                     "reasons": [c["reason"] for c in per],
                     "figures": {k: describe(v) for k, v in values.items()}})
    return {"claims": rows}


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _figure_cell(name: str, d: Mapping, draws: int) -> str:
    ci = d.get("ci95")
    text = f"{name} {_num(d['median'])}"
    if ci:
        text += f" [{_num(ci[0])}, {_num(ci[1])}]"
    if d["n"] < draws:
        text += f" ({d['n']} of {draws} draws)"
    return text


def render_draws_md(doc: Mapping) -> str:
    def cell(s: object) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    n = doc["draws"]
    lines = ["# Reproduction of the PDD paper's claims over draws", "",
             f"Generated by `{doc.get('command')}` ({n} draws; wall time {doc.get('wall_s')} s; "
             f"started {doc.get('started_wall')}). Draw I runs every slot's scenario on its "
             "own seed + I; each draw's table is in draw-I/reproduction.md. A figure is "
             "its median over the draws and, in brackets, the 95% interval of its mean "
             "(Student's t over the draws); the verdict is the one most draws gave, with "
             "every verdict's count.", "",
             "| # | claim | published | over the draws | verdict | draw 0 |",
             "|---|---|---|---|---|---|"]
    for c in doc["claims"]:
        figs = "; ".join(_figure_cell(k, d, c["draws"]) for k, d in c["figures"].items()) \
            or "-"
        counts = ", ".join(f"{v} {k}" for k, v in sorted(c["verdicts"].items(),
                                                         key=lambda kv: -kv[1]))
        lines.append("| " + " | ".join(cell(x) for x in (
            c["key"], c["title"], c["published"], figs,
            f"**{c['verdict']}** ({counts} of {c['draws']})",
            f"{c['measured'][0]}; {c['reasons'][0]}" if c["measured"] else "-")) + " |")
    lines += ["", "## Slots", "", "| slot | scenario | claims |", "|---|---|---|"]
    lines += [f"| {s['name']} | {s['scenario']} | {s['claims']} |"
              for s in doc.get("slots") or ()]
    if doc.get("errors"):
        lines += ["", "Runs that raised (their claims say so in that draw): " + "; ".join(
            f"{k}: {cell(v)}" for k, v in doc["errors"].items())]
    walls = [w for w in doc.get("draw_wall_s") or () if w is not None]
    if walls:
        lines += ["", f"Each draw's slots took {min(walls):g}-{max(walls):g} s of wall time."]
    return "\n".join(lines) + "\n"
