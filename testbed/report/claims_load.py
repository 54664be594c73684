"""Claims 6-11: goodput, BCR, p-rld's collapse, the bathtub, the filter, the handoff modes.

The rest of testbed.report.claims (same Claim, verdict rules, conditions);
split off by size. Each function takes the loaded runs by slot and the
handoff bench's JSON and returns one Claim. Pure.
"""

from __future__ import annotations

from statistics import mean, median
from typing import Mapping

from testbed.decision import Decision
from testbed.report.capacity import (CapacityConfig, Fleet, Prices,
                                     capacities_from_cost_model, compare_fleets, size_fleets)
from testbed.report.claims import (DIFFERS, NOT_HERE, REPRODUCED, Claim, _fmt, _missing, _pick,
                                   _span_s, change_pct, change_verdict, conditions, kind_of,
                                   pdd_settings)
from testbed.report.metrics import (Sla, completed, goodput_rps, percentile, producer_of,
                                    tpot_ms, workload_window)
from testbed.report.rundir import ModeData, RunData

HIT_BINS = ((0, 90), (90, 95), (95, 96), (96, 97), (97, 98), (98, 99), (99, 100))  # the paper's


# The load sweeps, the fleets' first (the paper-scale one, on the virtual clock, before the
# emulated one): a fleet on one line is the regime of claims 6-8
LOAD_SLOTS = ["paper-sweep", "fleet-sweep", "goodput-load", "headline"]


def _goodput(run: RunData, mode: ModeData) -> float | None:
    w = workload_window(mode.events, mode.requests)
    return goodput_rps(mode.requests, Sla.from_resolved(run.resolved), w and w[1] - w[0])


def _load_points(run: RunData) -> dict[str, list[tuple[float, float, str]]]:
    """{kind: [(offered req/s measured from arrivals, goodput, mode name)]} sorted by load."""
    out: dict[str, list] = {}
    for m in run.modes:
        span, g = _span_s(m.requests), _goodput(run, m)
        if span and g is not None:
            out.setdefault(kind_of(run, m.name), []).append((len(m.requests) / span, g, m.name))
    return {k: sorted(v) for k, v in out.items()}


def _violations(run: RunData, mode: ModeData) -> str:
    sla = Sla.from_resolved(run.resolved)
    done = completed(mode.requests)
    ttft = sum(1 for r in done if sla.ttft_s is not None and (r.get("ttft_s") or 0) > sla.ttft_s)
    tpot = sum(1 for r in done if sla.tpot_ms is not None and (tpot_ms(r) or 0) > sla.tpot_ms)
    return (f"{mode.name}: {len(mode.requests) - len(done)} failed, {ttft} over TTFT "
            f"{sla.ttft_s} s, {tpot} over TPOT {sla.tpot_ms} ms of {len(mode.requests)}")


def knee_goodput(run: RunData) -> dict[str, tuple[float, float, str]]:
    """Per kind of mode, the load point of highest goodput (the knee of goodput vs load)."""
    return {k: max(pts, key=lambda p: p[1]) for k, pts in _load_points(run).items()}


# -- 6. goodput within SLA ----------------------------------------------------
def claim_goodput(runs, bench) -> Claim:
    key, title, pub = "6", "goodput within SLA vs cross-DC PD", "+27.8%"
    slot, run, names = _pick(runs, LOAD_SLOTS, ["pdd", "cross-dc-pd"])
    if run is None:
        return _missing(key, title, pub, LOAD_SLOTS)
    knee = knee_goodput(run)
    p, b = knee.get("pdd"), knee.get("cross-dc-pd")
    ch = change_pct(p and p[1], b and b[1])
    fig = {"points": {k: [list(x) for x in v] for k, v in _load_points(run).items()},
           "pdd_knee": p and list(p), "base_knee": b and list(b), "change_pct": ch,
           "sla": run.resolved.get("sla")}
    verdict, why = change_verdict(27.8, ch)
    n_loads = len(fig["points"].get("pdd", []))
    note = "" if n_loads > 1 else "one load point: no sweep, the knee is that point"
    if verdict != REPRODUCED and p and b:
        why += "; " + "; ".join(_violations(run, run.mode(x[2])) for x in (p, b))
    measured = (f"{_fmt(ch, pct=True)} at the knee (pdd {p[1]:.3g} req/s at {p[0]:.2g} offered, "
                f"cross-dc-pd {b[1]:.3g} at {b[0]:.2g}); {n_loads} load point(s)") if p and b \
        else "-"
    return Claim(key, title, pub, measured, verdict, why, conditions(run, names["pdd"], note),
                 fig)


# -- 7. benefit-cost ratio and hardware ---------------------------------------
# The same-DC baseline of the paper-scale fleet's own size (88 GPU-A), run beside
# paper-sweep: where it ran, claim 7 sets pdd against it and costs both fleets as run.
SAME_DC_SLOT = "paper-samedc"


def fleet_of(run: RunData, kind: str, n_chips: int) -> Fleet:
    """The chips a mode of ``kind`` runs on in ``run``'s topology (metadata.json), each
    instance ``n_chips`` chips: P and RLD on GPU-A, MD on GPU-B and one WAN line for
    the modes that decode across it; same-dc-pd: its P and decoders (RLD hosts) only."""
    hosts = [h for dc in (run.metadata.get("topology") or {}).get("datacenters") or ()
             for h in dc.get("hosts") or ()]
    count = {r: sum(r in (h.get("roles") or ()) for h in hosts)
             for r in ("prefill", "relay_decode", "main_decode")}
    a = (count["prefill"] + count["relay_decode"]) * n_chips
    if kind == "same-dc-pd":
        return Fleet(a, 0, 0, {"P": count["prefill"] * n_chips,
                               "D": count["relay_decode"] * n_chips})
    return Fleet(a, count["main_decode"] * n_chips, 1,
                 {"P": count["prefill"] * n_chips, "RLD": count["relay_decode"] * n_chips,
                  "MD": count["main_decode"] * n_chips})


def claim_bcr(runs, bench, cfg: CapacityConfig | None = None) -> Claim:
    """Goodput at the knee, pdd / same-dc-pd, over the cost ratio of the two fleets.
    With the paper-scale sweep and its same-DC slot (``SAME_DC_SLOT``: 88 GPU-A), the
    baseline's goodput is that slot's and each fleet is costed as it ran; otherwise
    same-dc-pd is the sweep's own (on the topology's RLDs) and the fleets are the ones
    `testbed capacity` sizes for the paper's workload."""
    key, title = "7", "BCR vs same-DC homogeneous PD; fleet and cost"
    pub = "BCR +37.5%; 43 GPU-A + 32 GPU-B + 1 WAN line vs 88 GPU-A; cost -3.5% to -7.1%"
    slot, run, names = _pick(runs, LOAD_SLOTS, ["pdd", "same-dc-pd"])
    if run is None:
        return _missing(key, title, pub, LOAD_SLOTS)
    knee = knee_goodput(run)
    p, s = knee.get("pdd"), knee.get("same-dc-pd")
    own = runs.get(SAME_DC_SLOT) if slot == "paper-sweep" else None
    own_knee = own is not None and knee_goodput(own).get("same-dc-pd")
    if own_knee:
        s = own_knee
    ratio = p[1] / s[1] if p and s and s[1] else None
    share = (runs.get("headline") and _rld_share(runs["headline"])) or 0.062
    cfg = cfg or CapacityConfig()
    if own_knee:
        pdd, base = fleet_of(run, "pdd", cfg.n_chips), fleet_of(own, "same-dc-pd", cfg.n_chips)
    else:
        caps = capacities_from_cost_model(cfg.workload, cfg.chip_a, cfg.chip_b, cfg.n_chips)
        pdd, base = size_fleets(cfg.workload, caps, share, cfg.wan_line_gbit)
    rows = [compare_fleets(pdd, base, Prices(cfg.gpu_a_price, pb, cfg.wan_line_price), ratio)
            for pb in cfg.gpu_b_prices]
    best = max((r["bcr_change_pct"] for r in rows if r["bcr_change_pct"] is not None),
               default=None)
    fig = {"goodput_ratio": ratio, "rld_token_share": share, "bcr_change_pct": best,
           "fleet_pdd": [pdd.gpu_a, pdd.gpu_b, pdd.wan_lines], "fleet_base": base.gpu_a,
           "cost_change_pct": [r["cost_change_pct"] for r in rows],
           "gpu_b_prices": list(cfg.gpu_b_prices),
           "fleets": "as run" if own_knee else "planned",
           "base_slot": SAME_DC_SLOT if own_knee else slot,
           "pdd_knee": p and list(p), "base_knee": s and list(s)}
    costs = " to ".join(f"{c:+.1f}%" for c in fig["cost_change_pct"])
    how = "as run" if own_knee else "plan"
    measured = (f"BCR {_fmt(best, pct=True)} (measured goodput x{_fmt(ratio)} vs same-dc-pd); "
                f"{how} {pdd.gpu_a} GPU-A + {pdd.gpu_b} GPU-B + {pdd.wan_lines} WAN line(s) vs "
                f"{base.gpu_a} GPU-A, cost {costs}")
    verdict, why = change_verdict(37.5, best)
    prices = f"GPU-B at {'/'.join(f'{x:g}' for x in cfg.gpu_b_prices)} x GPU-A"
    if own_knee:
        why = (f"BCR: {why}; each fleet costed as it ran ({slot}'s pdd on {pdd.gpu_a} GPU-A + "
               f"{pdd.gpu_b} GPU-B + 1 line, {SAME_DC_SLOT}'s same-dc-pd on {base.gpu_a} "
               f"GPU-A), {prices}")
    else:
        why = (f"BCR: {why}; fleets sized by the cost model for "
               f"{cfg.workload.demand_rps:g} req/s at RLD share {share:.3g}, {prices} "
               "(testbed capacity)")
    return Claim(key, title, pub, measured, verdict, why, conditions(run, names["pdd"]), fig)


def _rld_share(run: RunData) -> float | None:
    for m in run.modes:
        if kind_of(run, m.name) == "pdd":
            toks = [producer_of(t) for r in completed(m.requests) for t in r.get("tokens") or ()]
            return sum(x == "RLD" for x in toks) / len(toks) if toks else None
    return None


# -- 8. p-rld collapses --------------------------------------------------------
BREAK_E2E_RATIO = 2.0  # p-rld "breaks" where its e2e p99 is twice pdd's, or it fails requests


def _e2e_p99(mode: ModeData) -> float | None:
    return percentile((r.get("e2e_s") for r in completed(mode.requests)), 99)


def rld_peak_hold(mode: ModeData, token_scale: int) -> tuple[int, int, int | None]:
    """(most sequences RLD decoded at once, their modeled KV tokens at that moment, RLD's
    modeled KV memory in tokens as the router budgets it, or None) over a mode's
    records: a request is on RLD from its first RLD token to its last, holding its
    prompt (x token_scale) and what RLD decoded of it."""
    edges, budget = [], None
    for r in mode.requests:
        d = Decision.of_record(r)
        if d is not None and d.routing is not None:
            budget = budget or d.routing.rld_budget_kv_tokens
        times = [t[2] for t in r.get("tokens") or () if producer_of(t) == "RLD"]
        if not times or r.get("prompt_len") is None:
            continue
        ctx = r["prompt_len"] * token_scale + len(times)
        edges += [(r["t_sent"] + min(times), 1, ctx), (r["t_sent"] + max(times), -1, -ctx)]
    held = n = peak_n = peak_tokens = 0
    for _, dn, dc in sorted(edges):
        n, held = n + dn, held + dc
        if held > peak_tokens:
            peak_tokens, peak_n = held, n
    return peak_n, peak_tokens, budget


def _rld_kv_waits(mode: ModeData) -> list[float]:
    """Each request's wait for RLD's KV memory, where it waited (RLD's report,
    testbed/pdd/compute/decoder.py)."""
    waits = ((r.get("reports") or {}).get("RLD", {}).get("kv_wait_s") for r in mode.requests)
    return [w for w in waits if w]


def claim_p_rld(runs, bench) -> Claim:
    key, title, pub = "8", "P->RLD alone overloads RLD", "collapses (qualitative)"
    slots = ["paper-sweep", "fleet-sweep", "rld-overload", "headline"]
    slot, run, names = _pick(runs, slots, ["pdd", "p-rld"])
    if run is None:
        return _missing(key, title, pub, slots)
    pts = _load_points(run)
    pairs = list(zip(pts.get("pdd", []), pts.get("p-rld", [])))
    rows, broke_at = [], None
    for (lp, gp, np_), (lr, gr, nr) in pairs:
        mp, mr = run.mode(np_), run.mode(nr)
        e2e = (_e2e_p99(mp), _e2e_p99(mr))
        failed = len(mr.requests) - len(completed(mr.requests))
        ratio = e2e[1] / e2e[0] if all(e2e) else None
        waits = _rld_kv_waits(mr)
        rows.append({"load_rps": lr, "pdd_e2e_p99_s": e2e[0], "p_rld_e2e_p99_s": e2e[1],
                     "e2e_ratio": ratio, "p_rld_failed": failed, "pdd_goodput": gp,
                     "p_rld_goodput": gr, "p_rld_kv_waited": len(waits),
                     "p_rld_kv_wait_max_s": max(waits, default=None)})
        if broke_at is None and ((ratio or 0) >= BREAK_E2E_RATIO or failed > 0):
            broke_at = lr
    fig = {"points": rows, "breaks_at_rps": broke_at}
    last = rows[-1] if rows else None
    if last is None:
        return Claim(key, title, pub, "-", NOT_HERE, "no load point with both modes",
                     conditions(run, names["pdd"]), fig)
    measured = "; ".join(f"{r['load_rps']:.2g} req/s: e2e p99 {_fmt(r['p_rld_e2e_p99_s'], ' s')}"
                         f" vs pdd {_fmt(r['pdd_e2e_p99_s'], ' s')}, {r['p_rld_failed']} failed"
                         + (f", {r['p_rld_kv_waited']} waited for RLD's KV memory (at most "
                            f"{_fmt(r['p_rld_kv_wait_max_s'], ' s')})"
                            if r["p_rld_kv_waited"] else "")
                         for r in rows)
    if broke_at is not None:
        verdict, why = REPRODUCED, f"p-rld breaks at {broke_at:.2g} req/s (e2e p99 >= " \
                                   f"{BREAK_E2E_RATIO:g}x pdd's, or failed requests)"
    else:
        verdict = DIFFERS
        why = (f"no collapse up to {last['load_rps']:.2g} req/s: e2e p99 ratio "
               f"{_fmt(last['e2e_ratio'])}, {last['p_rld_failed']} failed")
        top = pairs[-1][1][2]
        n, tokens, budget = rld_peak_hold(run.mode(top),
                                          int(pdd_settings(run, top).get("token_scale") or 1))
        fig["rld_peak"] = {"mode": top, "sequences": n, "kv_tokens": tokens,
                           "kv_capacity_tokens": budget}
        if budget:
            why += (f"; at that load p-rld's RLD held at most {n} sequences, "
                    f"{tokens / budget:.2f} of its modeled KV memory ({tokens / 1e6:.2f}M of "
                    f"{budget / 1e6:.2f}M tokens): the load that overloads it was not reached "
                    f"(past that memory RLD's decode loop queues the requests that do not fit)")
    note = "" if len(rows) > 1 else "one load point: no sweep"
    return Claim(key, title, pub, measured, verdict, why, conditions(run, names["p-rld"], note),
                 fig)


# -- 9. the bathtub ------------------------------------------------------------
def bathtub_points(runs) -> tuple[list[tuple[float, float, int]], str, RunData | None, str]:
    """[(hit rate %, TTFT benefit of pdd over cross-DC PD in %, n)], source, run, mode name.

    Every request is binned (``HIT_BINS``) by its own designed hit rate and paired by id
    with the same request in the baseline; the point's hit rate is the mean of its
    requests'. The bathtub slot's pdd-X / base-X mode pairs are pooled this way (a
    mode's workload aims at one bin, but its sessions' cold first turns have none of
    their prefix cached: binned per mode, every bin read 24% or 74-81% and +32-36%,
    the full run of 2026-12-02); without the slot, the headline's requests."""
    for slot in ("paper-bathtub", "bathtub"):
        run = runs.get(slot)
        if run is None:
            continue
        base = {n.split("-", 1)[1]: n for n in run.mode_names
                if kind_of(run, n) == "cross-dc-pd" and "-" in n}
        pairs = [(n, base[n.split("-", 1)[1]]) for n in run.mode_names
                 if kind_of(run, n) == "pdd" and "-" in n and n.split("-", 1)[1] in base]
        pts = _binned(run, pairs)
        if pts:
            return pts, slot, run, pairs[0][0]
    slot, run, names = _pick(runs, ["headline"], ["pdd", "cross-dc-pd"])
    if run is None:
        return [], "", None, ""
    return _binned(run, [(names["pdd"], names["cross-dc-pd"])]), "headline", run, names["pdd"]


def _binned(run: RunData, pairs: list[tuple[str, str]]) -> list[tuple[float, float, int]]:
    """(mean designed hit %, benefit %, n) per HIT_BINS bin over the requests completed in
    both modes of each (pdd mode, baseline mode) pair, matched by id."""
    matched = []  # (designed hit rate, pdd record, baseline record)
    for pdd_name, base_name in pairs:
        p = {r["id"]: r for r in completed(run.mode(pdd_name).requests)}
        b = {r["id"]: r for r in completed(run.mode(base_name).requests)}
        matched += [(b[i]["designed_hit_rate"], p[i], b[i]) for i in p
                    if i in b and b[i].get("designed_hit_rate") is not None]
    pts = []
    for lo, hi in HIT_BINS:
        inside = [m for m in matched if lo <= 100 * m[0] < hi + (hi == 100)]
        tp, tb = _mean_ttft([m[1] for m in inside]), _mean_ttft([m[2] for m in inside])
        if inside and tp is not None and tb:
            pts.append((100 * mean(m[0] for m in inside), 100 * (1 - tp / tb), len(inside)))
    return pts


def _mean_ttft(recs) -> float | None:
    t = [r["ttft_s"] for r in completed(recs) if r.get("ttft_s") is not None]
    return mean(t) if t else None


# A bin's benefit moves by more than a few points between runs of the same code: the
# bathtub-sweep scenario's 99% pair gave TTFT p50 ratios 1.066, 0.96 and 1.12 in three
# suites (16 requests, identical routing), a 16-point spread. So a valley counts only
# when both ends are this far above it, and only bins with enough requests count.
BATHTUB_MARGIN_PTS = 10.0
BATHTUB_MIN_N = 3


def claim_bathtub(runs, bench) -> Claim:
    key, title = "9", "bathtub: benefit vs prefix hit rate (7 bins)"
    pub = "high at both ends, low in the middle; dips near 20/40/70%"
    all_pts, source, run, name = bathtub_points(runs)
    pts = [p for p in all_pts if p[2] >= BATHTUB_MIN_N]
    measured = ", ".join(f"{h:g}%: {b:+.0f}% (n={n}{'' if n >= BATHTUB_MIN_N else ', not counted'})"
                         for h, b, n in all_pts)
    if run is None or len(pts) < 3:
        cond = conditions(run, name) if run is not None else {}
        return Claim(key, title, pub, measured or "-", NOT_HERE,
                     f"{len(pts)} hit-rate bin(s) with >= {BATHTUB_MIN_N} requests in both "
                     "modes; a shape needs 3", cond, {"points": all_pts})
    benefits = [b for _, b, _ in pts]
    low = min(range(1, len(pts) - 1), key=lambda i: benefits[i])
    floor = benefits[low] + BATHTUB_MARGIN_PTS
    tub = benefits[0] >= floor and benefits[-1] >= floor
    why = (f"ends {benefits[0]:+.0f}% (at {pts[0][0]:g}%) and {benefits[-1]:+.0f}% (at "
           f"{pts[-1][0]:g}%), lowest inside {benefits[low]:+.0f}% at {pts[low][0]:g}%" +
           ("" if tub else f": no valley (an end is not {BATHTUB_MARGIN_PTS:g} points above "
            "the lowest inner bin, the run-to-run spread of a bin)"))
    note = ("benefit = 1 - mean TTFT(pdd) / mean TTFT(cross-dc-pd) per bin; every request "
            "binned by its own designed hit rate, paired by id with itself in the baseline"
            + ("; the headline's requests (no bathtub slot)" if source == "headline" else
               "; the bathtub slot's mode pairs pooled"))
    return Claim(key, title, pub, measured, REPRODUCED if tub else DIFFERS, why,
                 conditions(run, name, note), {"points": all_pts})


# -- 10. the anomalous-traffic filter ------------------------------------------
def _anomalous(r: Mapping, pdd: Mapping) -> bool:
    ts = int(pdd.get("token_scale") or 1)
    return (r.get("prompt_len") or 0) * ts >= int(pdd.get("anomalous_min_input_tokens", 65536)) \
        and (r.get("max_out") or 0) < int(pdd.get("anomalous_max_output_tokens", 500))


def _caught(r: Mapping) -> bool:
    d = Decision.of_record(r)
    return d is not None and d.reason.startswith("anomalous") and r.get("pipeline") == "rld-only"


def claim_filter(runs, bench) -> Claim:
    key, title = "10", "anomalous-traffic filter: share caught, WAN bytes saved"
    pub = "3-4% of requests; their WAN transfer blocked"
    run = runs.get("odd-traffic")
    if run is None:
        return _missing(key, title, pub, ["odd-traffic"])
    on = [n for n in run.mode_names if pdd_settings(run, n).get("anomalous_filter")]
    off = [n for n in run.mode_names if not pdd_settings(run, n).get("anomalous_filter")
           and not pdd_settings(run, n).get("late_kv_local", True)]
    if not on or not off:
        return Claim(key, title, pub, "-", NOT_HERE, "needs a mode with the filter on and one "
                     "with both filters off", conditions(run, run.mode_names[0]))
    recs, pdd = run.mode(on[0]).requests, pdd_settings(run, on[0])
    designed = [r for r in recs if _anomalous(r, pdd)]
    caught = [r for r in recs if _caught(r)]
    wan = [sum(int((r.get("bytes") or {}).get("kv_wan") or 0) for r in run.mode(n).requests)
           for n in (on[0], off[0])]
    saved = change_pct(wan[0], wan[1])
    share = len(caught) / len(recs) if recs else None
    fig = {"caught_share": share, "designed_share": len(designed) / len(recs) if recs else None,
           "caught_of_designed": len([r for r in designed if _caught(r)]) / len(designed)
           if designed else None, "wan_bytes_change_pct": saved}
    measured = (f"caught {len(caught)} of {len(recs)} ({_fmt(share and 100 * share)}%; the "
                f"workload makes {len(designed)} anomalous); WAN bytes {_fmt(saved, pct=True)} "
                f"vs no filters")
    ok = fig["caught_of_designed"] == 1.0 and saved is not None and saved < 0
    why = (f"catches {_fmt(fig['caught_of_designed'] and 100 * fig['caught_of_designed'])}% of "
           "the requests that meet its rule and saves WAN bytes" if ok else
           f"caught {len(caught)} of {len(designed)} meeting the rule; WAN bytes "
           f"{_fmt(saved, pct=True)}")
    why += "; the share itself is the workload's (paper: 3-4% of production traffic)"
    return Claim(key, title, pub, measured, REPRODUCED if ok else DIFFERS, why,
                 conditions(run, on[0]), fig)


# -- 11. catch-up vs one-shot handoff ------------------------------------------
def handoff_spikes(recs) -> list[float]:
    """Per completed handed-over request: the gap at RLD -> MD over the median gap."""
    out = []
    for r in completed(recs):
        toks = sorted(r.get("tokens") or (), key=lambda t: t[0])
        gaps = [b[2] - a[2] for a, b in zip(toks, toks[1:])]
        at = [i for i, (a, b) in enumerate(zip(toks, toks[1:]))
              if producer_of(a) == "RLD" and producer_of(b) == "MD"]
        if at and gaps and median(gaps) > 0:
            out.append(gaps[at[0]] / median(gaps))
    return out


def claim_handoff_modes(runs, bench) -> Claim:
    key, title = "11", "catch-up vs one-shot handoff: stall and its visibility"
    pub = "catch-up: many imperceptible small handoffs instead of one big stall"
    run = runs.get("handoff")
    if run is None:
        return _missing(key, title, pub, ["handoff"])
    by = {pdd_settings(run, n).get("handoff_mode"): n for n in run.mode_names}
    if "one-shot" not in by or "catch-up" not in by:
        return Claim(key, title, pub, "-", NOT_HERE, "needs a one-shot and a catch-up mode",
                     conditions(run, run.mode_names[0]))
    fig = {}
    for hm, n in by.items():
        recs = run.mode(n).requests
        stalls = [(r.get("handoff") or {}).get("stall_ms") for r in completed(recs)]
        spikes = handoff_spikes(recs)
        fig[hm] = {"stall_p99_ms": percentile(stalls, 99), "spike_p99_x": percentile(spikes, 99),
                   "handed_over": len(spikes)}
    o, c = fig["one-shot"], fig["catch-up"]
    ok = None not in (o["stall_p99_ms"], c["stall_p99_ms"]) and c["stall_p99_ms"] < o["stall_p99_ms"]
    measured = (f"stall p99 catch-up {_fmt(c['stall_p99_ms'], ' ms')} vs one-shot "
                f"{_fmt(o['stall_p99_ms'], ' ms')}; TPOT spike at the handoff p99 "
                f"{_fmt(c['spike_p99_x'], 'x')} vs {_fmt(o['spike_p99_x'], 'x')} the median gap")
    why = "catch-up stalls less" if ok else "catch-up does not stall less"
    return Claim(key, title, pub, measured, REPRODUCED if ok else DIFFERS, why,
                 conditions(run, by["catch-up"]), fig)
