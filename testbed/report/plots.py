"""The report's plots: one function per PNG, matplotlib without a display.

Owns Plot, DEFAULT_HIT_BINS_PCT, ``hit_bins``, ``relayed_examples`` (the
requests the timeline shows) and the plot functions: ``plot_ttft_cdf``,
``plot_wan_throughput``, ``plot_relay_timeline``, ``plot_hit_rates`` and
``plot_kv_prediction`` (the router's predicted vs actual KV arrival at MD).
Each takes plain data and a path and returns a Plot;
when there is nothing to draw it writes nothing, removes a stale PNG of
the same name (so re-running is idempotent) and says why in ``note``.
Figures are built with ``matplotlib.figure.Figure`` (Agg canvas), never
pyplot, so no global state or display is involved.

Example::

    plot = plot_ttft_cdf({"pdd": [0.2, 0.3], "cross-dc-pd": [1.5, 9.0]}, run / "ttft_cdf.png")
    plot.drawn, plot.note
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from testbed.report.events import fault_key, fault_kind, workload_t0
from testbed.report.metrics import producer_of
from testbed.report.rundir import LinkSample

# Same edges as testbed.workload.hitrate.PDD_BINS_PCT (a unit test keeps them equal).
DEFAULT_HIT_BINS_PCT: tuple[tuple[float, float], ...] = (
    (0, 90), (90, 95), (95, 96), (96, 97), (97, 98), (98, 99), (99, 100))
PRODUCER_STYLE = {"RLD": ("tab:orange", "RLD (eager tokens)"), "MD": ("tab:blue", "MD tokens"),
                  "P": ("tab:gray", "P"), None: ("black", "unknown producer")}
EVENT_LINES = {"link_down": ("tab:red", "-"), "link_up": ("tab:green", "-"),
               "process_kill": ("black", "--"), "process_restart": ("black", ":"),
               "set_link": ("tab:gray", ":"),
               "cross_traffic_start": ("tab:purple", "-."),
               "cross_traffic_stop": ("tab:purple", ":")}
DPI = 110


@dataclass(frozen=True)
class Plot:
    title: str
    path: Path
    drawn: bool
    note: str = ""  # why it was not drawn, or a caveat


def hit_bins(resolved: Mapping) -> tuple[tuple[float, float], ...]:
    """Bins of the scenario's ``workload.hit_rate.bins`` if given, else the PDD bins."""
    hr = (resolved.get("workload") or {}).get("hit_rate") or {}
    bins = hr.get("bins") if isinstance(hr, Mapping) else None
    if bins:
        return tuple((float(b["lo_pct"]), float(b["hi_pct"])) for b in bins)
    return DEFAULT_HIT_BINS_PCT


def _skip(title: str, path: Path, note: str) -> Plot:
    path.unlink(missing_ok=True)
    return Plot(title, path, False, note)


def _save(fig: Figure, title: str, path: Path) -> Plot:
    fig.savefig(path, dpi=DPI)
    return Plot(title, path, True)


def plot_ttft_cdf(ttft_by_mode: Mapping[str, Sequence[float]], path: Path) -> Plot:
    """Empirical CDF of TTFT (completed requests) per mode, log time axis."""
    title = "TTFT CDF per mode"
    data = {m: np.sort(np.asarray([v for v in vs if v is not None], dtype=float))
            for m, vs in ttft_by_mode.items()}
    data = {m: a for m, a in data.items() if a.size}
    if not data:
        return _skip(title, path, "no completed request in any mode: no TTFT to plot")
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for mode, a in data.items():
        y = np.arange(1, a.size + 1) / a.size
        ax.step(a, 100 * y, where="post", label=f"{mode} (n={a.size})")
    if all(a.min() > 0 for a in data.values()):
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("completed requests (%)")
    ax.set_ylim(0, 101)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title)
    return _save(fig, title, path)


def wan_rates(samples: Sequence[LinkSample], direction: str,
              scale: float) -> tuple[np.ndarray, np.ndarray]:
    """(t_mono at the end of each interval, nominal Gbit/s over it) for one WAN direction."""
    s = sorted((x for x in samples if x.link == "wan" and x.direction == direction),
               key=lambda x: x.t_mono)
    t = np.asarray([x.t_mono for x in s], dtype=float)
    b = np.asarray([x.bytes for x in s], dtype=float)
    if t.size < 2:
        return np.empty(0), np.empty(0)
    dt = np.diff(t)
    ok = dt > 0
    rate = np.diff(b)[ok] * 8 * scale / dt[ok] / 1e9
    return t[1:][ok], np.where(rate < 0, np.nan, rate)  # a counter reset is a gap, not a dip


def _t0(events: Sequence[Mapping], samples: Sequence[LinkSample]) -> float:
    t0 = workload_t0(events)
    return min(s.t_mono for s in samples) if t0 is None else t0


def _mark_events(ax, events: Sequence[Mapping], t0: float) -> None:
    """Fault spans (fault_start .. fault_end) and lines for link/process/traffic events."""
    open_faults: dict[object, Mapping] = {}
    for e in sorted(events, key=lambda e: e["t_mono"]):
        kind, key = e.get("kind"), fault_key(e)
        if kind == "fault_start":
            open_faults[key] = e
        elif kind == "fault_end" and key in open_faults:
            start = open_faults.pop(key)
            ax.axvspan(start["t_mono"] - t0, e["t_mono"] - t0, color="tab:red", alpha=0.12,
                       label=_fault_label(key, start))
        elif kind in EVENT_LINES:
            color, style = EVENT_LINES[kind]
            ax.axvline(e["t_mono"] - t0, color=color, linestyle=style, lw=1.2, label=kind)
    for key, start in open_faults.items():  # never ended: shade to the right edge
        ax.axvspan(start["t_mono"] - t0, ax.get_xlim()[1], color="tab:red", alpha=0.12,
                   label=_fault_label(key, start) + " (no end)")


def _fault_label(key: object, start: Mapping) -> str:
    return " ".join(x for x in ("fault", "" if key is None else str(key), fault_kind(start)) if x)


def _dedup_legend(ax, **kw) -> None:
    handles, labels = ax.get_legend_handles_labels()
    seen: dict[str, object] = {}
    for h, lab in zip(handles, labels):
        seen.setdefault(lab, h)
    ax.legend(list(seen.values()), list(seen), fontsize=8, **kw)


def plot_wan_throughput(modes: Mapping[str, tuple[Sequence[LinkSample], Sequence[Mapping]]],
                        scale: float, path: Path) -> Plot:
    """WAN throughput per direction (nominal Gbit/s) over time, one panel per mode.

    ``modes`` maps a mode to its (links.csv samples, events); time is seconds
    from the mode's workload_start (else its first sample).
    """
    title = "WAN throughput (nominal scale)"
    usable = {m: v for m, v in modes.items() if any(s.link == "wan" for s in v[0])}
    if not usable:
        return _skip(title, path, "no WAN samples in links.csv for any mode")
    fig = Figure(figsize=(10, 2.8 * len(usable) + 0.6), layout="constrained")
    axes = fig.subplots(len(usable), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (mode, (samples, events)) in zip(axes, usable.items()):
        t0 = _t0(events, samples)
        for direction, color in (("a>b", "tab:blue"), ("b>a", "tab:green")):
            t, rate = wan_rates(samples, direction, scale)
            if t.size:
                ax.step(t - t0, rate, where="pre", color=color, label=f"WAN {direction}")
        cap = [(s.t_mono - t0, s.nominal_rate_gbit) for s in samples
               if s.link == "wan" and s.direction == "a>b" and s.nominal_rate_gbit is not None]
        if cap:
            ax.step(*zip(*sorted(cap)), where="post", color="black", ls="--", lw=0.8,
                    label="configured rate a>b")
        _mark_events(ax, events, t0)
        ax.set_ylabel("Gbit/s (nominal)")
        ax.set_title(mode, fontsize=10)
        ax.grid(True, alpha=0.3)
        _dedup_legend(ax, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1].set_xlabel("time since workload start (s)")
    fig.suptitle(f"{title}, k = {scale:g}")
    return _save(fig, title, path)


def relayed_examples(records: Sequence[Mapping], n: int) -> list[Mapping]:
    """Completed relayed requests with tokens from both RLD and MD, most eager tokens first."""
    out = []
    for r in records:
        producers = [producer_of(t) for t in r.get("tokens") or ()]
        if r.get("status") == "completed" and "RLD" in producers and "MD" in producers:
            out.append((-producers.count("RLD"), str(r.get("id")), r))
    return [r for *_, r in sorted(out, key=lambda x: x[:2])[:n]]


def plot_relay_timeline(mode: str, records: Sequence[Mapping], path: Path,
                        max_requests: int = 4) -> Plot:
    """Token arrival times of a few relayed requests, colored by producer, handoff marked."""
    title = f"Relayed requests in {mode}: token arrivals"
    chosen = relayed_examples(records, max_requests)
    if not chosen:
        return _skip(title, path, f"no completed request of {mode} has tokens from both "
                     "RLD and MD")
    fig = Figure(figsize=(8, 2.6 * len(chosen) + 0.6), layout="constrained")
    axes = fig.subplots(len(chosen), 1, squeeze=False)[:, 0]
    for ax, r in zip(axes, chosen):
        tokens = r["tokens"]
        for prod, (color, label) in PRODUCER_STYLE.items():
            pts = [(t[2], t[0]) for t in tokens if producer_of(t) == prod]
            if pts:
                ax.scatter(*zip(*pts), s=9, color=color, label=label)
        first_md = min(t[2] for t in tokens if producer_of(t) == "MD")
        h = r.get("handoff") or {}
        ax.axvline(first_md, color="tab:red", lw=1, ls="--",
                   label=f"handoff point (stall {h.get('stall_ms', 0) or 0:.0f} ms)")
        hit = r.get("p_hit_rate")
        ax.set_title(f"request {r.get('id')}: {r.get('pipeline')}, "
                     f"P hit {'?' if hit is None else f'{100 * hit:.1f}%'}, handoff "
                     f"{h.get('mode', '?')} in {h.get('batches', '?')} batch(es)", fontsize=9)
        ax.set_ylabel("output position")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[-1].set_xlabel("time since request sent (s)")
    return _save(fig, title, path)


def bin_shares(hit_pcts: Sequence[float], bins: Sequence[tuple[float, float]]) -> list[float]:
    """Share of values per bin: [lo, hi), hi = 100 inclusive, lo = hi holds exactly lo."""
    counts = [0] * len(bins)
    for x in hit_pcts:
        point = [i for i, (lo, hi) in enumerate(bins) if lo == hi == x]
        span = [i for i, (lo, hi) in enumerate(bins)
                if lo < hi and (lo <= x < hi or x == hi == 100)]
        for i in (point or span)[:1]:
            counts[i] += 1
    n = len(hit_pcts)
    return [c / n if n else 0.0 for c in counts]


def plot_hit_rates(hit_by_mode: Mapping[str, Sequence[float]],
                   bins: Sequence[tuple[float, float]], path: Path) -> Plot:
    """Prefix hit rate at P (fractions per request) binned, grouped bars per mode."""
    title = "Prefix hit rate at P per mode"
    data = {m: [100.0 * v for v in vs if v is not None] for m, vs in hit_by_mode.items()}
    data = {m: v for m, v in data.items() if v}
    if not data:
        return _skip(title, path, "no request records a p_hit_rate")
    fig = Figure(figsize=(8, 4.2), layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(len(bins))
    width = 0.8 / len(data)
    for i, (mode, values) in enumerate(data.items()):
        shares = 100 * np.asarray(bin_shares(values, bins))
        ax.bar(x + (i - (len(data) - 1) / 2) * width, shares, width,
               label=f"{mode} (n={len(values)})")
    ax.set_xticks(x, [f"{lo:g}-{hi:g}" for lo, hi in bins])
    ax.set_xlabel("prefix hit rate at P (%)")
    ax.set_ylabel("requests (%)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    ax.set_title(title)
    return _save(fig, title, path)


def kv_prediction_points(records: Sequence[Mapping]) -> tuple[list[float], list[float]]:
    """(predicted, actual) WAN time of each request whose KV reached MD (record ``kv_at_md``)."""
    pred, actual = [], []
    for r in records:
        kv = r.get("kv_at_md") or {}
        if kv.get("predicted_wan_s") is not None and kv.get("actual_wan_s") is not None:
            pred.append(float(kv["predicted_wan_s"]))
            actual.append(float(kv["actual_wan_s"]))
    return pred, actual


def plot_kv_prediction(records_by_mode: Mapping[str, Sequence[Mapping]], path: Path) -> Plot:
    """The router's predicted WAN time (prefill end -> KV at MD) against the actual, per mode."""
    title = "Router's WAN prediction vs actual KV arrival at MD"
    points = {m: kv_prediction_points(rs) for m, rs in records_by_mode.items()}
    points = {m: p for m, p in points.items() if p[0]}
    if not points:
        return _skip(title, path, "no request had both a predicted and an actual KV arrival")
    fig = Figure(figsize=(5.5, 5), layout="constrained")
    ax = fig.add_subplot()
    lo = min(min(min(p), min(a)) for p, a in points.values())
    hi = max(max(max(p), max(a)) for p, a in points.values())
    lo, hi = max(lo * 0.8, 1e-3), hi * 1.25
    for mode, (pred, actual) in points.items():
        ax.scatter(actual, pred, s=14, alpha=0.7, label=f"{mode} (n={len(pred)})")
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, label="predicted = actual")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("actual: prefill end -> KV at MD (s)")
    ax.set_ylabel("predicted at routing (s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(title, fontsize=10)
    return _save(fig, title, path)


def plot_balance(balance_by_mode: Mapping[str, Mapping], path: Path) -> Plot:
    """Per instance (P, RLD, MD): requests placed on it and its busy share, grouped bars
    per mode (testbed.report.balance)."""
    title = "Work per instance"
    rows = {m: [r for r in b.get("instances") or () if r["requests"] or r["tokens"]]
            for m, b in balance_by_mode.items()}
    if not any(rows.values()):
        return _skip(title, path, "no request names the instance it was placed on")
    names = [r["name"] for r in next(b for b in balance_by_mode.values())["instances"]]
    for b in balance_by_mode.values():
        names += [r["name"] for r in b["instances"] if r["name"] not in names]
    fig = Figure(figsize=(max(6.0, 0.9 * len(names) + 2), 5.5), layout="constrained")
    ax_req, ax_busy = fig.subplots(2, 1, sharex=True)
    x = np.arange(len(names))
    width = 0.8 / len(balance_by_mode)
    for i, (mode, b) in enumerate(balance_by_mode.items()):
        by = {r["name"]: r for r in b["instances"]}
        off = x + (i - (len(balance_by_mode) - 1) / 2) * width
        ax_req.bar(off, [by.get(n, {}).get("requests", 0) for n in names], width, label=mode)
        ax_busy.bar(off, [100 * (by.get(n, {}).get("busy_share") or 0) for n in names], width,
                    label=mode)
    ax_req.set_ylabel("requests placed")
    ax_busy.set_ylabel("busy (% of workload)")
    ax_busy.set_xticks(x, names)
    for ax in (ax_req, ax_busy):
        ax.grid(True, axis="y", alpha=0.3)
    ax_req.legend(fontsize=8)
    ax_req.set_title(title)
    return _save(fig, title, path)
