"""The paper's claims, each computed from run directories: one row per claim.

Owns Claim, the verdict rules (``magnitude_verdict``, ``change_verdict``),
``conditions`` and one pure function per claim of docs/reproduce.md's
numbered table (``CLAIMS``).
Input: the loaded runs by slot name (``testbed.report.reproduce.SLOTS``:
``headline``, ``baseline-64k``, ``goodput-load``, ``rld-overload``,
``bathtub``, ``odd-traffic``, ``handoff``) and the handoff bench's JSON;
a claim uses its own slot when it ran and falls back to the headline run,
saying so in its conditions. Nothing here runs anything or writes files.

Verdicts:
- *reproduced*: same direction and the same order of magnitude, i.e. the
  measured figure within half a decade of the published one
  (|log10(measured / published)| <= 0.5, ORDER); for a qualitative claim,
  the measured comparison comes out the way the paper says;
- *differs*: measured, but not that; the reason names the measured figures;
- *not reproducible here*: the testbed cannot measure it (the reason says
  what is missing and what was measured instead).

Example::

    rows = [fn(runs, bench) for fn in CLAIMS]
    rows[0].verdict, rows[0].measured
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import mean, median
from typing import Callable, Mapping, Sequence

from testbed.decision import Decision
from testbed.report.metrics import completed, is_relayed, percentile, producer_of
from testbed.report.rundir import ModeData, RunData

ORDER = 0.5  # decades: "same order of magnitude"
REPRODUCED, DIFFERS, NOT_HERE = "reproduced", "differs", "not reproducible here"


@dataclass(frozen=True)
class Claim:
    key: str
    title: str
    published: str
    measured: str
    verdict: str
    reason: str
    conditions: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)  # the numbers behind `measured`


def magnitude_verdict(published: float, measured: float | None) -> tuple[str, str]:
    """Same sign and within ORDER decades of the published figure."""
    if measured is None:
        return NOT_HERE, "no measured value"
    if published == 0 or measured == 0 or (published > 0) != (measured > 0):
        return DIFFERS, f"opposite direction ({measured:+.3g} vs {published:+.3g})"
    decades = math.log10(measured / published)
    if abs(decades) <= ORDER:
        return REPRODUCED, f"{measured:.3g} vs {published:.3g} ({measured / published:.2f}x)"
    word = "larger" if decades > 0 else "smaller"
    return DIFFERS, f"{abs(measured / published) if decades > 0 else published / measured:.1f}x " \
                    f"{word} than published ({measured:.3g} vs {published:.3g})"


change_verdict = magnitude_verdict  # a change in % is judged the same way


def change_pct(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return 100.0 * (value / base - 1.0)


def _fmt(x: float | None, unit: str = "", pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.1f}%" if pct else f"{x:.3g}{unit}"


def _resolved_mode(run: RunData, name: str) -> dict:
    for m in run.resolved.get("modes") or []:
        if isinstance(m, Mapping) and m.get("name") == name:
            return m
    return {"name": name, "mode": name}


def kind_of(run: RunData, name: str) -> str:
    """The mode (pdd, cross-dc-pd, ...) a mode folder ran."""
    return str(_resolved_mode(run, name).get("mode") or name)


def pdd_settings(run: RunData, name: str | None = None) -> dict:
    return run.pdd_settings(name)


def wan_rate_gbit(run: RunData) -> float | None:
    """The WAN's a>b rate the run recorded (metadata.json's topology), else None: a
    figure is never computed from a rate the run did not have."""
    v = (((run.metadata.get("topology") or {}).get("wan") or {}).get("a_to_b") or {}) \
        .get("rate_gbit")
    return float(v) if v is not None else None


def kv_bytes_per_token(run: RunData, mode: str | None = None) -> int | None:
    """The modeled KV bytes per token the run (or its mode) resolved, else None."""
    v = pdd_settings(run, mode).get("kv_bytes_per_token")
    return int(v) if v is not None else None


def conditions(run: RunData, name: str, note: str = "") -> dict:
    """k, token_scale, time_scale, model, WAN and the measured request shape of one mode."""
    pdd = pdd_settings(run, name)
    wan = (run.metadata.get("topology") or {}).get("wan") or {}
    ab, ba = wan.get("a_to_b") or {}, wan.get("b_to_a") or {}
    recs = run.mode(name).requests if name in run.mode_names else ()
    ts = int(pdd.get("token_scale") or 1)
    prompts = [r["prompt_len"] * ts for r in recs if r.get("prompt_len") is not None]
    outs = [r["max_out"] for r in recs if r.get("max_out") is not None]
    delays = [ab.get("delay_ms"), ba.get("delay_ms")]
    rtt = "?" if None in delays else f"{sum(delays):g}"
    out = {"run": run.path.name, "mode": name, "k": run.scale, "token_scale": ts,
           "time_scale": pdd.get("time_scale"),
           "model": f"modeled 70B-class (costmodel.BIG_MODEL), KV "
                    f"{pdd.get('kv_bytes_per_token', '? (not recorded)')} B/token; tokens "
                    "from the "
                    + ("hash engine" if pdd.get("engine") == "hash" else "tiny model"),
           "wan": f"{ab.get('rate_gbit', '?')} Gbit/s, RTT {rtt} ms",
           "requests": len(recs),
           "context_tokens_p50": median(prompts) if prompts else None,
           "output_tokens_p50": median(outs) if outs else None}
    if note:
        out["note"] = note
    return out


def _ttft(mode: ModeData) -> list[float]:
    return [r["ttft_s"] for r in completed(mode.requests) if r.get("ttft_s") is not None]


def _pick(runs: Mapping[str, RunData], slots: Sequence[str], kinds: Sequence[str]):
    """The first slot that ran with every kind of mode: (slot, run, {kind: mode name})."""
    for slot in slots:
        run = runs.get(slot)
        if run is None:
            continue
        names = {}
        for name in run.mode_names:
            names.setdefault(kind_of(run, name), name)
        if all(k in names for k in kinds):
            return slot, run, names
    return None, None, {}


def _missing(key: str, title: str, published: str, slots: Sequence[str]) -> Claim:
    return Claim(key, title, published, "-", NOT_HERE,
                 f"no run directory with the modes it needs (looked for {', '.join(slots)})")


# -- 1. TTFT vs cross-DC PD ---------------------------------------------------
def claim_ttft(runs, bench) -> Claim:
    key, title, pub = "1", "TTFT vs cross-DC PD", "-51.5% (TTFT)"
    slot, run, names = _pick(runs, ["headline"], ["pdd", "cross-dc-pd"])
    if run is None:
        return _missing(key, title, pub, ["headline"])
    p, b = _ttft(run.mode(names["pdd"])), _ttft(run.mode(names["cross-dc-pd"]))
    if not p or not b:
        return Claim(key, title, pub, "-", NOT_HERE, "a mode completed no request",
                     conditions(run, names["pdd"]))
    fig = {"mean_change_pct": change_pct(mean(p), mean(b))}
    for q in (50, 90, 99):
        fig[f"p{q}_change_pct"] = change_pct(percentile(p, q), percentile(b, q))
        fig[f"pdd_p{q}_s"], fig[f"base_p{q}_s"] = percentile(p, q), percentile(b, q)
    verdict, why = change_verdict(-51.5, fig["mean_change_pct"])
    measured = (f"mean {_fmt(fig['mean_change_pct'], pct=True)}; p50/p90/p99 "
                + " / ".join(_fmt(fig[f"p{q}_change_pct"], pct=True) for q in (50, 90, 99))
                + f" (pdd {fig['pdd_p50_s']:.2f}/{fig['pdd_p90_s']:.2f}/{fig['pdd_p99_s']:.2f} s "
                  f"vs {fig['base_p50_s']:.2f}/{fig['base_p90_s']:.2f}/{fig['base_p99_s']:.2f} s)")
    return Claim(key, title, pub, measured, verdict, "mean TTFT change: " + why,
                 conditions(run, names["pdd"]), fig)


# -- 2. the baseline's tail at 64K context ------------------------------------
PUB_TAIL_S = (4.2, 18.3, 29.7)


def claim_baseline_tail(runs, bench) -> Claim:
    key, title = "2", "cross-DC PD TTFT tail at 64K context, ~1K output"
    pub = "p50/p90/p99 4.2/18.3/29.7 s; KV transfer 1-20 s"
    # the paper-scale sweep (virtual clock), then the fleet's shared line
    slots = ["paper-sweep", "fleet", "baseline-64k", "headline"]
    slot, run, names = _pick(runs, slots, ["cross-dc-pd"])
    if run is None:
        return _missing(key, title, pub, slots)
    mode = run.mode(names["cross-dc-pd"])
    t = _ttft(mode)
    qs = [percentile(t, q) for q in (50, 90, 99)]
    kv = [(r.get("kv_at_md") or {}).get("actual_wan_s") for r in completed(mode.requests)]
    kv = [x for x in kv if x is not None]
    fig = {"ttft_p50_s": qs[0], "ttft_p90_s": qs[1], "ttft_p99_s": qs[2],
           "kv_transfer_min_s": min(kv) if kv else None,
           "kv_transfer_max_s": max(kv) if kv else None,
           "kv_transfer_p90_s": percentile(kv, 90)}
    prefills = {d.instances.get("PREFILL") for r in mode.requests
                if (d := Decision.of_record(r)) is not None} - {None}
    note = {"paper-sweep": f"the paper-scale fleet: {len(prefills)} P share one WAN line",
            "fleet": f"the fleet: {len(prefills)} P share one WAN line",
            "baseline-64k": "one P on the line"}.get(
        slot, "headline run (no fleet or baseline-64k run): mixed contexts")
    verdicts = [magnitude_verdict(p, q) for p, q in zip(PUB_TAIL_S, qs)]
    ok = all(v == REPRODUCED for v, _ in verdicts)
    measured = (" / ".join(_fmt(q, " s") for q in qs)
                + f"; KV transfer {_fmt(fig['kv_transfer_min_s'], ' s')}-"
                  f"{_fmt(fig['kv_transfer_max_s'], ' s')}")
    if ok:
        reason = "every percentile within half a decade"
    else:
        reason = "; ".join(f"p{q}: {why}" for q, (v, why) in zip((50, 90, 99), verdicts)
                           if v != REPRODUCED)
        rate, kvb = wan_rate_gbit(run), kv_bytes_per_token(run)
        reason += (f". The WAN part (prefill end -> KV at MD) is p90 "
                   f"{_fmt(fig['kv_transfer_p90_s'], ' s')} of the TTFT p90 {_fmt(qs[1], ' s')}")
        if rate is None or kvb is None:
            reason += ("; the run records no " + " and no ".join(
                w for w, v in (("WAN rate (metadata.json topology.wan.a_to_b.rate_gbit)", rate),
                               ("KV bytes per token (resolved pdd.kv_bytes_per_token)", kvb))
                if v is None) + ", so a whole KV's time on the line is not computed")
        else:
            full_s = 65536 * kvb * 8 / (rate * 1e9)
            fig["full_64k_kv_s"] = full_s
            reason += (f"; a whole 64K-token KV crosses this {rate:g} Gbit/s line in "
                       f"{full_s:.2g} s, so the paper's 1-20 s transfers imply an effective "
                       f"{rate * full_s / 20:.2g}-{rate * full_s:.2g} Gbit/s per transfer")
    return Claim(key, title, pub, measured, REPRODUCED if ok else DIFFERS, reason,
                 conditions(run, names["cross-dc-pd"], note), fig)


# -- 3. WAN bytes with and without decode-side reuse --------------------------
def _drc_modes(run: RunData) -> tuple[str | None, str | None]:
    """(a cross-dc-pd mode with MD's DRC, one with ``drc: false``) of ``run``."""
    on = off = None
    for name in run.mode_names:
        if kind_of(run, name) != "cross-dc-pd":
            continue
        if pdd_settings(run, name).get("drc", True) is False:
            off = off or name
        else:
            on = on or name
    return on, off


def claim_wan_bytes(runs, bench) -> Claim:
    key, title = "3", "WAN bytes: DRC at ~90% hit vs no decode-side reuse"
    pub = "up to 10x less; > 180 Gbit/s offered without caching"
    slot, run, names = _pick(runs, ["wan-bytes", "headline"], ["cross-dc-pd"])
    if run is None:
        return _missing(key, title, pub, ["wan-bytes", "headline"])
    name, off = _drc_modes(run)
    name = name or names["cross-dc-pd"]
    mode, pdd = run.mode(name), pdd_settings(run, name)
    ts, kvb = int(pdd.get("token_scale") or 1), kv_bytes_per_token(run, name)
    if kvb is None:
        return Claim(key, title, pub, "-", NOT_HERE, f"{run.path.name}: the run records no KV "
                     "bytes per token (resolved pdd.kv_bytes_per_token), so the bytes a request "
                     "without reuse would send are unknown", conditions(run, name))
    recs = [r for r in mode.requests if r.get("prompt_len") is not None]
    full = sum(r["prompt_len"] * ts * kvb for r in recs)  # nominal bytes, no reuse at all
    sent = sum(int((r.get("bytes") or {}).get("kv_wan") or 0) for r in recs) * run.scale
    hits = [r["md_hit_rate"] for r in recs if r.get("md_hit_rate") is not None]
    span = _span_s(recs)
    fig = {"full_kv_bytes": full, "wan_kv_bytes": sent,
           "reduction_x": full / sent if sent else None,
           "md_hit_rate_mean": mean(hits) if hits else None,
           "offered_gbit_no_cache": full * 8 / span / 1e9 if span else None,
           "prefill_tokens_per_s": sum(r["prompt_len"] * ts for r in recs) / span if span
           else None}
    offered = (f"{_fmt(fig['offered_gbit_no_cache'])} Gbit/s offered without caching at this "
               f"run's {_fmt(fig['prefill_tokens_per_s'])} prefilled tokens/s (one P)")
    if off is None:
        measured = (f"{_fmt(fig['reduction_x'], 'x')} less than the whole prompts' KV (MD hit "
                    f"{_fmt(fig['md_hit_rate_mean'])}); {offered}")
        reason = ("no `drc: false` cross-dc-pd mode in the run: the figure is the no-reuse "
                  "counterfactual from the records (prompt length x token_scale x KV per "
                  "token vs kv_wan sent)")
        return Claim(key, title, pub, measured, NOT_HERE, reason, conditions(run, name), fig)
    off_recs = run.mode(off).requests
    off_sent = sum(int((r.get("bytes") or {}).get("kv_wan") or 0) for r in off_recs) * run.scale
    same = sorted(r.get("id") for r in off_recs) == sorted(r.get("id") for r in mode.requests)
    fig.update({"wan_kv_bytes_drc_off": off_sent, "drc_off_mode": off,
                "measured_reduction_x": off_sent / sent if sent else None,
                "same_requests": same})
    x = fig["measured_reduction_x"]
    measured = (f"{_fmt(x, 'x')} less with the DRC ({name}: {sent / 1e9:.3g} GB vs {off}: "
                f"{off_sent / 1e9:.3g} GB of KV on the WAN, MD hit {_fmt(fig['md_hit_rate_mean'])}"
                f"); {offered}")
    # "up to 10x": the same direction and within half a decade of 10x is reproduced
    ok = x is not None and same and x >= 10 / 10 ** 0.5
    reason = ("measured: the same requests with MD's DRC and without it (`drc: false`, MD's "
              "cache capacity 0), cross-dc-pd both" if same else
              "the two modes did not run the same requests; the ratio is not comparable")
    if x is not None and not ok and same:
        reason += f"; {x:.2g}x is more than half a decade below the paper's 10x"
    return Claim(key, title, pub, measured, REPRODUCED if ok else DIFFERS, reason,
                 conditions(run, name), fig)


def _span_s(recs: Sequence[Mapping]) -> float | None:
    a = [r["arrival_s"] for r in recs if r.get("arrival_s") is not None]
    if len(a) >= 2 and max(a) > min(a):
        return (max(a) - min(a)) * len(a) / (len(a) - 1)  # n arrivals span n-1 gaps
    return None


# -- 4. RLD's share of output tokens ------------------------------------------
def claim_rld_share(runs, bench) -> Claim:
    key, title, pub = "4", "RLD's share of output tokens", "6.2% (MD 93.8%), ~1K-token outputs"
    slot, run, names = _pick(runs, ["headline"], ["pdd"])
    if run is None:
        return _missing(key, title, pub, ["headline"])
    done = completed(run.mode(names["pdd"]).requests)
    toks = [producer_of(t) for r in done for t in r.get("tokens") or ()]
    share = sum(p == "RLD" for p in toks) / len(toks) if toks else None
    relayed = [r for r in done if is_relayed(r)]
    fig = {"rld_token_share": share, "relayed_share": len(relayed) / len(done) if done else None,
           "md_token_share": sum(p == "MD" for p in toks) / len(toks) if toks else None}
    verdict, why = magnitude_verdict(0.062, share)
    measured = (f"{_fmt(share and 100 * share)}% (MD {_fmt(fig['md_token_share'] and 100 * fig['md_token_share'])}%)"
                f"; {len(relayed)} of {len(done)} requests relayed")
    return Claim(key, title, pub, measured, verdict, why, conditions(run, names["pdd"]), fig)


# -- 5. the handoff microbenchmark --------------------------------------------
def claim_handoff_bench(runs, bench) -> Claim:
    key, title = "5", "100-token handoff: KV shipping vs token IDs + recompute"
    pub = "KV mean/max 185/512.6 ms; IDs mean/max/std 305/321.4/4.8 ms"
    if not bench:
        return Claim(key, title, pub, "-", NOT_HERE, "no handoff-bench.json (testbed bench "
                     "handoff) in the run directory")
    kv, ids = bench["incremental_kv"], bench["token_ids_recompute"]
    fig = {"kv_mean_ms": kv["mean_ms"], "kv_max_ms": kv["max_ms"], "kv_std_ms": kv["std_ms"],
           "ids_mean_ms": ids["mean_ms"], "ids_max_ms": ids["max_ms"], "ids_std_ms": ids["std_ms"]}
    checks = [magnitude_verdict(185, kv["mean_ms"]), magnitude_verdict(305, ids["mean_ms"])]
    steadier = ids["std_ms"] < kv["std_ms"]
    ok = steadier and all(v == REPRODUCED for v, _ in checks)
    reason = (f"IDs std {ids['std_ms']:.3g} ms vs KV {kv['std_ms']:.3g} ms "
              f"({'steadier' if steadier else 'not steadier'}); KV mean {checks[0][1]}; "
              f"IDs mean {checks[1][1]}")
    measured = (f"KV {kv['mean_ms']:.0f}/{kv['max_ms']:.0f} ms (std {kv['std_ms']:.1f}); IDs "
                f"{ids['mean_ms']:.0f}/{ids['max_ms']:.0f}/{ids['std_ms']:.1f} ms")
    wan = bench.get("wan") or {}
    cond = {"run": "handoff-bench.json", "k": bench.get("scale"), "trials": kv.get("n"),
            "wan": f"{wan.get('rate_gbit')} Gbit/s, RTT {wan.get('rtt_ms')} ms, jitter "
                   f"{wan.get('jitter_ms')} ms, {wan.get('cross_flows')} cross flows",
            "model": "extend padded to costmodel GPU_B extend_s(100, context)"}
    return Claim(key, title, pub, measured, REPRODUCED if ok else DIFFERS, reason, cond, fig)


ClaimFn = Callable[[Mapping[str, RunData], dict | None], Claim]
