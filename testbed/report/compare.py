"""Runs side by side: one scenario under other backends, kernels or seeds.

Owns ``compare_runs`` (pure over RunData) and ``format_comparison``. One row
per figure and mode, one column per run:

    preflight_rtt_ms     the runner's WAN ping before the workload (events)
    wan_ab_bytes/_ba_    what the WAN's shaped channels carried, nominal
                         (links.csv counters x k)
    prefill_real_s_p50   P's real (tiny-model) prefill time: the machine's speed
    kv_wan_s_p50/_p90    MD's WAN KV transfer time per request (its report)
    ttft_p50/p90/p99_s, tpot_p50_ms, e2e_p99_s
    rld_token_share      tokens RLD produced / all; relayed_share: requests RLD served
    requests_completed/_failed

and the spread between runs, (max - min) / min. Reads only run directories
(``load_run``), so it works on runs copied back from a VM.

Example::

    rows = compare_runs([load_run("runs/cc-host"), load_run("runs/cc-netem")])
    print(format_comparison(rows, ["host", "netem"]))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from testbed.report.metrics import (completed, link_bytes, percentile, relayed_share,
                                    rld_token_share, tpot_ms)
from testbed.report.rundir import ModeData, RunData

WAN_LINK = "wan"


@dataclass(frozen=True)
class Row:
    mode: str
    figure: str
    unit: str
    values: tuple[float | None, ...]  # one per run, in the order given

    @property
    def spread(self) -> float | None:
        """(max - min) / min over the runs that have the figure."""
        vals = [v for v in self.values if v is not None]
        if len(vals) < 2 or min(vals) <= 0:
            return None
        return (max(vals) - min(vals)) / min(vals)


def _preflight_rtt(events: Sequence[Mapping]) -> float | None:
    return next((e.get("rtt_measured_ms") for e in events if e.get("kind") == "preflight"), None)


def _reported(requests: Sequence[Mapping], role: str, key: str) -> list[float]:
    return [t for r in requests
            if (t := ((r.get("reports") or {}).get(role) or {}).get(key)) is not None]


def mode_figures(mode: ModeData, scale: float) -> list[tuple[str, str, float | None]]:
    done = completed(mode.requests)
    ttft = [r.get("ttft_s") for r in done]
    e2e = [r.get("e2e_s") for r in done]
    tpot = [tpot_ms(r) for r in done]
    wan = link_bytes(mode.links, WAN_LINK)
    kv = _reported(mode.requests, "MD", "kv_transfer_s")
    prefill = _reported(mode.requests, "P", "prefill_real_s")
    return [
        ("preflight_rtt_ms", "ms", _preflight_rtt(mode.events)),
        ("wan_ab_bytes", "B nominal", wan["a>b"] * scale if "a>b" in wan else None),
        ("wan_ba_bytes", "B nominal", wan["b>a"] * scale if "b>a" in wan else None),
        ("prefill_real_s_p50", "s", percentile(prefill, 50)),
        ("kv_wan_s_p50", "s", percentile(kv, 50)),
        ("kv_wan_s_p90", "s", percentile(kv, 90)),
        ("ttft_p50_s", "s", percentile(ttft, 50)),
        ("ttft_p90_s", "s", percentile(ttft, 90)),
        ("ttft_p99_s", "s", percentile(ttft, 99)),
        ("tpot_p50_ms", "ms", percentile(tpot, 50)),
        ("e2e_p99_s", "s", percentile(e2e, 99)),
        ("rld_token_share", "", rld_token_share(mode.requests)),
        ("relayed_share", "", relayed_share(mode.requests)),
        ("requests_completed", "", float(len(done))),
        ("requests_failed", "", float(sum(1 for r in mode.requests
                                          if r.get("status") == "failed"))),
    ]


def compare_runs(runs: Sequence[RunData]) -> list[Row]:
    """Every figure of every mode the runs have, one value per run (None: absent)."""
    modes: list[str] = []
    for run in runs:
        modes += [m for m in run.mode_names if m not in modes]
    rows = []
    for mode in modes:
        per_run = []
        for run in runs:
            figs = mode_figures(run.mode(mode), run.scale) if mode in run.mode_names else []
            per_run.append({name: (unit, v) for name, unit, v in figs})
        names = next((list(f) for f in per_run if f), [])
        for name in names:
            unit = next(f[name][0] for f in per_run if name in f)
            rows.append(Row(mode, name, unit, tuple(f[name][1] if name in f else None
                                                    for f in per_run)))
    return rows


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1e6:
        return f"{v:.4g}"
    return f"{v:.4g}" if v != int(v) else f"{int(v)}"


def format_comparison(rows: Sequence[Row], labels: Sequence[str]) -> str:
    width = max([12] + [len(x) for x in labels])
    head = f"{'mode':<12} {'figure':<19} " + " ".join(f"{x:>{width}}" for x in labels) + \
        "   spread"
    lines = [head]
    for r in rows:
        spread = "-" if r.spread is None else f"{r.spread * 100:.1f}%"
        lines.append(f"{r.mode:<12} {r.figure:<19} " +
                     " ".join(f"{_fmt(v):>{width}}" for v in r.values) + f"   {spread}")
    return "\n".join(lines)
