"""One mode's metrics and the comparisons between modes, as summary.json states them.

Owns MODE_METRICS, PAIRED_METRICS, ``mode_metrics``, ``paired_metrics``,
``compare``, ``metric_value`` and the small pure functions they are made of.
Input is plain data read from a run directory: request records
(docs/pdd-roles.md, "What the client records"), events and links.csv rows.
Nothing here reads files or plots.

Definitions (docs/run-directory.md):
- percentiles are over completed requests, numpy's linear interpolation;
  no completed request -> None (null in JSON); ``ttft_mean_s`` is the mean
  over the same requests (the statistic of the paper's -51.5%);
- ``ttft_high_hit_p50_s``: the TTFT p50 of the high-hit majority, the
  completed requests whose workload designed a prefix hit rate >= 0.9
  (record ``designed_hit_rate``; HIGH_HIT); None when the workload designs
  none (a trace). PDD must keep these near the intra-DC level: their KV is
  short and they go p-md;
- ``tpot`` of a request = (e2e - ttft) / (tokens - 1), tokens = distinct
  positions received; a one-token request has no TPOT and meets any TPOT bound;
- ``goodput_rps`` = completed requests within the SLA (``ttft_s``, ``tpot_ms``;
  a bound that is absent is not checked; no SLA -> every completed request)
  per second of workload duration (``workload_start`` .. ``workload_end``
  events, else the span of the requests);
- bytes come from the records (what the roles sent on each path, all
  requests, failed ones too): ``wan_bytes`` = kv_wan + handoff,
  ``intra_dc_bytes`` = kv_intra. Records hold emulated bytes; the nominal
  figure is emulated x k, the emulated one is kept under ``emulated``.
  (links.csv counts everything on a link, cross traffic included; see
  ``link_bytes``.)
- ``rld_token_share`` = tokens produced by RLD / all tokens, and
  ``relayed_share`` = requests whose pipeline involved RLD / all, both over
  completed requests.
- ``relay_overhead_p50_ms/p90_ms``: the local path's cost, P's prefill end
  -> RLD's first token (record ``relay_overhead_ms``), over completed
  relayed requests (transfer of the KV over the intra-DC link + framing +
  RLD's emit); None when no request was relayed.
- ``after_prefill_p50_s/p90_s``: what a request's TTFT adds to P's own
  time, its first token's arrival at the client minus P's prefill end
  (record ``t_sent + ttft_s`` vs P's REPORT ``t_prefill_end``, one monotonic
  clock), over completed requests. P's queue and prefill are the same in
  every mode on one placement; this is the part a pipeline decides: the WAN
  KV wait in the cross-DC baseline, the local path in a relayed request.
- ``kv_prediction_error_p50/p90``: the router's WAN model against what
  happened, per request whose KV reached MD: ``|predicted - actual| /
  actual`` of the time from P's prefill end to the KV complete at MD
  (record ``kv_at_md``: ``predicted_wan_s`` vs ``actual_wan_s``).
- ``paired_ttft_ratio_p50`` (a pair's metric, summary.json ``paired``): the
  median, over the requests the mode did not relay (its p-md majority) that
  completed in both modes, of the request's TTFT in the mode over the same
  request's TTFT in the baseline (same id and prompt length: both modes
  replay one workload). Unlike ``ttft_p50_s`` of one mode over another's,
  it does not move when one request lands on the other side of the median:
  on quickstart's 24 requests the two p50s sit in a 20-40 ms gap between
  order statistics and their ratio read 0.89, 0.99 and 1.10 in three runs
  of one code while this median read 1.00 and 1.00 (docs/pdd-roles.md).
- ``wan_rate_max_over_shaper``: the largest rate links.csv shows on the
  WAN (either direction, between consecutive samples at least
  RATE_MIN_INTERVAL_S apart) over the rate its htb class allowed then (the
  higher of the two rows' emulated rates); above 1 by more than the htb
  burst over the interval means the samples are wrong, not the shaper
  (``shaper_rate_ratios``). None without WAN samples.
- ``p_hit_rate_mean`` / ``md_hit_rate_mean``: the mean prefix hit rate at P
  (its cache) and at MD (its decode-side radix cache, DRC) over the same
  requests: completed ones whose record has both (the KV went to MD).
  ``drc_hit_gap`` = the first minus the second: how many points of hit rate
  the fleet loses because a request's MD does not hold what its P held (each
  point is a point of the prompt's KV that crosses the WAN in vain). None
  without such requests.
- ``decision_regret_share``: of the routing decisions the pipeline rule made
  from its predictions, the share that the run's measured times would have
  reversed (``hindsight``: the counts per pipeline, the estimates used, the
  TTFT cost and the worst ten; testbed/report/hindsight.py says how each
  decision is judged). None when no decision was judged (the baselines).
- ``rss_slope_max_mb_per_min`` / ``fd_slope_max_per_min``: the largest slope
  of a serving role's resident memory / open descriptors over the second half
  of the workload window (testbed/report/resources.py; summary.json's
  ``resources`` has every instance's figures). A leak keeps a slope; a cache
  that fills and holds does not. None without the roles' stats files.
- ``wan_kv_share``: the WAN's A->B capacity the mode's KV used: the KV and
  handoff bytes of its requests (records, emulated) over what the WAN's a>b
  shaper allowed during the workload window (links.csv's emulated rate,
  averaged over the window's rows, times its length). It is the offered
  load of the fleet's own KV on the line (the KV of requests still in flight
  at the window's end counts too, so it can exceed 1 under overload). None
  without WAN rows.

Example::

    m = mode_metrics(records, events, Sla(ttft_s=2.0, tpot_ms=100), scale=10.0)
    m["ttft_p90_s"], m["wan_bytes"], m["emulated"]["wan_bytes"]
    compare({"pdd": m, "cross-dc-pd": b}, ["ttft_p90_s"], [("pdd", "cross-dc-pd")])
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np

from testbed.catalog import BOUNDABLE, MODE_FIGURES, PAIRED
from testbed.histogram import percentile
from testbed.report.balance import balance
from testbed.report.hindsight import hindsight
from testbed.report.rundir import LinkSample
from testbed.types import PDD_DEFAULTS, Sla

# The per-mode keys of summary.json, in contract order: the catalogue's figures
# (testbed/catalog.py), then the nested objects.
MODE_KEYS = MODE_FIGURES + ("hindsight", "balance", "emulated")
EMULATED_KEYS = ("wan_bytes", "intra_dc_bytes")
# Every name an expectation or a comparison may use (the catalogue's).
MODE_METRICS = BOUNDABLE
# Metrics of a (mode, baseline) pair over the same requests (``paired_metrics``);
# a comparison expectation may bound them like a ratio.
PAIRED_METRICS = PAIRED
# Compared between every mode and the baseline unless a scenario asks for more.
DEFAULT_COMPARED = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_ms", "e2e_p99_s",
                    "goodput_rps", "wan_bytes", "intra_dc_bytes")
PRODUCERS = {"p": "P", "prefill": "P", "1": "P",
             "rld": "RLD", "relay_decode": "RLD", "relay-decode": "RLD", "2": "RLD",
             "md": "MD", "main_decode": "MD", "main-decode": "MD", "3": "MD"}


def completed(records: Iterable[Mapping]) -> list[Mapping]:
    return [r for r in records if r.get("status") == "completed"]


def token_count(record: Mapping) -> int:
    """Distinct output positions the client received."""
    return len({t[0] for t in record.get("tokens") or ()})


HIGH_HIT = 0.9  # designed hit rate of the "high-hit majority" (ttft_high_hit_p50_s)


def high_hit(records: Iterable[Mapping]) -> list[Mapping]:
    """The records whose designed prefix hit rate is at least HIGH_HIT."""
    return [r for r in records
            if r.get("designed_hit_rate") is not None and r["designed_hit_rate"] >= HIGH_HIT]


def tpot_ms(record: Mapping) -> float | None:
    n, ttft, e2e = token_count(record), record.get("ttft_s"), record.get("e2e_s")
    if n < 2 or ttft is None or e2e is None:
        return None
    return 1000.0 * (e2e - ttft) / (n - 1)


def within_sla(record: Mapping, sla: Sla) -> bool:
    """Completed and within both bounds (absent bounds are not checked)."""
    if record.get("status") != "completed":
        return False
    ttft = record.get("ttft_s")
    if sla.ttft_s is not None and (ttft is None or ttft > sla.ttft_s):
        return False
    tpot = tpot_ms(record)
    return sla.tpot_ms is None or tpot is None or tpot <= sla.tpot_ms


def workload_window(events: Sequence[Mapping],
                    records: Sequence[Mapping]) -> tuple[float, float] | None:
    """(start, end) t_mono of the workload: its events, else the requests' span."""
    starts = [e["t_mono"] for e in events if e.get("kind") == "workload_start"]
    ends = [e["t_mono"] for e in events if e.get("kind") == "workload_end"]
    if starts and ends and max(ends) > min(starts):
        return min(starts), max(ends)
    sent = [r["t_sent"] for r in records if r.get("t_sent") is not None]
    done = [r["t_sent"] + r["e2e_s"] for r in records
            if r.get("t_sent") is not None and r.get("e2e_s") is not None]
    if sent and done and max(done) > min(sent):
        return min(sent), max(done)
    return None


def goodput_rps(records: Sequence[Mapping], sla: Sla, duration_s: float | None) -> float | None:
    if not duration_s:
        return None
    return sum(within_sla(r, sla) for r in records) / duration_s


def producer_of(token: Sequence) -> str | None:
    """'P', 'RLD' or 'MD' for a [position, token_id, t_rel_s, producer] entry."""
    if len(token) < 4 or token[3] is None:
        return None
    return PRODUCERS.get(str(token[3]).lower())


def rld_token_share(records: Sequence[Mapping]) -> float | None:
    tokens = [t for r in completed(records) for t in r.get("tokens") or ()]
    if not tokens:
        return None
    return sum(producer_of(t) == "RLD" for t in tokens) / len(tokens)


def is_relayed(record: Mapping) -> bool:
    """The pipeline involved RLD (p-rld-md, rld-only, p-rld-md->rld)."""
    return "rld" in str(record.get("pipeline") or "")


def relayed_share(records: Sequence[Mapping]) -> float | None:
    done = completed(records)
    return sum(map(is_relayed, done)) / len(done) if done else None


def kv_prediction_errors(records: Sequence[Mapping]) -> list[float]:
    """|predicted - actual| / actual of each request's WAN time (prefill end -> KV at MD)."""
    out = []
    for r in records:
        kv = r.get("kv_at_md") or {}
        pred, actual = kv.get("predicted_wan_s"), kv.get("actual_wan_s")
        if pred is not None and actual is not None and actual > 0:
            out.append(abs(pred - actual) / actual)
    return out


def relay_overhead_ms(records: Sequence[Mapping]) -> dict[str, float | None]:
    """``relay_overhead_p50_ms`` / ``_p90_ms``: P's prefill end -> RLD's first token (the
    record's ``relay_overhead_ms``), over completed relayed requests; None if none."""
    ms = [r.get("relay_overhead_ms") for r in completed(records) if is_relayed(r)]
    return {"relay_overhead_p50_ms": percentile(ms, 50),
            "relay_overhead_p90_ms": percentile(ms, 90)}


def after_prefill_s(record: Mapping) -> float | None:
    """First token at the client minus P's prefill end; None without both times."""
    end = ((record.get("reports") or {}).get("P") or {}).get("t_prefill_end")
    if end is None or record.get("t_sent") is None or record.get("ttft_s") is None:
        return None
    return record["t_sent"] + record["ttft_s"] - end


def handoff_stall_p99_ms(records: Sequence[Mapping]) -> float | None:
    stalls = [(r.get("handoff") or {}).get("stall_ms") for r in completed(records)]
    return percentile(stalls, 99)


def paired_ttft_ratios(records: Sequence[Mapping],
                       base_records: Sequence[Mapping]) -> list[float]:
    """TTFT(mode) / TTFT(baseline) of each request the mode did not relay, completed in
    both with a TTFT, matched by id (and prompt length, so that two workloads are never
    paired by accident)."""
    base = {r.get("id"): r for r in completed(base_records)}
    out = []
    for r in completed(records):
        b = base.get(r.get("id"))
        if b is None or is_relayed(r) or r.get("prompt_len") != b.get("prompt_len"):
            continue
        t, tb = r.get("ttft_s"), b.get("ttft_s")
        if t is not None and tb:
            out.append(t / tb)
    return out


def paired_metrics(records: Sequence[Mapping], base_records: Sequence[Mapping]) -> dict:
    """The PAIRED_METRICS of a mode against a baseline, with ``n`` (requests paired)."""
    ratios = paired_ttft_ratios(records, base_records)
    return {"paired_ttft_ratio_p50": percentile(ratios, 50), "n": len(ratios)}


def emulated_bytes(records: Iterable[Mapping]) -> dict[str, int]:
    """Bytes the roles sent on each path, summed over all requests (emulated scale)."""
    wan = intra = 0
    for r in records:
        b = r.get("bytes") or {}
        wan += int(b.get("kv_wan") or 0) + int(b.get("handoff") or 0)
        intra += int(b.get("kv_intra") or 0)
    return {"wan_bytes": wan, "intra_dc_bytes": intra}


def link_bytes(samples: Iterable[LinkSample], link: str) -> dict[str, int]:
    """Emulated bytes each direction of ``link`` carried (last - first counter)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for s in sorted((s for s in samples if s.link == link), key=lambda s: s.t_mono):
        first.setdefault(s.direction, s.bytes)
        last[s.direction] = s.bytes
    return {d: last[d] - first[d] for d in last}


RATE_MIN_INTERVAL_S = 0.25  # shorter intervals: a 64 KB GSO frame is a large share


def shaper_rate_ratios(samples: Iterable[LinkSample], link: str = "wan",
                       min_interval_s: float = RATE_MIN_INTERVAL_S) -> list[tuple[float, str, float]]:
    """(t_mono, direction, sampled rate / shaper rate) for each pair of consecutive rows
    of ``link`` at least ``min_interval_s`` apart; rows without a rate are skipped."""
    out = []
    by_dir: dict[str, list[LinkSample]] = {}
    for s in sorted((s for s in samples if s.link == link), key=lambda s: s.t_mono):
        by_dir.setdefault(s.direction, []).append(s)
    for direction, rows in by_dir.items():
        prev = None
        for s in rows:
            if prev is None or s.emulated_rate_gbit is None or prev.emulated_rate_gbit is None:
                prev = s
                continue
            dt = s.t_mono - prev.t_mono
            if dt < min_interval_s:
                continue  # keep prev: measure over a longer interval
            allowed = max(s.emulated_rate_gbit, prev.emulated_rate_gbit) * 1e9
            if allowed > 0 and s.bytes >= prev.bytes:
                out.append((s.t_mono, direction, (s.bytes - prev.bytes) * 8 / dt / allowed))
            prev = s
    return out


def hit_rates(records: Sequence[Mapping]) -> dict[str, float | None]:
    """``p_hit_rate_mean``, ``md_hit_rate_mean`` and ``drc_hit_gap`` over the completed
    requests whose record has both hit rates."""
    pairs = [(r["p_hit_rate"], r["md_hit_rate"]) for r in completed(records)
             if r.get("p_hit_rate") is not None and r.get("md_hit_rate") is not None]
    if not pairs:
        return {"p_hit_rate_mean": None, "md_hit_rate_mean": None, "drc_hit_gap": None}
    p = float(np.mean([a for a, _ in pairs]))
    md = float(np.mean([b for _, b in pairs]))
    return {"p_hit_rate_mean": p, "md_hit_rate_mean": md, "drc_hit_gap": p - md}


def wan_kv_share(wan_bytes: int, links: Sequence[LinkSample],
                 window: tuple[float, float] | None) -> float | None:
    """Emulated WAN bytes over the a>b capacity of the workload window (see above)."""
    if window is None or window[1] <= window[0]:
        return None
    rates = [s.emulated_rate_gbit for s in links
             if s.link == "wan" and s.direction == "a>b" and s.emulated_rate_gbit
             and window[0] <= s.t_mono <= window[1]]
    if not rates:
        return None
    capacity = float(np.mean(rates)) * 1e9 / 8 * (window[1] - window[0])
    return wan_bytes / capacity


def mode_metrics(records: Sequence[Mapping], events: Sequence[Mapping], sla: Sla,
                 scale: float, links: Sequence[LinkSample] = (),
                 relay_threshold_s: float = PDD_DEFAULTS.relay_threshold_s,
                 resources: Mapping | None = None,
                 instances: Mapping[str, str] | None = None) -> dict:
    """One mode's entry of summary.json, keys in contract order (``relay_threshold_s``:
    the mode's, for the decisions judged in hindsight; ``resources``: the mode's
    ``testbed.report.resources.mode_resources``, whose two slope bounds it carries;
    ``instances``: the mode's serving instances, name -> role, for ``balance``: without
    them only the instances the records name are counted)."""
    done = completed(records)
    judged = hindsight(records, relay_threshold_s)
    ttft = [r.get("ttft_s") for r in done]
    window = workload_window(events, records)
    emulated = emulated_bytes(records)
    spread = balance(records, instances if instances is not None else named_instances(records),
                     window)
    return {
        "requests_total": len(records),
        "requests_completed": len(done),
        "requests_failed": len(records) - len(done),
        "tokens_lost": sum(int(r.get("tokens_lost") or 0) for r in records),
        "tokens_duplicated": sum(int(r.get("tokens_duplicated") or 0) for r in records),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p90_s": percentile(ttft, 90),
        "ttft_p99_s": percentile(ttft, 99),
        "ttft_mean_s": float(np.mean([x for x in ttft if x is not None]))
        if any(x is not None for x in ttft) else None,
        "ttft_high_hit_p50_s": percentile((r.get("ttft_s") for r in high_hit(done)), 50),
        "tpot_p50_ms": percentile((tpot_ms(r) for r in done), 50),
        "e2e_p99_s": percentile((r.get("e2e_s") for r in done), 99),
        "goodput_rps": goodput_rps(records, sla, window and window[1] - window[0]),
        "handoff_stall_p99_ms": handoff_stall_p99_ms(records),
        **relay_overhead_ms(records),
        "after_prefill_p50_s": percentile(map(after_prefill_s, done), 50),
        "after_prefill_p90_s": percentile(map(after_prefill_s, done), 90),
        "wan_bytes": emulated["wan_bytes"] * scale,
        "intra_dc_bytes": emulated["intra_dc_bytes"] * scale,
        "rld_token_share": rld_token_share(records),
        "relayed_share": relayed_share(records),
        "kv_prediction_error_p50": percentile(kv_prediction_errors(records), 50),
        "kv_prediction_error_p90": percentile(kv_prediction_errors(records), 90),
        "wan_rate_max_over_shaper": max((r for _, _, r in shaper_rate_ratios(links)),
                                        default=None),
        **hit_rates(records),
        "wan_kv_share": wan_kv_share(emulated["wan_bytes"], links, window),
        "decision_regret_share": judged["decision_regret_share"],
        "rss_slope_max_mb_per_min": (resources or {}).get("rss_slope_max_mb_per_min"),
        "fd_slope_max_per_min": (resources or {}).get("fd_slope_max_per_min"),
        "md_imbalance": spread["imbalance"]["MAIN_DECODE"],
        "p_imbalance": spread["imbalance"]["PREFILL"],
        "hindsight": judged,
        "balance": spread,
        "emulated": emulated,
    }


def named_instances(records: Iterable[Mapping]) -> dict[str, str]:
    """{instance: role} of every instance a record's routing decision names."""
    out: dict[str, str] = {}
    for r in records:
        inst = ((r.get("reports") or {}).get("router") or {}).get("instances") or {}
        for role, name in inst.items() if isinstance(inst, Mapping) else ():
            if isinstance(name, str) and role in ("PREFILL", "RELAY_DECODE", "MAIN_DECODE"):
                out[name] = role
    return out


def metric_value(metrics: Mapping, name: str) -> float | None:
    """A metric of one mode by name; ``emulated.wan_bytes`` reaches into ``emulated``."""
    if name not in MODE_METRICS:
        raise KeyError(name)
    value: object = metrics
    for part in name.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value  # type: ignore[return-value]


def ratio(value: float | None, baseline: float | None) -> float | None:
    if value is None or baseline is None or baseline == 0:
        return None
    return value / baseline


def compare(modes: Mapping[str, Mapping], metrics: Sequence[str],
            pairs: Sequence[tuple[str, str]]) -> list[dict]:
    """For each (mode, baseline) pair and metric: both values, ratio, change in %."""
    out = []
    for mode, baseline in pairs:
        for name in metrics:
            v, b = metric_value(modes[mode], name), metric_value(modes[baseline], name)
            r = ratio(v, b)
            out.append({"metric": name, "mode": mode, "baseline": baseline, "value": v,
                        "baseline_value": b, "ratio": r,
                        "change_pct": None if r is None else 100.0 * (r - 1.0)})
    return out
