"""report.md: the human report of a run, rendered from its summary.

Owns ``render`` and the number formatting of the report. Sections: result,
what ran (scenario, topology, backend, k, seed, faults configured and the
fault/link events of each mode), metrics per mode (nominal figures, the
emulated ones alongside where they differ), comparisons, expectations,
versus the paper (its published figures, listed in docs/reproduce.md), plots. Pure: takes
the loaded run, the summary dict and the plots; returns the Markdown text.
Nothing time-dependent is written, so re-running gives identical bytes.

Example::

    text = render(run, summarize(run), plots)
"""

from __future__ import annotations

import json
from typing import Mapping, Sequence

from testbed.report.balance import ROLES
from testbed.report.events import TIMELINE_KINDS, describe, workload_t0
from testbed.report.fidelity import steal_line
from testbed.report.metrics import link_bytes
from testbed.report.plots import Plot
from testbed.report.rundir import RunData
from testbed.report.summary import baseline_of

ROWS = (  # (summary key, label)
    ("requests_total", "requests"), ("requests_completed", "completed"),
    ("requests_failed", "failed"), ("tokens_lost", "tokens lost"),
    ("tokens_duplicated", "tokens duplicated"), ("ttft_p50_s", "TTFT p50"),
    ("ttft_p90_s", "TTFT p90"), ("ttft_p99_s", "TTFT p99"), ("tpot_p50_ms", "TPOT p50"),
    ("e2e_p99_s", "end-to-end p99"), ("goodput_rps", "goodput within SLA"),
    ("handoff_stall_p99_ms", "handoff stall p99"), ("wan_bytes", "WAN bytes (roles)"),
    ("intra_dc_bytes", "intra-DC bytes (roles)"), ("rld_token_share", "RLD share of tokens"),
    ("relayed_share", "relayed share of requests"),
    ("decision_regret_share", "decisions reversed in hindsight"))
PAPER_MODE, PAPER_BASELINE = "pdd", "cross-dc-pd"


def fmt(metric: str, v: object) -> str:
    """A metric value with its unit, 'n/a' for null."""
    if v is None:
        return "n/a"
    if metric.endswith("_s"):
        return f"{v:.3g} s"
    if metric.endswith("_ms"):
        return f"{v:.3g} ms"
    if metric.endswith("_share"):
        return f"{100 * v:.1f}%"
    if metric.endswith("bytes"):
        return fmt_bytes(v)
    if metric.endswith("_rps"):
        return f"{v:.3g} req/s"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def fmt_bytes(v: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(v) >= size:
            return f"{v / size:.3g} {unit}"
    return f"{v:.0f} B"


def pct(change: float | None) -> str:
    return "n/a" if change is None else f"{change:+.1f}%"


def _kv(d: Mapping) -> str:
    return ", ".join(f"{k}={json.dumps(v) if isinstance(v, (dict, list)) else v}"
                     for k, v in d.items())


def topology_line(topo: object) -> str:
    """'two-dc: DC a (p1, rld1, ...), DC b (md1, ...); WAN 10 Gbit/s, RTT 40 ms'."""
    if not isinstance(topo, Mapping):
        return str(topo) if topo else "not recorded"
    def hosts(dc: Mapping) -> str:
        return ", ".join(h.get("name", "?") for h in dc.get("hosts") or [])

    dcs = ", ".join(f"DC {dc.get('name')} ({hosts(dc)})" for dc in topo.get("datacenters") or [])
    wan = topo.get("wan") or {}
    ab, ba = wan.get("a_to_b") or {}, wan.get("b_to_a") or {}  # metadata.json's topology
    parts = [f"{topo.get('name', '?')}: {dcs}" if dcs else str(topo.get("name", "?"))]
    if ab.get("rate_gbit") is not None:
        rate = f"{ab['rate_gbit']:g}" if ba.get("rate_gbit") in (None, ab["rate_gbit"]) \
            else f"{ab['rate_gbit']:g}/{ba['rate_gbit']:g}"
        delays = [d.get("delay_ms") for d in (ab, ba)]
        rtt = "" if None in delays else f", RTT {sum(delays):g} ms"
        parts.append(f"WAN {rate} Gbit/s{rtt}")
    return "; ".join(parts)


def _what_ran(run: RunData) -> list[str]:
    md, res = run.metadata, run.resolved
    out = ["## What ran", ""]
    if res.get("description"):
        out += [str(res["description"]).strip(), ""]
    out += [f"- scenario: `{md.get('scenario')}` ({md.get('scenario_file', 'file not recorded')})",
            f"- topology: {topology_line(md.get('topology'))}",
            f"- backend: {md.get('backend')}; bandwidth scale k = {run.scale:g} "
            "(emulated rates and bytes are nominal / k; figures below are nominal)",
            f"- seed: {md.get('seed')}; modes, in run order: {', '.join(run.mode_names)}",
            f"- host: {md.get('hostname')}, kernel {md.get('kernel')}, python "
            f"{md.get('python')}, git {md.get('git_revision')}, started {md.get('started_wall')}"]
    sla = res.get("sla") or {}
    out.append(f"- SLA: {_kv(sla) if sla else 'none (goodput counts every completed request)'}")
    out += ["", "Faults configured:", ""]
    out += [f"- {_kv(f)}" for f in res.get("faults") or []] or ["- none"]
    for m in run.modes:
        t0 = workload_t0(m.events)
        t0 = t0 if t0 is not None else min((e["t_mono"] for e in m.events), default=0.0)
        lines = [describe(e, t0) for e in sorted(m.events, key=lambda e: e["t_mono"])
                 if e.get("kind") in TIMELINE_KINDS]
        out += ["", f"Events of `{m.name}` (time from workload start):", ""]
        out += [f"- {x}" for x in lines] or ["- no fault or link event"]
        out += [f"- note: {n}" for n in m.notes]
    return out + [""]


def _metrics_table(run: RunData, summary: dict) -> list[str]:
    modes = summary["modes"]
    names = list(modes)
    out = ["## Metrics per mode", "",
           "| metric | " + " | ".join(f"`{n}`" for n in names) + " |",
           "|---|" + "---:|" * len(names)]
    for key, label in ROWS:
        cells = []
        for n in names:
            v = modes[n][key]
            em = modes[n]["emulated"].get(key)
            cells.append(fmt(key, v) + ("" if em is None or em == v
                                        else f" (emulated {fmt(key, em)})"))
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    wan = [link_bytes(m.links, "wan") for m in run.modes]
    cells = [", ".join(f"{d} {fmt_bytes(b * run.scale)}" for d, b in sorted(w.items())) or "n/a"
             for w in wan]
    out.append("| WAN link counters (links.csv) | " + " | ".join(cells) + " |")
    out += ["", "Times are real; bytes are nominal (emulated x k). \"(roles)\" bytes are what "
            "the roles sent for requests (KV on each path, plus handoff token IDs on the WAN, "
            "which the x k overstates slightly); the link counters count everything on the WAN "
            "link, cross traffic and headers included. Percentiles are over completed requests.",
            ""]
    return out


def _comparisons(summary: dict) -> list[str]:
    rows = summary["comparisons"]
    out = ["## Comparisons", ""]
    if not rows:
        return out + ["Only one mode ran: nothing to compare.", ""]
    out += ["| metric | mode | baseline | value | baseline value | ratio | change |",
            "|---|---|---|---:|---:|---:|---:|"]
    for c in rows:
        r = "n/a" if c["ratio"] is None else f"{c['ratio']:.3g}"
        out.append(f"| {c['metric']} | `{c['mode']}` | `{c['baseline']}` | "
                   f"{fmt(c['metric'], c['value'])} | {fmt(c['metric'], c['baseline_value'])} | "
                   f"{r} | {pct(c['change_pct'])} |")
    paired = [p for p in summary.get("paired", ()) if p["n"]]
    if paired:
        out += ["", "Paired over the same requests (those the mode did not relay, completed in "
                "both): the median of each request's TTFT in the mode over its TTFT in the "
                "baseline.", "",
                "| mode | baseline | requests | TTFT ratio p50 |", "|---|---|---:|---:|"]
        out += [f"| `{p['mode']}` | `{p['baseline']}` | {p['n']} | "
                f"{p['paired_ttft_ratio_p50']:.3g} |" for p in paired]
    return out + [""]


def _expectations(summary: dict) -> list[str]:
    out = ["## Expectations", ""]
    for e in summary["expectations"]:
        v = "null" if e["value"] is None else f"{e['value']:.4g}"
        out.append(f"- **{'PASS' if e['passed'] else 'FAIL'}** `{e['name']}`: value {v}; "
                   f"wanted {e['bound']}")
    if not summary["expectations"]:
        out.append("- the scenario states no expectation")
    for name, m in summary["modes"].items():
        if m["tokens_lost"] or m["tokens_duplicated"]:
            out.append(f"- **FAIL** `{name}` lost {m['tokens_lost']} and duplicated "
                       f"{m['tokens_duplicated']} tokens (must be 0: exactly-once handoff)")
    return out + [""]


def _ms(v: object) -> str:
    return "-" if v is None else f"{v:.2f}"


def _fidelity(fid: Mapping) -> list[str]:
    """How faithfully the host emulated each mode (testbed/report/fidelity.py)."""
    if not fid.get("modes"):
        return []
    tol = fid.get("tolerances") or {}
    out = ["## Fidelity", "",
           f"Verdict: **{fid.get('verdict') or 'not measured'}** (policy `{fid.get('policy')}`). "
           "Tolerances (docs/design.md, \"The fidelity verdict\"): "
           + ", ".join(f"{k} {v:g}" for k, v in tol.items()) + ".", ""]
    note = steal_line(fid)
    out += [f"- {r}" for r in fid.get("reasons", [])] + ([f"- note: {note}"] if note else []) \
        + ([""] if fid.get("reasons") else [])
    out += ["| mode | figure | value |", "|---|---|---|"]
    for mode, m in fid["modes"].items():
        net = m.get("network") or {}
        for cid, d in (net.get("delay_lines") or {}).items():
            out.append(f"| {mode} | delay line {cid}: lateness p50 / p99 / max ms, unexplained "
                       f"drops | {_ms(d.get('lateness_p50_ms'))} / {_ms(d.get('lateness_p99_ms'))}"
                       f" / {_ms(d.get('lateness_max_ms'))}, {d.get('unexplained_drops', 0)} of "
                       f"{d.get('frames', 0)} |")
        rtt = net.get("rtt") or {}
        if rtt.get("probes"):
            out.append(f"| {mode} | live RTT excess p50 / p99 ms ({rtt['probes']} probes) | "
                       f"{_ms(rtt['excess_p50_ms'])} / {_ms(rtt['excess_p99_ms'])} |")
        for cid, d in (net.get("shapers") or {}).items():
            out.append(f"| {mode} | shaper {cid}: delivered / configured while backlogged | "
                       f"{d['delivered_ratio']:.3f} over {d['backlogged_s']:g} s |")
        for name, r in ((m.get("compute") or {}).get("roles") or {}).items():
            pace = "" if r.get("overrun_time_share") is None else \
                f"overran {r['overrun_time_share']:.1%} of modeled time " \
                f"({r['overrun_step_share']:.1%} of {r['steps']} steps), "
            out.append(f"| {mode} | {name} ({r.get('role')}) | {pace}loop lag p99 "
                       f"{_ms(r.get('loop_lag_p99_ms'))} ms, max {_ms(r.get('loop_lag_max_ms'))} |")
        host = m.get("host") or {}
        if host:
            busy = ", ".join("-" if b is None else f"{b:.0%}" for b in host["cpu_busy_share"])
            out.append(f"| {mode} | host: CPU busy per core, peak memory | {busy}; "
                       f"{host['mem_peak_bytes'] / 2**30:.2f} GiB ({host['mem_peak_share']:.0%}) |")
            if host.get("cpu_steal_share") is not None:
                steal = ", ".join("-" if x is None else f"{x:.1%}" for x in host["cpu_steal_share"])
                out.append(f"| {mode} | host: CPU time the hypervisor took (steal) per core; "
                           f"worst core over one sample | {steal}; "
                           f"{host['cpu_steal_worst_share']:.0%} at "
                           f"+{host['cpu_steal_worst_at_s']:g} s |")
    return out + [""]


def _num(v: object, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def _lags(lags: Sequence) -> str:
    """A minute-by-minute list of loop-lag p99s, shortened to first, middle and last."""
    if not lags:
        return "-"
    shown = lags if len(lags) <= 3 else [lags[0], lags[len(lags) // 2], lags[-1]]
    return " / ".join(_ms(x) for x in shown) + (f" ({len(lags)} min)" if len(lags) > 3 else "")


def _resources(summary: dict) -> list[str]:
    """Each role process's memory, descriptors and loop lag over the workload
    (testbed/report/resources.py); nothing when the roles' stats carry no gauges."""
    modes = {n: r for n, r in (summary.get("resources") or {}).items() if r.get("instances")}
    if not modes:
        return []
    out = ["## Resources", "",
           "Each role's last process over the workload window: resident memory and open "
           "descriptors (first, last, peak) and their least-squares slopes over the "
           "window's second half (a leak keeps a slope; a cache that fills and holds does "
           "not), and its event loop's lag p99 by minute (first / middle / last). The "
           "client generates the load and keeps every record: shown, not judged "
           "(testbed/report/resources.py).", "",
           "| mode | instance | min | RSS MB first / last / peak | RSS MB/min | fds first / "
           "last / peak | fds/min | loop lag p99 ms by minute |",
           "|---|---|---:|---|---:|---|---:|---|"]
    for mode, res in modes.items():
        for name, f in res["instances"].items():
            restarts = f" ({f['processes']} processes)" if f["processes"] > 1 else ""
            out.append(f"| {mode} | {name} ({f['role']}){restarts} | {f['minutes']:g} | "
                       f"{f['rss_first_mb']:g} / {f['rss_last_mb']:g} / {f['rss_peak_mb']:g} | "
                       f"{_num(f['rss_slope_mb_per_min'], '.3f')} | {f['fds_first']} / "
                       f"{f['fds_last']} / {f['fds_peak']} | {_num(f['fd_slope_per_min'], '.3f')}"
                       f" | {_lags(f['loop_lag_p99_ms_by_min'])} |")
    return out + [""]


def _balance(summary: dict) -> list[str]:
    """Per mode with more than one instance of a role: each instance's share of the work
    (testbed/report/balance.py)."""
    modes = {n: m["balance"] for n, m in summary["modes"].items()
             if any(v is not None for v in ((m.get("balance") or {}).get("imbalance") or {})
                                           .values())}
    if not modes:
        return []
    out = ["## Balance", "",
           "Per instance: requests placed on it, output tokens it produced, the share of the "
           "workload window it was working (P: prefilling; a decoder: between its first and "
           "last token of a request), and its peak queue (P: requests waiting for it at once; "
           "a decoder: requests it held at once). Imbalance: the busiest instance's requests "
           "over the role's mean (1.0 even; n of n instances: one took all) "
           "(testbed/report/balance.py).", "",
           "| mode | instance | role | requests | tokens | busy | peak queue |",
           "|---|---|---|---:|---:|---:|---:|"]
    for mode, b in modes.items():
        for r in b["instances"]:
            busy = "-" if r["busy_share"] is None else f"{100 * r['busy_share']:.1f}%"
            out.append(f"| {mode} | {r['name']} | {r['role']} | {r['requests']} | "
                       f"{r['tokens']} | {busy} | {r['peak_queue']} |")
    out += ["", "| mode | " + " | ".join(f"{role} imbalance" for role in ROLES) + " |",
            "|---|" + "---:|" * len(ROLES)]
    for mode, b in modes.items():
        out.append(f"| {mode} | " + " | ".join(_num(b["imbalance"].get(role)) for role in ROLES)
                   + " |")
    placed = {n: m["hindsight"]["placement"] for n, m in summary["modes"].items()
              if ((m.get("hindsight") or {}).get("placement") or {}).get("judged")}
    if placed:
        out += ["", "MD placements in hindsight: each `p-md` request's finish on its MD "
                "(measured) against the other MD candidates' (its KV wait scaled by the "
                "prompt each lacked, that MD's measured per-token time then); reversed when "
                "another would have finished at least the relay threshold sooner "
                "(testbed/report/hindsight.py, `placement_hindsight`).", "",
                "| mode | judged | reversed | cost s | worst: id, MD -> other, finish s -> "
                "other s |", "|---|---:|---:|---:|---|"]
        for n, h in placed.items():
            worst = "; ".join(f"{w['id']}, {w['md']} -> {w['other_md']}, {w['finish_s']:.2f} "
                              f"-> {w['other_finish_s']:.2f}" for w in h["worst"][:3]) or "-"
            out.append(f"| {n} | {h['judged']} | {h['reversed']} | {h['cost_s_total']:.2f} | "
                       f"{worst} |")
    return out + [""]


def _hindsight(summary: dict) -> list[str]:
    """Per mode whose decisions were judged: the counts, and its worst ten reversals."""
    judged = {n: m["hindsight"] for n, m in summary["modes"].items()
              if (m.get("hindsight") or {}).get("judged")}
    if not judged:
        return []
    out = ["## Decisions in hindsight", "",
           "Each routing decision the pipeline rule made from its predictions, made again "
           "with the run's measured times: the gain of relaying (first token without "
           "relaying minus first token with it, the side not taken estimated from the "
           "mode's medians) against the mode's relay threshold "
           "(testbed/report/hindsight.py).", "",
           "| mode | judged | reversed | p-md reversed | p-rld-md reversed | rld-only reversed "
           "| TTFT cost total / p50 / max |", "|---|---:|---:|---:|---:|---:|---|"]
    for n, h in judged.items():
        bp = h["by_pipeline"]
        cells = [f"{bp[k]['reversed']} of {bp[k]['judged']}" if k in bp else "-"
                 for k in ("p-md", "p-rld-md", "rld-only")]
        out.append(f"| `{n}` | {h['judged']} | {h['reversed']} "
                   f"({fmt('x_share', h['decision_regret_share'])}) | " + " | ".join(cells)
                   + f" | {fmt('x_s', h['cost_s_total'])} / {fmt('x_s', h['cost_s_p50'])} / "
                     f"{fmt('x_s', h['cost_s_max'])} |")
    for n, h in judged.items():
        if not h["worst"]:
            continue
        out += ["", f"Worst reversals of `{n}` (threshold {h['relay_threshold_s']:g} s):", "",
                "| id | decided | TTFT s | other s | gain s | cost s | predicted WAN s "
                "| measured WAN s | margin s | reason |", "|---:|---|---:|---:|---:|---:|---:"
                "|---:|---:|---|"]
        for w in h["worst"]:
            i = w["inputs"]
            out.append("| " + " | ".join(
                "-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))
                for v in (w["id"], w["pipeline"], w["ttft_s"], w["other_ttft_s"], w["gain_s"],
                          w["cost_s"], i.get("predicted_wan_s"), i.get("actual_wan_s"),
                          i.get("wan_margin_s"), w["reason"])) + " |")
    return out + [""]


def _versus_paper(run: RunData, summary: dict) -> list[str]:
    modes = summary["modes"]
    out = ["## Versus the paper", ""]
    if PAPER_MODE not in modes or PAPER_BASELINE not in modes:
        return out + [f"Needs modes `{PAPER_MODE}` and `{PAPER_BASELINE}` in one run.", ""]
    changes = {c["metric"]: c for c in summary["comparisons"]
               if c["mode"] == PAPER_MODE and c["baseline"] == PAPER_BASELINE}

    def change(metric: str) -> str:
        return pct(changes[metric]["change_pct"]) if metric in changes else "n/a"

    p, b = modes[PAPER_MODE], modes[PAPER_BASELINE]
    ttft = " / ".join(change(f"ttft_p{q}_s") for q in (50, 90, 99))
    base = " / ".join("n/a" if b[f"ttft_p{q}_s"] is None else f"{b[f'ttft_p{q}_s']:.3g}"
                      for q in (50, 90, 99))
    wan = changes.get("wan_bytes", {}).get("ratio")
    out += ["| figure | this run | paper (published) |", "|---|---:|---:|",
            f"| TTFT change, pdd vs cross-DC PD (P50 / P90 / P99) | {ttft} | -51.5% |",
            f"| cross-DC PD baseline TTFT P50 / P90 / P99 | {base} s | 4.2 / 18.3 / 29.7 s |",
            f"| goodput within SLA, pdd vs cross-DC PD | {change('goodput_rps')} | +27.8% |",
            f"| RLD share of output tokens (pdd) | {fmt('rld_token_share', p['rld_token_share'])} "
            "| 6.2% |",
            f"| WAN bytes, pdd / cross-DC PD | {'n/a' if wan is None else f'{wan:.3g}'} | "
            "no figure; ~1 expected (both send the missing KV; PDD adds handoff token IDs) |",
            "", f"Caveat: the paper measured 64K-token contexts with 1K-token outputs on real "
            f"GPUs and a real WAN; this run used the scenario's workload ("
            f"{summary['modes'][PAPER_MODE]['requests_total']} requests per mode), a tiny model "
            f"padded to a cost model, and an emulated WAN at bandwidth scale k = {run.scale:g}. "
            "Compare directions and orders of magnitude, not the exact figures.", ""]
    return out


def _plots(plots: Sequence[Plot]) -> list[str]:
    out = ["## Plots", ""]
    for p in plots:
        if p.drawn:
            out += [f"### {p.title}", "", f"![{p.title}]({p.path.name})", ""]
        else:
            out += [f"- {p.title}: not drawn ({p.note})"]
    return out + [""]


def _captures(captures: dict[str, dict]) -> list[str]:
    if not captures:
        return []
    out = ["## WAN packets (bounded capture, `MODE/wan.pcap`)", "",
           "Emulated bytes, a>b (DC A -> DC B). *roles*: what requests.jsonl says the roles "
           "sent (KV + handoff); *PDD packets*: the capture's non-cross flows; *link*: the "
           "shaper's counter (links.csv, cross traffic included) against all a>b packets.", "",
           "| mode | packets | roles / PDD packets | link / all packets | cross share | "
           "retransmits | RTT p50 ms | HANDOFF frames (with filler) |",
           "|---|---|---|---|---|---|---|---|"]

    def f(x, fmt="{:.3f}"):
        return "-" if x is None else fmt.format(x)
    for mode, c in captures.items():
        ab = c["a_to_b"]
        out.append(f"| {mode} | {c['packets']} | {f(ab['roles_over_packets'])} | "
                   f"{f(ab['link_over_all_packets'])} | {f(c['cross_share'])} | "
                   f"{c['retransmits']} | {f(c['rtt_ms_p50'], '{:.1f}')} | "
                   f"{c['handoff_frames']} ({c['handoff_frames_with_filler']}) |")
    return out + [""]


def render(run: RunData, summary: dict, plots: Sequence[Plot],
           captures: dict[str, dict] | None = None) -> str:
    """The whole report.md text."""
    failed = [e["name"] for e in summary["expectations"] if not e["passed"]]
    verdict = "PASSED" if summary["passed"] else "FAILED"
    why = f" (failed: {', '.join(failed)})" if failed else ""
    fid = summary.get("fidelity") or {}
    virtual = summary.get("clock") == "virtual"
    fid_word = "none (virtual clock)" if virtual else fid.get('verdict') or 'not measured'
    head = [f"# Run report: {summary['scenario']}", ""]
    if virtual:
        head += ["**Clock: virtual.** The role code ran in one process on a simulated clock "
                 "over a network model (docs/virtual-clock.md), not in the emulated network: "
                 "no host kept up or fell behind, so there is no fidelity verdict; the "
                 "emulator is the reference these figures are checked against "
                 "(`testbed crossval`).", ""]
    head += [f"**Result: {verdict}**{why}. **Fidelity: {fid_word}**"
            f"{' (strict)' if fid.get('policy') == 'strict' else ''}. Baseline for comparisons: "
            f"`{baseline_of(run)}`. Machine-readable figures: [summary.json](summary.json).", ""]
    lines = (head + _what_ran(run) + _metrics_table(run, summary) + _comparisons(summary)
             + _expectations(summary) + _fidelity(fid) + _resources(summary)
             + _balance(summary) + _hindsight(summary)
             + _versus_paper(run, summary)
             + _captures(captures or {}) + _plots(plots))
    return "\n".join(lines).rstrip() + "\n"
