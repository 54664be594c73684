"""``testbed reproduce``: the paper's claims side by side with this machine's figures.

Owns Slot, FULL and QUICK (which scenario each claim's runs come from),
CLAIMS (the rows, in the order of the claim numbers 1-11 of
docs/reproduce.md), ``run_slots`` (the runs, one after another, with a
run function the caller passes: the CLI gives the scenario runner; tests
give fakes), ``build_table`` (run directories -> rows) and
``write_outputs`` (reproduction.json, reproduction.md, bathtub.png,
goodput_load.png).

Layout of DIR (``--out``; ``--from-runs`` reads the same layout)::

    DIR/SLOT/                  one run directory per slot (docs/run-directory.md)
    DIR/handoff-bench.json     `testbed bench handoff`'s JSON (claim 5)
    DIR/reproduction.json  DIR/reproduction.md  DIR/*.png

A slot is a scenario run under a fixed name (``headline``, ``handoff``...);
every scenario is a file under scenarios/ (the full set reuses the existing
scenarios by reference where they fit) and runs alone with ``testbed run``.

Example::

    table = build_table(Path("runs/repro"))
    write_outputs(Path("runs/repro"), table)
    [c["verdict"] for c in table["claims"]]
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping

from matplotlib.figure import Figure

from testbed.errors import TestbedError
from testbed.report.capacity import CapacityConfig
from testbed.report.claims import (NOT_HERE, Claim, claim_baseline_tail, claim_handoff_bench,
                                   claim_rld_share, claim_ttft, claim_wan_bytes)
from testbed.report.claims_load import (LOAD_SLOTS, bathtub_points, claim_bathtub, claim_bcr,
                                        claim_filter, claim_goodput, claim_handoff_modes,
                                        claim_p_rld, _load_points)
from testbed.report.rundir import RunData, load_run
from testbed.report.scale_sweep import (SWEEP_KS, SWEEP_SCENARIO, render_scale, scale_table,
                                        slot_name)

REPO = Path(__file__).resolve().parents[2]
BENCH_FILE = "handoff-bench.json"
JSON_FILE, MD_FILE = "reproduction.json", "reproduction.md"


@dataclass(frozen=True)
class Slot:
    name: str
    scenario: str  # relative to the repository root
    claims: str    # which claims use it (for the reader)
    scale: float | None = None  # bandwidth scale k for this run (None: the run's own)


FULL = (
    Slot("headline", "scenarios/pdd-vs-baseline.yaml", "1 4 7 (3, 9 fallback)"),
    Slot("wan-bytes", "scenarios/paper/wan-bytes.yaml", "3"),
    Slot("baseline-64k", "scenarios/paper/baseline-64k.yaml", "2"),
    Slot("goodput-load", "scenarios/paper/goodput-load.yaml", "6 7"),
    Slot("rld-overload", "scenarios/paper/rld-overload-sweep.yaml", "8"),
    Slot("bathtub", "scenarios/paper/bathtub-7bins.yaml", "9"),
    Slot("odd-traffic", "scenarios/odd-traffic.yaml", "10"),
    Slot("handoff", "scenarios/handoff-modes.yaml", "11"),
    # the fleet on one WAN line (claims 2 and 6-8 prefer these to the slots above)
    Slot("fleet", "scenarios/paper/fleet.yaml", "2"),
    Slot("fleet-sweep", "scenarios/paper/fleet-sweep.yaml", "6 7 8"),
)
# --clock virtual: the paper-scale fleet (19 instances, one 100 Gbit/s line, k = 1), which
# two cores cannot run in real time; its claims take these slots before any other
PAPER_SCALE = (
    Slot("paper-sweep", "scenarios/paper/paper-scale-sweep.yaml", "2 6 7 8"),
    Slot("paper-samedc", "scenarios/paper/paper-scale-samedc.yaml", "7"),
    Slot("paper-bathtub", "scenarios/paper/paper-scale-bathtub.yaml", "9"),
)
# --quick: 8 modes and 10 bench trials. A mode costs ~50 s of start-up, warm-up and
# drain besides its workload (pdd-vs-baseline: 3 modes of 75 s of arrivals in ~7 min).
QUICK = (
    Slot("headline", "scenarios/paper/quick-headline.yaml", "1 2 3 4 6 7 8 9"),
    Slot("odd-traffic", "scenarios/paper/quick-odd-traffic.yaml", "10"),
    Slot("handoff", "scenarios/paper/quick-handoff.yaml", "11"),
)
BENCH_TRIALS = {"full": 30, "quick": 10}
# --scale-sweep: the headline comparison at every k of SWEEP_KS (scale_sweep.py)
SWEEP = tuple(Slot(slot_name(k), SWEEP_SCENARIO, "scale invariance", float(k))
              for k in SWEEP_KS)

CLAIMS = (claim_ttft, claim_baseline_tail, claim_wan_bytes, claim_rld_share, claim_handoff_bench,
          claim_goodput, claim_bcr, claim_p_rld, claim_bathtub, claim_filter,
          claim_handoff_modes)

RunFn = Callable[[Path, Path, "float | None"], None]  # (scenario file, run directory, k)
BenchFn = Callable[[int], dict]           # trials -> bench JSON


def finished_entries(out: Path, slots: tuple[Slot, ...], bench_trials: int) -> dict:
    """The slots of an earlier ``reproduce`` into ``out`` that need not run again
    (``--resume``): its reproduction.json lists the slot with the same scenario, scale
    and no error, and the slot's run directory has its report (summary.json); the
    bench, when it ran with the same trials and its JSON is there. {slot: entry}."""
    path = out / JSON_FILE
    try:
        prev = json.loads(path.read_text()).get("runs") or {} if path.is_file() else {}
    except (OSError, json.JSONDecodeError, AttributeError):
        return {}
    keep = {}
    for slot in slots:
        e = prev.get(slot.name)
        if isinstance(e, dict) and e.get("error") is None and e.get("scenario") == slot.scenario \
                and e.get("scale") == slot.scale and (out / slot.name / "summary.json").is_file():
            keep[slot.name] = e
    e = prev.get("handoff-bench")
    if isinstance(e, dict) and e.get("error") is None and e.get("trials") == bench_trials \
            and (out / BENCH_FILE).is_file():
        keep["handoff-bench"] = e
    return keep


def run_slots(slots: tuple[Slot, ...], out: Path, run_fn: RunFn,
              bench_fn: BenchFn | None, bench_trials: int, done: Mapping | None = None,
              log: dict | None = None) -> dict:
    """Run every slot's scenario into out/SLOT and the bench into out/handoff-bench.json.

    A slot that raises a TestbedError is recorded (its claims then say so) and the
    others still run; anything else (a bug, Ctrl-C) propagates, ``log`` (filled in
    as slots end) then holding the slots that finished. ``done`` (finished_entries):
    slots kept from an earlier run, not run again (their entries say ``resumed``)."""
    out.mkdir(parents=True, exist_ok=True)
    log = {} if log is None else log
    done = done or {}
    for slot in slots:
        if slot.name in done:
            log[slot.name] = dict(done[slot.name], resumed=True)
            continue
        t0 = time.monotonic()
        entry = {"scenario": slot.scenario, "claims": slot.claims, "error": None,
                 "scale": slot.scale}
        try:
            run_fn(REPO / slot.scenario, out / slot.name, slot.scale)
        except TestbedError as e:
            entry["error"] = f"{type(e).__name__}: {e}"
            print(f"testbed: reproduce: slot {slot.name} failed ({entry['error']}); its claims "
                  "will say so; going on", file=sys.stderr, flush=True)
        entry["wall_s"] = round(time.monotonic() - t0, 1)
        log[slot.name] = entry
    if bench_fn is not None and "handoff-bench" in done:
        log["handoff-bench"] = dict(done["handoff-bench"], resumed=True)
    elif bench_fn is not None:
        t0 = time.monotonic()
        entry = {"scenario": "testbed bench handoff", "claims": "5", "error": None,
                 "trials": bench_trials}
        try:
            (out / BENCH_FILE).write_text(json.dumps(bench_fn(bench_trials), indent=1) + "\n")
        except TestbedError as e:
            entry["error"] = f"{type(e).__name__}: {e}"
        entry["wall_s"] = round(time.monotonic() - t0, 1)
        log["handoff-bench"] = entry
    return log


def load_runs(run_dir: Path) -> tuple[dict[str, RunData], dict | None, dict[str, str]]:
    """(runs by slot, bench JSON or None, {slot: why it could not be read})."""
    runs, problems = {}, {}
    for d in sorted(p for p in run_dir.iterdir() if p.is_dir()) if run_dir.is_dir() else ():
        if not (d / "metadata.json").is_file():
            continue
        try:
            runs[d.name] = load_run(d)
        except TestbedError as e:
            problems[d.name] = str(e)
    bench_path = run_dir / BENCH_FILE
    bench = json.loads(bench_path.read_text()) if bench_path.is_file() else None
    return runs, bench, problems


def build_table(run_dir: Path, capacity: CapacityConfig | None = None) -> dict:
    """Every claim's row from the run directories under run_dir."""
    if not run_dir.is_dir():
        raise TestbedError(f"{run_dir}: no such directory")
    runs, bench, problems = load_runs(run_dir)
    claims = []
    for fn in CLAIMS:
        try:
            c = fn(runs, bench, capacity) if fn is claim_bcr else fn(runs, bench)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            c = Claim(fn.__name__, fn.__doc__ or fn.__name__, "-", "-", NOT_HERE,
                      f"the run directories lack what it needs ({type(e).__name__}: {e})")
        claims.append(asdict(c))
    counts: dict[str, int] = {}
    for c in claims:
        counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
    rows, spread = scale_table(runs)
    return {"run_dir": str(run_dir), "slots": sorted(runs), "unreadable": problems,
            "scale_invariance": {"rows": rows, "spread": spread},
            "bench": bench is not None, "counts": counts, "claims": claims,
            "bathtub": [list(p) for p in bathtub_points(runs)[0]],
            "goodput_load": {slot: _load_points(run) for slot, run in runs.items()
                             if slot in LOAD_SLOTS}}


def _cond(c: Mapping) -> str:
    k = c.get("conditions") or {}
    if not k:
        return "-"
    parts = [f"{k['run']}/{k['mode']}" if "mode" in k else str(k.get("run", ""))]
    if k.get("k") is not None:
        parts.append(f"k={k['k']:g}")
    for key, label in (("token_scale", "token_scale"), ("time_scale", "time_scale"),
                       ("context_tokens_p50", "context p50"), ("output_tokens_p50", "output p50"),
                       ("requests", "requests"), ("trials", "trials")):
        if k.get(key) is not None:
            v = k[key]
            parts.append(f"{label} {v:g}" if isinstance(v, (int, float)) else f"{label} {v}")
    for key in ("wan", "model", "note"):
        if k.get(key):
            parts.append(str(k[key]))
    return "; ".join(parts)


def render_md(table: dict, meta: Mapping) -> str:
    def cell(s: object) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    kind = "from existing runs" if meta.get("from_runs") else meta.get("set") or \
        ("quick" if meta.get("quick") else "full")
    n_resumed = sum(1 for r in (meta.get("runs") or {}).values() if r.get("resumed"))
    resumed = (f", {n_resumed} slots kept from an earlier run (--resume); every slot's own "
               f"wall time summed: {meta.get('slots_wall_s')} s") if n_resumed else ""
    lines = ["# Reproduction of the PDD paper's claims", "",
             f"Generated by `{meta.get('command', 'testbed reproduce')}` ({kind}; wall time "
             f"{meta.get('wall_s', '-')} s{resumed}; started {meta.get('started_wall', '-')}"
             f"{' (interrupted)' if meta.get('interrupted') else ''}). "
             "Verdicts: *reproduced* = same direction, within half a decade of the published "
             "figure (or the qualitative comparison holds); *differs* = measured, not that "
             "(reason measured); *not reproducible here* = the testbed cannot measure it as "
             "stated (reason given).", "",
             "| # | claim | published | this run | verdict | why | conditions |",
             "|---|---|---|---|---|---|---|"]
    for c in table["claims"]:
        lines.append("| " + " | ".join(cell(x) for x in (
            c["key"], c["title"], c["published"], c["measured"], f"**{c['verdict']}**",
            c["reason"], _cond(c))) + " |")
    lines += ["", "Counts: " + ", ".join(f"{v} {k}" for k, v in sorted(table["counts"].items())),
              ""]
    src = meta.get("source") or {}
    runs = meta.get("runs") or src.get("runs")
    if runs:
        lines += ["## Runs", ""]
        if src:
            lines += [f"The runs were made by `{src.get('command')}` (wall time "
                      f"{src.get('wall_s')} s; started {src.get('started_wall')}"
                      f"{', interrupted' if src.get('interrupted') else ''}); this table "
                      "was rebuilt from their run directories.", ""]
        lines += ["| slot | scenario | claims | wall s | error |", "|---|---|---|---|---|"]
        for name, r in runs.items():
            wall = f"{r['wall_s']}{' (kept)' if r.get('resumed') else ''}"
            lines.append(f"| {name} | {r['scenario']} | {r['claims']} | {wall} | "
                         f"{cell(r['error'] or '-')} |")
        lines.append("")
    if table["unreadable"]:
        lines += ["Unreadable run directories: " + "; ".join(
            f"{k}: {v}" for k, v in table["unreadable"].items()), ""]
    scale = table.get("scale_invariance") or {}
    lines += render_scale(scale.get("rows") or [], scale.get("spread") or {})
    lines += ["Plots: bathtub.png (claim 9), goodput_load.png (claim 6)"
              + (", scale.png (scale invariance)" if scale.get("rows") else "") + ".", ""]
    return "\n".join(lines)


def plot_bathtub(points: list, path: Path) -> None:
    fig = Figure(figsize=(6, 3.5))
    ax = fig.add_subplot()
    if points:
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel("prefix hit rate (%)")
    ax.set_ylabel("TTFT benefit of pdd over cross-dc-pd (%)")
    ax.set_title("claim 9: benefit vs hit rate" + ("" if points else " (no data)"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_goodput(points_by_slot: Mapping, path: Path) -> None:
    fig = Figure(figsize=(6, 3.5))
    ax = fig.add_subplot()
    slot = next((s for s in LOAD_SLOTS if s in points_by_slot), "headline")
    for kind, pts in (points_by_slot.get(slot) or {}).items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=kind)
    ax.set_xlabel("offered load (req/s, from arrivals)")
    ax.set_ylabel("goodput within SLA (req/s)")
    ax.set_title(f"claim 6: goodput vs load ({slot})")
    if points_by_slot.get(slot):
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_outputs(out: Path, table: dict, meta: Mapping | None = None) -> None:
    meta = dict(meta or {})
    out.mkdir(parents=True, exist_ok=True)
    doc = {**meta, **table}
    (out / JSON_FILE).write_text(json.dumps(doc, indent=1, allow_nan=False, default=str) + "\n")
    (out / MD_FILE).write_text(render_md(table, meta))
    plot_bathtub(table["bathtub"], out / "bathtub.png")
    plot_goodput(table["goodput_load"], out / "goodput_load.png")
    rows = (table.get("scale_invariance") or {}).get("rows") or []
    if rows:
        plot_scale(rows, out / "scale.png")


def plot_scale(rows: list, path: Path) -> None:
    fig = Figure(figsize=(6, 3.5))
    ax = fig.add_subplot()
    for ts in sorted({r["token_scale"] for r in rows}):
        pts = sorted((r["k"], r["ttft_p90_change_pct"]) for r in rows
                     if r["token_scale"] == ts and r["ttft_p90_change_pct"] is not None)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"token_scale {ts}")
    ax.set_xscale("log")
    ax.set_xlabel("bandwidth scale k")
    ax.set_ylabel("TTFT p90 change, pdd vs cross-dc-pd (%)")
    ax.set_title("scale invariance of claim 1")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def reproduce(out: Path, quick: bool, run_fn: RunFn | None, bench_fn: BenchFn | None,
              from_runs: Path | None = None, capacity: CapacityConfig | None = None,
              command: str = "testbed reproduce", scale_sweep: bool = False,
              resume: bool = False, slots: tuple[Slot, ...] | None = None) -> dict:
    """Run (unless from_runs) and write the table into out; return it. ``resume``: keep
    the slots an earlier run into ``out`` finished (``finished_entries``) and run the
    rest; ``slots_wall_s`` is then the sum of every slot's own wall time. ``slots``:
    another set than FULL / QUICK (PAPER_SCALE), named in the table."""
    started, t0 = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.monotonic()
    meta: dict = {"command": command, "quick": quick, "started_wall": started,
                  "from_runs": str(from_runs) if from_runs else None}
    if slots is not None:
        meta["set"] = "paper-scale" if slots == PAPER_SCALE else "custom"
    if from_runs is None:
        if run_fn is None:
            raise TestbedError("reproduce: nothing to run with and no --from-runs")
        kind = "quick" if quick else "full"
        slots = slots or (QUICK if quick else FULL) + (SWEEP if scale_sweep else ())
        done = finished_entries(out, slots, BENCH_TRIALS[kind]) if resume else {}
        meta["runs"] = {}
        try:
            run_slots(slots, out, run_fn, bench_fn, BENCH_TRIALS[kind], done, meta["runs"])
        except BaseException:  # Ctrl-C, SIGTERM: keep what finished, the table so far
            meta["interrupted"] = True
            meta["wall_s"] = round(time.monotonic() - t0, 1)
            meta["slots_wall_s"] = _slots_wall(meta["runs"])
            write_outputs(out, build_table(out, capacity), meta)
            raise
        meta["slots_wall_s"] = _slots_wall(meta["runs"])
    else:
        meta["source"] = _source_of(from_runs)
    table = build_table(from_runs or out, capacity)
    meta["wall_s"] = round(time.monotonic() - t0, 1)
    write_outputs(out, table, meta)
    return {**meta, **table}


def _source_of(run_dir: Path) -> dict | None:
    """What the reproduction that made ``run_dir`` recorded (its command, wall times,
    runs), for a table rebuilt from it; None when it has no readable record."""
    try:
        src = json.loads((run_dir / JSON_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(src, dict):
        return None
    if src.get("source"):  # rebuilt from a rebuild: the runs' own record
        return src["source"]
    if not isinstance(src.get("runs"), dict):
        return None
    return {k: src.get(k) for k in ("command", "quick", "started_wall", "wall_s",
                                    "slots_wall_s", "interrupted", "runs")}


def _slots_wall(runs: Mapping) -> float:
    return round(sum(e.get("wall_s") or 0.0 for e in runs.values()), 1)


def format_summary(doc: Mapping) -> str:
    """One line per claim (the CLI's output)."""
    rows = [f"{c['key']:>3} {c['verdict']:<22} {c['title']}: {c['measured']}"
            for c in doc["claims"]]
    return "\n".join(rows + [f"wall {doc.get('wall_s')} s; " + ", ".join(
        f"{v} {k}" for k, v in sorted(doc["counts"].items()))])


