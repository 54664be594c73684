"""Scale invariance: how much the headline answer moves with the emulation knobs.

Owns SWEEP_KS, SWEEP_SLOTS and ``scale_table``. ``testbed reproduce
--scale-sweep`` runs scenarios/paper/scale-sweep.yaml once per bandwidth
scale k (slot ``scale-kK``, ``--scale K``); each run has pdd and cross-dc-pd
at token_scale 32 and at 64 (``pdd-ts64``/``base-ts64``, real prompts half
as long, so the same modeled contexts). ``scale_table`` reads those run
directories and gives, per (k, token_scale), the TTFT p50/p90 change of pdd
against cross-dc-pd (claim 1's figure) and the nominal WAN bytes of both, then
how far each figure spreads over the sweep: for the TTFT changes the range in
percentage points, for the bytes the range over the mean. A spread above
INVARIANT_PCT means the emulation knob changes the answer (docs/backends.md,
"Bandwidth scale k", says what k distorts).

Example::

    rows, spread = scale_table(runs)   # runs: {slot: RunData}
"""

from __future__ import annotations

from typing import Mapping

from testbed.report.metrics import completed, emulated_bytes, percentile

SWEEP_KS = (10, 25, 50, 100)
SWEEP_SCENARIO = "scenarios/paper/scale-sweep.yaml"
INVARIANT_PCT = 10.0
PAIRS = {32: ("pdd", "cross-dc-pd"), 64: ("pdd-ts64", "base-ts64")}  # token_scale -> modes


def slot_name(k: float) -> str:
    return f"scale-k{k:g}"


def _ttft(mode) -> tuple[float | None, float | None]:
    t = [r.get("ttft_s") for r in completed(mode.requests)]
    return percentile(t, 50), percentile(t, 90)


def _change(v: float | None, b: float | None) -> float | None:
    return None if v is None or not b else 100.0 * (v / b - 1.0)


def scale_table(runs: Mapping) -> tuple[list[dict], dict]:
    """(one row per k and token_scale, the spread of each figure over the rows)."""
    rows = []
    for k in SWEEP_KS:
        run = runs.get(slot_name(k))
        if run is None:
            continue
        for ts, (p, b) in PAIRS.items():
            if p not in run.mode_names or b not in run.mode_names:
                continue
            pm, bm = run.mode(p), run.mode(b)
            (p50, p90), (b50, b90) = _ttft(pm), _ttft(bm)
            rows.append({
                "k": run.scale, "token_scale": ts,
                "completed": f"{len(completed(pm.requests))}/{len(pm.requests)} "
                             f"{len(completed(bm.requests))}/{len(bm.requests)}",
                "pdd_ttft_p50_s": p50, "base_ttft_p50_s": b50,
                "pdd_ttft_p90_s": p90, "base_ttft_p90_s": b90,
                "ttft_p50_change_pct": _change(p50, b50),
                "ttft_p90_change_pct": _change(p90, b90),
                "pdd_wan_bytes": emulated_bytes(pm.requests)["wan_bytes"] * run.scale,
                "base_wan_bytes": emulated_bytes(bm.requests)["wan_bytes"] * run.scale})
    spread = {}
    for key in ("ttft_p50_change_pct", "ttft_p90_change_pct"):
        vals = [r[key] for r in rows if r[key] is not None]
        spread[key] = max(vals) - min(vals) if len(vals) >= 2 else None
    for key in ("pdd_wan_bytes", "base_wan_bytes"):
        vals = [r[key] for r in rows if r[key]]
        spread[key] = (100.0 * (max(vals) - min(vals)) / (sum(vals) / len(vals))
                       if len(vals) >= 2 else None)
    known = [v for v in spread.values() if v is not None]
    spread["invariant"] = all(v <= INVARIANT_PCT for v in known) if known else None
    return rows, spread


def render_scale(rows: list[dict], spread: dict) -> list[str]:
    """The table's markdown lines for reproduction.md (empty without sweep runs)."""
    if not rows:
        return []

    def f(x, fmt="{:.3g}"):
        return "-" if x is None else fmt.format(x)
    out = ["## Scale invariance (`--scale-sweep`)", "",
           "The headline comparison on scenarios/paper/scale-sweep.yaml at each bandwidth "
           "scale k and two token_scale values (same modeled contexts). TTFT change: pdd "
           "against cross-dc-pd (claim 1); bytes: nominal KV + handoff on the WAN.", "",
           "| k | token_scale | completed pdd / base | TTFT p50 pdd / base s | change % | "
           "TTFT p90 pdd / base s | change % | WAN GB pdd / base |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['k']:g} | {r['token_scale']} | {r['completed']} | "
                   f"{f(r['pdd_ttft_p50_s'])} / {f(r['base_ttft_p50_s'])} | "
                   f"{f(r['ttft_p50_change_pct'], '{:+.1f}')} | "
                   f"{f(r['pdd_ttft_p90_s'])} / {f(r['base_ttft_p90_s'])} | "
                   f"{f(r['ttft_p90_change_pct'], '{:+.1f}')} | "
                   f"{r['pdd_wan_bytes'] / 1e9:.3g} / {r['base_wan_bytes'] / 1e9:.3g} |")
    out += ["", "Spread over the sweep (TTFT: range of the change in points; bytes: range "
            f"over the mean, %): TTFT p50 {f(spread['ttft_p50_change_pct'], '{:.1f}')}, "
            f"p90 {f(spread['ttft_p90_change_pct'], '{:.1f}')}; WAN bytes pdd "
            f"{f(spread['pdd_wan_bytes'], '{:.1f}')}, base {f(spread['base_wan_bytes'], '{:.1f}')}"
            f". Within {INVARIANT_PCT:g}: {spread['invariant']}.", ""]
    return out
